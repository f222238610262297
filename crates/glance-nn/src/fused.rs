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
            .for_each(|(d, s)| quick_gelu_slice(s, d));
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }

    /// d/dx x·σ(ax) = σ(ax) + a·x·σ(ax)·(1 − σ(ax)).
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let s = candle_nn::ops::sigmoid(&(arg * 1.702)?)?;
        let ds = (&s + ((arg * 1.702)? * &s)?.mul(&(1.0 - &s)?)?)?;
        Ok(Some(grad_res.mul(&ds)?))
    }
}

/// `dst[i] = src[i] · σ(1.702 src[i])`, with [`exp_approx`] so that the loop vectorises (a
/// vision tower's activation: libm's `expf`, one value at a time, took 4% of its time).
fn quick_gelu_slice(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above).
        return unsafe { quick_gelu_avx512(src, dst) };
    }
    quick_gelu_portable(src, dst)
}

/// [`quick_gelu_portable`] compiled for AVX-512F (the same operations, so the same bits).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quick_gelu_avx512(src: &[f32], dst: &mut [f32]) {
    quick_gelu_portable(src, dst)
}

#[inline(always)]
fn quick_gelu_portable(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = x / (1.0 + exp_approx(-1.702 * x));
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
        // The inputs are random (candle's CPU generator is not seedable): exp_approx's 3e-7
        // relative error, summed over ~460 visible keys and normalised, reached 1.5e-6 once.
        assert!(d < 4e-6, "{d}");
        let g_fused = fused.sum_all()?.backward()?.get(&x).unwrap().clone();
        let g_comp = composed.sum_all()?.backward()?.get(&x).unwrap().clone();
        let d: f32 = (g_fused - g_comp)?.abs()?.max_all()?.to_scalar()?;
        assert!(d < 1e-5, "{d}");
        Ok(())
    }
}

/// Softmax over the last dimension with a vectorised `exp` (Cephes' `expf` polynomial, relative
/// error ~1e-7; the library `expf` is called once per element and does not vectorise). Rows are
/// spread over the current rayon pool. Inference only: it has no backward pass, so
/// [`crate::softmax_last_dim`] uses it in `Mode::Infer` alone.
struct FastSoftmax;

impl CustomOp1 for FastSoftmax {
    fn name(&self) -> &'static str {
        "fast-softmax-last-dim"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(src) = storage else {
            candle_core::bail!("fast softmax: only f32")
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("fast softmax: input must be contiguous")
        };
        let src = &src[a..b];
        let dim = layout.shape().dims().last().copied().unwrap_or(1).max(1);
        let mut dst = vec![0f32; src.len()];
        let rows_per_task = (CHUNK / dim).max(1);
        dst.par_chunks_mut(rows_per_task * dim)
            .zip(src.par_chunks(rows_per_task * dim))
            .for_each(|(d, s)| {
                for (d, s) in d.chunks_mut(dim).zip(s.chunks(dim)) {
                    softmax_row(s, d);
                }
            });
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

pub(crate) fn softmax_row(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { softmax_row_avx512(src, dst) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { softmax_row_avx2(src, dst) };
        }
    }
    softmax_row_portable(src, dst)
}

/// [`softmax_row_portable`] compiled for AVX-512F: sixteen lanes of the same operations (Rust
/// fuses no multiply-add it is not told to), so the same bits as the other builds.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row_avx512(src: &[f32], dst: &mut [f32]) {
    softmax_row_portable(src, dst)
}

/// [`softmax_row_portable`] compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_row_avx2(src: &[f32], dst: &mut [f32]) {
    softmax_row_portable(src, dst)
}

/// Written so the loops vectorise (no branches in the element loop).
#[inline(always)]
fn softmax_row_portable(src: &[f32], dst: &mut [f32]) {
    // Sixteen lanes, then across them: an order that vectorises (a max is the same in any
    // order). A comparison and select is one `max` instruction where `f32::max`, which must
    // pass NaNs over, costs a compare and a blend on the accumulator's chain.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = src.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            lanes[i] = if c[i] > lanes[i] { c[i] } else { lanes[i] };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // Every key hidden: undefined, NaN as candle's kernel gives.
        dst.iter_mut().for_each(|d| *d = f32::NAN);
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = exp_approx(s - max);
    }
    // Summed in eight lanes over 8-value chunks, the lanes pairwise, then the tail in order (as
    // `matvec`'s portable dot): the same bits with or without SIMD.
    let mut lanes = [0f32; 8];
    let chunks = dst.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] += c[i];
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for &x in tail {
        sum += x;
    }
    let inv = 1.0 / sum;
    dst.iter_mut().for_each(|d| *d *= inv);
}

/// `e^x` for `x ≤ 0` ranges and beyond: Cephes `expf` (range reduction by ln 2, degree-5
/// polynomial), inputs clamped to the finite f32 range; `-inf` gives ~1e-38.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 88.7);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * C1 - n * C2;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n from n's bits: adding 1.5 · 2²³ puts the integer n (|n| ≤ 128) in the low mantissa
    // bits, where an integer subtraction reads it (`n as i32`, saturating, does not vectorise).
    let n_bits = (n + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000);
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// Softmax over the last dimension: the vectorised kernel for contiguous f32 on CPU, candle's
/// otherwise.
pub fn softmax_last_dim_fast(xs: &Tensor) -> Result<Tensor> {
    if xs.dtype() == candle_core::DType::F32 && xs.is_contiguous() && xs.device().is_cpu() {
        xs.apply_op1_no_bwd(&FastSoftmax)
    } else {
        candle_nn::ops::softmax_last_dim(xs)
    }
}

#[cfg(test)]
mod softmax_tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn exp_is_accurate() {
        for i in -8700..=8800 {
            let x = i as f32 * 0.01;
            let (got, want) = (exp_approx(x), (x as f64).exp());
            assert!(
                ((got as f64 - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert!(exp_approx(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn every_build_of_the_row_softmax_gives_the_same_bits() {
        for len in [1, 7, 8, 9, 64, 577] {
            let src: Vec<f32> = (0..len)
                .map(|j| {
                    if j % 11 == 3 {
                        f32::NEG_INFINITY
                    } else {
                        ((j * 29 % 53) as f32 - 26.0) / 4.0
                    }
                })
                .collect();
            let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
            softmax_row(&src, &mut a);
            softmax_row_portable(&src, &mut b);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{len} values");
        }
    }

    #[test]
    fn softmax_matches_candle_with_masks() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 3.0, (4, 7, 577), &dev)?;
        // Hide a band of keys, as causal / window masks do.
        let mask: Vec<f32> = (0..577)
            .map(|j| if j % 5 == 0 { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        let x = x.broadcast_add(&Tensor::from_vec(mask, 577, &dev)?)?;
        let d: f32 = (softmax_last_dim_fast(&x)? - candle_nn::ops::softmax_last_dim(&x)?)?
            .abs()?
            .max_all()?
            .to_scalar()?;
        // The inputs are random (candle's CPU generator is not seedable): exp_approx's 3e-7
        // relative error, summed over ~460 visible keys and normalised, reached 1.5e-6 once.
        assert!(d < 4e-6, "{d}");
        Ok(())
    }
}
