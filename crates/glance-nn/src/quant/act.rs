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
        for (b, (xb, qb)) in x
            .chunks_exact(BLOCK)
            .zip(qs.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut sum = 0i32;
            for (q, v) in qb.iter_mut().zip(xb) {
                // `as` saturates (NaN → 0): never out of range.
                *q = super::round_small((v * inv).clamp(-127.0, 127.0)) as i8;
                sum += *q as i32;
            }
            d[b] = scale;
            sums[b] = sum;
        }
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
