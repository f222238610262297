//! q8: per-block symmetric 8-bit weights (llama.cpp's Q8_0): blocks of 32 values along a row,
//! `w ≈ d · q` with `q` in `-127..=127` and one f16 scale `d` per block — 8.5 bits per weight.
//!
//! Layout (row-major, struct of arrays so every vector load is plain): `qs` `(rows, cols)` i8,
//! `scales` `(rows, cols / 32)` f16 bits. In memory each row's whole groups of 16 blocks are held
//! in the kernels' order ([`super::group::to_kernel_order`]: the AVX-512 kernel loads them already
//! transposed); files keep llama.cpp's order ([`Q8Matrix::stored_qs`], [`Q8Matrix::from_parts`]).
//!
//! Kernels: the input rows are quantized to 8 bits per block ([`super::act`]) and each block's dot
//! product is an integer one — AVX-512 VNNI `vpdpbusd` on two blocks at once, or AVX2's
//! `maddubs` (both take unsigned × signed bytes, so `|w|` meets `x` with `w`'s sign, as
//! llama.cpp does) — scaled by `d_w · d_x` into f32 lanes. Every output is accumulated over its
//! blocks in one order whatever the number of input rows, so a row computed in a batch equals the
//! row alone, bit for bit.

use super::act::QuantRows;
use super::group::{to_kernel_order, to_stored_order};
use super::half::Isa;
use super::{f16_bits, f16_value, round_small, QuantError, BLOCK, CHUNK_BLOCKS};
use rayon::prelude::*;

/// A `(rows, cols)` q8 matrix; `cols` is a multiple of 32.
#[derive(Clone)]
pub struct Q8Matrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) qs: Vec<i8>,
    pub(crate) scales: Vec<u16>,
}

impl std::fmt::Debug for Q8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Q8Matrix({}x{})", self.rows, self.cols)
    }
}

impl Q8Matrix {
    /// Quantizes `data` `(rows, cols)`: per block `d = max |w| / 127` (rounded to f16), `q =
    /// round(w / d)`.
    pub fn quantize(data: &[f32], rows: usize, cols: usize) -> Result<Self, QuantError> {
        super::check_shape(data.len(), rows, cols)?;
        let mut qs = vec![0i8; rows * cols];
        let mut scales = vec![0u16; rows * cols / BLOCK];
        // Chunks of blocks in parallel (the same values in any order: each block alone).
        data.par_chunks(BLOCK * CHUNK_BLOCKS)
            .zip(qs.par_chunks_mut(BLOCK * CHUNK_BLOCKS))
            .zip(scales.par_chunks_mut(CHUNK_BLOCKS))
            .try_for_each(|((data, qs), scales)| {
                for ((wb, qb), s) in data
                    .chunks_exact(BLOCK)
                    .zip(qs.chunks_exact_mut(BLOCK))
                    .zip(scales.iter_mut())
                {
                    let amax = wb.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let d = f16_bits(amax / 127.0)?;
                    let dv = f16_value(d);
                    let inv = if dv > 0.0 { 1.0 / dv } else { 0.0 };
                    for (q, w) in qb.iter_mut().zip(wb) {
                        *q = round_small((w * inv).clamp(-127.0, 127.0)) as i8;
                    }
                    *s = d;
                }
                Ok::<(), QuantError>(())
            })?;
        Ok(Self::in_kernel_order(rows, cols, qs, scales))
    }

    /// The parts with each row's values moved into the kernels' order.
    fn in_kernel_order(rows: usize, cols: usize, mut qs: Vec<i8>, scales: Vec<u16>) -> Self {
        qs.par_chunks_mut(cols.max(1))
            .for_each(|row| to_kernel_order(row, BLOCK));
        Self {
            rows,
            cols,
            qs,
            scales,
        }
    }

    /// The values in llama.cpp's order `(rows, cols)` (as a file keeps them).
    pub fn stored_qs(&self) -> Vec<i8> {
        let mut qs = self.qs.clone();
        qs.par_chunks_mut(self.cols.max(1))
            .for_each(|row| to_stored_order(row, BLOCK));
        qs
    }

