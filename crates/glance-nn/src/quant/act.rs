//! Input rows quantized to 8 bits per block of 32 for the integer dot products of the q8 / q4
//! kernels (as llama.cpp's Q8_0 activations): `x ≈ d · q`, `q` in `-127..=127`, one f32 `d` per
//! block. Done once per linear call, before the weight rows are split over threads.

use super::BLOCK;

/// `m` rows of `n` values (`n` a multiple of [`BLOCK`]), quantized per block.
pub struct QuantRows {
    pub m: usize,
    pub n: usize,
    /// `(m, n)` 8-bit values.
    pub qs: Vec<i8>,
    /// `(m, n / 32)` scales.
    pub d: Vec<f32>,
    /// `(m, n / 32)`: `8 · d · Σ q` per block — the term a q4 weight block's offset of 8 removes.
    pub offset8: Vec<f32>,
    /// `(m, n / 32, 8)`: each scale repeated over 8 lanes, so that a 512-bit vector holds the
    /// scales of two consecutive blocks (the AVX-512 kernels' layout).
    pub d_lanes: Vec<f32>,
}

impl QuantRows {
    /// `x` `(m, n)` row-major.
    pub fn new(x: &[f32], m: usize, n: usize) -> Self {
        debug_assert_eq!(x.len(), m * n);
        debug_assert_eq!(n % BLOCK, 0);
        let nb = n / BLOCK;
        let mut qs = vec![0i8; m * n];
        let mut d = vec![0f32; m * nb];
        let mut offset8 = vec![0f32; m * nb];
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
                *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                sum += *q as i32;
            }
            d[b] = scale;
            offset8[b] = 8.0 * scale * sum as f32;
        }
        let d_lanes = d.iter().flat_map(|&v| [v; 8]).collect();
        Self {
            m,
            n,
            qs,
            d,
            offset8,
            d_lanes,
        }
    }

    pub fn blocks(&self) -> usize {
        self.n / BLOCK
    }
}
