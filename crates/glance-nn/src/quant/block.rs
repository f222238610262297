//! What the per-block formats q8 ([`super::q8`]) and q4 ([`super::q4`]) share: a matrix of rows
//! quantized in blocks of [`BLOCK`] values with one f16 scale each ([`BlockMatrix`]), generic
//! over a [`BlockFormat`] that says only what differs — how one block is quantized, widened and
//! dotted with an 8-bit input block, how many stored elements it takes, and the format's vector
//! kernels.
//!
//! Layout (row-major, struct of arrays so every vector load is plain): `qs` `(rows, cols / 32 ·
//! BLOCK_LEN)` stored elements and `scales` `(rows, cols / 32)` f16 bits. In memory each row's
//! whole groups of 16 blocks are held in the kernels' order ([`super::group::to_kernel_order`]:
//! the AVX-512 kernel loads them already transposed); files keep llama.cpp's order
//! ([`BlockMatrix::stored_qs`], [`BlockMatrix::from_parts`]).

use super::act::QuantRows;
use super::group::{to_kernel_order, to_stored_order};
use super::half::Isa;
use super::{f16_value, QuantError, BLOCK, CHUNK_BLOCKS};
use rayon::prelude::*;
use std::marker::PhantomData;

/// One per-block format: its stored element, block size in elements and per-block arithmetic.
/// Implemented by [`super::q8::Q8`] and [`super::q4::Q4`] (its [`Kernels`] can only be made in
/// this crate).
pub trait BlockFormat: Clone + Send + Sync + 'static {
    /// The stored element: an `i8` level (q8) or a byte of two 4-bit levels (q4).
    type Q: Copy + Default + PartialEq + Send + Sync;
    /// The matrix type's name in messages (`Q8Matrix`).
    const MATRIX: &'static str;
    /// The format's name in messages (`q8`).
    const NAME: &'static str;
    /// What the stored elements are called in messages (`values`, `bytes`).
    const UNIT: &'static str;
    /// Stored elements per block of [`BLOCK`] values.
    const BLOCK_LEN: usize;
    /// The format's vector kernels.
    const KERNELS: Kernels<Self::Q>;

    /// Quantizes the [`BLOCK`] values `w` into `q` ([`Self::BLOCK_LEN`] elements, llama.cpp's
    /// order) and returns the block's f16 scale bits.
    fn quantize_block(w: &[f32], q: &mut [Self::Q]) -> Result<u16, QuantError>;

    /// The block `q` (llama.cpp's order) of scale `d` widened into `out` ([`BLOCK`] values).
    fn dequantize_block(d: f32, q: &[Self::Q], out: &mut [f32]);

    /// The integer dot product of the block `q` (llama.cpp's order) with the 8-bit input block
    /// `x`, the weights' offset included (the portable reference's block sum).
    fn block_dot(q: &[Self::Q], x: &[i8]) -> i32;
}

/// One vector kernel of a block format: `(weights, scales, input rows, weight rows, out)`,
/// `out[r * m + i] = w_r · x_i` for weight rows `0..rows`.
///
/// # Safety
/// A kernel needs the instruction sets its field of [`Kernels`] names (and F16C); the weights
/// (kernels' order) and scales must hold `rows` whole rows of `x.n` values and `out` at least
/// `rows · x.m` values.
pub(crate) type Kernel<Q> = unsafe fn(&[Q], &[u16], &QuantRows, usize, &mut [f32]);

/// A block format's vector kernels (the portable reference is [`BlockFormat::block_dot`] summed
/// in block order). `vnni` needs AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `avx2` needs AVX2, FMA
/// and F16C.
pub struct Kernels<Q> {
    #[cfg(target_arch = "x86_64")]
    pub(crate) vnni: Kernel<Q>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) avx2: Kernel<Q>,
    pub(crate) _q: PhantomData<fn(&[Q])>,
}

/// A `(rows, cols)` matrix in block format `F`; `cols` is a multiple of 32.
#[derive(Clone)]
pub struct BlockMatrix<F: BlockFormat> {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// `(rows, cols / 32 · F::BLOCK_LEN)` stored elements, each row in the kernels' order.
    pub(crate) qs: Vec<F::Q>,
    /// `(rows, cols / 32)` f16 bits.
    pub(crate) scales: Vec<u16>,
    format: PhantomData<F>,
}

