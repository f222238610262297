//! Decode kernels: `y = W x` for one row ([`matvec`]) or a few ([`matmul_rows`]), split over
//! output rows across the current rayon pool, with AVX2 + FMA register-blocked kernels when the
//! CPU has them.
//!
//! Decode is memory-bound at real sizes: each step streams every weight once. candle's GEMM gains
//! nothing from a second thread on a matrix-vector product (measured on the decode shapes) and
//! pays milliseconds of dispatch on a few rows; these kernels read each weight row once,
//! contiguously, for all input rows at once, on as many threads as the pool has.
//!
//! **One summation order.** Every output is computed in the same order whatever the kernel: one
//! 8-lane accumulator over the row's 8-element chunks in order, its lanes summed in a fixed tree,
//! then the tail elements in order. So a row computed among others (a draft tree verified in one
//! pass) gets bit for bit the linear outputs it gets alone (one decode step) — part of why greedy
//! speculative decoding reproduces autoregressive decoding token for token.

use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// Output rows per rayon task.
pub(crate) const ROWS_PER_TASK: usize = 64;

/// Most rows [`matmul_rows`] is meant for: beyond, a GEMM's blocking wins.
pub const MAX_SMALL_ROWS: usize = 64;

/// `x` `(1, in)` or `(in,)`, `w` `(out, in)` contiguous f32 → `(1, out)`.
pub fn matvec(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (out_dim, in_dim) = w.dims2()?;
    let x = x.flatten_all()?.reshape((1, x.elem_count()))?;
    if x.dim(1)? != in_dim {
        candle_core::bail!(
            "matvec: x has {} values for a ({out_dim}, {in_dim}) matrix",
            x.dim(1)?
        )
    }
    matmul_rows(w, &x)
}

/// `x` `(m, in)`, `w` `(out, in)` contiguous f32 → `(m, out)`, every output in the one summation
/// order (see the module documentation).
pub fn matmul_rows(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let mut ys = matmul_rows_group(&[w], x)?;
    Ok(ys.pop().expect("one matrix, one result"))
}

/// [`matmul_rows`] of several matrices with the same inputs `x` `(m, in)` (a layer's query, key
/// and value projections) in one parallel region: each result bit for bit what `matmul_rows`
/// gives that matrix alone.
pub fn matmul_rows_group(ws: &[&Tensor], x: &Tensor) -> Result<Vec<Tensor>> {
    let (m, x_in) = x.dims2()?;
    for w in ws {
        let (out_dim, in_dim) = w.dims2()?;
        if x_in != in_dim {
            candle_core::bail!("matmul_rows: x is ({m}, {x_in}) for a ({out_dim}, {in_dim}) matrix")
        }
    }
    let x = x.contiguous()?;
    let x_data = x.storage_and_layout();
    let w_data: Vec<_> = ws.iter().map(|w| w.storage_and_layout()).collect();
    let x_slice = contiguous_f32(&x_data.0, x_data.1)?;
    let w_slices = w_data
        .iter()
        .map(|(storage, layout)| contiguous_f32(storage, layout))
        .collect::<Result<Vec<_>>>()?;
    let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; w.dims()[0] * m]).collect();
    let kernels: Vec<_> = w_slices
        .iter()
        .map(|&w| {
            move |first: usize, rows: usize, ys: &mut [f32]| {
                let w_rows = &w[first * x_in..(first + rows) * x_in];
                block(w_rows, x_slice, x_in, m, ys);
            }
        })
        .collect();
    let mut parts: Vec<RowsPart<'_>> = ys
        .iter_mut()
        .zip(&kernels)
        .zip(ws)
        .map(|((y, kernel), w)| RowsPart {
            out_dim: w.dims()[0],
            kernel,
            y,
        })
        .collect();
    rows_parallel_parts(m, &mut parts);
    ys.into_iter()
        .zip(ws)
        .map(|(y, w)| Tensor::from_vec(y, (m, w.dims()[0]), w.device()))
        .collect()
}

