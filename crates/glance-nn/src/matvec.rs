//! Batch-1 decode kernel: `y = W x` for one row, split over output rows across the current rayon
//! pool, with an AVX2 + FMA dot product when the CPU has it.
//!
//! Decode is memory-bound: each step streams every weight once. candle's GEMM gains nothing from a
//! second thread on a matrix-vector product (measured on the decode shapes); this kernel reads each
//! weight row exactly once, contiguously, on as many threads as the pool has.

use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// Input rows of [`matvec_rows`] kept in L1 together.
const X_BLOCK: usize = 4;
/// Output rows per rayon task.
const ROWS_PER_TASK: usize = 64;

/// `x` `(1, in)` or `(in,)`, `w` `(out, in)` contiguous f32 → `(1, out)`.
pub fn matvec(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (out_dim, in_dim) = w.dims2()?;
    let w_data = w.storage_and_layout();
    let x_flat = x.flatten_all()?.contiguous()?;
    let x_data = x_flat.storage_and_layout();
    let (candle_core::Storage::Cpu(ws), candle_core::Storage::Cpu(xs)) = (&*w_data.0, &*x_data.0)
    else {
        candle_core::bail!("matvec: CPU tensors only")
    };
    let (Some((wa, wb)), Some((xa, xb))) =
        (w_data.1.contiguous_offsets(), x_data.1.contiguous_offsets())
    else {
        candle_core::bail!("matvec: contiguous inputs only")
    };
    let w_slice = &ws.as_slice::<f32>()?[wa..wb];
    let x_slice = &xs.as_slice::<f32>()?[xa..xb];
    if x_slice.len() != in_dim {
        candle_core::bail!(
            "matvec: x has {} values for a ({out_dim}, {in_dim}) matrix",
            x_slice.len()
        )
    }
    let mut y = vec![0f32; out_dim];
    y.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each(|(c, ys)| {
            let first = c * ROWS_PER_TASK;
            for (r, yr) in ys.iter_mut().enumerate() {
                let row = &w_slice[(first + r) * in_dim..(first + r + 1) * in_dim];
                *yr = dot(row, x_slice);
            }
        });
    drop((w_data, x_data));
    Tensor::from_vec(y, (1, out_dim), w.device())
}

/// `x` `(n, in)`, `w` `(out, in)` contiguous f32 → `(n, out)`, reading `W` once for all `n` rows
/// (continuous batching: a few decode rows at once). Every output is the same [`dot`] that
/// [`matvec`] computes, so row `r` equals `matvec(w, x[r])` bit for bit.
pub fn matvec_rows(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (out_dim, in_dim) = w.dims2()?;
    let (n, x_in) = x.dims2()?;
    if x_in != in_dim || in_dim == 0 {
        candle_core::bail!("matvec_rows: x is ({n}, {x_in}) for a ({out_dim}, {in_dim}) matrix")
    }
    let x = x.contiguous()?;
    let w_data = w.storage_and_layout();
    let x_data = x.storage_and_layout();
    let (candle_core::Storage::Cpu(ws), candle_core::Storage::Cpu(xs)) = (&*w_data.0, &*x_data.0)
    else {
        candle_core::bail!("matvec_rows: CPU tensors only")
    };
    let (Some((wa, wb)), Some((xa, xb))) =
        (w_data.1.contiguous_offsets(), x_data.1.contiguous_offsets())
    else {
        candle_core::bail!("matvec_rows: contiguous inputs only")
    };
    let w_slice = &ws.as_slice::<f32>()?[wa..wb];
    let x_slice = &xs.as_slice::<f32>()?[xa..xb];
    let xr: Vec<&[f32]> = x_slice.chunks_exact(in_dim).collect();
    // (out, n): each task owns whole output rows, every input row beside them.
    let mut yt = vec![0f32; out_dim * n];
    yt.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(c, ys)| {
            let first = c * ROWS_PER_TASK;
            let wrow = |j: usize| &w_slice[(first + j) * in_dim..(first + j + 1) * in_dim];
            let rows = ys.len() / n;
            // Input rows four at a time (they stay in L1 while the task's weight rows stream
            // past; the weight rows stay in L2 for the next four).
            for r0 in (0..n).step_by(X_BLOCK) {
                for j in 0..rows {
                    let row = wrow(j);
                    for (r, x) in xr.iter().enumerate().skip(r0).take(X_BLOCK) {
                        ys[j * n + r] = dot(row, x);
                    }
                }
            }
        });
    drop((w_data, x_data));
    // (out, n) -> (n, out)
    Tensor::from_vec(yt, (out_dim, n), w.device())?
        .t()?
        .contiguous()
}

/// Dot product, vectorised.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

/// Sixteen independent accumulators so the compiler vectorises without reassociating.
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let va = _mm256_loadu_ps(pa.add(i + 8 * k));
            let vb = _mm256_loadu_ps(pb.add(i + 8 * k));
            *acc_k = _mm256_fmadd_ps(va, vb, *acc_k);
        }
        i += 32;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), s);
    let mut total: f32 = lanes.iter().sum();
    while i < n {
        total += a[i] * b[i];
        i += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_matmul_on_odd_sizes() -> Result<()> {
        let dev = Device::Cpu;
        for (out, inp) in [(1, 1), (7, 33), (129, 100), (300, 768)] {
            let w = Tensor::randn(0f32, 1.0, (out, inp), &dev)?;
            let x = Tensor::randn(0f32, 1.0, (1, inp), &dev)?;
            let want = x.matmul(&w.t()?)?;
            let got = matvec(&w, &x)?;
            let d: f32 = (got - want)?.abs()?.max_all()?.to_scalar()?;
            assert!(d < 1e-4, "({out}, {inp}): {d}");
        }
        // Several rows at once: each equals its own matvec exactly.
        for (out, inp, n) in [(130, 77, 5), (131, 768, 9), (64, 33, 1), (3, 100, 4)] {
            let w = Tensor::randn(0f32, 1.0, (out, inp), &dev)?;
            let x = Tensor::randn(0f32, 1.0, (n, inp), &dev)?;
            let rows = matvec_rows(&w, &x)?;
            assert_eq!(rows.dims(), &[n, out]);
            for r in 0..n {
                let one: Vec<f32> = matvec(&w, &x.narrow(0, r, 1)?)?.flatten_all()?.to_vec1()?;
                let got: Vec<f32> = rows.get(r)?.to_vec1()?;
                assert_eq!(one, got, "({out}, {inp}) x {n}: row {r}");
            }
        }
        let a: Vec<f32> = (0..1000).map(|i| (i % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i % 7) as f32 * 0.5).collect();
        let exact: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_portable(&a, &b) - exact).abs() < 1e-3);
        assert!((dot(&a, &b) - exact).abs() < 1e-3);
        Ok(())
    }
}