impl<F: BlockFormat> std::fmt::Debug for BlockMatrix<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({}x{})", F::MATRIX, self.rows, self.cols)
    }
}

impl<F: BlockFormat> BlockMatrix<F> {
    /// Quantizes `data` `(rows, cols)` block by block ([`BlockFormat::quantize_block`]).
    pub fn quantize(data: &[f32], rows: usize, cols: usize) -> Result<Self, QuantError> {
        super::check_shape(data.len(), rows, cols)?;
        let mut qs = vec![F::Q::default(); rows * cols / BLOCK * F::BLOCK_LEN];
        let mut scales = vec![0u16; rows * cols / BLOCK];
        // Chunks of blocks in parallel (the same values in any order: each block alone).
        data.par_chunks(BLOCK * CHUNK_BLOCKS)
            .zip(qs.par_chunks_mut(F::BLOCK_LEN * CHUNK_BLOCKS))
            .zip(scales.par_chunks_mut(CHUNK_BLOCKS))
            .try_for_each(|((data, qs), scales)| {
                for ((wb, qb), s) in data
                    .chunks_exact(BLOCK)
                    .zip(qs.chunks_exact_mut(F::BLOCK_LEN))
                    .zip(scales.iter_mut())
                {
                    *s = F::quantize_block(wb, qb)?;
                }
                Ok::<(), QuantError>(())
            })?;
        Ok(Self::in_kernel_order(rows, cols, qs, scales))
    }

    /// Stored elements of one row.
    fn row_len(cols: usize) -> usize {
        cols / BLOCK * F::BLOCK_LEN
    }

    /// The parts with each row's elements moved into the kernels' order.
    fn in_kernel_order(rows: usize, cols: usize, mut qs: Vec<F::Q>, scales: Vec<u16>) -> Self {
        qs.par_chunks_mut(Self::row_len(cols).max(1))
            .for_each(|row| to_kernel_order(row, F::BLOCK_LEN));
        Self {
            rows,
            cols,
            qs,
            scales,
            format: PhantomData,
        }
    }

    /// The stored elements in llama.cpp's order `(rows, cols / 32 · BLOCK_LEN)` (as a file keeps
    /// them).
    pub fn stored_qs(&self) -> Vec<F::Q> {
        let mut qs = self.qs.clone();
        qs.par_chunks_mut(Self::row_len(self.cols).max(1))
            .for_each(|row| to_stored_order(row, F::BLOCK_LEN));
        qs
    }

