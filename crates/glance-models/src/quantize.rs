//! `glance quantize`: a LLaVA checkpoint rewritten with its weights packed in a format, in the
//! layout of [`glance_nn::quant::store`], so that loading it in that format reads the packed
//! values as they are (no quantization at load time).
//!
//! The model is loaded as [`Llava::load_as`] loads it, recording every packed matrix by name; the
//! output's `model.safetensors` holds those in packed form and every other tensor as the source
//! stores it. The directory's other files (config with its `block_diffusion` settings, tokenizer,
//! templates) are copied, and so are its draft heads (`draft-*/`, which load in f32 whatever the
//! model's format), as they are. Written files are mode 0644 (readable by all, as `cp` leaves
//! them).

use crate::checkpoint::MappedTensors;
use crate::llava::{Llava, LlavaConfig, WeightLayout};
use candle_core::{DType, Device};
use glance_core::{Error, Result};
use glance_nn::quant::store::{self, StoredTensor};
use glance_nn::quant::{PackedMatrix, Recorder};
use glance_nn::{Mode, WeightFormat, WeightLoad};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// What [`quantize_dir`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeSummary {
    /// Matrices written packed.
    pub packed: usize,
    /// Of those, how many in each format actually written, most first: q8 / q4 matrices whose
    /// input dimension is not a multiple of 32 fall back to bf16
    /// ([`WeightFormat::for_in_dim`]), and the vision tower's are in the companion format.
    pub by_format: Vec<(WeightFormat, usize)>,
    /// Tensors copied as stored.
    pub copied: usize,
    /// Bytes of the written `model.safetensors`.
    pub bytes: u64,
}

fn safetensors_dtype(name: &str, d: DType) -> safetensors::Dtype {
    match d {
        DType::U8 if store::stored_dtype_is_i8(name) => safetensors::Dtype::I8,
        DType::U8 => safetensors::Dtype::U8,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::F16 => safetensors::Dtype::F16,
        _ => safetensors::Dtype::F32,
    }
}

/// Writes `src` with its weights in `format` (not f32) to the new directory `out`.
pub fn quantize_dir(src: &Path, out: &Path, format: WeightFormat) -> Result<QuantizeSummary> {
    if format == WeightFormat::F32 {
        return Err(Error::InvalidParam(
            "quantize writes packed weights: choose bf16, f16, q8 or q4".into(),
        ));
    }
    if out.exists() {
        return Err(Error::InvalidParam(format!(
            "{} already exists; quantize writes a new directory",
            out.display()
        )));
    }
    check_outside(src, out)?;
    let config = LlavaConfig::from_dir(src)?;
    let vb = crate::checkpoint::var_builder(src, DType::F32, &Device::Cpu)?;
    let layout = WeightLayout::detect(&vb);
    let mapped = Arc::new(MappedTensors::open(src)?);
    let record = Recorder::default();
    let mut load = WeightLoad::new(format).with_source(mapped.clone());
    load.record = Some(record.clone());
    let model = Llava::from_var_builder_as(&vb, config, &layout, Mode::Infer, &load)?;
    drop(model);
    let packed: HashMap<String, Arc<PackedMatrix>> =
        std::mem::take(&mut *record.lock().expect("not poisoned"))
            .into_iter()
            .collect();
    // Everything written: packed matrices' parts, then the other tensors as stored.
    let mut stored: Vec<StoredTensor> = Vec::new();
    let mut copied: Vec<(&str, safetensors::Dtype, &[usize], &[u8])> = Vec::new();
    for (name, dtype, shape, bytes) in mapped.tensors() {
        match packed.get(name) {
            Some(p) => stored.extend(store::to_stored(name, p)),
            None => copied.push((name, dtype, shape, bytes)),
        }
    }
    let mut views = Vec::with_capacity(stored.len() + copied.len());
    let bad = |e: safetensors::SafeTensorError| Error::Safetensors {
        path: out.join("model.safetensors"),
        reason: e.to_string(),
    };
    for t in &stored {
        let view = safetensors::tensor::TensorView::new(
            safetensors_dtype(&t.name, t.dtype),
            t.shape.clone(),
            &t.bytes,
        )
        .map_err(bad)?;
        views.push((t.name.clone(), view));
    }
    for (name, dtype, shape, bytes) in &copied {
        let view =
            safetensors::tensor::TensorView::new(*dtype, shape.to_vec(), bytes).map_err(bad)?;
        views.push((name.to_string(), view));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    for entry in std::fs::read_dir(src).map_err(|e| Error::io(src, e))? {
        let path = entry.map_err(|e| Error::io(src, e))?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let weights = name.ends_with(".safetensors") || name == "model.safetensors.index.json";
        if path.is_file() && !weights {
            copy_file(&path, &out.join(&*name))?;
        } else if path.is_dir() && name.starts_with("draft-") {
            copy_draft(&path, &out.join(&*name))?;
        }
    }
    let metadata = HashMap::from([
        ("glance_weights".to_string(), format.name().to_string()),
        (
            "glance_layout_version".to_string(),
            store::LAYOUT_VERSION.to_string(),
        ),
    ]);
    let file = out.join("model.safetensors");
    safetensors::serialize_to_file(views, Some(metadata), &file).map_err(bad)?;
    // The safetensors writer renames a private temporary file (mode 0600) into place.
    readable_by_all(&file)?;
    let bytes = std::fs::metadata(&file)
        .map_err(|e| Error::io(&file, e))?
        .len();
    let mut by_format: Vec<(WeightFormat, usize)> = Vec::new();
    for p in packed.values() {
        match by_format.iter_mut().find(|(f, _)| *f == p.format()) {
            Some((_, n)) => *n += 1,
            None => by_format.push((p.format(), 1)),
        }
    }
    by_format.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.name().cmp(b.0.name())));
    Ok(QuantizeSummary {
        by_format,
        packed: packed.len(),
        copied: copied.len(),
        bytes,
    })
}