/// The f32 values of a contiguous CPU tensor's storage.
fn contiguous_f32<'a>(
    storage: &'a candle_core::Storage,
    layout: &candle_core::Layout,
) -> Result<&'a [f32]> {
    match (storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(cpu), Some((a, b))) => Ok(&cpu.as_slice::<f32>()?[a..b]),
        (candle_core::Storage::Cpu(_), None) => {
            candle_core::bail!("matmul_rows: contiguous inputs only")
        }
        _ => candle_core::bail!("matmul_rows: CPU tensors only"),
    }
}

/// One matrix of [`rows_parallel_parts`]: `kernel(first, rows, ys)` makes the outputs `ys`
/// `(rows, m)` of its weight rows `first..first + rows`, written into `y` `(m, out_dim)`.
pub(crate) struct RowsPart<'a> {
    pub out_dim: usize,
    pub kernel: &'a (dyn Fn(usize, usize, &mut [f32]) + Sync),
    pub y: &'a mut [f32],
}

/// Runs every part's kernel over its `out_dim` output rows in tasks of [`ROWS_PER_TASK`] on the
/// current rayon pool, the tasks of all parts (matrices over the same `m` input rows: a layer's
/// query, key and value projections) in one parallel region, so no thread waits at the end of
/// one matrix for the next to start. Each task moves its `(rows, m)` outputs into its columns of
/// its part's result itself (there is no transpose pass after the products). Every weight
/// format's kernel runs through here.
pub(crate) fn rows_parallel_parts(m: usize, parts: &mut [RowsPart<'_>]) {
    thread_local! {
        /// A task's `(rows, m)` outputs before they go to their columns (at most 64 × 64).
        static OUTPUTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let kernels: Vec<_> = parts.iter().map(|p| p.kernel).collect();
    let mut dests: Vec<(usize, &mut [f32])> =
        parts.iter_mut().map(|p| (p.out_dim, &mut *p.y)).collect();
    columns_parallel_parts(m, &mut dests, |part, first, mut cols| {
        let kernel = kernels[part];
        if m == 1 {
            // (rows, 1) is a run of the result's one row.
            return kernel(first, cols.cols(), cols.row_mut());
        }
        OUTPUTS.with(|outputs| {
            let mut ys = outputs.borrow_mut();
            ys.clear();
            ys.resize(cols.cols() * m, 0.0);
            kernel(first, cols.cols(), &mut ys);
            cols.store_transposed(&ys);
        })
    });
}

/// Columns `first .. first + cols` of a row-major `(m, ld)` result: the part one task of
/// [`columns_parallel_into`] writes (no other task writes them).
pub(crate) struct Columns<'a> {
    ptr: *mut f32,
    ld: usize,
    m: usize,
    cols: usize,
    _y: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a `Columns` is the only handle on its columns of the result (the tasks' columns are
// disjoint), so moving it to another thread shares nothing.
unsafe impl Send for Columns<'_> {}

impl Columns<'_> {
    /// Rows of the result (the input rows).
    pub(crate) fn rows(&self) -> usize {
        self.m
    }

    /// Columns this handle writes.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Values from one row of the result to the next.
    pub(crate) fn ld(&self) -> usize {
        self.ld
    }

    /// The result's row 0, at this handle's first column: values `i * ld + c` for `i < rows`,
    /// `c < cols` are this handle's to write, and no others.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut f32 {
        self.ptr
    }

    /// This handle's columns of the result's first row.
    pub(crate) fn row_mut(&mut self) -> &mut [f32] {
        // SAFETY: values `0..cols` of row 0 are this handle's, and only its (`Columns` is the
        // one handle on them while it lives).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cols) }
    }

    /// Writes `ys` `(cols, rows)` — a kernel's outputs, weight row by weight row — into this
    /// handle's columns of every row of the result.
    ///
    /// # Panics
    /// If `ys` does not hold `cols · rows` values.
    pub(crate) fn store_transposed(&mut self, ys: &[f32]) {
        assert_eq!(
            ys.len(),
            self.cols * self.m,
            "Columns::store_transposed: shape"
        );
        for i in 0..self.m {
            // SAFETY: values `i * ld .. i * ld + cols` are this handle's (`i < rows`).
            let row =
                unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.ld), self.cols) };
            for (c, v) in row.iter_mut().enumerate() {
                *v = ys[c * self.m + i];
            }
        }
    }
}

