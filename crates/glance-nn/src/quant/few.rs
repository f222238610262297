//! The AVX-512 VNNI q8 / q4 kernel for a few input rows (decode, and the rows a verification
//! pass brings, below the format's [`super::x86::GroupPrep::BLOCK_FROM_ROWS`]): tiles of `R`
//! weight rows × `M` input rows whose float accumulators stay in registers over the whole row,
//! so the input loads are shared by `R` weight rows, the accumulators never go through memory
//! between groups and every tile ends in its `R · M` lane sums.
//!
//! Per output the operations are those of [`super::x86::grouped_rows`]'s many-row path: one
//! integer sum per block (exact in any order), then per group in group order
//! `acc = fmadd(cvt(dot), d_w · d_x, acc)` (the first group onto zero), then
//! [`crate::matvec::hsum512`] — so a row gives the same bits in a tile of any shape and in any
//! batch.

use super::act::QuantRows;
use super::ahead::Ahead;
use super::group::{GROUP, GROUP_BYTES};
use super::x86::GroupPrep;
use std::arch::x86_64::*;

/// Tiles ahead of the one computing whose weight rows are prefetched (at least
/// [`PREFETCH_ROWS`] rows).
const PREFETCH_TILES: usize = 4;

/// Weight rows ahead of the one computing that are prefetched at the least.
const PREFETCH_ROWS: usize = 8;

/// Most input rows a tile takes at once: with 2 weight rows, `2 · 2 · 5` accumulators, the 2
/// weight words, one input vector and the group's input scales and offsets fit the 32 vector
/// registers (6 rows spilled: 0.6× the rate of 4 + 2, `kernel_rate`).
const MAX_CHUNK: usize = 5;

/// `out[r * m + i] = w_r · x_i` for weight rows `0..rows` and the `x.m` input rows, in tiles
/// of up to 3 weight rows × up to 5 input rows (see the module header).
///
/// # Safety
/// As [`super::x86::grouped_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub unsafe fn few_rows(
    scales: &[u16],
    x: &QuantRows,
    rows: usize,
    shift: u32,
    out: &mut [f32],
    prep: &impl GroupPrep,
) {
    let m = x.m;
    // Weight rows per tile (from 3 input rows) as many as the registers allow (accumulators:
    // `R · M` float and `R · M` integer ones of 32); each tile of weight rows meets every input
    // row, in chunks of up to 5, before the next (the weights stream from memory once).
    // One or two input rows stream one weight row at a time (memory-bound in a decode step; one
    // stream is what the hardware prefetcher follows best: with 4 weight rows per tile a one-row
    // pass cost 1.18× (q4) the previous kernel's, and a two-row pass 1.09× that of one weight row
    // per tile, at the model level; docs/kernels.md).
    let tile_rows = match m {
        1 | 2 => 1,
        3 => 3,
        _ => 2,
    };
    let nb = x.blocks();
    let (w0, row_bytes) = prep.row_bytes();
    // The weight rows (and their scales) `ahead_rows` on, prefetched into L2 a share per group
    // (`ahead.rs`): a tile reads R rows at once, which the hardware prefetcher follows less
    // well than one stream, and even one row's stream ran a fifth faster with it (measured
    // beyond the caches, docs/kernels.md). Past this call's rows too: they are usually the
    // next task's, which this thread runs next. Every tile over the same weight rows (one per
    // 4 input rows) asks for them all: the lines are in L2 after the first, and splitting them
    // between the tiles measured slower (8 and 12 rows of q8, docs/kernels.md).
    let ahead = |r0: usize, r: usize| {
        let first = r0 + (PREFETCH_TILES * r).max(PREFETCH_ROWS);
        let scales = scales.as_ptr().wrapping_add(first * nb) as *const u8;
        (
            Ahead::new(w0.wrapping_add(first * row_bytes), r * row_bytes, 1),
            Ahead::new(scales, 2 * r * nb, 1),
        )
    };
    // The input rows in as few chunks of at most `MAX_CHUNK` as hold them, of sizes as even as
    // they go (6 rows: 3 + 3; 9: 5 + 4): every chunk unpacks the tile's weight words again, so
    // a chunk of one row costs about what a whole one does.
    let chunks = m.div_ceil(MAX_CHUNK);
    macro_rules! inputs {
        ($r:literal, $r0:expr) => {{
            let ahead = ahead($r0, $r);
            let mut i0 = 0;
            for c in 0..chunks {
                let size = (m - i0) / (chunks - c);
                match size {
                    5 => tile::<$r, 5>(scales, x, ($r0, i0), shift, out, prep, ahead),
                    4 => tile::<$r, 4>(scales, x, ($r0, i0), shift, out, prep, ahead),
                    3 => tile::<$r, 3>(scales, x, ($r0, i0), shift, out, prep, ahead),
                    2 => tile::<$r, 2>(scales, x, ($r0, i0), shift, out, prep, ahead),
                    1 => tile::<$r, 1>(scales, x, ($r0, i0), shift, out, prep, ahead),
                    _ => unreachable!("chunks of 1 to {MAX_CHUNK} input rows"),
                }
                i0 += size;
            }
        }};
    }
    let mut r0 = 0;
    while r0 < rows {
        let r = tile_rows.min(rows - r0);
        match r {
            3 => inputs!(3, r0),
            2 => inputs!(2, r0),
            _ => inputs!(1, r0),
        }
        r0 += r;
    }
}

