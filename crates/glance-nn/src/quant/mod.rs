//! Weight formats chosen at load time: f32, bf16 / f16 kept as 16-bit values, and per-block 8-bit
//! ([`q8`], llama.cpp's Q8_0) and 4-bit ([`q4`], llama.cpp's Q4_0) quantization.
//!
//! A [`crate::Linear`] holds either an f32 tensor (training, and the `f32` format) or a
//! [`PackedMatrix`]. Packed weights are inference only and live on the CPU:
//! - a few input rows (decode, draft trees, continuous batching: ≤ [`crate::matvec::MAX_SMALL_ROWS`])
//!   run the format's own kernels — AVX-512 (with VNNI for q8 / q4), AVX2 + FMA, or a portable
//!   fallback, chosen at run time — split over output rows on the current rayon pool;
//! - more rows (a prefill) dequantize tiles of output rows into f32 and use candle's GEMM
//!   ([`PackedMatrix::matmul`]).
//!
//! q8 and q4 need the input dimension to be a multiple of 32 (their block); a matrix whose input
//! dimension is not falls back to bf16 ([`WeightFormat::for_in_dim`]).

/// The row loop the packed kernels share: `$row::<M>(qs, sc, x, r, i, &mut out[r * m + i..])`
/// for every weight row `r < rows` over the `x.m` input rows, four at a time, then the one to
/// three left.
macro_rules! each_row_tile {
    ($row:ident, $qs:expr, $sc:expr, $x:expr, $rows:expr, $out:expr) => {{
        let m = $x.m;
        for r in 0..$rows {
            let mut i = 0;
            while i + 4 <= m {
                $row::<4>($qs, $sc, $x, r, i, &mut $out[r * m + i..]);
                i += 4;
            }
            match m - i {
                3 => $row::<3>($qs, $sc, $x, r, i, &mut $out[r * m + i..]),
                2 => $row::<2>($qs, $sc, $x, r, i, &mut $out[r * m + i..]),
                1 => $row::<1>($qs, $sc, $x, r, i, &mut $out[r * m + i..]),
                _ => {}
            }
        }
    }};
}

pub mod act;
pub mod half;
pub mod q4;
pub mod q8;
pub mod store;

use candle_core::{DType, Tensor};
pub use half::{HalfKind, HalfMatrix, Isa};
use q4::Q4Matrix;
use q8::Q8Matrix;
use rayon::prelude::*;
use std::sync::Arc;

/// Values per quantization block (q8, q4).
pub const BLOCK: usize = 32;

/// How a model's linear weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    #[default]
    F32,
    Bf16,
    F16,
    Q8,
    Q4,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 5] = [Self::F32, Self::Bf16, Self::F16, Self::Q8, Self::Q4];

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::Q8 => "q8",
            Self::Q4 => "q4",
        }
    }

    /// Stored bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        match self {
            Self::F32 => 32.0,
            Self::Bf16 | Self::F16 => 16.0,
            Self::Q8 => 8.5,
            Self::Q4 => 4.5,
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, Self::Q8 | Self::Q4)
    }

    /// The format a matrix with `in_dim` columns gets: q8 / q4 need whole blocks of 32 along a
    /// row, otherwise bf16.
    pub fn for_in_dim(self, in_dim: usize) -> Self {
        if self.is_quantized() && !in_dim.is_multiple_of(BLOCK) {
            Self::Bf16
        } else {
            self
        }
    }

    /// The format of the tensors kept beside the linear weights of a model loaded in this format
    /// (embeddings, the vision tower): f32 for f32, bf16 otherwise.
    pub fn companion(self) -> Self {
        match self {
            Self::F32 => Self::F32,
            Self::F16 => Self::F16,
            _ => Self::Bf16,
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = glance_core::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                glance_core::Error::InvalidParam(format!(
                    "unknown weight format `{s}` (available: f32, bf16, f16, q8, q4)"
                ))
            })
    }
}

/// Why a matrix cannot be packed.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantError {
    Shape(String),
    /// A block scale beyond f16's range (a weight of magnitude > ~8·10⁶).
    Range(f32),
}

impl std::fmt::Display for QuantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Shape(s) => f.write_str(s),
            Self::Range(v) => write!(
                f,
                "a block scale of {v} does not fit an f16 (weights too large to quantize)"
            ),
        }
    }
}

impl std::error::Error for QuantError {}

impl From<QuantError> for glance_core::Error {
    fn from(e: QuantError) -> Self {
        glance_core::Error::InvalidParam(e.to_string())
    }
}

