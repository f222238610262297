//! bf16 / f16 weights kept as 16-bit values (owned, or borrowed from a memory-mapped checkpoint
//! that already stores them so), with f32 accumulation.
//!
//! The kernels are the f32 decode kernels of [`crate::matvec`] instantiated with a widening load
//! (bf16: the 16 bits shifted into the high half of an f32; f16: the hardware conversion, F16C /
//! AVX-512F), so every output follows the one summation order described there: a row computed
//! among others equals the row alone, bit for bit.
//!
//! **bf16 on AVX-512 BF16** ([`Isa::Avx512Bf16`]) runs `vdpbf16ps` instead: the input rows are
//! rounded to bf16 once per product ([`Bf16Rows`], as llama.cpp does for its BF16 weights) and each
//! instruction does 32 multiply-adds, twice the f32 FMA's — what a pass over several rows (a
//! draft tree, a diffusion block) is bound by. Weight rows are register-blocked 4 × 4 with the
//! input rows, each weight vector loaded once per tile; every output is still accumulated over
//! its 32-value chunks in order and its lanes summed in one tree, so a row in a batch equals the
//! row alone, bit for bit.
//!
//! **bf16 on Intel AMX** ([`Isa::Amx`]) multiplies the same bf16-rounded inputs by tiles of 16
//! weight rows with `tdpbf16ps` (`super::amx`), 8,192 multiply-adds per instruction.

use super::SharedBytes;
use crate::matvec::{has_avx2_fma, has_avx512, simd_kernel};

/// Which 16-bit float.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfKind {
    Bf16,
    F16,
}

/// The 16-bit values, row-major `(rows, cols)`.
#[derive(Clone)]
enum HalfData {
    Owned(Vec<u16>),
    /// Borrowed from a memory-mapped file, 2-byte aligned (checked when made).
    Shared(SharedBytes),
}

/// A `(rows, cols)` matrix of bf16 or f16 values.
#[derive(Clone)]
pub struct HalfMatrix {
    kind: HalfKind,
    rows: usize,
    cols: usize,
    data: HalfData,
}

impl std::fmt::Debug for HalfMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = matches!(self.data, HalfData::Shared(_));
        write!(
            f,
            "HalfMatrix({:?}, {}x{}, shared: {shared})",
            self.kind, self.rows, self.cols
        )
    }
}

