//! q4: llama.cpp's Q4_0 — blocks of 32 values along a row, `w ≈ d · (q − 8)` with `q` in
//! `0..=15` and one f16 scale `d` per block: 4.5 bits per weight.
//!
//! **Why Q4_0 and not scale + minimum (Q4_1 / k-quants).** Decode is bound by the bytes read per
//! token; Q4_0 is the smallest 4-bit layout (18 bytes per 32 weights against 20 for a scale and a
//! minimum), which is what the memory target at the 7B shape (≤ 5 GB) and the speed comparison
//! with llama.cpp's Q4_0 ask for. Linear weights of trained transformers are centred near zero,
//! so a per-block minimum buys little; the scale is chosen so that the block's largest magnitude
//! maps to −8 exactly (llama.cpp's choice: the full range of 16 levels is used on that side).
//!
//! Layout ([`super::block`]): `qs` `(rows, cols / 2)` bytes — per block 16 bytes, byte `j`
//! holding value `j` in its low nibble and value `j + 16` in its high nibble (llama.cpp's order,
//! which lets one AND and one shift unpack a block into 32 bytes in order) — and `scales`
//! `(rows, cols / 32)` f16 bits.
//!
//! Kernels: integer dot products against the input quantized to 8 bits per block
//! ([`super::act`]): the nibbles are unsigned bytes, so `vpdpbusd` / `maddubs` take them directly
//! and the offset of 8 is removed once per block as `d_w · 8 · d_x · Σ q_x`, precomputed per
//! input block. One accumulation order per output whatever the number of input rows.

use super::block::{BlockFormat, BlockMatrix, Kernels};
use super::{f16_bits, f16_value, round_small, QuantError, BLOCK};
use std::marker::PhantomData;

/// The q4 block format (see the module header).
#[derive(Debug, Clone, Copy)]
pub struct Q4;

/// A `(rows, cols)` q4 matrix; `cols` is a multiple of 32.
pub type Q4Matrix = BlockMatrix<Q4>;

impl BlockFormat for Q4 {
    type Q = u8;
    const MATRIX: &'static str = "Q4Matrix";
    const NAME: &'static str = "q4";
    const UNIT: &'static str = "bytes";
    const BLOCK_LEN: usize = BLOCK / 2;
    const KERNELS: Kernels<u8> = Kernels {
        #[cfg(target_arch = "x86_64")]
        vnni: x86::block_vnni,
        #[cfg(target_arch = "x86_64")]
        avx2: x86::block_avx2,
        _q: PhantomData,
    };

    /// The value of largest magnitude `v` sets `d = v / −8` (rounded to f16), `q = clamp(round(w
    /// / d) + 8, 0, 15)`.
    fn quantize_block(w: &[f32], q: &mut [u8]) -> Result<u16, QuantError> {
        let extreme = w
            .iter()
            .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        let d = f16_bits(extreme / -8.0)?;
        let dv = f16_value(d);
        let inv = if dv != 0.0 { 1.0 / dv } else { 0.0 };
        let level = |w: f32| (round_small((w * inv).clamp(-8.0, 7.0)) + 8.0) as u8;
        for j in 0..BLOCK / 2 {
            q[j] = level(w[j]) | (level(w[j + BLOCK / 2]) << 4);
        }
        Ok(d)
    }

    fn dequantize_block(d: f32, q: &[u8], out: &mut [f32]) {
        for j in 0..BLOCK / 2 {
            out[j] = d * ((q[j] & 0x0f) as f32 - 8.0);
            out[j + BLOCK / 2] = d * ((q[j] >> 4) as f32 - 8.0);
        }
    }

    /// `Σ (q_w − 8) q_x`.
    fn block_dot(q: &[u8], x: &[i8]) -> i32 {
        let mut dot = 0i32;
        for j in 0..BLOCK / 2 {
            dot += ((q[j] & 0x0f) as i32 - 8) * x[j] as i32;
            dot += ((q[j] >> 4) as i32 - 8) * x[j + BLOCK / 2] as i32;
        }
        dot
    }
}

