//! A Hugging Face model directory: `config.json` and weights in one `model.safetensors` or in shards
//! listed by `model.safetensors.index.json`. Weights may be f32, f16 or bf16 on disk (or packed
//! q8 / q4 values written by `glance quantize`, `glance_nn::quant::store`); glance holds them as
//! the load's weight format says ([`MappedTensors`] lends 16-bit tensors in place) and computes in
//! f32 on CPU.
//!
//! A model directory is user input. Its small files are read through a size cap
//! ([`glance_core::io`]); shard names of the index must stay inside the directory (plain relative
//! names: no absolute paths, no `..`); a weight stored with an integer or boolean dtype is
//! refused instead of being converted to float (the safetensors format,
//! Hugging Face's `safetensors` specification, stores each tensor's dtype in the header).

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use glance_core::io::{read_capped, read_to_string_capped, MAX_JSON_FILE_BYTES};
use glance_core::{Error, Result};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Reads and parses a JSON file of at most [`MAX_JSON_FILE_BYTES`], naming the file in every
/// error.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = read_capped(path, MAX_JSON_FILE_BYTES, "a JSON file")?;
    serde_json::from_slice(&bytes).map_err(|e| Error::json(path, e))
}

/// Reads a text file of a model directory (a chat template) of at most [`MAX_JSON_FILE_BYTES`].
pub fn read_text(path: &Path) -> Result<String> {
    read_to_string_capped(
        path,
        MAX_JSON_FILE_BYTES,
        "a template or configuration file",
    )
}

/// Checks that a shard name from `model.safetensors.index.json` names a file inside the model
/// directory: relative, no `..` / root / drive components. Symlinks are not resolved (the
/// Hugging Face cache links every file into `blobs/`), only the name is judged.
fn check_shard_name(index: &Path, name: &str) -> Result<()> {
    use std::path::Component;
    let path = Path::new(name);
    let escapes = name.is_empty()
        || name.contains('\\')
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(Error::Config(format!(
            "{}: shard name {name:?} must be a file name inside the model directory (no absolute \
             paths, `..` or backslashes)",
            index.display()
        )));
    }
    Ok(())
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
        for s in &shards {
            check_shard_name(&index, s)?;
        }
        if shards.is_empty() {
            return Err(Error::Config(format!(
                "{}: weight_map lists no shards",
                index.display()
            )));
        }
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
///
/// The map lets go of a tensor's pages once the tensor is read ([`MappedBackend`]): mapped file
/// pages count as resident while they stay mapped, so a 13 GB bf16 checkpoint loaded as q4 would
/// otherwise hold the whole file resident beside the packed model until the load ends.
pub fn var_builder(dir: &Path, dtype: DType, device: &Device) -> Result<VarBuilder<'static>> {
    let mapped = std::sync::Arc::new(MappedTensors::open(dir)?);
    Ok(VarBuilder::from_backend(
        Box::new(MappedBackend(mapped)),
        dtype,
        device.clone(),
    ))
}

/// `t` if it has the shape `s` a `VarBuilder` asked for, else candle's shape error naming `name`
/// (what candle's own backends answer).
pub(crate) fn shape_checked(
    t: candle_core::Tensor,
    s: candle_core::Shape,
    name: &str,
) -> candle_core::Result<candle_core::Tensor> {
    if t.shape() != &s {
        return Err(candle_core::Error::UnexpectedShape {
            msg: format!("shape mismatch for {name}"),
            expected: s,
            got: t.shape().clone(),
        }
        .bt());
    }
    Ok(t)
}

/// A `VarBuilder` backend over [`MappedTensors`]: each tensor is copied out of the map in the
/// dtype asked for, then its pages are handed back (`madvise(MADV_DONTNEED)`; the file stays in
/// the page cache, and a later read maps it again).
struct MappedBackend(std::sync::Arc<MappedTensors>);

impl candle_nn::var_builder::SimpleBackend for MappedBackend {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        shape_checked(self.get_unchecked(name, dtype, dev)?, s, name)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let Some((f, stored, shape, start, len)) = self.0.index.get(name) else {
            return Err(candle_core::Error::CannotFindTensor {
                path: name.to_string(),
            }
            .bt());
        };
        let map = &self.0.maps[*f];
        let view =
            safetensors::tensor::TensorView::new(*stored, shape.clone(), &map[*start..][..*len])
                .map_err(|e| candle_core::Error::Msg(format!("{name}: {e}")))?;
        let t = candle_core::safetensors::Load::load(&view, dev)?.to_dtype(dtype)?;
        // SAFETY: the map is read-only and private, so dropping its pages loses nothing: any
        // later read of these bytes (a tensor used in place, a neighbour sharing a page) faults
        // the same file contents back in.
        #[cfg(unix)]
        unsafe {
            // Only advice: a failure leaves the pages mapped, as before.
            let _ = map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *start, *len);
        }
        Ok(t)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.index.contains_key(name)
    }
}

