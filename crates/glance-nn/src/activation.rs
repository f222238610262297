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

    /// A gated MLP's `act(g) * u` (SwiGLU's for SiLU). SiLU over contiguous f32 CPU tensors
    /// outside any autograd graph is one pass over both, split over the rayon pool when large,
    /// with the very operations of `g.silu()? * u` (`v / (1 + exp(-v))`, then the product), so
    /// the same bits; anything else is that composition.
    pub fn gated(self, g: &Tensor, u: &Tensor) -> Result<Tensor> {
        let fusable = self == Activation::Silu
            && g.shape() == u.shape()
            && [g, u].iter().all(|t| {
                t.dtype() == candle_core::DType::F32
                    && t.device().is_cpu()
                    && t.is_contiguous()
                    && !t.track_op()
            });
        if !fusable {
            return self.forward(g)? * u;
        }
        let (gs, gl) = g.storage_and_layout();
        let (us, ul) = u.storage_and_layout();
        let (
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(gv)),
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(uv)),
            Some((ga, gb)),
            Some((ua, ub)),
        ) = (&*gs, &*us, gl.contiguous_offsets(), ul.contiguous_offsets())
        else {
            candle_core::bail!("gated: contiguous f32 CPU tensors expected")
        };
        let (gv, uv) = (&gv[ga..gb], &uv[ua..ub]);
        let mut out = vec![0f32; gv.len()];
        let swiglu = |(o, (g, u)): (&mut [f32], (&[f32], &[f32]))| {
            for (o, (&v, &u)) in o.iter_mut().zip(g.iter().zip(u)) {
                *o = v / (1.0 + (-v).exp()) * u;
            }
        };
        // Below a few rows a second thread costs more than it saves.
        const CHUNK: usize = 1 << 13;
        if out.len() < 2 * CHUNK {
            swiglu((&mut out, (gv, uv)));
        } else {
            use rayon::prelude::*;
            out.par_chunks_mut(CHUNK)
                .zip(gv.par_chunks(CHUNK).zip(uv.par_chunks(CHUNK)))
                .for_each(swiglu);
        }
        let shape = g.shape().clone();
        drop((gs, us));
        Tensor::from_vec(out, shape, g.device())
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

    /// The fused SwiGLU product is `g.silu()? * u`, bit for bit, small (one thread) and large
    /// (split over the pool); other activations and shapes take the composition.
    #[test]
    fn gated_silu_is_the_composed_product_bit_for_bit() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        for n in [7, 5632, 8 * 5632] {
            let g = Tensor::randn(0f32, 3.0, n, &dev)?;
            let u = Tensor::randn(0f32, 1.0, n, &dev)?;
            let want: Vec<f32> = (g.silu()? * &u)?.to_vec1()?;
            let got: Vec<f32> = Activation::Silu.gated(&g, &u)?.to_vec1()?;
            assert!(
                want.iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{n}"
            );
            let gelu: Vec<f32> = Activation::Gelu.gated(&g, &u)?.to_vec1()?;
            let want: Vec<f32> = (g.gelu_erf()? * &u)?.to_vec1()?;
            assert_eq!(gelu, want);
        }
        let (g, u) = (
            Tensor::ones(4, candle_core::DType::F32, &dev)?,
            Tensor::ones(5, candle_core::DType::F32, &dev)?,
        );
        assert!(Activation::Silu.gated(&g, &u).is_err());
        Ok(())
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
