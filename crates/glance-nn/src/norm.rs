//! RMSNorm (Llama family) and LayerNorm (CLIP), fused for inference, composed for training.

use crate::Mode;
use candle_core::{Result, Tensor};

/// `x / sqrt(mean(x²) + eps) * weight`, computed in f32.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
    mode: Mode,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64, mode: Mode) -> Self {
        Self {
            weight,
            eps: eps as f32,
            mode,
        }
    }

    /// `xs`: `(..., hidden)`.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        match self.mode {
            Mode::Infer if xs.is_contiguous() => {
                candle_nn::ops::rms_norm(xs, &self.weight, self.eps)
            }
            _ => candle_nn::ops::rms_norm_slow(xs, &self.weight, self.eps),
        }
    }
}

/// `(x - mean) / sqrt(var + eps) * weight + bias`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
    mode: Mode,
}

impl LayerNorm {
    pub fn new(weight: Tensor, bias: Tensor, eps: f64, mode: Mode) -> Self {
        Self {
            weight,
            bias,
            eps: eps as f32,
            mode,
        }
    }

    /// `xs`: `(..., hidden)`.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        match self.mode {
            Mode::Infer if xs.is_contiguous() => {
                candle_nn::ops::layer_norm(xs, &self.weight, &self.bias, self.eps)
            }
            _ => candle_nn::ops::layer_norm_slow(xs, &self.weight, &self.bias, self.eps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn fused_and_composed_agree() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (3, 7, 13), &dev)?;
        let w = Tensor::randn(1f32, 0.1, 13, &dev)?;
        let b = Tensor::randn(0f32, 0.1, 13, &dev)?;
        let d = (RmsNorm::new(w.clone(), 1e-6, Mode::Infer).forward(&x)?
            - RmsNorm::new(w.clone(), 1e-6, Mode::Train).forward(&x)?)?;
        assert!(d.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
        let d = (LayerNorm::new(w.clone(), b.clone(), 1e-5, Mode::Infer).forward(&x)?
            - LayerNorm::new(w, b, 1e-5, Mode::Train).forward(&x)?)?;
        assert!(d.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
        Ok(())
    }
}