/// The checkpoint's tensors as stored, memory-mapped (read-only), for weights kept in place
/// ([`glance_nn::quant::RawSource`]): bf16 / f16 weights loaded in that same format are not
/// copied. Each file is validated as by [`var_builder`].
pub struct MappedTensors {
    /// Name → (file, dtype as stored, shape, byte range in the file).
    index:
        std::collections::BTreeMap<String, (usize, safetensors::Dtype, Vec<usize>, usize, usize)>,
    maps: Vec<std::sync::Arc<memmap2::Mmap>>,
}

impl MappedTensors {
    pub fn open(dir: &Path) -> Result<Self> {
        let mut index = std::collections::BTreeMap::new();
        let mut maps = Vec::new();
        for (f, path) in weight_files(dir)?.into_iter().enumerate() {
            validate_safetensors(&path)?;
            let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: read-only map of a checkpoint glance never writes while it is open.
            let mmap = unsafe { memmap_file(&file) }.map_err(|e| Error::io(&path, e))?;
            let st =
                safetensors::SafeTensors::deserialize(&mmap).map_err(|e| Error::Safetensors {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            let base = mmap.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - base;
                let entry = (
                    f,
                    view.dtype(),
                    view.shape().to_vec(),
                    start,
                    view.data().len(),
                );
                index.insert(name, entry);
            }
            maps.push(std::sync::Arc::new(mmap));
        }
        Ok(Self { index, maps })
    }

    /// Every tensor as stored, by name: dtype, shape, bytes.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, safetensors::Dtype, &[usize], &[u8])> {
        self.index
            .iter()
            .map(|(name, (f, dtype, shape, start, len))| {
                (
                    name.as_str(),
                    *dtype,
                    shape.as_slice(),
                    &self.maps[*f][*start..*start + *len],
                )
            })
    }
}

impl glance_nn::quant::RawSource for MappedTensors {
    fn raw(&self, name: &str) -> Option<glance_nn::quant::RawTensor> {
        let (f, stored, shape, start, len) = self.index.get(name)?;
        let dtype = match stored {
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::F32 => DType::F32,
            // Packed values (glance_nn::quant::store): bytes, signed for q8.
            safetensors::Dtype::U8 | safetensors::Dtype::I8
                if glance_nn::quant::store::is_packed_name(name) =>
            {
                DType::U8
            }
            _ => return None,
        };
        let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = self.maps[*f].clone();
        Some(glance_nn::quant::RawTensor {
            dtype,
            shape: shape.clone(),
            bytes: glance_nn::quant::SharedBytes::new(owner, *start, *len)?,
        })
    }
}

/// The weight format a directory written by `glance quantize` records
/// (`glance_nn::quant::store::WEIGHTS_KEY` in its safetensors metadata), or `None` for an
/// ordinary checkpoint. Every weight file's header is read; files that disagree are an error.
pub fn recorded_format(dir: &Path) -> Result<Option<glance_nn::WeightFormat>> {
    let mut found: Option<glance_nn::WeightFormat> = None;
    for path in weight_files(dir)? {
        let bad = |reason: String| Error::Safetensors {
            path: path.clone(),
            reason,
        };
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: read-only map of a file we only read.
        let mmap = unsafe { memmap_file(&file) }.map_err(|e| Error::io(&path, e))?;
        let (_, header) =
            safetensors::SafeTensors::read_metadata(&mmap).map_err(|e| bad(e.to_string()))?;
        let metadata = header.metadata();
        glance_nn::quant::store::check_metadata(metadata.as_ref()).map_err(bad)?;
        let format = metadata
            .as_ref()
            .and_then(|m| m.get(glance_nn::quant::store::WEIGHTS_KEY))
            .map(|w| w.parse::<glance_nn::WeightFormat>())
            .transpose()?;
        if found.is_some() && format != found {
            return Err(bad(format!(
                "records weights {} but an earlier file of the checkpoint records {}",
                format.map_or("none".into(), |f| f.name().to_string()),
                found.map_or("none", |f| f.name())
            )));
        }
        found = format;
    }
    Ok(found)
}

/// Checks a requested weight format against the one `dir` records ([`recorded_format`]): a
/// directory written by `glance quantize` loads in its own format only.
pub fn check_format(dir: &Path, format: glance_nn::WeightFormat) -> Result<()> {
    match recorded_format(dir)? {
        Some(recorded) if recorded != format => Err(Error::InvalidParam(format!(
            "{} holds {recorded} weights (written by `glance quantize`): load it with --weights \
             {recorded}, or without --weights, instead of {format}",
            dir.display()
        ))),
        _ => Ok(()),
    }
}

