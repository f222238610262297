//! Activation functions named as Hugging Face configs name them (`hidden_act`, `projector_hidden_act`).

use candle_core::{Result, Tensor};
use serde::Deserialize;

/// An activation function, deserialised from the strings HF configs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Activation {
    /// Exact GELU with erf (`torch.nn.functional.gelu`).
    #[serde(rename = "gelu")]
    Gelu,
    /// GELU with the tanh approximation.
    #[serde(alias = "gelu_new", alias = "gelu_pytorch_tanh", alias = "gelu_fast")]
    #[serde(rename = "gelu_tanh")]
    GeluTanh,
    /// CLIP's `x * sigmoid(1.702 x)`.
    #[serde(rename = "quick_gelu")]
    QuickGelu,
    #[serde(rename = "silu", alias = "swish")]
    Silu,
    #[serde(rename = "relu")]
    Relu,
}

impl Activation {
    pub fn forward(self, xs: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => xs.gelu_erf(),
            Activation::GeluTanh => xs.gelu(),
            Activation::QuickGelu => crate::fused::quick_gelu(xs),
            Activation::Silu => xs.silu(),
            Activation::Relu => xs.relu(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hf_names() {
        let a: Activation = serde_json::from_str("\"gelu_pytorch_tanh\"").unwrap();
        assert_eq!(a, Activation::GeluTanh);
        let a: Activation = serde_json::from_str("\"quick_gelu\"").unwrap();
        assert_eq!(a, Activation::QuickGelu);
        assert!(serde_json::from_str::<Activation>("\"mystery\"").is_err());
    }

    #[test]
    fn quick_gelu_matches_formula() -> Result<()> {
        let x = Tensor::new(&[-2f32, -0.5, 0.0, 0.7, 3.0], &candle_core::Device::Cpu)?;
        let y: Vec<f32> = Activation::QuickGelu.forward(&x)?.to_vec1()?;
        for (xi, yi) in [-2f32, -0.5, 0.0, 0.7, 3.0].iter().zip(y) {
            let want = xi / (1.0 + (-1.702 * xi).exp());
            assert!((want - yi).abs() < 1e-6);
        }
        Ok(())
    }
}
