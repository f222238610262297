//! Products of bf16 weights with many input rows on AVX-512 BF16, for vision towers: the
//! weights packed in panels of [`NR`] output columns, each panel a run of pairs of input values
//! (`(panels, pairs, NR)` of two bf16 values each), and every output accumulated in a lane of
//! its own (`vdpbf16ps` of a broadcast pair of input values against a panel's pair for 16
//! columns), so no output ends in a sum across lanes.
//!
//! **Why a second bf16 kernel.** The decode kernel of bf16 weights ([`super::half`]) sums each
//! output over the 16 lanes of a vector and then across them: that order is what every row
//! count shares, so a row among others equals the row alone, but over hundreds of rows each
//! tile of 4 × 4 outputs streams its 4 input rows from L2 for every 4 weight rows, and ran at
//! about half of `vdpbf16ps`' peak on a vision tower (docs/kernels-avx512-bf16.md, "The
//! tower's products in panels"). Here a register tile of [`MR`] input rows × [`NR`] columns
//! keeps 24 accumulators, the panel's block of [`KC`] pairs (16 KiB) stays in L1 while every
//! tile of the task's rows meets it, and the tiles' results go through the output between
//! blocks (exact in f32: one
//! order of additions per output). A row's result still depends on that row alone — its pairs
//! in order, then the bias — but its bits are not the decode kernel's, so a language model,
//! whose prompt and verified rows must equal its decode steps', keeps [`super::half`]: only a
//! vision tower, which meets every image's rows at once and never one by one, is packed so
//! ([`crate::Linear::for_many_rows`]).

use super::half::Bf16Rows;
use candle_core::Tensor;

/// Output columns per panel: 4 vectors of 16 lanes.
const NR: usize = 64;

// A group's tasks ([`crate::matvec::columns_parallel_parts`]) are whole panels.
const _: () = assert!(NR == crate::matvec::ROWS_PER_TASK);

/// Input rows per register tile (`MR · 4` accumulators of 32 registers).
const MR: usize = 6;

/// Pairs of input values per block of a panel (`KC · NR · 4` bytes = 16 KiB, in L1 while the
/// task's row tiles meet it).
const KC: usize = 64;

/// A `(rows, cols)` bf16 matrix packed in panels for [`PanelMatrix::matmul_group`].
#[derive(Clone)]
pub struct PanelMatrix {
    rows: usize,
    cols: usize,
    /// Pairs of input values per row: `cols` rounded up to whole chunks of 32 (the padding of
    /// [`Bf16Rows`]), halved.
    pairs: usize,
    /// `(⌈rows / NR⌉, pairs, NR)` pairs of bf16 bits (the lower value in the low half); zero
    /// past `rows` and `cols`.
    data: Vec<u32>,
}

impl std::fmt::Debug for PanelMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PanelMatrix(bf16, {}x{})", self.rows, self.cols)
    }
}