    /// Row `r`'s elements in llama.cpp's order into `buf`.
    pub(crate) fn stored_row<'a>(&self, r: usize, buf: &'a mut Vec<F::Q>) -> &'a [F::Q] {
        let len = Self::row_len(self.cols);
        buf.clear();
        buf.extend_from_slice(&self.qs[r * len..(r + 1) * len]);
        to_stored_order(buf, F::BLOCK_LEN);
        buf
    }

    /// From stored parts (a quantized checkpoint, elements in llama.cpp's order), checked for
    /// size.
    pub fn from_parts(
        rows: usize,
        cols: usize,
        qs: Vec<F::Q>,
        scales: Vec<u16>,
    ) -> Result<Self, QuantError> {
        let len = rows * Self::row_len(cols);
        if !cols.is_multiple_of(BLOCK) || qs.len() != len || scales.len() != rows * cols / BLOCK {
            return Err(QuantError::Shape(format!(
                "{} ({rows}, {cols}) needs {len} {} and {} scales, got {} and {}",
                F::NAME,
                F::UNIT,
                rows * cols / BLOCK,
                qs.len(),
                scales.len()
            )));
        }
        Ok(Self::in_kernel_order(rows, cols, qs, scales))
    }

    /// A matrix of rows `rows` of this one, in that order, the same blocks (copied).
    ///
    /// # Panics
    /// If a row is outside the matrix.
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        let (len, nb) = (Self::row_len(self.cols), self.cols / BLOCK);
        let mut qs = Vec::with_capacity(rows.len() * len);
        let mut scales = Vec::with_capacity(rows.len() * nb);
        for &r in rows {
            assert!(
                r < self.rows,
                "{}::select_rows: row {r} of {}",
                F::MATRIX,
                self.rows
            );
            qs.extend_from_slice(&self.qs[r * len..(r + 1) * len]);
            scales.extend_from_slice(&self.scales[r * nb..(r + 1) * nb]);
        }
        Self {
            rows: rows.len(),
            cols: self.cols,
            qs,
            scales,
            format: PhantomData,
        }
    }

    /// Bytes of the stored elements and scales.
    pub fn storage_bytes(&self) -> usize {
        self.qs.len() * std::mem::size_of::<F::Q>() + 2 * self.scales.len()
    }

    /// Rows `first..` widened into `out` (whole rows).
    ///
    /// # Panics
    /// If `out` does not hold whole rows or the rows are outside the matrix.
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) {
        let (n, nb) = (self.cols, self.cols / BLOCK);
        assert!(
            out.len().is_multiple_of(n.max(1)) && first * n + out.len() <= self.rows * n,
            "{}::dequantize_rows: {} values from row {first} of a ({}, {n}) matrix",
            F::MATRIX,
            out.len(),
            self.rows
        );
        let mut buf = Vec::with_capacity(Self::row_len(n));
        for (i, orow) in out.chunks_exact_mut(n.max(1)).enumerate() {
            let qs = self.stored_row(first + i, &mut buf);
            let scales = &self.scales[(first + i) * nb..];
            for ((ob, qb), &s) in orow
                .chunks_exact_mut(BLOCK)
                .zip(qs.chunks_exact(F::BLOCK_LEN))
                .zip(scales)
            {
                F::dequantize_block(f16_value(s), qb, ob);
            }
        }
    }

    /// `out[r * m + i] = w_r · x_i` for weight rows `first..first + rows`, with the fastest
    /// kernel `isa` allows that the CPU has: AVX-512 VNNI, else AVX2, else the portable
    /// reference.
    ///
    /// # Panics
    /// If the rows are outside the matrix, `x`'s rows are not `cols` long or `out` holds fewer
    /// than `rows · x.rows()` values.
    pub fn block(&self, first: usize, rows: usize, x: &QuantRows, out: &mut [f32], isa: Isa) {
        assert!(
            first + rows <= self.rows && x.n == self.cols && out.len() >= rows * x.m,
            "{}::block: rows {first}..{} of {}, ({}, {}) inputs for {} columns, {} outputs",
            F::MATRIX,
            first + rows,
            self.rows,
            x.m,
            x.n,
            self.cols,
            out.len()
        );
        let (len, nb) = (Self::row_len(self.cols), self.cols / BLOCK);
        let qs = &self.qs[first * len..(first + rows) * len];
        let sc = &self.scales[first * nb..(first + rows) * nb];
        #[cfg(target_arch = "x86_64")]
        match isa {
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx if super::has_vnni() => {
                // SAFETY: the CPU supports AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C (checked in
                // the guard), all the VNNI kernel needs; `qs` and `sc` are `rows` whole rows of
                // `x.n` values and `out` holds `rows · x.m` (asserted above).
                unsafe { (F::KERNELS.vnni)(qs, sc, x, rows, out) };
                return;
            }
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx if super::has_avx2_f16c() => {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked in the guard), all the
                // AVX2 kernel needs; the shapes were asserted above.
                unsafe { (F::KERNELS.avx2)(qs, sc, x, rows, out) };
                return;
            }
            _ => {}
        }
        let _ = isa;
        block_portable::<F>(qs, sc, x, rows, out);
    }
}

/// The reference: per block `(d_w · d_x) · F::block_dot(…)`, added in block order (`qs` in the
/// kernels' order, each row read back in llama.cpp's).
fn block_portable<F: BlockFormat>(
    qs: &[F::Q],
    sc: &[u16],
    x: &QuantRows,
    rows: usize,
    out: &mut [f32],
) {
    let len = x.blocks() * F::BLOCK_LEN;
    let mut stored = Vec::with_capacity(qs.len());
    super::for_each_stored_row(qs, len, F::BLOCK_LEN, rows, |_, row| {
        stored.extend_from_slice(row)
    });
    super::act::portable_blocks(sc, x, rows, out, |r, b, xq| {
        let at = r * len + b * F::BLOCK_LEN;
        F::block_dot(&stored[at..at + F::BLOCK_LEN], xq)
    });
}

