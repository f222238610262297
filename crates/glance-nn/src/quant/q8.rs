//! q8: per-block symmetric 8-bit weights (llama.cpp's Q8_0): blocks of 32 values along a row,
//! `w ≈ d · q` with `q` in `-127..=127` and one f16 scale `d` per block — 8.5 bits per weight.
//!
//! Layout ([`super::block`]): `qs` `(rows, cols)` i8 — one stored element per value — and
//! `scales` `(rows, cols / 32)` f16 bits.
//!
//! Kernels: the input rows are quantized to 8 bits per block ([`super::act`]) and each block's dot
//! product is an integer one — AVX-512 VNNI `vpdpbusd` on two blocks at once, or AVX2's
//! `maddubs` (both take unsigned × signed bytes, so `|w|` meets `x` with `w`'s sign, as
//! llama.cpp does) — scaled by `d_w · d_x` into f32 lanes. Every output is accumulated over its
//! blocks in one order whatever the number of input rows, so a row computed in a batch equals the
//! row alone, bit for bit.

use super::block::{BlockFormat, BlockMatrix, Kernels};
use super::{f16_bits, f16_value, round_small, QuantError, BLOCK};
use std::marker::PhantomData;

/// The q8 block format (see the module header).
#[derive(Debug, Clone, Copy)]
pub struct Q8;

/// A `(rows, cols)` q8 matrix; `cols` is a multiple of 32.
pub type Q8Matrix = BlockMatrix<Q8>;

impl BlockFormat for Q8 {
    type Q = i8;
    const MATRIX: &'static str = "Q8Matrix";
    const NAME: &'static str = "q8";
    const UNIT: &'static str = "values";
    const BLOCK_LEN: usize = BLOCK;
    const KERNELS: Kernels<i8> = Kernels {
        #[cfg(target_arch = "x86_64")]
        vnni: x86::block_vnni,
        #[cfg(target_arch = "x86_64")]
        avx2: x86::block_avx2,
        _q: PhantomData,
    };

    /// `d = max |w| / 127` (rounded to f16), `q = round(w / d)`.
    fn quantize_block(w: &[f32], q: &mut [i8]) -> Result<u16, QuantError> {
        let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = f16_bits(amax / 127.0)?;
        let dv = f16_value(d);
        let inv = if dv > 0.0 { 1.0 / dv } else { 0.0 };
        for (q, w) in q.iter_mut().zip(w) {
            *q = round_small((w * inv).clamp(-127.0, 127.0)) as i8;
        }
        Ok(d)
    }

    fn dequantize_block(d: f32, q: &[i8], out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(q) {
            *o = d * q as f32;
        }
    }

    /// `Σ q_w q_x`.
    fn block_dot(q: &[i8], x: &[i8]) -> i32 {
        q.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum()
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
    /// registers ([`super::super::group`]); the weights are made unsigned by adding 128 (a flip
    /// of the sign bit), whose term `128 · Σ q_x` is removed per block.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `qs` and `sc` hold `rows` whole rows of `x.n` values (and their scales), `out` at least `rows · x.m` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn block_vnni(qs: &[i8], sc: &[u16], x: &QuantRows, rows: usize, out: &mut [f32]) {
        let prep = Prep {
            qs,
            n: x.n,
            net: network_vectors::<3>(3),
        };
        grouped_rows(sc, x, rows, 7, out, &prep);
    }

    struct Prep<'a> {
        qs: &'a [i8],
        n: usize,
        net: [[__m512i; 2]; 3],
    }

    impl GroupPrep for Prep<'_> {
        const BLOCK_FROM_ROWS: usize = 16;

        /// # Safety
        /// See [`GroupPrep::prep`].
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn prep(&self, r: usize, g: usize, blocks: usize) -> [__m512i; 8] {
            let base = self.qs.as_ptr().add(r * self.n + g * GROUP_BYTES) as *const u8;
            let mut v = load_group::<8>(base, blocks == GROUP, blocks * BLOCK, &self.net);
            let flip = _mm512_set1_epi8(-128);
            for vi in v.iter_mut() {
                *vi = _mm512_xor_si512(*vi, flip);
            }
            v
        }

        fn row_bytes(&self) -> (*const u8, usize) {
            (self.qs.as_ptr() as *const u8, self.n)
        }

        /// # Safety
        /// See [`GroupPrep::word`].
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn word(&self, r: usize, g: usize, v: usize) -> __m512i {
            let base = self.qs.as_ptr().add(r * self.n + g * GROUP_BYTES + 64 * v);
            _mm512_xor_si512(_mm512_loadu_si512(base as *const _), _mm512_set1_epi8(-128))
        }
    }

    /// See [`super::super::block::BlockMatrix::block`]: AVX2 over the groups as held
    /// ([`super::super::avx2`]).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `qs` and `sc` hold `rows` whole rows of `x.n` values (and their scales), `out` at least `rows · x.m` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_avx2(qs: &[i8], sc: &[u16], x: &QuantRows, rows: usize, out: &mut [f32]) {
        super::super::avx2::grouped::<false>(qs.as_ptr() as *const u8, sc, x, rows, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_kernel, values, ODD_SIZES};
    use super::*;

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let w = values(64 * 96, 3);
        let q = Q8Matrix::quantize(&w, 64, 96).unwrap();
        let mut back = vec![0f32; w.len()];
        q.dequantize_rows(0, &mut back);
        for (b, (wb, bb)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
            let d = f16_value(q.scales[b]);
            for (a, c) in wb.iter().zip(bb) {
                assert!((a - c).abs() <= 0.5 * d * 1.01, "{a} vs {c} (d {d})");
            }
        }
    }

    #[test]
    fn kernels_match_the_reference_on_odd_sizes() {
        for (m, rows, n) in ODD_SIZES {
            let w = Q8Matrix::quantize(&values(rows * n, 1), rows, n).unwrap();
            let stored = w.stored_qs();
            check_kernel(
                rows,
                n,
                m,
                |x, out, isa| w.block(0, rows, x, out, isa),
                |r, k| stored[r * n + k] as f32 * f16_value(w.scales[(r * n + k) / BLOCK]),
            );
        }
    }
}