impl PanelMatrix {
    /// Whether this CPU runs the panel kernel (AVX-512 F / BW / VL / BF16).
    pub fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Packs the bf16 bits `bits` `(rows, cols)`, row-major (the panels in parallel on the
    /// current rayon pool: a vision tower's layers are packed as they load).
    ///
    /// # Panics
    /// If `bits` does not hold `rows · cols` values.
    pub fn from_bf16(bits: &[u16], rows: usize, cols: usize) -> Self {
        use rayon::prelude::*;
        assert_eq!(bits.len(), rows * cols, "PanelMatrix::from_bf16: shape");
        let pairs = cols.div_ceil(32) * 16;
        let mut data = vec![0u32; rows.div_ceil(NR) * pairs * NR];
        if pairs > 0 {
            data.par_chunks_mut(pairs * NR)
                .enumerate()
                .for_each(|(p, panel)| fill_panel(panel, bits, p, rows, cols));
        }
        Self {
            rows,
            cols,
            pairs,
            data,
        }
    }

    /// [`PanelMatrix::from_bf16`] on this thread into this matrix's storage (kept, not
    /// reallocated, where it is large enough: an attention packs each head's keys and values in
    /// turn).
    ///
    /// # Panics
    /// If `bits` does not hold `rows · cols` values.
    pub fn repack(&mut self, bits: &[u16], rows: usize, cols: usize) {
        assert_eq!(bits.len(), rows * cols, "PanelMatrix::repack: shape");
        let pairs = cols.div_ceil(32) * 16;
        self.data.clear();
        self.data.resize(rows.div_ceil(NR) * pairs * NR, 0);
        if pairs > 0 {
            for (p, panel) in self.data.chunks_exact_mut(pairs * NR).enumerate() {
                fill_panel(panel, bits, p, rows, cols);
            }
        }
        (self.rows, self.cols, self.pairs) = (rows, cols, pairs);
    }

    /// `(rows, cols)`: `(out, in)` of a linear layer.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes held.
    pub fn storage_bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// [`PanelMatrix::matmul_group`] of tensors: `x` `(m, in)` and each bias `(out)` give each
    /// matrix's `(m, out)`.
    ///
    /// # Panics
    /// If the CPU lacks AVX-512 BF16 ([`PanelMatrix::available`]).
    pub fn matmul_tensors(
        mats: &[(&PanelMatrix, Option<&Tensor>)],
        x: &Tensor,
    ) -> candle_core::Result<Vec<Tensor>> {
        super::pass::group_tensors(mats, x, PanelMatrix::dims, Self::matmul_group)
    }

    /// The products of several matrices `(matrix, bias)` with the same input rows `x` `(m, in)`
    /// (a layer's query, key and value projections), each `(m, out)`: the rows rounded to bf16
    /// once (to nearest, ties to even), every matrix's panels one task each in one parallel
    /// region on the current rayon pool; `y = x · wᵀ + bias`.
    ///
    /// # Panics
    /// If the CPU lacks AVX-512 BF16 ([`PanelMatrix::available`]), a matrix's inputs are not
    /// `in` values long, or a bias not `out`.
    pub fn matmul_group(
        mats: &[(&PanelMatrix, Option<&[f32]>)],
        x: &[f32],
        m: usize,
    ) -> Vec<Vec<f32>> {
        assert!(Self::available(), "PanelMatrix: AVX-512 BF16 needed");
        let n = mats.first().map_or(0, |(w, _)| w.cols);
        for (w, bias) in mats {
            assert!(
                w.cols == n && x.len() == m * n,
                "PanelMatrix::matmul_group: ({m}, {n}) inputs for ({}, {})",
                w.rows,
                w.cols
            );
            assert!(
                bias.is_none_or(|b| b.len() == w.rows),
                "PanelMatrix::matmul_group: bias for {} outputs",
                w.rows
            );
        }
        let xb = Bf16Rows::new(x, m, n);
        let mut ys: Vec<Vec<f32>> = mats.iter().map(|(w, _)| vec![0f32; m * w.rows]).collect();
        let mut parts: Vec<(usize, &mut [f32])> = ys
            .iter_mut()
            .zip(mats)
            .map(|(y, (w, _))| (w.rows, y.as_mut_slice()))
            .collect();
        crate::matvec::columns_parallel_parts(m, &mut parts, |part, first, mut cols| {
            let (w, bias) = mats[part];
            // The tasks are the panels: columns of NR from a multiple of NR.
            let bias = bias.map(|b| &b[first..first + cols.cols()]);
            let (ld, n) = (cols.ld(), cols.cols());
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW/VL/BF16 checked at the top; `first / NR` is a panel of `w`,
            // `xb` holds `m` rows of `w.pairs` pairs, and the handle's `n ≤ NR` columns of its
            // `m` rows (`ld` apart) are this task's to write.
            unsafe {
                x86::panel(w, first / NR, &xb, (cols.as_mut_ptr(), ld, n), bias)
            };
        });
        ys
    }

    /// `out` `(x.rows(), rows)` = `x · wᵀ` on this thread, for rows already rounded to bf16
    /// whose padded length is this matrix's (`x.stride()` = `cols` rounded up to whole chunks of
    /// 32): a vision tower's attention, whose heads are its tasks.
    ///
    /// # Panics
    /// If the CPU lacks AVX-512 BF16, `x`'s rows are not this matrix's length or `out` holds
    /// fewer than `x.rows() · rows` values.
    pub(crate) fn matmul_rows(&self, x: &Bf16Rows, out: &mut [f32]) {
        assert!(Self::available(), "PanelMatrix: AVX-512 BF16 needed");
        let m = x.rows();
        assert!(
            x.stride() == 2 * self.pairs && out.len() >= m * self.rows,
            "PanelMatrix::matmul_rows: rows of {} for ({}, {}), {} outputs",
            x.stride(),
            self.rows,
            self.cols,
            out.len()
        );
        for first in (0..self.rows).step_by(NR) {
            let n = NR.min(self.rows - first);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW/VL/BF16 checked at the top; `x` holds `m` rows of `self.pairs`
            // pairs and `out` `m` rows of `self.rows` (checked just above), whose columns
            // `first..first + n` are the panel's.
            unsafe {
                x86::panel(
                    self,
                    first / NR,
                    x,
                    (out.as_mut_ptr().add(first), self.rows, n),
                    None,
                )
            };
        }
    }
}

/// Panel `p` `(pairs, NR)` (zeroed) of the bf16 bits `bits` `(rows, cols)`: output row `p · NR
/// + lane`'s values `2j, 2j + 1` at `panel[j · NR + lane]`, the lower in the low half; zero past
/// `rows` and `cols`.
fn fill_panel(panel: &mut [u32], bits: &[u16], p: usize, rows: usize, cols: usize) {
    for lane in 0..NR.min(rows - p * NR) {
        let row = &bits[(p * NR + lane) * cols..][..cols];
        for (j, pair) in row.chunks(2).enumerate() {
            let high = pair.get(1).map_or(0, |&v| u32::from(v) << 16);
            panel[j * NR + lane] = u32::from(pair[0]) | high;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{PanelMatrix, KC, MR, NR};
    use crate::quant::half::Bf16Rows;
    use std::arch::x86_64::*;

    /// Panel `panel` of `w` against every row of `x` into `out` `(c0, ld, cols)`: row `i`'s
    /// `cols ≤ NR` outputs at `c0 + i · ld`, `+ bias`; the panel's blocks of [`KC`] pairs in
    /// order, each met by every tile of [`MR`] rows.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/BF16; `panel` must be a panel of `w`, `x` hold rows of
    /// `2 · w.pairs` values, `c0 + i · ld + c` be writable for every row `i` of `x` and `c <
    /// cols`, and `bias` (if any) hold `cols` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn panel(
        w: &PanelMatrix,
        panel: usize,
        x: &Bf16Rows,
        (c0, ld, cols): (*mut f32, usize, usize),
        bias: Option<&[f32]>,
    ) {
        let m = x.rows();
        let masks: [__mmask16; 4] = std::array::from_fn(|v| {
            let lanes = cols.saturating_sub(16 * v).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        });
        let b0 = w.data.as_ptr().add(panel * w.pairs * NR);
        let a0 = x.bits().as_ptr();
        let stride = x.stride();
        let mut k0 = 0;
        while k0 < w.pairs {
            let kc = KC.min(w.pairs - k0);
            let step = Step {
                b: b0.add(k0 * NR),
                kc,
                first: k0 == 0,
                bias: if k0 + kc == w.pairs { bias } else { None },
                masks,
            };
            let mut i0 = 0;
            while i0 < m {
                // Row `i0`'s pair `k0` and its outputs.
                let a = a0.add(i0 * stride + 2 * k0);
                let c = c0.add(i0 * ld);
                match m - i0 {
                    1 => tile::<1>(&step, a, stride, c, ld),
                    2 => tile::<2>(&step, a, stride, c, ld),
                    3 => tile::<3>(&step, a, stride, c, ld),
                    4 => tile::<4>(&step, a, stride, c, ld),
                    5 => tile::<5>(&step, a, stride, c, ld),
                    _ => tile::<MR>(&step, a, stride, c, ld),
                }
                i0 += MR;
            }
            k0 += kc;
        }
    }

    /// One block of a panel: `kc` pairs from `b`, the first block (outputs start at zero) or
    /// not (they continue from the output), the last with the bias (added after every pair).
    struct Step<'a> {
        b: *const u32,
        kc: usize,
        first: bool,
        bias: Option<&'a [f32]>,
        masks: [__mmask16; 4],
    }

    /// Rows `0..M` from `a` (row `i` at `a + i · stride`) against a block of the panel, into
    /// `c` (row `i` at `c + i · ld`, the columns of `masks`).
    ///
    /// # Safety
    /// As [`panel`], for `M` rows from `a` and `c` and the block's pairs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[inline]
    unsafe fn tile<const M: usize>(
        s: &Step<'_>,
        a: *const u16,
        stride: usize,
        c: *mut f32,
        ld: usize,
    ) {
        // (M, 4) accumulators: row i's columns 16v..16v + 16.
        let mut acc = [[_mm512_setzero_ps(); 4]; M];
        if !s.first {
            for (i, row) in acc.iter_mut().enumerate() {
                for (v, a) in row.iter_mut().enumerate() {
                    *a = _mm512_maskz_loadu_ps(s.masks[v], c.add(i * ld + 16 * v));
                }
            }
        }
        for k in 0..s.kc {
            let bp = s.b.add(k * NR) as *const __m512i;
            let bv: [__m512bh; 4] =
                std::array::from_fn(|v| std::mem::transmute(_mm512_loadu_si512(bp.add(v))));
            for (i, row) in acc.iter_mut().enumerate() {
                // Row i's pair k broadcast to every lane.
                let pair = std::ptr::read_unaligned(a.add(i * stride + 2 * k) as *const i32);
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                for (a, b) in row.iter_mut().zip(&bv) {
                    *a = _mm512_dpbf16_ps(*a, av, *b);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                let a = match s.bias {
                    Some(b) => {
                        _mm512_add_ps(a, _mm512_maskz_loadu_ps(s.masks[v], b.as_ptr().add(16 * v)))
                    }
                    None => a,
                };
                _mm512_mask_storeu_ps(c.add(i * ld + 16 * v), s.masks[v], a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::values;
    use super::*;

    fn bf16(v: f32) -> f32 {
        half::bf16::from_f32(v).to_f32()
    }

    /// Every output against an f64 sum of the bf16-rounded weights and inputs, on sizes off
    /// the panel, the tile and the block (a remainder of each), in a group of matrices with and
    /// without biases; and each row's outputs the same bits whatever the other rows.
    #[test]
    fn panels_compute_the_bf16_products_and_each_row_alone() {
        if !PanelMatrix::available() {
            return;
        }
        let n = 300; // 10 chunks of 32 (the last partial): 160 pairs, 2 blocks and a part.
        let shapes = [(70, true), (64, false), (3, true)];
        let ws: Vec<Vec<f32>> = shapes
            .iter()
            .enumerate()
            .map(|(j, &(out, _))| values(out * n, j as u32 + 1))
            .collect();
        let mats: Vec<PanelMatrix> = ws
            .iter()
            .zip(&shapes)
            .map(|(w, &(out, _))| {
                let bits: Vec<u16> = w
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_bits())
                    .collect();
                PanelMatrix::from_bf16(&bits, out, n)
            })
            .collect();
        let biases: Vec<Option<Vec<f32>>> = shapes
            .iter()
            .map(|&(out, b)| b.then(|| values(out, 7)))
            .collect();
        let group: Vec<(&PanelMatrix, Option<&[f32]>)> = mats
            .iter()
            .zip(&biases)
            .map(|(w, b)| (w, b.as_deref()))
            .collect();
        let m = 13; // two tiles of 6 and one row
        let x = values(m * n, 9);
        let ys = PanelMatrix::matmul_group(&group, &x, m);
        for (j, ((w, &(out, _)), y)) in ws.iter().zip(&shapes).zip(&ys).enumerate() {
            assert_eq!(y.len(), m * out);
            for i in 0..m {
                for r in 0..out {
                    let want: f64 = (0..n)
                        .map(|k| f64::from(bf16(w[r * n + k])) * f64::from(bf16(x[i * n + k])))
                        .sum::<f64>()
                        + biases[j].as_ref().map_or(0.0, |b| f64::from(b[r]));
                    let got = f64::from(y[i * out + r]);
                    assert!(
                        (got - want).abs() < 1e-3,
                        "matrix {j} row {i} col {r}: {got} vs {want}"
                    );
                }
            }
        }
        // Row 12 alone, and rows 5..8: the same bits as among all 13.
        for (first, rows) in [(12, 1), (5, 3)] {
            let alone = PanelMatrix::matmul_group(&group, &x[first * n..(first + rows) * n], rows);
            for ((y, a), &(out, _)) in ys.iter().zip(&alone).zip(&shapes) {
                let among = &y[first * out..(first + rows) * out];
                assert!(among.iter().zip(a).all(|(p, q)| p.to_bits() == q.to_bits()));
            }
        }
    }
}