/// Weight rows `r0..r0 + R` against input rows `i0..i0 + M` over the whole row, into
/// `out[r * m + i]`, prefetching the weight rows and scales ahead (a share of the rows' per
/// group) as it goes; prefetching changes no arithmetic.
///
/// # Safety
/// As [`few_rows`], for weight rows `r0..r0 + R` of its `rows` and input rows `i0..i0 + M` of
/// `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile<const R: usize, const M: usize>(
    scales: &[u16],
    x: &QuantRows,
    (r0, i0): (usize, usize),
    shift: u32,
    out: &mut [f32],
    prep: &impl GroupPrep,
    (rows_ahead, scales_ahead): (Ahead, Ahead),
) {
    let (m, nb) = (x.m, x.blocks());
    let groups = nb.div_ceil(GROUP);
    let shift = _mm_cvtsi32_si128(shift as i32);
    // (R, M) float accumulators, in registers for the whole row.
    let mut acc = [[_mm512_setzero_ps(); M]; R];
    scales_ahead.fetch(0, 1);
    for g in 0..groups {
        rows_ahead.fetch(g, groups);
        let blocks = (nb - g * GROUP).min(GROUP);
        let bm: __mmask16 = if blocks == GROUP {
            0xffff
        } else {
            (1 << blocks) - 1
        };
        // (M, 8 vectors): this group of the tile's input rows, contiguous.
        let xg = x.grouped.as_ptr().add((g * m + i0) * GROUP_BYTES) as *const __m512i;
        // With one input row, two integer chains per weight row keep the adder busy.
        let mut s0 = [[_mm512_setzero_si512(); M]; R];
        let mut s1 = [[_mm512_setzero_si512(); M]; R];
        if blocks == GROUP {
            // Word by word: each weight word unpacked once for the M input rows, each input
            // vector loaded once for the R weight rows (few registers live).
            for v in 0..8 {
                let wv: [__m512i; R] = std::array::from_fn(|j| prep.word(r0 + j, g, v));
                for k in 0..M {
                    let xv = _mm512_loadu_si512(xg.add(8 * k + v));
                    for j in 0..R {
                        if M == 1 && v % 2 == 1 {
                            s1[j][k] = _mm512_dpbusd_epi32(s1[j][k], wv[j], xv);
                        } else {
                            s0[j][k] = _mm512_dpbusd_epi32(s0[j][k], wv[j], xv);
                        }
                    }
                }
            }
        } else {
            // A partial group, transposed in registers (`prep`) once per weight row.
            for (j, sj) in s0.iter_mut().enumerate() {
                let wv = prep.prep(r0 + j, g, blocks);
                for (v, &w) in wv.iter().enumerate() {
                    for (k, s) in sj.iter_mut().enumerate() {
                        let xv = _mm512_loadu_si512(xg.add(8 * k + v));
                        *s = _mm512_dpbusd_epi32(*s, w, xv);
                    }
                }
            }
        }
        let mut offset = [_mm512_setzero_si512(); M];
        let mut dx = [_mm512_setzero_ps(); M];
        for k in 0..M {
            let at = (i0 + k) * nb + g * GROUP;
            let sums = _mm512_maskz_loadu_epi32(bm, x.sums.as_ptr().add(at));
            offset[k] = _mm512_sll_epi32(sums, shift);
            dx[k] = _mm512_maskz_loadu_ps(bm, x.d.as_ptr().add(at));
        }
        for j in 0..R {
            let ws = scales.as_ptr().add((r0 + j) * nb + g * GROUP);
            let dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(bm, ws as *const i16));
            for k in 0..M {
                let dot = _mm512_sub_epi32(_mm512_add_epi32(s0[j][k], s1[j][k]), offset[k]);
                acc[j][k] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, dx[k]), acc[j][k]);
            }
        }
    }
    for j in 0..R {
        for k in 0..M {
            out[(r0 + j) * m + i0 + k] = crate::matvec::hsum512(acc[j][k]);
        }
    }
}
