//! Weight formats chosen at load time: f32, bf16 / f16 kept as 16-bit values, and per-block 8-bit
//! ([`q8`], llama.cpp's Q8_0) and 4-bit ([`q4`], llama.cpp's Q4_0) quantization.
//!
//! A [`crate::Linear`] holds either an f32 tensor (training, and the `f32` format) or a
//! [`PackedMatrix`]. Packed weights are inference only and live on the CPU:
//! every product runs the format's own kernels — AVX-512 (VNNI for q8 / q4 over groups of 16
//! blocks: [`group`]; BF16 dot products for bf16), AVX2 + FMA, or a portable fallback, chosen at
//! run time — split over output rows on the current rayon pool, the input rows in passes of 64
//! (decode, draft trees, diffusion blocks, continuous batching and prompts alike: a row's result
//! never depends on the rows beside it).
//!
//! q8 and q4 are one generic matrix over a block format ([`block::BlockMatrix`],
//! [`block::BlockFormat`]): construction, row access, the file layout and the dispatch over
//! instruction sets exist once; each format keeps only its per-block arithmetic and its kernels.
//! They need the input dimension to be a multiple of 32 (their block); a matrix whose input
//! dimension is not falls back to bf16 ([`WeightFormat::for_in_dim`]).

pub mod act;
#[cfg(target_arch = "x86_64")]
mod ahead;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod bench;
pub mod block;
#[cfg(target_arch = "x86_64")]
mod few;
pub mod group;
pub mod half;
mod panel;
mod pass;
pub mod q4;
pub mod q8;
pub mod store;

use candle_core::{DType, Tensor};
pub use half::{HalfKind, HalfMatrix, Isa};
pub use panel::PanelMatrix;
use q4::Q4Matrix;
use q8::Q8Matrix;
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