impl HalfMatrix {
    /// Rounds `data` `(rows, cols)` to the nearest 16-bit value.
    pub fn from_f32(kind: HalfKind, data: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "HalfMatrix::from_f32: shape");
        let bits = match kind {
            HalfKind::Bf16 => data
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect(),
            HalfKind::F16 => data
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect(),
        };
        Self {
            kind,
            rows,
            cols,
            data: HalfData::Owned(bits),
        }
    }

    /// The values in `bytes` (little-endian 16-bit, `(rows, cols)`) without copying them; `None`
    /// when the length does not match or the bytes are not 2-byte aligned.
    pub fn shared(kind: HalfKind, bytes: SharedBytes, rows: usize, cols: usize) -> Option<Self> {
        if bytes.len() != 2 * rows * cols || !(bytes.as_slice().as_ptr() as usize).is_multiple_of(2)
        {
            return None;
        }
        if cfg!(target_endian = "big") {
            return None;
        }
        Some(Self {
            kind,
            rows,
            cols,
            data: HalfData::Shared(bytes),
        })
    }

    pub fn kind(&self) -> HalfKind {
        self.kind
    }

    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Whether the values are borrowed from a mapped file (not copied).
    pub fn is_shared(&self) -> bool {
        matches!(self.data, HalfData::Shared(_))
    }

    /// The raw 16-bit values, row-major.
    pub fn bits(&self) -> &[u16] {
        match &self.data {
            HalfData::Owned(v) => v,
            HalfData::Shared(b) => {
                let bytes = b.as_slice();
                // SAFETY: any two bytes are a valid u16; alignment and length were checked in
                // `shared` (a mis-aligned remainder would land in the prefix, which is empty).
                let (pre, mid, _) = unsafe { bytes.align_to::<u16>() };
                debug_assert!(pre.is_empty());
                mid
            }
        }
    }

    pub fn storage_bytes(&self) -> usize {
        2 * self.rows * self.cols
    }

    /// A matrix of rows `rows` of this one, in that order, the same bits (copied).
    ///
    /// # Panics
    /// If a row is outside the matrix.
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        let (bits, n) = (self.bits(), self.cols);
        let mut out = Vec::with_capacity(rows.len() * n);
        for &r in rows {
            assert!(
                r < self.rows,
                "HalfMatrix::select_rows: row {r} of {}",
                self.rows
            );
            out.extend_from_slice(&bits[r * n..(r + 1) * n]);
        }
        Self {
            kind: self.kind,
            rows: rows.len(),
            cols: n,
            data: HalfData::Owned(out),
        }
    }

    /// Rows `first..first + out.len() / cols` widened to f32 into `out`.
    ///
    /// # Panics
    /// If `out` does not hold whole rows or the rows are outside the matrix.
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) {
        let n = self.cols;
        assert!(
            out.len().is_multiple_of(n.max(1)) && first * n + out.len() <= self.rows * n,
            "HalfMatrix::dequantize_rows: {} values from row {first} of a ({}, {n}) matrix",
            out.len(),
            self.rows
        );
        let src = &self.bits()[first * self.cols..first * self.cols + out.len()];
        for (o, &b) in out.iter_mut().zip(src) {
            *o = widen(self.kind, b);
        }
    }

    /// `out[r * m + i] = w_r · x_i` for weight rows `first..first + rows`, `x` `(m, cols)`.
    ///
    /// # Panics
    /// If the rows are outside the matrix, `x` is not `(m, cols)` or `out` holds fewer than
    /// `rows · m` values.
    pub fn block(&self, first: usize, rows: usize, x: &[f32], m: usize, out: &mut [f32]) {
        let n = self.cols;
        assert!(
            first + rows <= self.rows && x.len() == m * n && out.len() >= rows * m,
            "HalfMatrix::block: rows {first}..{} of {}, {} inputs for ({m}, {n}), {} outputs",
            first + rows,
            self.rows,
            x.len(),
            out.len()
        );
        let w = &self.bits()[first * n..(first + rows) * n];
        block(self.kind, w, x, n, m, out, Isa::best());
    }
}

/// One 16-bit value widened to f32.
#[inline(always)]
pub fn widen(kind: HalfKind, bits: u16) -> f32 {
    match kind {
        HalfKind::Bf16 => f32::from_bits((bits as u32) << 16),
        HalfKind::F16 => half::f16::from_bits(bits).to_f32(),
    }
}

/// The instruction sets a kernel can be run with (tests run every one the CPU has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Intel AMX tiles (with AVX-512 BF16): bf16 weights run `tdpbf16ps` on bf16-rounded
    /// inputs (`super::amx`); every other format runs as [`Isa::Avx512Bf16`].
    Amx,
    /// AVX-512 with BF16 dot products: bf16 weights run `vdpbf16ps` on bf16-rounded inputs;
    /// every other format runs as [`Isa::Avx512`].
    Avx512Bf16,
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    /// The fastest this CPU has (detected once: every product asks).
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Self::available()[0])
    }

    /// Every instruction set this CPU can run, fastest first.
    pub fn available() -> Vec<Self> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx512_bf16() && super::amx::available() {
                v.push(Isa::Amx);
            }
            if has_avx512_bf16() {
                v.push(Isa::Avx512Bf16);
            }
            if has_avx512() {
                v.push(Isa::Avx512);
            }
            if has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c") {
                v.push(Isa::Avx2);
            }
        }
        v.push(Isa::Portable);
        v
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512_bf16() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has_avx512() && has!("avx512bw") && has!("avx512vl") && has!("avx512bf16")
}

