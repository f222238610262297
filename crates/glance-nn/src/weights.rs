//! Reading parameters through a `VarBuilder` with errors that name the tensor and both shapes.
//!
//! The same calls serve checkpoints (mmaped safetensors) and training (a `VarMap` backend creates
//! the variables on first use).

use crate::quant::{
    store, HalfKind, HalfMatrix, PackedMatrix, QuantError, WeightFormat, WeightLoad,
};
use crate::{LayerNorm, Linear, Mode, RmsNorm};
use candle_core::{Shape, Tensor};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};

/// The tensor `name` under `vb`'s prefix, checked against `shape`.
pub fn param<S: Into<Shape>>(vb: &VarBuilder, shape: S, name: &str) -> Result<Tensor> {
    let shape: Shape = shape.into();
    match vb.get(shape.clone(), name) {
        Ok(t) => Ok(t),
        Err(e) => {
            let full = vb.pp(name).prefix();
            if !vb.contains_tensor(name) {
                return Err(Error::MissingTensor { name: full });
            }
            match vb.get_unchecked(name) {
                Ok(t) if t.dims() != shape.dims() => Err(Error::ShapeMismatch {
                    name: full,
                    expected: shape.dims().to_vec(),
                    found: t.dims().to_vec(),
                }),
                _ => Err(Error::Candle(e)),
            }
        }
    }
}

/// `{prefix}.weight` `(out, in)` and, if `bias`, `{prefix}.bias` `(out,)`.
pub fn linear(vb: &VarBuilder, in_dim: usize, out_dim: usize, bias: bool) -> Result<Linear> {
    let w = param(vb, (out_dim, in_dim), "weight")?;
    let b = if bias {
        Some(param(vb, out_dim, "bias")?)
    } else {
        None
    };
    Ok(Linear::new(w, b))
}

/// [`linear`] with the weight held in `load.format` (the bias stays f32): bf16 / f16 weights
/// stored so in the checkpoint are used in place when `load` has the checkpoint's tensors as
/// stored; otherwise the weight is read (as f32) and packed, one matrix at a time. q8 / q4
/// matrices whose input size is not a multiple of 32 are held in bf16
/// ([`WeightFormat::for_in_dim`]).
pub fn linear_as(
    vb: &VarBuilder,
    in_dim: usize,
    out_dim: usize,
    bias: bool,
    load: &WeightLoad,
) -> Result<Linear> {
    let format = load.format.for_in_dim(in_dim);
    if format == WeightFormat::F32 {
        if let Some(source) = &load.source {
            let name = vb.pp("weight").prefix();
            if let Some(Err(e)) =
                store::from_stored(source.as_ref(), &name, (out_dim, in_dim), format)
            {
                return Err(Error::InvalidParam(e));
            }
        }
        return linear(vb, in_dim, out_dim, bias);
    }
    let b = if bias {
        Some(param(vb, out_dim, "bias")?.to_dtype(candle_core::DType::F32)?)
    } else {
        None
    };
    let packed = std::sync::Arc::new(packed_param(vb, (out_dim, in_dim), "weight", format, load)?);
    if let Some(record) = &load.record {
        let name = vb.pp("weight").prefix();
        record
            .lock()
            .expect("not poisoned")
            .push((name, packed.clone()));
    }
    Ok(Linear::packed(packed, b))
}

/// The matrix `name` `(rows, cols)` under `vb`'s prefix held in `format` (not f32).
pub fn packed_param(
    vb: &VarBuilder,
    (rows, cols): (usize, usize),
    name: &str,
    format: WeightFormat,
    load: &WeightLoad,
) -> Result<PackedMatrix> {
    let kind = match format {
        WeightFormat::Bf16 => Some((HalfKind::Bf16, candle_core::DType::BF16)),
        WeightFormat::F16 => Some((HalfKind::F16, candle_core::DType::F16)),
        _ => None,
    };
    if let Some(source) = &load.source {
        let full = vb.pp(name).prefix();
        match store::from_stored(source.as_ref(), &full, (rows, cols), format) {
            Some(Ok(p)) => return Ok(p),
            Some(Err(e)) => return Err(Error::InvalidParam(e)),
            None => {}
        }
    }
    if let (Some((kind, dtype)), Some(source)) = (kind, &load.source) {
        if let Some(raw) = source.raw(&vb.pp(name).prefix()) {
            if raw.dtype == dtype && raw.shape == [rows, cols] {
                if let Some(m) = HalfMatrix::shared(kind, raw.bytes, rows, cols) {
                    return Ok(PackedMatrix::Half(m));
                }
            }
        }
    }
    let w = param(vb, (rows, cols), name)?;
    let packed = pack_tensor(format, &w)?;
    drop(w);
    // The f32 matrix just freed stays resident otherwise: under `runtime::tune_allocator`'s
    // thresholds glibc keeps freed blocks in the heap, and a load of a 7B model packs hundreds of
    // them, so its peak would carry several of these buffers beside the packed model.
    crate::runtime::release_free_memory();
    packed.map_err(|e| Error::InvalidParam(format!("{}: {e}", vb.pp(name).prefix())))
}

/// `w` `(rows, cols)` packed in `format`, read in place when it is a contiguous f32 CPU tensor
/// (the usual case: a loader's freshly read weight), so that packing a matrix holds its f32
/// values once, not twice; any other tensor is converted to f32 first. The outer error is
/// reading the tensor, the inner one packing it.
pub fn pack_tensor(
    format: WeightFormat,
    w: &Tensor,
) -> Result<std::result::Result<PackedMatrix, QuantError>> {
    // (rows, cols)
    let (rows, cols) = w.dims2()?;
    {
        let (storage, layout) = w.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(PackedMatrix::pack(format, &v[a..b], rows, cols));
        }
    }
    let v = w
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(PackedMatrix::pack(format, &v, rows, cols))
}

pub fn rms_norm(vb: &VarBuilder, size: usize, eps: f64, mode: Mode) -> Result<RmsNorm> {
    Ok(RmsNorm::new(param(vb, size, "weight")?, eps, mode))
}

pub fn layer_norm(vb: &VarBuilder, size: usize, eps: f64, mode: Mode) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        param(vb, size, "weight")?,
        param(vb, size, "bias")?,
        eps,
        mode,
    ))
}
