//! The AVX2 kernel of q8 and q4, for CPUs without AVX-512 VNNI.
//!
//! **Why.** The packed matrices hold each row's whole groups of 16 blocks in the VNNI kernel's
//! word-major order ([`super::group`]). A per-block AVX2 kernel needs each block contiguous, so it
//! had to copy every row back into llama.cpp's order on every call: at the TinyLlama-1.1B shape
//! that made a q4 decode step read its weights at 2.1 GB/s (bf16 read at 14.6 on the same
//! machine). This kernel reads the groups as they are held instead.
//!
//! **How.** In a whole group, word `t` of the 16 blocks is 64 contiguous bytes, so one 256-bit
//! load holds word `t` of 8 blocks, block `8h + l` in lane `l` of half `h`. The input rows'
//! groups are arranged the same way ([`super::act::QuantRows`]`::grouped`). Per half group:
//! - `maddubs` / `madd` give each lane the 4-value dot of its block's word, and the words add up
//!   to the 8 blocks' whole integer sums (exact, in any order). q4's unsigned nibbles go in as
//!   they are, and their offset of 8 comes off as `8 · Σ q_x` per block; q8's signed weights go
//!   in as `|w|` against `sign(x, w)`.
//! - One convert, one multiply (`d_w · d_x` of the 8 blocks) and one fused multiply-add take
//!   the sums into the output's float accumulator: float work per 256 multiply-adds, not per 32.
//!
//! A last, partial group (held as stored) follows block by block, then the accumulator's lanes
//! are summed in a fixed tree. Tiles of up to 4 input rows share each weight load (and from
//! [`Q8_PAIRS_FROM_ROWS`] input rows q8's tiles hold two weight rows, sharing each input load);
//! every output goes through the same operations whatever the tile or the number of input rows,
//! so a row gives the same bits alone and in any batch.

use super::act::QuantRows;
use super::group::{GROUP, GROUP_BYTES};
use super::BLOCK;
use crate::matvec::hsum256;
use std::arch::x86_64::*;

/// Blocks per half group: one 256-bit vector of 4-byte words.
const HALF: usize = GROUP / 2;

/// From this many input rows q8 goes two weight rows at a time, each input load shared by both
/// (q8 spends four operations per 32 multiply-adds, so its loads weigh more than q4's). Measured
/// at the TinyLlama-1.1B shape, 2 threads (`bench decode --rows`, docs/kernels.md): 16 rows
/// 1.16-1.40x faster, 32 rows 1.12-1.24x, a 64-row prefill 1.26-1.40x; 4 rows went 1.2x slower.
const Q8_PAIRS_FROM_ROWS: usize = 16;

/// `out[r * m + i] = w_r · x_i` for weight rows `0..rows` of a q4 (`Q4`) or q8 matrix whose
/// stored elements start at `qs` (bytes; q8's are `i8`), `sc` their f16 scales.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `qs` must hold `rows` whole rows of `x.n` values in
/// the kernels' order and `sc` their scales; `out` at least `rows · x.m` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn grouped<const Q4: bool>(
    qs: *const u8,
    sc: &[u16],
    x: &QuantRows,
    rows: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    if !Q4 && x.m >= Q8_PAIRS_FROM_ROWS {
        while r + 2 <= rows {
            row_tiles::<Q4, 2, 4>(qs, sc, x, r, out);
            r += 2;
        }
    }
    while r < rows {
        row_tiles::<Q4, 1, 4>(qs, sc, x, r, out);
        r += 1;
    }
}

/// Weight rows `r0..r0 + R` against every input row, in tiles of `M` input rows (the last one
/// smaller).
///
/// # Safety
/// As [`grouped`], for weight rows in range.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn row_tiles<const Q4: bool, const R: usize, const M: usize>(
    qs: *const u8,
    sc: &[u16],
    x: &QuantRows,
    r0: usize,
    out: &mut [f32],
) {
    let m = x.m;
    let mut i = 0;
    while i + M <= m {
        tile::<Q4, R, M>(qs, sc, x, r0, i, out);
        i += M;
    }
    match m - i {
        0 => {}
        1 => tile::<Q4, R, 1>(qs, sc, x, r0, i, out),
        2 => tile::<Q4, R, 2>(qs, sc, x, r0, i, out),
        3 => tile::<Q4, R, 3>(qs, sc, x, r0, i, out),
        _ => unreachable!("tiles hold at most 4 input rows"),
    }
}

