//! Reading parameters through a `VarBuilder` with errors that name the tensor and both shapes.
//!
//! The same calls serve checkpoints (mmaped safetensors) and training (a `VarMap` backend creates
//! the variables on first use).

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