/// Input rows `(m, n)` rounded to bf16 (to nearest, ties to even) for the `vdpbf16ps` and AMX
/// kernels, each padded with zeros to whole chunks of 32 values: `(m, ⌈n / 32⌉ · 32)`.
pub struct Bf16Rows {
    m: usize,
    stride: usize,
    bits: Vec<u16>,
    /// The same rows as AMX `B` tiles, arranged by the first task that needs them.
    #[cfg(target_arch = "x86_64")]
    tiles: std::sync::OnceLock<super::amx::Bf16Tiles>,
}

impl Bf16Rows {
    pub fn new(x: &[f32], m: usize, n: usize) -> Self {
        assert_eq!(x.len(), m * n, "Bf16Rows::new: shape");
        Self::from_rows(m, n, |i, dst| round_into(&x[i * n..(i + 1) * n], dst))
    }

    /// `m` rows of `n` values, row `i`'s written by `fill(i, dst)` into `dst` (its `n` values,
    /// zero when called) — for rows made and rounded in one pass.
    pub fn from_rows(m: usize, n: usize, mut fill: impl FnMut(usize, &mut [u16])) -> Self {
        let stride = n.div_ceil(32) * 32;
        // Each row's place zeroed just before it is written (while it is in cache), not the
        // whole buffer first.
        let mut bits = Vec::with_capacity(m * stride);
        for i in 0..m {
            let at = bits.len();
            bits.resize(at + stride, 0);
            fill(i, &mut bits[at..at + n]);
        }
        Self {
            m,
            stride,
            bits,
            #[cfg(target_arch = "x86_64")]
            tiles: std::sync::OnceLock::new(),
        }
    }

    /// Input rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values per row, padding included (a multiple of 32).
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// `(m, stride)` bf16 bits.
    pub fn bits(&self) -> &[u16] {
        &self.bits
    }

    /// The rows as AMX tiles (arranged once, on first use).
    #[cfg(target_arch = "x86_64")]
    fn tiles(&self) -> &super::amx::Bf16Tiles {
        self.tiles.get_or_init(|| super::amx::Bf16Tiles::new(self))
    }
}

/// `row` rounded to bf16 (to nearest, ties to even) into `dst`'s first `row.len()` values.
///
/// # Panics
/// If `dst` holds fewer values than `row`.
pub fn round_into(row: &[f32], dst: &mut [u16]) {
    assert!(
        dst.len() >= row.len(),
        "round_into: {} values into {}",
        row.len(),
        dst.len()
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: AVX-512 F/BW/VL/BF16 are present (checked just above); `dst` holds at least
        // `row.len()` values (checked at the top).
        unsafe { round_row(row, dst) };
        return;
    }
    for (d, &v) in dst.iter_mut().zip(row) {
        *d = half::bf16::from_f32(v).to_bits();
    }
}

/// `row` rounded to bf16 into `dst` with `vcvtne2ps2bf16` (to nearest, ties to even, as
/// `half::bf16::from_f32` for every finite value above the subnormals).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/BF16; `dst` must hold at least `row.len()` values (the
/// masked stores write nothing past them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn round_row(row: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = row.len();
    debug_assert!(dst.len() >= n);
    for c in (0..n).step_by(32) {
        let left = (n - c).min(32);
        let lo_mask: __mmask16 = if left >= 16 { 0xffff } else { (1 << left) - 1 };
        let hi_mask: __mmask16 = if left >= 32 {
            0xffff
        } else if left > 16 {
            (1 << (left - 16)) - 1
        } else {
            0
        };
        let lo = _mm512_maskz_loadu_ps(lo_mask, row.as_ptr().add(c));
        let hi = _mm512_maskz_loadu_ps(hi_mask, row.as_ptr().add(c + 16.min(left)));
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        let mask: __mmask32 = if left >= 32 { !0 } else { (1 << left) - 1 };
        _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(c) as *mut i16, mask, v);
    }
}

