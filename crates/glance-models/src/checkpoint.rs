//! A Hugging Face model directory: `config.json` and weights in one `model.safetensors` or in shards
//! listed by `model.safetensors.index.json`. Weights may be f32, f16 or bf16 on disk; glance
//! computes in f32 on CPU.

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Reads and parses a JSON file, naming the file in every error.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks that `dir` is a directory and returns `dir/name`, or a [`Error::MissingFile`].
pub fn required_file(dir: &Path, name: &str) -> Result<PathBuf> {
    if !dir.is_dir() {
        return Err(Error::MissingFile {
            dir: dir.to_path_buf(),
            what: "model directory (no such directory)".into(),
        });
    }
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::MissingFile {
            dir: dir.to_path_buf(),
            what: name.to_string(),
        })
    }
}

/// The safetensors files of a checkpoint, in shard order.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: std::collections::BTreeMap<String, String>,
        }
        let idx: Index = read_json(&index)?;
        let shards: BTreeSet<String> = idx.weight_map.into_values().collect();
        let files: Vec<PathBuf> = shards.into_iter().map(|s| dir.join(s)).collect();
        for f in &files {
            if !f.is_file() {
                return Err(Error::MissingFile {
                    dir: dir.to_path_buf(),
                    what: format!(
                        "shard {} listed in model.safetensors.index.json",
                        f.display()
                    ),
                });
            }
        }
        return Ok(files);
    }
    Err(Error::MissingFile {
        dir: dir.to_path_buf(),
        what: "model.safetensors or model.safetensors.index.json".into(),
    })
}

/// Memory-maps the checkpoint's weights; every tensor is converted to `dtype` when read.
/// Each file's header is validated first so a truncated or corrupt file is named.
pub fn var_builder(dir: &Path, dtype: DType, device: &Device) -> Result<VarBuilder<'static>> {
    let files = weight_files(dir)?;
    for f in &files {
        validate_safetensors(f)?;
    }
    // SAFETY: the files are memory-mapped read-only; glance never writes to a checkpoint it has
    // open. A concurrent external writer could change the data under us, as with any mmap.
    unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device) }.map_err(Error::Candle)
}

/// Parses the header of a safetensors file and checks every tensor lies inside the file.
fn validate_safetensors(path: &Path) -> Result<()> {
    let bad = |reason: String| Error::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map of a file we only read.
    let mmap = unsafe { memmap_file(&file) }.map_err(|e| Error::io(path, e))?;
    safetensors::SafeTensors::deserialize(&mmap).map_err(|e| bad(e.to_string()))?;
    Ok(())
}

unsafe fn memmap_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    memmap2::MmapOptions::new().map(file)
}