/// Vector helpers shared by the q8 and q4 kernels.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::act::QuantRows;
    use super::ahead::Ahead;
    use super::group::{plan, GROUP, GROUP_BYTES};
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// The index vectors of [`super::group::plan`] for q8 (`w = 3`) and q4 (`w = 2`).
    fn network(w: u32) -> &'static [[[i32; 16]; 2]] {
        static PLANS: OnceLock<[Vec<[[i32; 16]; 2]>; 2]> = OnceLock::new();
        let plans = PLANS.get_or_init(|| {
            [2, 3].map(|w| {
                plan(w)
                    .into_iter()
                    .map(|st| st.map(|idx| idx.map(|i| i as i32)))
                    .collect()
            })
        });
        &plans[(w - 2) as usize]
    }

    /// A group's `V` stored vectors transposed in registers (see [`super::group`]).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn transpose<const V: usize>(v: &mut [__m512i; V], idx: &[[__m512i; 2]]) {
        for (j, st) in idx.iter().enumerate() {
            let bit = 1 << j;
            for a in 0..V {
                if a & bit == 0 {
                    let (va, vb) = (v[a], v[a | bit]);
                    v[a] = _mm512_permutex2var_epi32(va, st[0], vb);
                    v[a | bit] = _mm512_permutex2var_epi32(va, st[1], vb);
                }
            }
        }
    }

    /// The network of `w` as vectors.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `S` must be the number of stages of `w`'s network.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn network_vectors<const S: usize>(w: u32) -> [[__m512i; 2]; S] {
        let plan = network(w);
        debug_assert_eq!(plan.len(), S);
        std::array::from_fn(|j| plan[j].map(|idx| _mm512_loadu_si512(idx.as_ptr() as *const _)))
    }

    /// `count` bytes from `p` (at most 64) in a vector, the rest zero; nothing past them is read.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW; `p` must be valid for reading `min(count, 64)` bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    pub unsafe fn load_bytes(p: *const u8, count: usize) -> __m512i {
        if count >= 64 {
            _mm512_loadu_si512(p as *const _)
        } else {
            _mm512_maskz_loadu_epi8((1u64 << count) - 1, p as *const i8)
        }
    }

    /// Group `g` of a weight row as `V` vectors of 4-byte words in the kernels' order
    /// ([`super::group`]): `base` points at the group; a whole group is held transposed (plain
    /// loads), a partial one as stored (its `valid` bytes loaded, the rest zero, then
    /// transposed by `net`).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW; `base` must be valid for reading the group's bytes
    /// (`V · 64` when `whole`, else `valid`).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    pub unsafe fn load_group<const V: usize>(
        base: *const u8,
        whole: bool,
        valid: usize,
        net: &[[__m512i; 2]],
    ) -> [__m512i; V] {
        let mut v = [_mm512_setzero_si512(); V];
        if whole {
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = _mm512_loadu_si512(base.add(64 * i) as *const _);
            }
        } else {
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = load_bytes(base.add(64 * i), valid.saturating_sub(64 * i));
            }
            transpose(&mut v, net);
        }
        v
    }

    /// Weight rows that meet one group of the inputs before the next group.
    const ROW_BLOCK: usize = 8;

    /// A packed format's weights as the grouped kernel reads them.
    pub trait GroupPrep {
        /// Input rows from which [`grouped_rows`] takes the weight rows [`ROW_BLOCK`] at a
        /// time, two per tile, each group's weights unpacked once for every input row; below,
        /// the register tiles of [`super::few`]. Where the unpacking costs little (q4: a mask
        /// and a shift) the blocks pay from fewer rows than where it costs more (q8: loads and
        /// a sign flip per vector); measured per format with `kernel_rate` (docs/kernels.md).
        const BLOCK_FROM_ROWS: usize;

        /// The 8 unsigned weight vectors of row `r`'s group `g` (of `blocks` ≤ 16 blocks, the
        /// missing ones zero) in word order.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F/BW/VL/VNNI; `r` and `g` must be in the matrix.
        unsafe fn prep(&self, r: usize, g: usize, blocks: usize) -> [__m512i; 8];

        /// Unsigned weight vector `v < 8` of row `r`'s group `g`, a whole group: `prep(r, g,
        /// 16)[v]`, loading only what that vector needs.
        ///
        /// # Safety
        /// As [`GroupPrep::prep`]; group `g` must be whole.
        unsafe fn word(&self, r: usize, g: usize, v: usize) -> __m512i;

        /// The weights' first byte and the bytes of one row (for prefetching).
        fn row_bytes(&self) -> (*const u8, usize);
    }

    /// The AVX-512 VNNI kernel of q8 and q4 over groups of 16 blocks (see [`super::group`]):
    /// `out[r * m + i] = w_r · x_i` for weight rows `0..rows`. `prep` gives each group's 8
    /// unsigned weight vectors, meeting the inputs' 8 arranged vectors; `2^shift` is the
    /// weights' offset, whose integer term `2^shift · Σ q_x` is removed per block. `scales`
    /// `(rows, n / 32)` are the weights' f16 scales. With many input rows two weight rows at a
    /// time share each input load (a 512-bit load is what limits the loop then); with fewer
    /// than [`GroupPrep::BLOCK_FROM_ROWS`], register tiles over whole rows ([`super::few`]).
    ///
    /// Per output: one integer sum per block (exact, in any order), then one float
    /// multiply-add per group in group order, then the lanes summed in a fixed tree — the same
    /// operations whatever the number of input rows or of weight rows in a tile.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `scales` holds the scales of `rows` whole rows of `x.n` values that `prep` reads, `out` at least `rows · x.m` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn grouped_rows<P: GroupPrep>(
        scales: &[u16],
        x: &QuantRows,
        rows: usize,
        shift: u32,
        out: &mut [f32],
        prep: &P,
    ) {
        let (m, nb) = (x.m, x.blocks());
        if m < P::BLOCK_FROM_ROWS {
            // A few input rows: register tiles over whole rows (`few.rs`).
            super::few::few_rows(scales, x, rows, shift, out, prep);
            return;
        }
        let groups = nb.div_ceil(GROUP);
        // A block of weight rows goes through one group at a time, so the group's inputs
        // (m × 512 bytes) stay in L1 while every row of the block meets them, two weight rows
        // per tile (the loop is compute-bound at this many input rows).
        let block = ROW_BLOCK;
        let mut acc = vec![_mm512_setzero_ps(); block * m];
        // The next block's weight rows (contiguous) are prefetched a share per group while this
        // block computes: the block reads its rows a group at a time, `block` streams at once,
        // and leaves the memory idle between its groups' loads otherwise. Measured beyond the
        // caches (`kernel_rate`, one thread, `R=5632 L=8`, GMAC per CPU-second, on against off,
        // two alternations): q4 16 rows 80 / 99 against 68 / 65, 64 rows 106 / 114 against
        // 92 / 97; q8 16 rows 63 / 62 against 59 / 59, 64 rows 98 / 98 against 94 / 95.
        let (w0, row_bytes) = prep.row_bytes();
        for r0 in (0..rows).step_by(block) {
            let rb = block.min(rows - r0);
            // Every accumulator is first written by group 0 (no clearing pass).
            let acc = &mut acc[..rb * m];
            // Past this call's rows too: they are usually the next task's, which this thread
            // runs next.
            let ahead = Ahead::new(
                w0.wrapping_add((r0 + block) * row_bytes),
                block * row_bytes,
                1,
            );
            let next_scales = scales.as_ptr().wrapping_add((r0 + block) * nb);
            Ahead::new(next_scales as *const u8, 2 * block * nb, 1).fetch(0, 1);
            for g in 0..groups {
                ahead.fetch(g, groups);
                let mut j = 0;
                while j + 2 <= rb {
                    let acc = &mut acc[j * m..(j + 2) * m];
                    grouped_step::<2>(scales, x, r0 + j, g, shift, acc, prep);
                    j += 2;
                }
                while j < rb {
                    let acc = &mut acc[j * m..(j + 1) * m];
                    grouped_step::<1>(scales, x, r0 + j, g, shift, acc, prep);
                    j += 1;
                }
            }
            for (j, acc_j) in acc.chunks_exact(m.max(1)).enumerate() {
                for (k, a) in acc_j.iter().enumerate() {
                    out[(r0 + j) * m + k] = crate::matvec::hsum512(*a);
                }
            }
        }
    }

    /// Group `g` of weight rows `r0..r0 + R` of [`grouped_rows`] against every input row, into
    /// `acc` `(R, m)`.
    ///
    /// # Safety
    /// As [`grouped_rows`], for weight rows `r0..r0 + R` and a group of the rows; `acc` holds
    /// `R · x.m` accumulators.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn grouped_step<const R: usize>(
        scales: &[u16],
        x: &QuantRows,
        r0: usize,
        g: usize,
        shift: u32,
        acc: &mut [__m512],
        prep: &impl GroupPrep,
    ) {
        let (m, nb) = (x.m, x.blocks());
        let shift = _mm_cvtsi32_si128(shift as i32);
        let blocks = (nb - g * GROUP).min(GROUP);
        let bm: __mmask16 = if blocks == GROUP {
            0xffff
        } else {
            (1 << blocks) - 1
        };
        let mut wv = [[_mm512_setzero_si512(); 8]; R];
        let mut dw = [_mm512_setzero_ps(); R];
        for j in 0..R {
            wv[j] = prep.prep(r0 + j, g, blocks);
            let ws = scales.as_ptr().add((r0 + j) * nb + g * GROUP);
            dw[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(bm, ws as *const i16));
        }
        // (m, 8 vectors): this group of every input row, contiguous.
        let xg = x.grouped.as_ptr().add(g * m * GROUP_BYTES) as *const __m512i;
        for k in 0..m {
            let xk = xg.add(8 * k);
            let at = k * nb + g * GROUP;
            let sums = _mm512_maskz_loadu_epi32(bm, x.sums.as_ptr().add(at));
            let offset = _mm512_sll_epi32(sums, shift);
            let dx = _mm512_maskz_loadu_ps(bm, x.d.as_ptr().add(at));
            // Two integer chains per weight row; each input vector loaded once.
            let mut s = [[_mm512_setzero_si512(); 2]; R];
            for v in (0..8).step_by(2) {
                let (x0, x1) = (
                    _mm512_loadu_si512(xk.add(v)),
                    _mm512_loadu_si512(xk.add(v + 1)),
                );
                for j in 0..R {
                    s[j][0] = _mm512_dpbusd_epi32(s[j][0], wv[j][v], x0);
                    s[j][1] = _mm512_dpbusd_epi32(s[j][1], wv[j][v + 1], x1);
                }
            }
            for j in 0..R {
                let dot = _mm512_sub_epi32(_mm512_add_epi32(s[j][0], s[j][1]), offset);
                let a = &mut acc[j * m + k];
                let before = if g == 0 { _mm512_setzero_ps() } else { *a };
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw[j], dx), before);
            }
        }
    }
}