impl Q4Matrix {
    /// The level `q` (0..=15) of value `k` of row `r`.
    #[cfg(test)]
    pub(crate) fn level(&self, r: usize, k: usize) -> u8 {
        let (b, j) = (k / BLOCK, k % BLOCK);
        let mut buf = Vec::new();
        let byte = self.stored_row(r, &mut buf)[b * BLOCK / 2 + j % (BLOCK / 2)];
        if j < BLOCK / 2 {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::act::QuantRows;
    use super::super::group::{GROUP, GROUP_BYTES};
    use super::super::x86::{grouped_rows, load_group, network_vectors, GroupPrep};
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// See [`super::super::block::BlockMatrix::block`]: AVX-512 VNNI over groups of 16 blocks transposed in
    /// registers ([`super::super::group`]): 4 vectors of packed nibbles, transposed, give the
    /// low nibbles (values `4t..4t + 4` of each block) and the high ones (`16 + 4t..`); the
    /// levels' offset of 8 is removed per block as `8 · Σ q_x`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `qs` and `sc` hold `rows` whole rows of `x.n` values (and their scales), `out` at least `rows · x.m` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn block_vnni(qs: &[u8], sc: &[u16], x: &QuantRows, rows: usize, out: &mut [f32]) {
        let prep = Prep {
            qs,
            n: x.n,
            net: network_vectors::<2>(2),
        };
        grouped_rows(sc, x, rows, 3, out, &prep);
    }

    struct Prep<'a> {
        qs: &'a [u8],
        n: usize,
        net: [[__m512i; 2]; 2],
    }

    impl GroupPrep for Prep<'_> {
        const BLOCK_FROM_ROWS: usize = 8;

        /// # Safety
        /// See [`GroupPrep::prep`].
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn prep(&self, r: usize, g: usize, blocks: usize) -> [__m512i; 8] {
            let base = self.qs.as_ptr().add((r * self.n + g * GROUP_BYTES) / 2);
            let v = load_group::<4>(base, blocks == GROUP, blocks * BLOCK / 2, &self.net);
            let low = _mm512_set1_epi8(0x0f);
            let mut out = [_mm512_setzero_si512(); 8];
            for t in 0..4 {
                out[t] = _mm512_and_si512(v[t], low);
                out[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v[t], 4), low);
            }
            out
        }

        fn row_bytes(&self) -> (*const u8, usize) {
            (self.qs.as_ptr(), self.n / 2)
        }

        /// # Safety
        /// See [`GroupPrep::word`].
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn word(&self, r: usize, g: usize, v: usize) -> __m512i {
            let base = self
                .qs
                .as_ptr()
                .add((r * self.n + g * GROUP_BYTES) / 2 + 64 * (v % 4));
            let w = _mm512_loadu_si512(base as *const _);
            let w = if v < 4 { w } else { _mm512_srli_epi16(w, 4) };
            _mm512_and_si512(w, _mm512_set1_epi8(0x0f))
        }
    }

    /// See [`super::super::block::BlockMatrix::block`]: AVX2 over the groups as held
    /// ([`super::super::avx2`]).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `qs` and `sc` hold `rows` whole rows of `x.n` values (and their scales), `out` at least `rows · x.m` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_avx2(qs: &[u8], sc: &[u16], x: &QuantRows, rows: usize, out: &mut [f32]) {
        super::super::avx2::grouped::<true>(qs.as_ptr(), sc, x, rows, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_kernel, values, ODD_SIZES};
    use super::*;

    #[test]
    fn quantization_error_is_within_a_step() {
        let w = values(64 * 96, 3);
        let q = Q4Matrix::quantize(&w, 64, 96).unwrap();
        let mut back = vec![0f32; w.len()];
        q.dequantize_rows(0, &mut back);
        for (b, (wb, bb)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
            let d = f16_value(q.scales[b]);
            for (a, c) in wb.iter().zip(bb) {
                // Half a step on the side of the block's extreme (levels −8 · d reach it); on the
                // other side the levels stop at 7 · d, so values beyond are clipped by < 1 step.
                let same_side = (a * -d) >= 0.0;
                let bound = if same_side { 0.5 } else { 1.0 } * d.abs() * 1.01;
                assert!((a - c).abs() <= bound, "{a} vs {c} (d {d})");
            }
        }
        // The level accessor agrees with the unpacking.
        assert_eq!(
            back[40],
            f16_value(q.scales[1]) * (q.level(0, 40) as f32 - 8.0)
        );
    }

    #[test]
    fn kernels_match_the_reference_on_odd_sizes() {
        for (m, rows, n) in ODD_SIZES {
            let w = Q4Matrix::quantize(&values(rows * n, 1), rows, n).unwrap();
            check_kernel(
                rows,
                n,
                m,
                |x, out, isa| w.block(0, rows, x, out, isa),
                |r, k| (w.level(r, k) as f32 - 8.0) * f16_value(w.scales[(r * n + k) / BLOCK]),
            );
        }
    }
}