fn check_shape(len: usize, rows: usize, cols: usize) -> Result<(), QuantError> {
    if len != rows * cols || !cols.is_multiple_of(BLOCK) {
        return Err(QuantError::Shape(format!(
            "cannot quantize {len} values as ({rows}, {cols}) in blocks of {BLOCK}"
        )));
    }
    Ok(())
}

/// `v` rounded to f16 bits, or an error when it overflows.
fn f16_bits(v: f32) -> Result<u16, QuantError> {
    let h = ::half::f16::from_f32(v);
    if v.is_finite() && !h.is_finite() {
        return Err(QuantError::Range(v));
    }
    Ok(h.to_bits())
}

/// Blocks per parallel task when quantizing a matrix.
const CHUNK_BLOCKS: usize = 1024;

/// `v` (|v| ≤ 2²²) rounded to the nearest integer, ties to even, without a libm call (baseline
/// x86-64 has no rounding instruction): adding and subtracting 1.5 · 2²³ drops the fraction.
/// NaN stays NaN.
#[inline(always)]
fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

#[inline(always)]
fn f16_value(bits: u16) -> f32 {
    ::half::f16::from_bits(bits).to_f32()
}

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") && has_avx2_f16c()
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_f16c() -> bool {
    crate::matvec::has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
}

/// One kernel of a packed format: `(weights, scales, input rows, weight rows, out)`.
type PackedKernel<W> = unsafe fn(&[W], &[u16], &act::QuantRows, usize, &mut [f32]);

/// A packed format's kernels. `vnni` and `avx2` need exactly those instruction sets (and F16C),
/// nothing else; `portable` is the reference.
struct PackedKernels<W> {
    #[cfg(target_arch = "x86_64")]
    vnni: PackedKernel<W>,
    #[cfg(target_arch = "x86_64")]
    avx2: PackedKernel<W>,
    portable: fn(&[W], &[u16], &act::QuantRows, usize, &mut [f32]),
}

impl<W> PackedKernels<W> {
    /// Runs AVX-512 VNNI when `isa` allows it and the CPU has it, else AVX2, else the portable
    /// reference.
    fn run(
        &self,
        isa: half::Isa,
        w: &[W],
        sc: &[u16],
        x: &act::QuantRows,
        rows: usize,
        out: &mut [f32],
    ) {
        use half::Isa;
        #[cfg(target_arch = "x86_64")]
        match isa {
            Isa::Avx512 if has_vnni() => {
                // SAFETY: the CPU supports AVX-512 F/BW/VL/VNNI and F16C (checked in the
                // guard), all the VNNI kernel needs.
                unsafe { (self.vnni)(w, sc, x, rows, out) };
                return;
            }
            Isa::Avx2 | Isa::Avx512 if has_avx2_f16c() => {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked in the guard), all the
                // AVX2 kernel needs.
                unsafe { (self.avx2)(w, sc, x, rows, out) };
                return;
            }
            _ => {}
        }
        let _ = isa;
        (self.portable)(w, sc, x, rows, out);
    }
}

/// Vector helpers shared by the q8 and q4 kernels.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Indices that spread scales `2p` and `2p + 1` of 8 over the two halves of a 512-bit
    /// vector, for `p` in `0..4`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn pair_index() -> [__m512i; 4] {
        let mut out = [_mm512_setzero_si512(); 4];
        for (p, o) in out.iter_mut().enumerate() {
            let lo = _mm256_set1_epi32(2 * p as i32);
            let hi = _mm256_set1_epi32(2 * p as i32 + 1);
            *o = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        out
    }

    /// An f16 scale widened to f32 in all 8 lanes.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub unsafe fn scale_256(bits: u16) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
    }
}

/// Bytes owned elsewhere (a memory-mapped checkpoint), shared without copying.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// `owner`'s bytes `start..start + len`, or `None` when out of range.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<Self> {
        let total = (*owner).as_ref().len();
        (start.checked_add(len)? <= total).then_some(Self { owner, start, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A tensor of a checkpoint as stored: dtype, shape and its bytes in place.
pub struct RawTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: SharedBytes,
}

/// Where a loader can find tensors as stored (to keep bf16 / f16 weights in place).
pub trait RawSource: Send + Sync {
    /// The tensor `name` (full dotted name) as stored, if the source has it.
    fn raw(&self, name: &str) -> Option<RawTensor>;
}

/// How linear weights are loaded: their format, and optionally the checkpoint's tensors as
/// stored (bf16 / f16 weights are then used in place when the file already has that dtype).
#[derive(Clone, Default)]
pub struct WeightLoad {
    pub format: WeightFormat,
    pub source: Option<Arc<dyn RawSource>>,
    /// If set, every packed matrix is recorded with its full name (to write a packed checkpoint:
    /// [`store`]).
    pub record: Option<Recorder>,
}

/// Packed matrices by full tensor name, in load order.
pub type Recorder = Arc<std::sync::Mutex<Vec<(String, Arc<PackedMatrix>)>>>;

impl std::fmt::Debug for WeightLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightLoad")
            .field("format", &self.format)
            .field("source", &self.source.is_some())
            .finish()
    }
}