/// Whether `kind` weights run the `vdpbf16ps` kernel under `isa` (its inputs are then
/// [`Bf16Rows`]).
pub fn uses_bf16_inputs(kind: HalfKind, isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kind == HalfKind::Bf16 && matches!(isa, Isa::Avx512Bf16 | Isa::Amx) && has_avx512_bf16()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kind, isa);
        false
    }
}

/// [`block`] for bf16 weights with inputs already rounded ([`uses_bf16_inputs`]) and the kernel
/// of `isa` (AMX's tiles for [`Isa::Amx`], else `vdpbf16ps`): `x` holds the `m` rows of `n`
/// values.
///
/// # Panics
/// If `x` is not `m` rows of `n` values, `w` not whole rows of `n` or `out` holds fewer than
/// `rows · m` values.
pub fn block_bf16_inputs(w: &[u16], x: &Bf16Rows, n: usize, m: usize, out: &mut [f32], isa: Isa) {
    assert!(
        x.m == m
            && x.bits.len() == m * x.stride
            && x.stride >= n
            && w.len().is_multiple_of(n.max(1))
            && out.len() >= w.len() / n.max(1) * m,
        "block_bf16_inputs: {} input rows of stride {} for ({m}, {n}), {} weights, {} outputs",
        x.bits.len() / x.stride.max(1),
        x.stride,
        w.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx && n > 0 && super::amx::available() {
        // SAFETY: AMX is available (checked just above); the tiles hold `x`'s rows of `n`
        // values and `out` at least `rows · m` (checked at the top).
        unsafe { super::amx::block(w, x.tiles(), n, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU supports AVX-512 F/BW/VL/BF16 (checked just above); the shapes were
        // checked at the top.
        unsafe { avx512_dp::block(w, x, n, m, out) };
        return;
    }
    // Elsewhere the same values through the widening kernel (the products differ only in the
    // order of additions).
    let xs: Vec<f32> = (0..m)
        .flat_map(|i| {
            x.bits[i * x.stride..i * x.stride + n]
                .iter()
                .map(|&b| widen(HalfKind::Bf16, b))
        })
        .collect();
    block(HalfKind::Bf16, w, &xs, n, m, out, Isa::best());
}

/// [`block_bf16_inputs`] on AMX, each input row's outputs written side by side into `out`
/// (`out`'s row `i`, column `r`, for `x`'s row `i` and `w`'s row `r`), plus `bias[r]` where
/// given: the layout a linear layer's result has, with no `(rows, m)` result to transpose and
/// no pass to add the bias after. Returns `false`, writing nothing, where AMX is not available.
///
/// # Panics
/// If `x` is not `out.rows()` rows of `n > 0` values, `w` not `out.cols()` rows of `n` or
/// `bias` not `out.cols()` values.
#[cfg(target_arch = "x86_64")]
pub(crate) fn block_bf16_amx_into(
    w: &[u16],
    x: &Bf16Rows,
    n: usize,
    mut out: crate::matvec::Columns<'_>,
    bias: Option<&[f32]>,
) -> bool {
    assert!(
        n > 0
            && x.m == out.rows()
            && x.stride >= n
            && w.len() == out.cols() * n
            && bias.is_none_or(|b| b.len() == out.cols()),
        "block_bf16_amx_into: {} input rows of stride {} for {} rows of {n}, {} weights and {:?} \
         biases for {} columns",
        x.m,
        x.stride,
        out.rows(),
        w.len(),
        bias.map(<[f32]>::len),
        out.cols()
    );
    if !super::amx::available() {
        return false;
    }
    let ld = out.ld();
    let bias = bias.map_or(std::ptr::null(), <[f32]>::as_ptr);
    // SAFETY: AMX is available (checked just above); the tiles hold `x`'s rows of `n` values;
    // `Dest::Inputs` writes `i * ld + r` for `i < x.m` and `r < w.len() / n`, `out`'s own values,
    // and reads `bias[r]` (checked at the top).
    unsafe {
        super::amx::block_to(
            w,
            x.tiles(),
            n,
            out.as_mut_ptr(),
            super::amx::Dest::Inputs { ld, bias },
        )
    };
    true
}

/// `out[r * m + i] = w_r · x_i` for the 16-bit weight rows `w` and f32 inputs `x` `(m, n)`, with
/// the kernel of `isa` (which the CPU must have: see [`Isa::available`]).
///
/// # Panics
/// If `x` is not `(m, n)`, `w` not whole rows of `n` or `out` holds fewer than `rows · m`
/// values.
pub fn block(kind: HalfKind, w: &[u16], x: &[f32], n: usize, m: usize, out: &mut [f32], isa: Isa) {
    assert!(
        x.len() == m * n && w.len().is_multiple_of(n.max(1)) && out.len() >= w.len() / n.max(1) * m,
        "half::block: ({m}, {n}) inputs, {} weights, {} outputs",
        w.len(),
        out.len()
    );
    if uses_bf16_inputs(kind, isa) {
        block_bf16_inputs(w, &Bf16Rows::new(x, m, n), n, m, out, isa);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    match (isa, kind) {
        (Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx, _) if has_avx512() => {
            // SAFETY: the CPU supports AVX-512F and VL (checked in this arm's guard).
            unsafe {
                match kind {
                    HalfKind::Bf16 => avx512_bf16::block(w, x, n, m, out),
                    HalfKind::F16 => avx512_f16::block(w, x, n, m, out),
                }
            }
            return;
        }
        (Isa::Avx2, _) if has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c") => {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked in this arm's guard).
            unsafe {
                match kind {
                    HalfKind::Bf16 => avx2_bf16::block(w, x, n, m, out),
                    HalfKind::F16 => avx2_f16::block(w, x, n, m, out),
                }
            }
            return;
        }
        _ => {}
    }
    let _ = isa;
    for (r, wr) in w.chunks_exact(n).enumerate() {
        for (i, xi) in x.chunks_exact(n).enumerate() {
            out[r * m + i] = dot_portable(kind, wr, xi);
        }
    }
}

/// The portable order of [`crate::matvec`]: eight lanes over 8-element chunks, lanes summed in
/// the same tree, then the tail.
fn dot_portable(kind: HalfKind, w: &[u16], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (cw, cx) = (w.chunks_exact(8), x.chunks_exact(8));
    let (tw, tx) = (cw.remainder(), cx.remainder());
    for (a, b) in cw.zip(cx) {
        for i in 0..8 {
            acc[i] += widen(kind, a[i]) * b[i];
        }
    }
    let mut total =
        ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (a, b) in tw.iter().zip(tx) {
        total += widen(kind, *a) * b;
    }
    total
}

/// Sixteen bf16 values widened to f32: each shifted into the high half of a 32-bit lane.
///
/// # Safety
/// The CPU must support AVX-512F; `p` must be valid for reading 16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_bf16_512(p: *const u16) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let h = _mm256_loadu_si256(p as *const __m256i);
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
}

/// Sixteen f16 values widened to f32.
///
/// # Safety
/// The CPU must support AVX-512F; `p` must be valid for reading 16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_f16_512(p: *const u16) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// Eight bf16 values widened to f32.
///
/// # Safety
/// The CPU must support AVX2; `p` must be valid for reading 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load_bf16_256(p: *const u16) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// Eight f16 values widened to f32.
///
/// # Safety
/// The CPU must support AVX2 and F16C; `p` must be valid for reading 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn load_f16_256(p: *const u16) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// One bf16 weight widened (the kernels' scalar tail).
///
/// # Safety
/// `p` must be valid for a read.
#[inline(always)]
unsafe fn read_bf16(p: *const u16) -> f32 {
    widen(HalfKind::Bf16, *p)
}

/// One f16 weight widened (the kernels' scalar tail).
///
/// # Safety
/// `p` must be valid for a read.
#[inline(always)]
unsafe fn read_f16(p: *const u16) -> f32 {
    widen(HalfKind::F16, *p)
}

simd_kernel!(
    avx512_bf16,
    "avx512f,avx512vl",
    16,
    4,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_fmadd_ps,
    crate::matvec::hsum512,
    u16,
    super::load_bf16_512,
    super::read_bf16
);
simd_kernel!(
    avx512_f16,
    "avx512f,avx512vl",
    16,
    4,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_fmadd_ps,
    crate::matvec::hsum512,
    u16,
    super::load_f16_512,
    super::read_f16
);
simd_kernel!(
    avx2_bf16,
    "avx2,fma,f16c",
    8,
    2,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_fmadd_ps,
    crate::matvec::hsum256,
    u16,
    super::load_bf16_256,
    super::read_bf16
);
simd_kernel!(
    avx2_f16,
    "avx2,fma,f16c",
    8,
    2,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_fmadd_ps,
    crate::matvec::hsum256,
    u16,
    super::load_f16_256,
    super::read_f16
);

/// The `vdpbf16ps` kernel (see the module header).
#[cfg(target_arch = "x86_64")]
mod avx512_dp {
    use super::super::ahead::Ahead;
    use super::Bf16Rows;
    use std::arch::x86_64::*;

    /// `out[r * m + i] = w_r · x_i` for the weight rows in `w` (`w.len() / n` rows of `n`).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/BF16; `n > 0` and `w` holds whole rows of `n` values;
    /// `x` holds `m` rows of `x.stride ≥ n` values (whole chunks of 32: every chunk is loaded
    /// whole); `out` holds at least `rows · m` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn block(w: &[u16], x: &Bf16Rows, n: usize, m: usize, out: &mut [f32]) {
        let rows = w.len() / n;
        let mut r = 0;
        if m == 1 {
            while r + 8 <= rows {
                tile::<8, 1>(w, x, n, r, 0, m, out, rows_ahead(w, n, r, 8, 1));
                r += 8;
            }
        }
        while r + 4 <= rows {
            // The tile's input-row chunks of 4 share the prefetch of the weights ahead (see
            // [`TILES_AHEAD`]).
            let ahead = rows_ahead(w, n, r, 4, m.div_ceil(4));
            let mut i = 0;
            while i + 4 <= m {
                tile::<4, 4>(w, x, n, r, i, m, out, ahead.part(i / 4));
                i += 4;
            }
            let ahead = ahead.part(i / 4);
            match m - i {
                3 => tile::<4, 3>(w, x, n, r, i, m, out, ahead),
                2 => tile::<4, 2>(w, x, n, r, i, m, out, ahead),
                1 => tile::<4, 1>(w, x, n, r, i, m, out, ahead),
                _ => {}
            }
            r += 4;
        }
        while r < rows {
            for i in 0..m {
                tile::<1, 1>(w, x, n, r, i, m, out, Ahead::NONE);
            }
            r += 1;
        }
    }

    /// How many tiles on the prefetched rows lie.
    const TILES_AHEAD: usize = 4;

    /// The weight rows a tile of `tile` rows from `r0` prefetches into L2 while it computes
    /// (`ahead.rs`): the rows [`TILES_AHEAD`] tiles on, split evenly between the `parts` calls
    /// that cover the tile's input rows. Over many input rows a tile reads its weights from the
    /// caches after its first chunk of inputs, and without software prefetch the memory idles
    /// while it computes; over a few, a tile reads 4 or 8 rows at once, more streams than the hardware
    /// prefetcher follows well. Past the call's rows too (usually the next task's, which the
    /// same thread runs next). Measured at the model level (random TinyLlama-1.1B, 2 threads,
    /// AMD EPYC, before against after, two alternations): one row 66–69 against 60–65 ms, 8
    /// rows 121–126 against 86–91 ms (docs/kernels.md).
    fn rows_ahead(w: &[u16], n: usize, r0: usize, tile: usize, parts: usize) -> Ahead {
        let first = r0 + TILES_AHEAD * tile;
        let start = (w.as_ptr() as *const u8).wrapping_add(2 * first * n);
        Ahead::new(start, 2 * tile * n, parts)
    }

    /// Weight rows `r0..r0 + R` × input rows `i0..i0 + M`: each output accumulated over the
    /// 32-value chunks in order (the last one masked), then its lanes summed. Prefetching
    /// `ahead` (a share per chunk) changes no arithmetic.
    ///
    /// # Safety
    /// As [`block`], for weight rows `r0..r0 + R` and input rows `i0..i0 + M`, which it keeps in range.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const M: usize>(
        w: &[u16],
        x: &Bf16Rows,
        n: usize,
        r0: usize,
        i0: usize,
        m: usize,
        out: &mut [f32],
        ahead: Ahead,
    ) {
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        let (wp, xp) = (w.as_ptr(), x.bits.as_ptr());
        let chunks = n.div_ceil(32);
        for c in 0..chunks {
            ahead.fetch(c, chunks);
            let left = n - 32 * c;
            let mask: __mmask32 = if left >= 32 { !0 } else { (1 << left) - 1 };
            let mut xv = [_mm512_setzero_si512(); M];
            for (i, v) in xv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(xp.add((i0 + i) * x.stride + 32 * c) as *const _);
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let wv =
                    _mm512_maskz_loadu_epi16(mask, wp.add((r0 + r) * n + 32 * c) as *const i16);
                let wb: __m512bh = std::mem::transmute(wv);
                for (a, v) in acc_r.iter_mut().zip(&xv) {
                    *a = _mm512_dpbf16_ps(*a, wb, std::mem::transmute::<__m512i, __m512bh>(*v));
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (i, a) in acc_r.iter().enumerate() {
                out[(r0 + r) * m + i0 + i] = crate::matvec::hsum512(*a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Every instruction set against a plain f64 reference of the same 16-bit weights, on odd
    /// sizes; each row of a batch bit for bit the row alone.
    #[test]
    fn kernels_match_the_reference_on_odd_sizes() {
        for kind in [HalfKind::Bf16, HalfKind::F16] {
            for (m, rows, n) in [
                (1, 1, 1),
                (1, 9, 33),
                (3, 13, 47),
                (5, 70, 100),
                (17, 9, 301),
                // AMX: whole and partial tiles of 16 weight rows and 16 input rows, more than
                // the 64 input rows its four result tiles hold, whole chunks of 32 and a tail.
                (16, 33, 64),
                (40, 37, 96),
                (70, 18, 64),
                // Two pairs of input tiles, rows of 19 chunks (the last partial) and a last block
                // of 3 weight rows.
                (50, 35, 600),
            ] {
                let w = HalfMatrix::from_f32(kind, &values(rows * n, 1), rows, n);
                let x_f32 = values(m * n, 7);
                for isa in Isa::available() {
                    // The BF16 kernel multiplies bf16-rounded inputs: its reference does too.
                    let x: Vec<f32> = if uses_bf16_inputs(kind, isa) {
                        let r = |v: f32| half::bf16::from_f32(v).to_f32();
                        x_f32.iter().map(|&v| r(v)).collect()
                    } else {
                        x_f32.clone()
                    };
                    let mut out = vec![0f32; rows * m];
                    block(kind, w.bits(), &x_f32, n, m, &mut out, isa);
                    for r in 0..rows {
                        for i in 0..m {
                            let want: f64 = (0..n)
                                .map(|k| {
                                    widen(kind, w.bits()[r * n + k]) as f64 * x[i * n + k] as f64
                                })
                                .sum();
                            let got = out[r * m + i] as f64;
                            assert!(
                                (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                                "{kind:?} {isa:?} ({m},{rows},{n}) [{r},{i}]: {got} vs {want}"
                            );
                            let mut alone = vec![0f32; rows];
                            block(
                                kind,
                                w.bits(),
                                &x_f32[i * n..(i + 1) * n],
                                n,
                                1,
                                &mut alone,
                                isa,
                            );
                            assert_eq!(alone[r].to_bits(), out[r * m + i].to_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "half::block: (2, 8) inputs")]
    fn block_refuses_inputs_of_another_shape() {
        let w = vec![0u16; 3 * 8];
        block(
            HalfKind::F16,
            &w,
            &[0.0; 15],
            8,
            2,
            &mut [0.0; 6],
            Isa::Portable,
        );
    }

    #[test]
    #[should_panic(expected = "half::block:")]
    fn block_refuses_a_short_output() {
        let w = vec![0u16; 3 * 8];
        block(
            HalfKind::Bf16,
            &w,
            &[0.0; 16],
            8,
            2,
            &mut [0.0; 5],
            Isa::best(),
        );
    }

    #[test]
    #[should_panic(expected = "block_bf16_inputs: 2 input rows of stride 32 for (3, 8)")]
    fn bf16_inputs_refuse_another_row_count() {
        let x = Bf16Rows::new(&[0.0; 16], 2, 8);
        block_bf16_inputs(&[0u16; 8], &x, 8, 3, &mut [0.0; 3], Isa::best());
    }

    #[test]
    #[should_panic(expected = "HalfMatrix::block: rows 2..4 of 3")]
    fn matrix_block_refuses_rows_outside() {
        let w = HalfMatrix::from_f32(HalfKind::Bf16, &[0.0; 3 * 8], 3, 8);
        w.block(2, 2, &[0.0; 8], 1, &mut [0.0; 2]);
    }

    #[test]
    #[should_panic(expected = "HalfMatrix::block: rows 0..3 of 3, 7 inputs for (1, 8)")]
    fn matrix_block_refuses_inputs_of_another_length() {
        let w = HalfMatrix::from_f32(HalfKind::F16, &[0.0; 3 * 8], 3, 8);
        w.block(0, 3, &[0.0; 7], 1, &mut [0.0; 3]);
    }

    #[test]
    #[should_panic(expected = "HalfMatrix::dequantize_rows: 16 values from row 2 of a (3, 8)")]
    fn dequantize_refuses_rows_outside() {
        let w = HalfMatrix::from_f32(HalfKind::Bf16, &[0.0; 3 * 8], 3, 8);
        w.dequantize_rows(2, &mut [0.0; 16]);
    }

    #[test]
    #[should_panic(expected = "HalfMatrix::dequantize_rows: 12 values")]
    fn dequantize_refuses_part_of_a_row() {
        let w = HalfMatrix::from_f32(HalfKind::Bf16, &[0.0; 3 * 8], 3, 8);
        w.dequantize_rows(0, &mut [0.0; 12]);
    }

    #[test]
    fn shared_bytes_are_used_in_place() {
        let v: Vec<u16> = (0..12u16)
            .map(|i| half::bf16::from_f32(i as f32).to_bits())
            .collect();
        let bytes: Vec<u8> = v.iter().flat_map(|b| b.to_le_bytes()).collect();
        let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = std::sync::Arc::new(bytes);
        let sb = SharedBytes::new(owner.clone(), 0, 24).unwrap();
        let m = HalfMatrix::shared(HalfKind::Bf16, sb, 3, 4).unwrap();
        assert!(m.is_shared());
        assert_eq!(m.bits().as_ptr() as *const u8, (*owner).as_ref().as_ptr());
        assert_eq!(m.bits(), &v[..]);
        // Wrong length: refused.
        let sb = SharedBytes::new(owner, 0, 22).unwrap();
        assert!(HalfMatrix::shared(HalfKind::Bf16, sb, 3, 4).is_none());
    }
}