    /// Row `r`'s values in llama.cpp's order into `buf`.
    fn stored_row<'a>(&self, r: usize, buf: &'a mut Vec<i8>) -> &'a [i8] {
        buf.clear();
        buf.extend_from_slice(&self.qs[r * self.cols..(r + 1) * self.cols]);
        to_stored_order(buf, BLOCK);
        buf
    }

    /// From stored parts (a quantized checkpoint, values in llama.cpp's order), checked for size.
    pub fn from_parts(
        rows: usize,
        cols: usize,
        qs: Vec<i8>,
        scales: Vec<u16>,
    ) -> Result<Self, QuantError> {
        if !cols.is_multiple_of(BLOCK)
            || qs.len() != rows * cols
            || scales.len() != rows * cols / BLOCK
        {
            return Err(QuantError::Shape(format!(
                "q8 ({rows}, {cols}) needs {} values and {} scales, got {} and {}",
                rows * cols,
                rows * cols / BLOCK,
                qs.len(),
                scales.len()
            )));
        }
        Ok(Self::in_kernel_order(rows, cols, qs, scales))
    }

    pub fn storage_bytes(&self) -> usize {
        self.qs.len() + 2 * self.scales.len()
    }

    /// Rows `first..` widened into `out` (whole rows).
    ///
    /// # Panics
    /// If `out` does not hold whole rows or the rows are outside the matrix.
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) {
        let (n, nb) = (self.cols, self.cols / BLOCK);
        assert!(
            out.len().is_multiple_of(n.max(1)) && first * n + out.len() <= self.rows * n,
            "Q8Matrix::dequantize_rows: {} values from row {first} of a ({}, {n}) matrix",
            out.len(),
            self.rows
        );
        let mut buf = Vec::with_capacity(n);
        for (i, orow) in out.chunks_exact_mut(n.max(1)).enumerate() {
            let qs = self.stored_row(first + i, &mut buf);
            let scales = &self.scales[(first + i) * nb..];
            for ((ob, qb), &s) in orow
                .chunks_exact_mut(BLOCK)
                .zip(qs.chunks_exact(BLOCK))
                .zip(scales)
            {
                let d = f16_value(s);
                for (o, &q) in ob.iter_mut().zip(qb) {
                    *o = d * q as f32;
                }
            }
        }
    }

    /// `out[r * m + i] = w_r · x_i` for weight rows `first..first + rows`.
    ///
    /// # Panics
    /// If the rows are outside the matrix, `x`'s rows are not `cols` long or `out` holds fewer
    /// than `rows · x.rows()` values.
    pub fn block(&self, first: usize, rows: usize, x: &QuantRows, out: &mut [f32], isa: Isa) {
        assert!(
            first + rows <= self.rows && x.n == self.cols && out.len() >= rows * x.m,
            "Q8Matrix::block: rows {first}..{} of {}, ({}, {}) inputs for {} columns, {} outputs",
            first + rows,
            self.rows,
            x.m,
            x.n,
            self.cols,
            out.len()
        );
        let (n, nb) = (self.cols, self.cols / BLOCK);
        let qs = &self.qs[first * n..(first + rows) * n];
        let sc = &self.scales[first * nb..(first + rows) * nb];
        super::PackedKernels {
            #[cfg(target_arch = "x86_64")]
            vnni: x86::block_vnni,
            #[cfg(target_arch = "x86_64")]
            avx2: x86::block_avx2,
            portable: block_portable,
        }
        .run(isa, qs, sc, x, rows, out);
    }
}

