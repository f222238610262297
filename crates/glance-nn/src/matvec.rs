//! Batch-1 decode kernel: `y = W x` for one row, split over output rows across the current rayon
//! pool, with an AVX2 + FMA dot product when the CPU has it.
//!
//! Decode is memory-bound: each step streams every weight once. candle's GEMM gains nothing from a
//! second thread on a matrix-vector product (measured on the decode shapes); this kernel reads each
//! weight row exactly once, contiguously, on as many threads as the pool has.

use candle_core::{Result, Tensor};
use rayon::prelude::*;

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
    if x_in != in_dim {
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
            let mut j = 0;
            // Two weight rows against four input rows at a time: each weight vector loaded once
            // serves four products.
            while j + 2 <= rows {
                let mut r = 0;
                while r + 4 <= n {
                    let b = dot_2x4(
                        [wrow(j), wrow(j + 1)],
                        [xr[r], xr[r + 1], xr[r + 2], xr[r + 3]],
                    );
                    for (cw, out) in b.iter().enumerate() {
                        ys[(j + cw) * n + r..(j + cw) * n + r + 4].copy_from_slice(out);
                    }
                    r += 4;
                }
                for rr in r..n {
                    ys[j * n + rr] = dot(wrow(j), xr[rr]);
                    ys[(j + 1) * n + rr] = dot(wrow(j + 1), xr[rr]);
                }
                j += 2;
            }
            for jj in j..rows {
                for (rr, x) in xr.iter().enumerate() {
                    ys[jj * n + rr] = dot(wrow(jj), x);
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

/// `dot(w[c], x[r])` for two weight rows and four input rows, each result the same bits as
/// [`dot`] gives (the same accumulators, each summed in the same order).
fn dot_2x4(w: [&[f32]; 2], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above); all rows have the
            // same length (the caller slices them from one matrix each).
            return unsafe { dot_2x4_avx2(w, x) };
        }
    }
    let mut out = [[0f32; 4]; 2];
    for (c, o) in out.iter_mut().enumerate() {
        for (r, v) in o.iter_mut().enumerate() {
            *v = dot(w[c], x[r]);
        }
    }
    out
}

/// [`dot_avx2`]'s four accumulators (lane group `k` of every 32-value step) computed one group at
/// a time, so that eight products (2 weight rows × 4 input rows) share each weight load and fit
/// in registers; then summed exactly as `dot_avx2` sums them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_2x4_avx2(w: [&[f32]; 2], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    use std::arch::x86_64::*;
    let n = w[0].len();
    let main = n / 32 * 32;
    // groups[k][c][r]: accumulator k of dot(w[c], x[r]).
    let mut groups = [[[_mm256_setzero_ps(); 4]; 2]; 4];
    for (k, g) in groups.iter_mut().enumerate() {
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        let mut i = 8 * k;
        while i < main {
            let w0 = _mm256_loadu_ps(w[0].as_ptr().add(i));
            let w1 = _mm256_loadu_ps(w[1].as_ptr().add(i));
            for r in 0..4 {
                let xv = _mm256_loadu_ps(x[r].as_ptr().add(i));
                acc[0][r] = _mm256_fmadd_ps(w0, xv, acc[0][r]);
                acc[1][r] = _mm256_fmadd_ps(w1, xv, acc[1][r]);
            }
            i += 32;
        }
        *g = acc;
    }
    let mut out = [[0f32; 4]; 2];
    for c in 0..2 {
        for r in 0..4 {
            let s = _mm256_add_ps(
                _mm256_add_ps(groups[0][c][r], groups[1][c][r]),
                _mm256_add_ps(groups[2][c][r], groups[3][c][r]),
            );
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), s);
            let mut total: f32 = lanes.iter().sum();
            for i in main..n {
                total += w[c][i] * x[r][i];
            }
            out[c][r] = total;
        }
    }
    out
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