/// [`rows_parallel_parts`] for kernels that write their outputs into `y` `(m, out_dim)` directly:
/// `kernel(first, columns)` fills columns `first .. first + columns.cols()` of every row.
pub(crate) fn columns_parallel_into(
    out_dim: usize,
    m: usize,
    kernel: impl Fn(usize, Columns<'_>) + Sync,
    y: &mut [f32],
) {
    columns_parallel_parts(m, &mut [(out_dim, y)], |_, first, cols| kernel(first, cols));
}

/// Tasks of [`ROWS_PER_TASK`] columns over every part `(out_dim, y)` (`y` `(m, out_dim)`) in
/// one parallel region: `task(part, first, columns)` writes columns `first .. first +
/// columns.cols()` of part `part`'s rows.
pub(crate) fn columns_parallel_parts(
    m: usize,
    parts: &mut [(usize, &mut [f32])],
    task: impl Fn(usize, usize, Columns<'_>) + Sync,
) {
    struct Base(*mut f32, usize);
    // SAFETY: shared only to make each task's `Columns`, which are disjoint.
    unsafe impl Sync for Base {}
    let bases: Vec<Base> = parts
        .iter_mut()
        .map(|(out_dim, y)| {
            assert_eq!(y.len(), *out_dim * m, "columns_parallel_parts: shape");
            Base(y.as_mut_ptr(), *out_dim)
        })
        .collect();
    if m == 0 {
        return;
    }
    let tasks: Vec<(usize, usize)> = bases
        .iter()
        .enumerate()
        .flat_map(|(part, b)| {
            (0..b.1)
                .step_by(ROWS_PER_TASK)
                .map(move |first| (part, first))
        })
        .collect();
    let bases = &bases;
    tasks.into_par_iter().for_each(|(part, first)| {
        let (ptr, out_dim) = (bases[part].0, bases[part].1);
        let cols = Columns {
            // SAFETY: `first < out_dim`, inside the part's first row.
            ptr: unsafe { ptr.add(first) },
            ld: out_dim,
            m,
            cols: ROWS_PER_TASK.min(out_dim - first),
            _y: std::marker::PhantomData,
        };
        task(part, first, cols)
    });
}

/// `out[r * m + i] = w_r · x_i` for the weight rows in `w` and the `m` input rows in `x`, each
/// of length `n`, every output in the one summation order.
///
/// # Panics
/// If `x` is not `(m, n)`, `w` not whole rows of `n` or `out` holds fewer than `rows · m`
/// values.
pub(crate) fn block(w: &[f32], x: &[f32], n: usize, m: usize, out: &mut [f32]) {
    assert!(
        x.len() == m * n && w.len().is_multiple_of(n.max(1)) && out.len() >= w.len() / n.max(1) * m,
        "matvec::block: ({m}, {n}) inputs, {} inputs given, {} weights, {} outputs",
        x.len(),
        w.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU supports AVX-512F and VL (checked just above).
            unsafe { avx512::block(w, x, n, m, out) };
            return;
        }
        if has_avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            unsafe { avx2::block(w, x, n, m, out) };
            return;
        }
    }
    for (r, wr) in w.chunks_exact(n).enumerate() {
        for (i, xi) in x.chunks_exact(n).enumerate() {
            out[r * m + i] = dot_portable(wr, xi);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Dot product in the kernels' summation order.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut out = [0f32];
    block(&a[..n], &b[..n], n, 1, &mut out);
    out[0]
}

/// The portable order: eight lanes over 8-element chunks, lanes summed, then the tail.
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut total =
        ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (x, y) in ta.iter().zip(tb) {
        total += x * y;
    }
    total
}

/// One register-blocked kernel, instantiated per instruction set and weight element type: `$lanes`-wide accumulators, tiles
/// of `$tile` weight rows × up to 4 input rows (8 × 1 for a single input row), every output
/// accumulated over the row's `$lanes`-element chunks in order, its lanes summed by `$hsum`, then
/// the tail elements in order — the same sequence of operations in every tile.
///
/// Weights are `$wty` values, widened to f32 lanes by `$wload` (a vector) and `$wscalar` (one
/// value): f32 here, bf16 / f16 in [`crate::quant::half`]. Inputs are always f32.
macro_rules! simd_kernel {
    ($module:ident, $feature:literal, $lanes:literal, $tile:literal, $zero:ident, $load:ident,
     $fmadd:ident, $hsum:expr, $wty:ty, $wload:path, $wscalar:path) => {
        #[cfg(target_arch = "x86_64")]
        mod $module {
            use std::arch::x86_64::*;

            /// See [`super::block`].
            ///
            /// # Safety
            /// The CPU must support `$feature`; `w` holds whole rows of `n` values, `x` `m` rows of `n`, `out` at least `rows · m` values.
            #[target_feature(enable = $feature)]
            pub unsafe fn block(w: &[$wty], x: &[f32], n: usize, m: usize, out: &mut [f32]) {
                let rows = w.len() / n;
                let (wp, xp) = (w.as_ptr(), x.as_ptr());
                let mut r = 0;
                if m == 1 {
                    while r + 8 <= rows {
                        tile::<8, 1>(wp, xp, n, r, 0, m, out);
                        r += 8;
                    }
                }
                while r + $tile <= rows {
                    let mut i = 0;
                    while i + 4 <= m {
                        tile::<$tile, 4>(wp, xp, n, r, i, m, out);
                        i += 4;
                    }
                    // The last 1–3 input rows in one tile: each weight row is read once.
                    match m - i {
                        3 => tile::<$tile, 3>(wp, xp, n, r, i, m, out),
                        2 => tile::<$tile, 2>(wp, xp, n, r, i, m, out),
                        1 => tile::<$tile, 1>(wp, xp, n, r, i, m, out),
                        _ => {}
                    }
                    r += $tile;
                }
                while r < rows {
                    for i in 0..m {
                        tile::<1, 1>(wp, xp, n, r, i, m, out);
                    }
                    r += 1;
                }
            }

            /// Weight rows `r0..r0 + R` × input rows `i0..i0 + M`.
            ///
            /// # Safety
            /// As [`block`], for weight rows `r0..r0 + R` and input rows `i0..i0 + M`, which it keeps in range.
            #[inline(always)]
            unsafe fn tile<const R: usize, const M: usize>(
                wp: *const $wty,
                xp: *const f32,
                n: usize,
                r0: usize,
                i0: usize,
                m: usize,
                out: &mut [f32],
            ) {
                let mut acc = [[$zero(); M]; R];
                let chunks = n / $lanes;
                for c in 0..chunks {
                    let mut xv = [$zero(); M];
                    for (i, v) in xv.iter_mut().enumerate() {
                        *v = $load(xp.add((i0 + i) * n + $lanes * c));
                    }
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let wv = $wload(wp.add((r0 + r) * n + $lanes * c));
                        for (a, v) in acc_r.iter_mut().zip(&xv) {
                            *a = $fmadd(wv, *v, *a);
                        }
                    }
                }
                for (r, acc_r) in acc.iter().enumerate() {
                    for (i, a) in acc_r.iter().enumerate() {
                        let mut total = $hsum(*a);
                        for k in $lanes * chunks..n {
                            total += $wscalar(wp.add((r0 + r) * n + k)) * *xp.add((i0 + i) * n + k);
                        }
                        out[(r0 + r) * m + i0 + i] = total;
                    }
                }
            }
        }
    };
}