/// The reference: per block `(d_w · d_x) · Σ q_w q_x`, added in block order (`qs` in the
/// kernels' order, each row read back in llama.cpp's).
fn block_portable(qs: &[i8], sc: &[u16], x: &QuantRows, rows: usize, out: &mut [f32]) {
    let n = x.n;
    let mut stored = Vec::with_capacity(qs.len());
    super::for_each_stored_row(qs, n, BLOCK, rows, |_, row| stored.extend_from_slice(row));
    super::act::portable_blocks(sc, x, rows, out, |r, b, xq| {
        let w = &stored[r * n + b * BLOCK..r * n + (b + 1) * BLOCK];
        w.iter().zip(xq).map(|(&a, &q)| a as i32 * q as i32).sum()
    });
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::act::QuantRows;
    use super::super::for_each_stored_row;
    use super::super::group::{GROUP, GROUP_BYTES};
    use super::super::x86::{grouped_rows, load_group, network_vectors, scale_256, GroupPrep};
    use super::BLOCK;
    use crate::matvec::hsum256;
    use std::arch::x86_64::*;

    /// See [`super::Q8Matrix::block`]: AVX-512 VNNI over groups of 16 blocks transposed in
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

    /// See [`super::Q8Matrix::block`]: AVX2, one block per 256-bit step.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `qs` and `sc` hold `rows` whole rows of `x.n` values (and their scales), `out` at least `rows · x.m` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_avx2(qs: &[i8], sc: &[u16], x: &QuantRows, rows: usize, out: &mut [f32]) {
        let (n, nb, m) = (x.n, x.blocks(), x.m);
        for_each_stored_row(qs, n, BLOCK, rows, |r, row| {
            let (sc, out) = (&sc[r * nb..(r + 1) * nb], &mut out[r * m..(r + 1) * m]);
            each_row_tile!(row_avx2, row, sc, x, 1, out);
        });
    }

    /// # Safety
    /// As [`block_avx2`], for weight row `r` and input rows `i0..i0 + M`; `out` starts at the row's first output.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn row_avx2<const M: usize>(
        qs: &[i8],
        sc: &[u16],
        x: &QuantRows,
        r: usize,
        i0: usize,
        out: &mut [f32],
    ) {
        let (n, nb) = (x.n, x.blocks());
        let wq = qs.as_ptr().add(r * n);
        let ws = sc.as_ptr().add(r * nb);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); M];
        for b in 0..nb {
            let wv = _mm256_loadu_si256(wq.add(BLOCK * b) as *const __m256i);
            let aw = _mm256_abs_epi8(wv);
            let dw = scale_256(*ws.add(b));
            for (k, a) in acc.iter_mut().enumerate() {
                let i = i0 + k;
                let xv = _mm256_loadu_si256(x.qs.as_ptr().add(i * n + BLOCK * b) as *const _);
                let sx = _mm256_sign_epi8(xv, wv);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                let dx = _mm256_set1_ps(x.d[i * nb + b]);
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, dx), *a);
            }
        }
        for k in 0..M {
            out[k] = hsum256(acc[k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_kernel, values};
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
        // In-dims: 1, 3, 7, 8 and 9 blocks (partial groups of 16), 16, 22 and 35; 1 to 70 rows.
        for (m, rows, n) in [
            (1, 1, 32),
            (1, 5, 96),
            (3, 7, 224),
            (6, 70, 288),
            (17, 9, 256),
            // Whole groups of 16 blocks, and whole groups with a partial one after.
            (1, 3, 512),
            (5, 6, 704),
            (17, 4, 1120),
            // The few-row tiles (`few.rs`): 4 × 2, 3 × 3 and 2 × 4 with their remainders, over
            // whole groups and a partial one.
            (2, 9, 1120),
            (3, 5, 544),
            (8, 5, 1056),
            (15, 3, 512),
        ] {
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

    #[test]
    #[should_panic(expected = "Q8Matrix::block: rows 2..4 of 3")]
    fn block_refuses_rows_outside() {
        let w = Q8Matrix::quantize(&values(3 * 64, 1), 3, 64).unwrap();
        let x = QuantRows::new(&values(64, 2), 1, 64);
        w.block(2, 2, &x, &mut [0.0; 2], Isa::Portable);
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::block: rows 0..3 of 3, (1, 32) inputs for 64 columns")]
    fn block_refuses_inputs_of_another_width() {
        let w = Q8Matrix::quantize(&values(3 * 64, 1), 3, 64).unwrap();
        let x = QuantRows::new(&values(32, 2), 1, 32);
        w.block(0, 3, &x, &mut [0.0; 3], Isa::best());
    }

    #[test]
    #[should_panic(
        expected = "Q8Matrix::block: rows 0..3 of 3, (2, 64) inputs for 64 columns, 5 outputs"
    )]
    fn block_refuses_a_short_output() {
        let w = Q8Matrix::quantize(&values(3 * 64, 1), 3, 64).unwrap();
        let x = QuantRows::new(&values(2 * 64, 2), 2, 64);
        w.block(0, 3, &x, &mut [0.0; 5], Isa::best());
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::dequantize_rows: 128 values from row 2 of a (3, 64)")]
    fn dequantize_refuses_rows_outside() {
        let w = Q8Matrix::quantize(&values(3 * 64, 1), 3, 64).unwrap();
        w.dequantize_rows(2, &mut [0.0; 128]);
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::dequantize_rows: 100 values")]
    fn dequantize_refuses_part_of_a_row() {
        let w = Q8Matrix::quantize(&values(3 * 64, 1), 3, 64).unwrap();
        w.dequantize_rows(0, &mut [0.0; 100]);
    }
}