/// Copies a file, leaving it mode 0644.
fn copy_file(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).map_err(|e| Error::io(from, e))?;
    readable_by_all(to)
}

/// Copies a draft head's directory (its files; a head has no sub-directories).
fn copy_draft(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| Error::io(from, e))? {
        let path = entry.map_err(|e| Error::io(from, e))?.path();
        if path.is_file() {
            copy_file(&path, &to.join(path.file_name().unwrap_or_default()))?;
        }
    }
    Ok(())
}

/// Sets mode 0644 (on Unix; elsewhere files keep the platform's default).
fn readable_by_all(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| Error::io(path, e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Refuses an output directory inside the source directory (or the source itself): the copy
/// would land among the files it copies, and a later `quantize` of the source would copy it too.
fn check_outside(src: &Path, out: &Path) -> Result<()> {
    use std::path::Component;
    let src_abs = src.canonicalize().map_err(|e| Error::io(src, e))?;
    let cwd = std::env::current_dir().map_err(|e| Error::io(Path::new("."), e))?;
    // `out` does not exist yet: normalise it lexically, then resolve its nearest existing
    // ancestor (symbolic links included) and append the rest.
    let mut lexical = std::path::PathBuf::new();
    for c in cwd.join(out).components() {
        match c {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    let mut existing = lexical.as_path();
    let mut rest = Vec::new();
    let out_abs = loop {
        match existing.canonicalize() {
            Ok(real) => break rest.iter().rev().fold(real, |p, c| p.join(c)),
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                _ => return Ok(()),
            },
        }
    };
    if out_abs.starts_with(&src_abs) {
        return Err(Error::InvalidParam(format!(
            "the output {} is inside the model directory {}: write it elsewhere",
            out.display(),
            src.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_inside_the_source_are_refused() {
        let d = std::env::temp_dir().join(format!("glance-quantize-{}", std::process::id()));
        let src = d.join("model");
        std::fs::create_dir_all(&src).unwrap();
        for inside in [src.join("q4"), src.join("a/b/c"), src.join("./q4/../q8")] {
            let e = check_outside(&src, &inside).unwrap_err().to_string();
            assert!(e.contains("inside the model directory"), "{e}");
        }
        assert!(check_outside(&src, &d.join("model-q4")).is_ok());
        std::fs::remove_dir_all(&d).ok();
    }
}
