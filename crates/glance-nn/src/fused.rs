//! Fused element-wise kernels for the CPU hot path, each with a backward pass so the same op
//! serves training (unlike candle's fused softmax / norms, see the crate docs).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows handled per rayon task; small tensors stay on one thread.
const CHUNK: usize = 1 << 14;

/// CLIP's `quick_gelu(x) = x · σ(1.702 x)` in one pass (the composed form makes three).
struct QuickGelu;

impl CustomOp1 for QuickGelu {
    fn name(&self) -> &'static str {
        "quick-gelu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(src) = storage else {
            candle_core::bail!("quick-gelu: only f32 is fused")
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("quick-gelu: input must be contiguous")
        };
        let src = &src[a..b];
        let mut dst = vec![0f32; src.len()];
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| {
                for (d, &x) in d.iter_mut().zip(s) {
                    *d = x / (1.0 + (-1.702 * x).exp());
                }
            });
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }

    /// d/dx x·σ(ax) = σ(ax) + a·x·σ(ax)·(1 − σ(ax)).
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let s = candle_nn::ops::sigmoid(&(arg * 1.702)?)?;
        let ds = (&s + ((arg * 1.702)? * &s)?.mul(&(1.0 - &s)?)?)?;
        Ok(Some(grad_res.mul(&ds)?))
    }
}

/// `x · σ(1.702 x)`: fused for contiguous f32, composed otherwise.
pub fn quick_gelu(xs: &Tensor) -> Result<Tensor> {
    if xs.dtype() == candle_core::DType::F32 && xs.is_contiguous() && xs.device().is_cpu() {
        xs.apply_op1(QuickGelu)
    } else {
        xs * candle_nn::ops::sigmoid(&(xs * 1.702)?)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn matches_composed_form_and_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 2.0, (3, 50_000), &dev)?)?;
        let fused = quick_gelu(x.as_tensor())?;
        let composed = (x.as_tensor() * candle_nn::ops::sigmoid(&(x.as_tensor() * 1.702)?)?)?;
        let d: f32 = (&fused - &composed)?.abs()?.max_all()?.to_scalar()?;
        assert!(d < 1e-6, "{d}");
        let g_fused = fused.sum_all()?.backward()?.get(&x).unwrap().clone();
        let g_comp = composed.sum_all()?.backward()?.get(&x).unwrap().clone();
        let d: f32 = (g_fused - g_comp)?.abs()?.max_all()?.to_scalar()?;
        assert!(d < 1e-5, "{d}");
        Ok(())
    }
}