/// Parses the header of a safetensors file and checks the packed-weight layout version of a file
/// written by `glance quantize` ([`glance_nn::quant::store::check_metadata`]), that every tensor
/// lies inside the file and that no weight is stored as integers or booleans: converting those
/// to float would load garbage silently. (Integer index buffers such as CLIP's `position_ids`
/// are allowed.)
fn validate_safetensors(path: &Path) -> Result<()> {
    let bad = |reason: String| Error::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map of a file we only read.
    let mmap = unsafe { memmap_file(&file) }.map_err(|e| Error::io(path, e))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&mmap).map_err(|e| bad(e.to_string()))?;
    glance_nn::quant::store::check_metadata(header.metadata().as_ref()).map_err(bad)?;
    let st = safetensors::SafeTensors::deserialize(&mmap).map_err(|e| bad(e.to_string()))?;
    let mut names = st.names();
    names.sort();
    for name in names {
        let view = st.tensor(name).map_err(|e| bad(e.to_string()))?;
        let dtype = view.dtype();
        // Integer index buffers (CLIP's `position_ids`) are never read as weights.
        let is_index = name.ends_with("_ids") || name.ends_with("num_batches_tracked");
        // q8 / q4 values of a checkpoint written by `glance quantize` (glance_nn::quant::store).
        let packed = glance_nn::quant::store::is_packed_name(name)
            && matches!(dtype, safetensors::Dtype::I8 | safetensors::Dtype::U8);
        if !is_index && !packed && !is_float(dtype) {
            return Err(bad(format!(
                "tensor `{name}` is stored as {dtype:?}, but weights must be floating point \
                 (F32, F16 or BF16; q8 / q4 values only as written by `glance quantize`)"
            )));
        }
    }
    Ok(())
}

fn is_float(dtype: safetensors::Dtype) -> bool {
    use safetensors::Dtype as D;
    matches!(dtype, D::F16 | D::BF16 | D::F32 | D::F64)
}

/// `file` mapped read-only into memory.
///
/// # Safety
/// The file must not be modified or truncated (by this process or another) while the map or
/// any slice of it is alive: the mapped bytes are read as immutable memory
/// (`memmap2::MmapOptions::map`).
unsafe fn memmap_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    memmap2::MmapOptions::new().map(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("glance-ckpt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write_st(path: &Path, tensors: &[(&str, Dtype)]) {
        let data = [0u8; 16];
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, dt)| {
                let bytes = dt.bitsize().div_ceil(8);
                (
                    n.to_string(),
                    TensorView::new(*dt, vec![1], &data[..bytes]).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn integer_weights_are_refused_naming_tensor_and_dtype() {
        let d = scratch("dtype");
        let f = d.join("model.safetensors");
        write_st(
            &f,
            &[
                ("lm_head.weight", Dtype::F32),
                ("embeddings.position_ids", Dtype::I64),
            ],
        );
        validate_safetensors(&f).unwrap();
        for dt in [Dtype::I32, Dtype::I64, Dtype::U8, Dtype::BOOL] {
            write_st(&f, &[("lm_head.weight", dt), ("norm.bias", Dtype::F16)]);
            let class = [("embeddings.class_embedding", dt)];
            write_st(&d.join("class.safetensors"), &class);
            assert!(validate_safetensors(&d.join("class.safetensors")).is_err());
            match validate_safetensors(&f) {
                Err(Error::Safetensors { reason, .. }) => {
                    assert!(reason.contains("lm_head.weight"), "{reason}");
                    assert!(reason.contains(&format!("{dt:?}")), "{reason}");
                }
                other => panic!("{dt:?}: {other:?}"),
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shard_names_must_stay_inside_the_directory() {
        let d = scratch("shards");
        let shard = d.join("model-00001-of-00001.safetensors");
        write_st(&shard, &[("w.weight", Dtype::F32)]);
        let index = |name: &str| {
            std::fs::write(
                d.join("model.safetensors.index.json"),
                serde_json::json!({"weight_map": {"w.weight": name}}).to_string(),
            )
            .unwrap();
        };
        index("model-00001-of-00001.safetensors");
        assert_eq!(weight_files(&d).unwrap(), vec![shard.clone()]);
        index("./model-00001-of-00001.safetensors");
        assert!(weight_files(&d).is_ok());
        for bad in [
            "../model-00001-of-00001.safetensors",
            "sub/../../x.safetensors",
            "/etc/passwd",
            "..\\x.safetensors",
            "",
        ] {
            index(bad);
            match weight_files(&d) {
                Err(Error::Config(m)) => assert!(m.contains("shard name"), "{bad}: {m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        // A symlink inside the directory (the Hugging Face cache layout) keeps working.
        #[cfg(unix)]
        {
            let blobs = d.join("blobs");
            std::fs::create_dir_all(&blobs).unwrap();
            std::fs::rename(&shard, blobs.join("abc123")).unwrap();
            std::os::unix::fs::symlink(blobs.join("abc123"), &shard).unwrap();
            index("model-00001-of-00001.safetensors");
            assert_eq!(weight_files(&d).unwrap(), vec![shard]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn json_files_are_read_through_the_cap() {
        let d = scratch("json");
        let p = d.join("config.json");
        std::fs::write(&p, b"{\"a\": 1}").unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(MAX_JSON_FILE_BYTES + 1).unwrap();
        drop(f);
        match read_json::<serde_json::Value>(&p) {
            Err(e @ Error::TooLarge { .. }) => {
                assert!(e.to_string().contains("config.json"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