#[cfg(test)]
mod tests {
    use super::super::q4::Q4;
    use super::super::q8::Q8;
    use super::super::tests::values;
    use super::*;

    fn matrix<F: BlockFormat>() -> BlockMatrix<F> {
        BlockMatrix::quantize(&values(3 * 64, 1), 3, 64).unwrap()
    }

    fn rows_outside<F: BlockFormat>() {
        let x = QuantRows::new(&values(64, 2), 1, 64);
        matrix::<F>().block(2, 2, &x, &mut [0.0; 2], Isa::Portable);
    }

    fn inputs_of_another_width<F: BlockFormat>() {
        let x = QuantRows::new(&values(32, 2), 1, 32);
        matrix::<F>().block(0, 3, &x, &mut [0.0; 3], Isa::best());
    }

    fn a_short_output<F: BlockFormat>() {
        let x = QuantRows::new(&values(2 * 64, 2), 2, 64);
        matrix::<F>().block(0, 3, &x, &mut [0.0; 5], Isa::best());
    }

    fn dequantize_outside<F: BlockFormat>() {
        matrix::<F>().dequantize_rows(2, &mut [0.0; 128]);
    }

    fn dequantize_part_of_a_row<F: BlockFormat>() {
        matrix::<F>().dequantize_rows(0, &mut [0.0; 100]);
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::block: rows 2..4 of 3")]
    fn q8_block_refuses_rows_outside() {
        rows_outside::<Q8>();
    }

    #[test]
    #[should_panic(expected = "Q4Matrix::block: rows 2..4 of 3")]
    fn q4_block_refuses_rows_outside() {
        rows_outside::<Q4>();
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::block: rows 0..3 of 3, (1, 32) inputs for 64 columns")]
    fn q8_block_refuses_inputs_of_another_width() {
        inputs_of_another_width::<Q8>();
    }

    #[test]
    #[should_panic(expected = "Q4Matrix::block: rows 0..3 of 3, (1, 32) inputs for 64 columns")]
    fn q4_block_refuses_inputs_of_another_width() {
        inputs_of_another_width::<Q4>();
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::block: rows 0..3 of 3, (2, 64) inputs for 64 columns, 5")]
    fn q8_block_refuses_a_short_output() {
        a_short_output::<Q8>();
    }

    #[test]
    #[should_panic(expected = "Q4Matrix::block: rows 0..3 of 3, (2, 64) inputs for 64 columns, 5")]
    fn q4_block_refuses_a_short_output() {
        a_short_output::<Q4>();
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::dequantize_rows: 128 values from row 2 of a (3, 64)")]
    fn q8_dequantize_refuses_rows_outside() {
        dequantize_outside::<Q8>();
    }

    #[test]
    #[should_panic(expected = "Q4Matrix::dequantize_rows: 128 values from row 2 of a (3, 64)")]
    fn q4_dequantize_refuses_rows_outside() {
        dequantize_outside::<Q4>();
    }

    #[test]
    #[should_panic(expected = "Q8Matrix::dequantize_rows: 100 values")]
    fn q8_dequantize_refuses_part_of_a_row() {
        dequantize_part_of_a_row::<Q8>();
    }

    #[test]
    #[should_panic(expected = "Q4Matrix::dequantize_rows: 100 values")]
    fn q4_dequantize_refuses_part_of_a_row() {
        dequantize_part_of_a_row::<Q4>();
    }

    /// The parts a file keeps come back as the same matrix, and wrong sizes are refused.
    #[test]
    fn stored_parts_round_trip() {
        fn check<F: BlockFormat>() {
            let w = matrix::<F>();
            let back =
                BlockMatrix::<F>::from_parts(3, 64, w.stored_qs(), w.scales.clone()).unwrap();
            assert!(back.qs == w.qs && back.scales == w.scales);
            let e = BlockMatrix::<F>::from_parts(3, 64, w.stored_qs(), vec![0; 5]).unwrap_err();
            assert!(e.to_string().starts_with(F::NAME), "{e}");
        }
        check::<Q8>();
        check::<Q4>();
    }
}