impl WeightLoad {
    pub fn new(format: WeightFormat) -> Self {
        Self {
            format,
            source: None,
            record: None,
        }
    }

    /// f32, as glance always loaded.
    pub fn f32() -> Self {
        Self::default()
    }

    pub fn with_source(mut self, source: Arc<dyn RawSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// The same source with another format (e.g. [`WeightFormat::companion`] for a vision tower).
    pub fn as_format(&self, format: WeightFormat) -> Self {
        Self {
            format,
            source: self.source.clone(),
            record: self.record.clone(),
        }
    }
}

/// A weight matrix `(out, in)` in a packed format.
#[derive(Clone, Debug)]
pub enum PackedMatrix {
    Half(HalfMatrix),
    Q8(Q8Matrix),
    Q4(Q4Matrix),
}

/// Same format, shape and stored bits.
impl PartialEq for PackedMatrix {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Half(a), Self::Half(b)) => {
                a.kind() == b.kind() && a.dims() == b.dims() && a.bits() == b.bits()
            }
            (Self::Q8(a), Self::Q8(b)) => {
                (a.rows, a.cols) == (b.rows, b.cols) && a.qs == b.qs && a.scales == b.scales
            }
            (Self::Q4(a), Self::Q4(b)) => {
                (a.rows, a.cols) == (b.rows, b.cols) && a.qs == b.qs && a.scales == b.scales
            }
            _ => false,
        }
    }
}

/// Output rows per dequantized tile of a prefill GEMM.
const TILE_ROWS: usize = 512;