/// Runs `kernel(r, row)` for rows `0..rows` of `qs` (`row_len` elements a row, `block_len` a
/// block, held in the kernels' order), each row read back in llama.cpp's order: how the
/// portable reference sees a packed matrix.
pub(crate) fn for_each_stored_row<T: Copy + Default>(
    qs: &[T],
    row_len: usize,
    block_len: usize,
    rows: usize,
    mut kernel: impl FnMut(usize, &[T]),
) {
    let mut row = Vec::with_capacity(row_len);
    for r in 0..rows {
        row.clear();
        row.extend_from_slice(&qs[r * row_len..(r + 1) * row_len]);
        group::to_stored_order(&mut row, block_len);
        kernel(r, &row);
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

/// Input rows per pass of the kernels over the weights (their inputs stay in cache).
const ROWS_PER_PASS: usize = crate::matvec::MAX_SMALL_ROWS;

/// Input rows per pass at most for bf16 weights on AMX, whose products are cheap enough that
/// streaming the weights again for each pass shows: 128 rows of bf16 inputs are 512 KiB at
/// 2,048 values a row, 1.4 MiB at 5,632, in a core's 2 MiB of L2.
const AMX_ROWS_PER_PASS: usize = 128;

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

    /// A matrix of rows `rows` of this one, in that order, in the same format with the same
    /// stored bits: each of its output rows is computed exactly as here.
    ///
    /// # Panics
    /// If a row is outside the matrix.
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        match self {
            Self::Half(h) => Self::Half(h.select_rows(rows)),
            Self::Q8(q) => Self::Q8(q.select_rows(rows)),
            Self::Q4(q) => Self::Q4(q.select_rows(rows)),
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
        self.rows_with_bias(x, m, isa, None)
    }

    /// [`PackedMatrix::matmul_rows_with`] plus `bias` (`out` values) on every row: the same f32
    /// sums as adding it after, in the pass that makes the rows (AMX: as each tile is stored).
    fn rows_with_bias(&self, x: &[f32], m: usize, isa: Isa, bias: Option<&[f32]>) -> Vec<f32> {
        let mut ys = Self::group_rows(&[(self, bias)], x, m, isa);
        ys.pop().expect("one matrix, one result")
    }

    /// `x` `(m, in)` f32 CPU tensor → `(m, out)` through the format's kernels, whatever `m`
    /// ([`PackedMatrix::matmul_rows`]): a prompt row gets exactly what the same row gets in a
    /// decode step.
    pub fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.matmul_bias(x, None)
    }

    /// [`PackedMatrix::matmul`] plus `bias` `(out,)` on every row, added in place (the same f32
    /// sums as a broadcast add after). A contiguous f32 CPU `x` is read where it lies.
    pub fn matmul_bias(&self, x: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let mut ys = Self::matmul_group(&[(self, bias)], x)?;
        Ok(ys.pop().expect("one matrix, one result"))
    }
}

#[cfg(test)]
pub(crate) mod tests;
