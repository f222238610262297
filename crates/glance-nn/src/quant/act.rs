//! Input rows quantized to 8 bits per block of 32 for the integer dot products of the q8 / q4
//! kernels (as llama.cpp's Q8_0 activations): `x ≈ d · q`, `q` in `-127..=127`, one f32 `d` per
//! block. Done once per linear call, before the weight rows are split over threads.

use super::group::GROUP_BYTES;
use super::BLOCK;

/// `m` rows of `n` values (`n` a multiple of [`BLOCK`]), quantized per block.
pub struct QuantRows {
    pub(crate) m: usize,
    pub(crate) n: usize,
    /// `(m, n)` 8-bit values.
    pub(crate) qs: Vec<i8>,
    /// `(m, n / 32)` scales.
    pub(crate) d: Vec<f32>,
    /// The rows' groups of 16 blocks arranged as the AVX-512 VNNI kernels read them
    /// ([`super::group::arrange_group`], the last group padded with zeros), group-major:
    /// `(⌈n / 512⌉, m, 512)`.
    pub(crate) grouped: Vec<i8>,
    /// `(m, n / 32)`: `Σ q` per block — the integer term a weight offset removes (q4's 8, and
    /// q8's 128 in the VNNI kernel's unsigned weights).
    pub(crate) sums: Vec<i32>,
}

impl QuantRows {
    /// `x` `(m, n)` row-major.
    pub fn new(x: &[f32], m: usize, n: usize) -> Self {
        assert!(
            x.len() == m * n && n.is_multiple_of(BLOCK),
            "QuantRows::new: {} values for ({m}, {n}), n a multiple of {BLOCK}",
            x.len()
        );
        let nb = n / BLOCK;
        let mut qs = vec![0i8; m * n];
        let mut d = vec![0f32; m * nb];
        let mut sums = vec![0i32; m * nb];
        quantize_blocks(x, &mut qs, &mut d, &mut sums);
        // Group-major: the kernels read one group of every row together.
        let mut grouped = vec![0i8; m * n.div_ceil(GROUP_BYTES) * GROUP_BYTES];
        for (k, row) in qs.chunks_exact(n.max(1)).enumerate() {
            for (g, group) in row.chunks(GROUP_BYTES).enumerate() {
                let at = (g * m + k) * GROUP_BYTES;
                super::group::arrange_group(group, &mut grouped[at..at + GROUP_BYTES]);
            }
        }
        Self {
            m,
            n,
            qs,
            d,
            grouped,
            sums,
        }
    }

    /// Input rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.n
    }

    pub fn blocks(&self) -> usize {
        self.n / BLOCK
    }
}

/// Each block of 32 values of `x` quantized into `qs`, with its scale in `d` and the sum of its
/// 8-bit values in `sums` — with AVX-512 where the CPU has it, the same values either way.
fn quantize_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::matvec::has_avx512() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { quantize_blocks_avx512(x, qs, d, sums) };
        return;
    }
    for (b, (xb, qb)) in x
        .chunks_exact(BLOCK)
        .zip(qs.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        let (scale, sum) = quantize_block(xb, qb);
        d[b] = scale;
        sums[b] = sum;
    }
}

/// One block: `q = round(v / d)` in `-127..=127` with `d = max |v| / 127` (NaN → 0); returns
/// `(d, Σ q)`.
pub(crate) fn quantize_block(xb: &[f32], qb: &mut [i8]) -> (f32, i32) {
    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
    let (scale, inv) = block_scale(amax);
    let mut sum = 0i32;
    for (q, v) in qb.iter_mut().zip(xb) {
        // `as` saturates (NaN → 0): never out of range.
        *q = super::round_small((v * inv).clamp(-127.0, 127.0)) as i8;
        sum += *q as i32;
    }
    (scale, sum)
}

/// A block's scale `max |v| / 127` and the factor that divides by it (0 for a block of zeros).
#[inline(always)]
fn block_scale(amax: f32) -> (f32, f32) {
    let scale = amax / 127.0;
    (scale, if scale > 0.0 { 1.0 / scale } else { 0.0 })
}

/// [`quantize_block`] over every block, sixteen values a vector: the same operations on each
/// value (IEEE products, the clamp, rounding by the same 1.5 · 2²³ addition), so the same bits.
///
/// # Safety
/// The CPU must support AVX-512F; `x` and `qs` hold whole blocks, `d` and `sums` one value per
/// block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_blocks_avx512(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    use std::arch::x86_64::*;
    let blocks = x.len() / BLOCK;
    assert!(qs.len() == x.len() && d.len() == blocks && sums.len() == blocks);
    let magic = _mm512_set1_ps(12_582_912.0);
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    for b in 0..blocks {
        let p = x.as_ptr().add(b * BLOCK);
        let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        // `max(a, |v|)` keeps `a` where `v` is NaN, as `f32::max` does.
        let m = _mm512_max_ps(
            _mm512_abs_ps(v1),
            _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()),
        );
        let (scale, inv) = block_scale(_mm512_reduce_max_ps(m));
        let inv = _mm512_set1_ps(inv);
        let quantize = |v: __m512| {
            let t = _mm512_mul_ps(v, inv);
            // `clamp` keeps NaN; `as i8` makes it 0 (the masked lanes below).
            let finite = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(t, t);
            let t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);
            let r = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
            _mm512_maskz_cvttps_epi32(finite, r)
        };
        let (q0, q1) = (quantize(v0), quantize(v1));
        let out = qs.as_mut_ptr().add(b * BLOCK);
        _mm_storeu_si128(out as *mut __m128i, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(out.add(16) as *mut __m128i, _mm512_cvtepi32_epi8(q1));
        *d.get_unchecked_mut(b) = scale;
        *sums.get_unchecked_mut(b) = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/// The portable reference of the packed formats: `out[r * m + i]` = the sum over blocks, in
/// block order, of `(d_w · d_x) · dot(r, b, x_i's block b)`, where `dot` is the format's integer
/// dot of weight row `r`'s block `b` with an 8-bit input block and `sc` holds the f16 weight
/// scales (`rows × blocks`).
pub(crate) fn portable_blocks(
    sc: &[u16],
    x: &QuantRows,
    rows: usize,
    out: &mut [f32],
    dot: impl Fn(usize, usize, &[i8]) -> i32,
) {
    let (m, n, nb) = (x.m, x.n, x.blocks());
    for r in 0..rows {
        for i in 0..m {
            let mut total = 0f32;
            for b in 0..nb {
                let xq = &x.qs[i * n + b * BLOCK..i * n + (b + 1) * BLOCK];
                let d = dot(r, b, xq);
                total += super::f16_value(sc[r * nb + b]) * x.d[i * nb + b] * d as f32;
            }
            out[r * m + i] = total;
        }
    }
}