impl PackedMatrix {
    /// Packs `data` `(rows, cols)` in `format` (not f32; q8 / q4 need `cols` a multiple of 32:
    /// see [`WeightFormat::for_in_dim`]).
    pub fn pack(
        format: WeightFormat,
        data: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Self, QuantError> {
        if data.len() != rows * cols {
            return Err(QuantError::Shape(format!(
                "{} values for a ({rows}, {cols}) matrix",
                data.len()
            )));
        }
        Ok(match format {
            WeightFormat::F32 => {
                return Err(QuantError::Shape("f32 weights are not packed".into()))
            }
            WeightFormat::Bf16 => {
                Self::Half(HalfMatrix::from_f32(HalfKind::Bf16, data, rows, cols))
            }
            WeightFormat::F16 => Self::Half(HalfMatrix::from_f32(HalfKind::F16, data, rows, cols)),
            WeightFormat::Q8 => Self::Q8(Q8Matrix::quantize(data, rows, cols)?),
            WeightFormat::Q4 => Self::Q4(Q4Matrix::quantize(data, rows, cols)?),
        })
    }

    pub fn format(&self) -> WeightFormat {
        match self {
            Self::Half(h) if h.kind() == HalfKind::Bf16 => WeightFormat::Bf16,
            Self::Half(_) => WeightFormat::F16,
            Self::Q8(_) => WeightFormat::Q8,
            Self::Q4(_) => WeightFormat::Q4,
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Self::Half(h) => h.dims(),
            Self::Q8(q) => (q.rows, q.cols),
            Self::Q4(q) => (q.rows, q.cols),
        }
    }

    /// Bytes of the weights in memory (or mapped).
    pub fn storage_bytes(&self) -> usize {
        match self {
            Self::Half(h) => h.storage_bytes(),
            Self::Q8(q) => q.storage_bytes(),
            Self::Q4(q) => q.storage_bytes(),
        }
    }

    /// Whether the weights are borrowed from a mapped checkpoint.
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Half(h) if h.is_shared())
    }

    /// Rows `first..first + out.len() / in` as f32 into `out`.
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) {
        match self {
            Self::Half(h) => h.dequantize_rows(first, out),
            Self::Q8(q) => q.dequantize_rows(first, out),
            Self::Q4(q) => q.dequantize_rows(first, out),
        }
    }

    /// The whole matrix as f32 `(out, in)`.
    pub fn dequantize(&self) -> Vec<f32> {
        let (rows, cols) = self.dims();
        let mut out = vec![0f32; rows * cols];
        self.dequantize_rows(0, &mut out);
        out
    }

    /// `x` `(m, in)` row-major → `(m, out)` with this CPU's fastest kernel, split over output
    /// rows on the current rayon pool. Each output row does not depend on the other input rows.
    pub fn matmul_rows(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_rows_with(x, m, Isa::best())
    }

    /// [`PackedMatrix::matmul_rows`] with a given instruction set (one the CPU has).
    pub fn matmul_rows_with(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        let (out_dim, n) = self.dims();
        debug_assert_eq!(x.len(), m * n);
        match self {
            Self::Half(h) => crate::matvec::rows_parallel(out_dim, m, |first, rows, ys| {
                let w = &h.bits()[first * n..(first + rows) * n];
                half::block(h.kind(), w, x, n, m, ys, isa)
            }),
            Self::Q8(q) => {
                let xq = act::QuantRows::new(x, m, n);
                crate::matvec::rows_parallel(out_dim, m, |first, rows, ys| {
                    q.block(first, rows, &xq, ys, isa)
                })
            }
            Self::Q4(q) => {
                let xq = act::QuantRows::new(x, m, n).with_nibble_order();
                crate::matvec::rows_parallel(out_dim, m, |first, rows, ys| {
                    q.block(first, rows, &xq, ys, isa)
                })
            }
        }
    }

    /// `x` `(m, in)` f32 CPU tensor → `(m, out)`: the kernels for a few rows, else f32 tiles of
    /// [`TILE_ROWS`] output rows dequantized in parallel and multiplied with candle's GEMM.
    pub fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (out_dim, n) = self.dims();
        let (m, xn) = x.dims2()?;
        if xn != n {
            candle_core::bail!("packed matmul: x is ({m}, {xn}) for a ({out_dim}, {n}) matrix")
        }
        if m <= crate::matvec::MAX_SMALL_ROWS {
            let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let y = self.matmul_rows(&xs, m);
            return Tensor::from_vec(y, (m, out_dim), x.device());
        }
        let mut tiles = Vec::with_capacity(out_dim.div_ceil(TILE_ROWS));
        for first in (0..out_dim).step_by(TILE_ROWS) {
            let rows = TILE_ROWS.min(out_dim - first);
            let mut w = vec![0f32; rows * n];
            w.par_chunks_mut(n * 16)
                .enumerate()
                .for_each(|(c, chunk)| self.dequantize_rows(first + 16 * c, chunk));
            // (rows, in)
            let w = Tensor::from_vec(w, (rows, n), x.device())?;
            // (m, in) x (in, rows) -> (m, rows)
            tiles.push(x.matmul(&w.t()?)?);
        }
        if tiles.len() == 1 {
            return Ok(tiles.pop().expect("one tile"));
        }
        Tensor::cat(&tiles, 1)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::act::QuantRows;
    use super::*;

    /// Deterministic values in [-1, 1].
    pub fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503))
                    >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Runs `kernel` (weight rows × quantized inputs, `out[r * m + i]`) with every instruction
    /// set the CPU has against a plain f64 reference over the dequantized weights `w(r, k)` and
    /// the dequantized inputs; checks each row of a batch equals the row alone, bit for bit.
    pub fn check_kernel(
        rows: usize,
        n: usize,
        m: usize,
        kernel: impl Fn(&QuantRows, &mut [f32], Isa),
        w: impl Fn(usize, usize) -> f32,
    ) {
        let x = values(m * n, 11);
        let xq = QuantRows::new(&x, m, n).with_nibble_order();
        let xd =
            |i: usize, k: usize| xq.qs[i * n + k] as f64 * xq.d[i * n / BLOCK + k / BLOCK] as f64;
        for isa in Isa::available() {
            let mut out = vec![0f32; rows * m];
            kernel(&xq, &mut out, isa);
            for r in 0..rows {
                for i in 0..m {
                    let want: f64 = (0..n).map(|k| w(r, k) as f64 * xd(i, k)).sum();
                    let scale: f64 = (0..n).map(|k| (w(r, k) as f64 * xd(i, k)).abs()).sum();
                    let got = out[r * m + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + scale),
                        "{isa:?} ({m},{rows},{n}) [{r},{i}]: {got} vs {want}"
                    );
                    let alone = QuantRows::new(&x[i * n..(i + 1) * n], 1, n).with_nibble_order();
                    let mut one = vec![0f32; rows];
                    kernel(&alone, &mut one, isa);
                    assert_eq!(one[r].to_bits(), out[r * m + i].to_bits(), "{isa:?}");
                }
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_ties_even() {
        for (v, want) in [
            (0.4, 0.0),
            (0.5, 0.0),
            (1.5, 2.0),
            (-2.5, -2.0),
            (126.6, 127.0),
            (-7.51, -8.0),
        ] {
            assert_eq!(round_small(v), want, "{v}");
        }
        assert!(round_small(f32::NAN).is_nan());
    }

    #[test]
    fn formats_parse_and_fall_back() {
        for f in WeightFormat::ALL {
            assert_eq!(f.name().parse::<WeightFormat>().unwrap(), f);
        }
        assert_eq!("Q4".parse::<WeightFormat>().unwrap(), WeightFormat::Q4);
        let e = "q3".parse::<WeightFormat>().unwrap_err().to_string();
        assert!(e.contains("q3") && e.contains("q4"), "{e}");
        assert_eq!(WeightFormat::Q4.for_in_dim(33), WeightFormat::Bf16);
        assert_eq!(WeightFormat::Q8.for_in_dim(64), WeightFormat::Q8);
        assert_eq!(WeightFormat::F16.for_in_dim(33), WeightFormat::F16);
    }

    /// The packed product (kernels for few rows, dequantized GEMM tiles for many) against the
    /// f32 product of the dequantized matrix, for every format and on odd output sizes.
    #[test]
    fn packed_matmul_matches_dequantized_product() -> candle_core::Result<()> {
        let dev = candle_core::Device::Cpu;
        for format in [
            WeightFormat::Bf16,
            WeightFormat::F16,
            WeightFormat::Q8,
            WeightFormat::Q4,
        ] {
            for (m, out, n) in [(1, 37, 64), (5, 600, 96), (70, 531, 64)] {
                let w = values(out * n, 5);
                let p = PackedMatrix::pack(format, &w, out, n).unwrap();
                assert_eq!(p.format(), format);
                let wd = Tensor::from_vec(p.dequantize(), (out, n), &dev)?;
                let x = Tensor::from_vec(values(m * n, 9), (m, n), &dev)?;
                let want = x.matmul(&wd.t()?)?;
                let got = p.matmul(&x)?;
                let err: f32 = (&got - &want)?.abs()?.max_all()?.to_scalar()?;
                let scale: f32 = want.abs()?.max_all()?.to_scalar()?;
                // q8 / q4 also quantize the input to 8 bits: ~0.5% of the largest output.
                let tol = if format.is_quantized() && m <= 64 {
                    1e-2
                } else {
                    1e-5
                };
                assert!(
                    err <= tol * scale,
                    "{format} ({m},{out},{n}): {err} of {scale}"
                );
            }
        }
        assert!(PackedMatrix::pack(WeightFormat::Q8, &values(33, 1), 1, 33).is_err());
        Ok(())
    }
}

#[cfg(test)]
mod throughput {
    use super::*;

    /// Manual: `cargo test --release -p glance-nn throughput -- --ignored --nocapture`. Weight
    /// bytes streamed per second by each format's matrix-vector kernel on one thread, beside
    /// the f32 kernel, on a matrix far beyond the caches.
    #[test]
    #[ignore]
    fn kernel_throughput() {
        let (rows, cols) = (8192, 8192);
        let w = tests::values(rows * cols, 3);
        let x = tests::values(cols, 5);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let wt = candle_core::Tensor::from_vec(w.clone(), (rows, cols), &candle_core::Device::Cpu)
            .unwrap();
        let xt =
            candle_core::Tensor::from_vec(x.clone(), (1, cols), &candle_core::Device::Cpu).unwrap();
        let best = |f: &(dyn Fn() + Sync)| {
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    pool.install(f);
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let s = best(&|| {
            std::hint::black_box(crate::matvec::matvec(&wt, &xt).unwrap());
        });
        println!("f32: {:.1} GB/s", (rows * cols * 4) as f64 / s / 1e9);
        for f in [
            WeightFormat::Bf16,
            WeightFormat::F16,
            WeightFormat::Q8,
            WeightFormat::Q4,
        ] {
            let p = PackedMatrix::pack(f, &w, rows, cols).unwrap();
            for isa in Isa::available() {
                let s = best(&|| {
                    std::hint::black_box(p.matmul_rows_with(&x, 1, isa));
                });
                println!(
                    "{f} {isa:?}: {:.1} GB/s ({:.2} ms)",
                    p.storage_bytes() as f64 / s / 1e9,
                    s * 1e3
                );
            }
        }
    }
}