pub(crate) use simd_kernel;

/// One f32 weight (the kernels' scalar tail).
///
/// # Safety
/// `p` must be valid for a read.
#[inline(always)]
pub(crate) unsafe fn read_f32(p: *const f32) -> f32 {
    *p
}

/// Lanes of a 256-bit vector summed in a fixed tree.
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Lanes of a 512-bit vector: the halves added, then [`hsum256`].
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum512(v: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    hsum256(_mm256_add_ps(lo, hi))
}

// AVX-512: 16 lanes, 4 × 4 tiles (16 accumulators of 32 registers).
simd_kernel!(
    avx512,
    "avx512f,avx512vl",
    16,
    4,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_fmadd_ps,
    super::hsum512,
    f32,
    _mm512_loadu_ps,
    super::read_f32
);
// AVX2 + FMA: 8 lanes, 2 × 4 tiles (8 accumulators of 16 registers).
simd_kernel!(
    avx2,
    "avx2,fma",
    8,
    2,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_fmadd_ps,
    super::hsum256,
    f32,
    _mm256_loadu_ps,
    super::read_f32
);

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// How far a dot product of `n` unit normals may lie from candle's GEMM, which adds in
    /// another order: the rounding grows with the length (a run of (17, 300, 768) once differed
    /// by 1.07e-4).
    fn tolerance(n: usize) -> f32 {
        1e-4 * (n as f32 / 100.0).max(1.0)
    }

    #[test]
    fn matches_matmul_on_odd_sizes() -> Result<()> {
        let dev = Device::Cpu;
        for (out, inp) in [(1, 1), (7, 33), (129, 100), (300, 768)] {
            let w = Tensor::randn(0f32, 1.0, (out, inp), &dev)?;
            let x = Tensor::randn(0f32, 1.0, (1, inp), &dev)?;
            let want = x.matmul(&w.t()?)?;
            let got = matvec(&w, &x)?;
            let d: f32 = (got - want)?.abs()?.max_all()?.to_scalar()?;
            assert!(d < tolerance(inp), "({out}, {inp}): {d}");
        }
        for (m, out, inp) in [(2, 7, 33), (3, 9, 47), (5, 129, 100), (17, 300, 768)] {
            let w = Tensor::randn(0f32, 1.0, (out, inp), &dev)?;
            let x = Tensor::randn(0f32, 1.0, (m, inp), &dev)?;
            let want = x.matmul(&w.t()?)?;
            let got = matmul_rows(&w, &x)?;
            let d: f32 = (&got - want)?.abs()?.max_all()?.to_scalar()?;
            assert!(d < tolerance(inp), "({m}, {out}, {inp}): {d}");
            // Each row bit for bit what it gets alone.
            for i in 0..m {
                let alone = matvec(&w, &x.narrow(0, i, 1)?)?;
                let row = got.narrow(0, i, 1)?;
                assert_eq!(alone.to_vec2::<f32>()?, row.to_vec2::<f32>()?);
            }
        }
        let a: Vec<f32> = (0..1000).map(|i| (i % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i % 7) as f32 * 0.5).collect();
        let exact: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_portable(&a, &b) - exact).abs() < 1e-3);
        assert!((dot(&a, &b) - exact).abs() < 1e-3);
        Ok(())
    }

    #[test]
    #[should_panic(expected = "matvec::block: (2, 8) inputs, 15 inputs given")]
    fn block_refuses_inputs_of_another_shape() {
        block(&[0.0; 24], &[0.0; 15], 8, 2, &mut [0.0; 6]);
    }

    #[test]
    #[should_panic(
        expected = "matvec::block: (2, 8) inputs, 16 inputs given, 24 weights, 5 outputs"
    )]
    fn block_refuses_a_short_output() {
        block(&[0.0; 24], &[0.0; 16], 8, 2, &mut [0.0; 5]);
    }
}