/// Weight rows `r0..r0 + R` against input rows `i0..i0 + M`, into `out` `(rows, m)`.
///
/// # Safety
/// As [`grouped`], for weight rows and input rows in range.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
// Register tiles: the loops index several arrays by the same tile position.
#[allow(clippy::needless_range_loop)]
unsafe fn tile<const Q4: bool, const R: usize, const M: usize>(
    qs: *const u8,
    sc: &[u16],
    x: &QuantRows,
    r0: usize,
    i0: usize,
    out: &mut [f32],
) {
    let (n, nb, m) = (x.n, x.blocks(), x.m);
    // Bytes per value: a half for q4's nibbles.
    let bytes = |values: usize| if Q4 { values / 2 } else { values };
    let wrow = |j: usize| qs.add((r0 + j) * bytes(n));
    let ws = |j: usize| sc.as_ptr().add((r0 + j) * nb);
    let ones = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi8(0x0f);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let groups = nb / GROUP;
    for g in 0..groups {
        // Input row `i`'s group `g`: `(groups, m, 512)` bytes, group-major.
        let xg = |k: usize| x.grouped.as_ptr().add((g * m + i0 + k) * GROUP_BYTES) as *const u8;
        let wg = |j: usize| wrow(j).add(bytes(g * GROUP_BYTES));
        for h in 0..2 {
            let mut sums = [[_mm256_setzero_si256(); M]; R];
            if Q4 {
                // Word `t`: the low nibbles are values `4t..4t + 4` of each block (input word
                // `t`), the high ones `16 + 4t..` (input word `t + 4`). A pair of products is at
                // most 2 · 15 · 127 in magnitude, so the 8 pairs per 16-bit lane of the 4 words
                // (30,480 at most) add up without saturating before one widening `madd`.
                let mut pairs = [[_mm256_setzero_si256(); M]; R];
                for t in 0..4 {
                    let mut lo = [_mm256_setzero_si256(); R];
                    let mut hi = [_mm256_setzero_si256(); R];
                    for j in 0..R {
                        let w = _mm256_loadu_si256(wg(j).add(64 * t + 32 * h) as *const _);
                        lo[j] = _mm256_and_si256(w, low);
                        hi[j] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
                    }
                    for k in 0..M {
                        let xl = _mm256_loadu_si256(xg(k).add(64 * t + 32 * h) as *const _);
                        let xh = _mm256_loadu_si256(xg(k).add(64 * (t + 4) + 32 * h) as *const _);
                        for j in 0..R {
                            let d = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo[j], xl),
                                _mm256_maddubs_epi16(hi[j], xh),
                            );
                            pairs[j][k] = _mm256_add_epi16(pairs[j][k], d);
                        }
                    }
                }
                for j in 0..R {
                    for k in 0..M {
                        sums[j][k] = _mm256_madd_epi16(pairs[j][k], ones);
                    }
                }
            } else {
                for t in 0..8 {
                    let mut w = [_mm256_setzero_si256(); R];
                    let mut aw = [_mm256_setzero_si256(); R];
                    for j in 0..R {
                        w[j] = _mm256_loadu_si256(wg(j).add(64 * t + 32 * h) as *const _);
                        aw[j] = _mm256_sign_epi8(w[j], w[j]);
                    }
                    for k in 0..M {
                        let xv = _mm256_loadu_si256(xg(k).add(64 * t + 32 * h) as *const _);
                        for j in 0..R {
                            let d = signed_pairs(aw[j], w[j], xv);
                            sums[j][k] = _mm256_add_epi32(sums[j][k], _mm256_madd_epi16(d, ones));
                        }
                    }
                }
            }
            let b0 = g * GROUP + h * HALF;
            let mut dw = [_mm256_setzero_ps(); R];
            for j in 0..R {
                dw[j] = _mm256_cvtph_ps(_mm_loadu_si128(ws(j).add(b0) as *const _));
            }
            for k in 0..M {
                let i = i0 + k;
                let off = if Q4 {
                    let sx = _mm256_loadu_si256(x.sums.as_ptr().add(i * nb + b0) as *const _);
                    _mm256_slli_epi32(sx, 3)
                } else {
                    _mm256_setzero_si256()
                };
                let dx = _mm256_loadu_ps(x.d.as_ptr().add(i * nb + b0));
                for j in 0..R {
                    let s = if Q4 {
                        _mm256_sub_epi32(sums[j][k], off)
                    } else {
                        sums[j][k]
                    };
                    acc[j][k] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[j], dx), acc[j][k]);
                }
            }
        }
    }
    // The blocks after the last whole group, as stored: one block at a time.
    let mut tail = [[0f32; M]; R];
    for b in groups * GROUP..nb {
        for (j, tail) in tail.iter_mut().enumerate() {
            let wb = wrow(j).add(bytes(b * BLOCK));
            let dw = super::f16_value(*ws(j).add(b));
            // q4: the block's 32 levels in order (low nibbles, then high).
            let w = if Q4 {
                let v = _mm_loadu_si128(wb as *const _);
                let lo = _mm_and_si128(v, _mm_set1_epi8(0x0f));
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0f));
                _mm256_set_m128i(hi, lo)
            } else {
                _mm256_loadu_si256(wb as *const _)
            };
            let aw = _mm256_sign_epi8(w, w);
            for (k, t) in tail.iter_mut().enumerate() {
                let i = i0 + k;
                let xv = _mm256_loadu_si256(x.qs.as_ptr().add(i * n + b * BLOCK) as *const _);
                let d = if Q4 {
                    _mm256_maddubs_epi16(w, xv)
                } else {
                    signed_pairs(aw, w, xv)
                };
                let mut s = hsum_epi32(_mm256_madd_epi16(d, ones));
                if Q4 {
                    s -= 8 * x.sums[i * nb + b];
                }
                *t += s as f32 * (dw * x.d[i * nb + b]);
            }
        }
    }
    for j in 0..R {
        for k in 0..M {
            out[(r0 + j) * m + i0 + k] = hsum256(acc[j][k]) + tail[j][k];
        }
    }
}

/// q8's signed bytes `w` against `x`: adjacent products summed in pairs, 16 bits each, as
/// `|w|` (`aw`, unsigned) against `sign(x, w)`, since `maddubs` takes one unsigned operand.
/// `|w| ≤ 128` against `|x| ≤ 127`: a pair stays below 2^15.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn signed_pairs(aw: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w))
}

/// The 8 lanes of an integer vector summed (exact).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}
