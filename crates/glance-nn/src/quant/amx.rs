//! bf16 weights on Intel AMX ([`super::Isa::Amx`]): `tdpbf16ps` multiplies a tile of 16 weight
//! rows × 32 values by a tile of 32 values × 16 input rows, 8,192 multiply-adds in one
//! instruction, against `vdpbf16ps`'s 32. A pass over a few input rows (a draft tree, a
//! diffusion block) then costs what streaming the weights costs, and a prompt's 64-row passes
//! cost little more.
//!
//! **Operands.** The weight rows are the `A` tile, loaded in place with the row stride (no copy
//! of the matrix; a row's last, partial chunk of 32 goes through a zero-padded scratch tile). The
//! input rows, rounded to bf16 once per product, are arranged once per product as `B` tiles
//! ([`Bf16Tiles`]): row `kp` of a tile holds, for each of its 16 input rows, the pair of values
//! `2kp, 2kp + 1` of the chunk (the pair layout `tdpbf16ps` multiplies; a tile is the transpose
//! of its rows' chunk read as 16 × 16 pairs). Each `C` tile (16 weight rows × up to 16 input
//! rows, f32) accumulates over the row's chunks in order and is stored straight into the output:
//! as `(rows, m)` ([`Dest::Rows`]), or through a 16 × 16 register transpose as `(m, rows)`, a
//! linear layer's result, with its bias added ([`Dest::Inputs`]).
//!
//! **A row alone equals the row in a batch, bit for bit.** Every output `C[r][i]` is one
//! accumulator that meets the chunks in the same order whatever `m` is: a tile's other input
//! rows are other columns of `C`, which the instruction computes independently. The kernel test
//! (`half.rs`, `kernels_match_the_reference_on_odd_sizes`) checks it on the CPU it runs on; the
//! bits differ from the `vdpbf16ps` kernel's (another summation order), so a process uses one
//! of them throughout ([`super::Isa::best`]).
//!
//! **The OS must allow it.** Linux grants a process the AMX tile state on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`available`] asks once and falls
//! back to the other kernels when it is refused or the kernel is too old.

use super::half::Bf16Rows;
use std::arch::asm;
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
use std::sync::OnceLock;

/// Input rows per `B` tile (and `C` tile width).
const TILE_M: usize = 16;
/// Weight rows per `A` tile.
const TILE_R: usize = 16;
/// bf16 values per chunk of a row: one `A` tile row of 64 bytes.
const CHUNK: usize = 32;
/// Value pairs per chunk: the rows of a `B` tile.
const PAIRS: usize = CHUNK / 2;

/// Whether this CPU has AMX tiles with bf16 and the OS lets this process use them (asked once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        use std::arch::is_x86_feature_detected as has;
        // CPUID leaf 7 (present on every CPU with AVX-512, checked first): EDX bit 22
        // AMX-BF16, bit 24 AMX-TILE.
        let tiles = has!("avx512f") && has!("avx512bw") && has!("avx512bf16") && {
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            edx & (1 << 22) != 0 && edx & (1 << 24) != 0
        };
        tiles && request_tile_state()
    })
}

/// Asks Linux for the AMX tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, 18)`); `false` when
/// refused.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call with these arguments only changes which XSAVE
    // features this process may use; it reads and writes no memory of ours.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The input rows of one product as `B` tiles: `(tiles, chunks, 16 pairs, 16 input rows)` words,
/// each word the bf16 pair `(x[2kp], x[2kp + 1])` of a chunk (zeros past the rows and the row's
/// end).
pub struct Bf16Tiles {
    m: usize,
    chunks: usize,
    words: Vec<u32>,
}

impl Bf16Tiles {
    /// `x`'s rows arranged as tiles.
    pub fn new(x: &Bf16Rows) -> Self {
        Self::arrange(x, std::arch::is_x86_feature_detected!("avx512f"))
    }

    /// [`Bf16Tiles::new`], a tile at a time through a register transpose where `vector` (the CPU
    /// must have AVX-512 F), else a value at a time.
    fn arrange(x: &Bf16Rows, vector: bool) -> Self {
        let (m, stride) = (x.rows(), x.stride());
        let chunks = stride / CHUNK;
        let tiles = m.div_ceil(TILE_M);
        let bits = x.bits();
        if vector {
            // A tile is the transpose of its 16 rows' chunk read as 16 × 16 words (pairs),
            // each written once where it goes (no zeroed buffer first, no copy).
            let len = tiles * chunks * PAIRS * TILE_M;
            let mut words: Vec<u32> = Vec::with_capacity(len);
            let at = words.as_mut_ptr();
            for t in 0..tiles {
                let rows = (m - t * TILE_M).min(TILE_M);
                let first = &bits[t * TILE_M * stride..];
                for c in 0..chunks {
                    // SAFETY: the caller saw AVX-512 F; `first` holds `rows` rows of `stride`
                    // values, each with chunk `c`; tile `(t, c)` is inside the capacity.
                    unsafe {
                        let tile = at.add((t * chunks + c) * PAIRS * TILE_M);
                        arrange_tile(first.as_ptr().add(CHUNK * c), stride, rows, tile);
                    }
                }
            }
            // SAFETY: every tile of the `len` words was written just above.
            unsafe { words.set_len(len) };
            return Self { m, chunks, words };
        }
        let mut words = vec![0u32; tiles * chunks * PAIRS * TILE_M];
        for i in 0..m {
            let (t, mi) = (i / TILE_M, i % TILE_M);
            let row = &bits[i * stride..(i + 1) * stride];
            for (c, chunk) in row.chunks_exact(CHUNK).enumerate() {
                let tile = &mut words[(t * chunks + c) * PAIRS * TILE_M..][..PAIRS * TILE_M];
                for (kp, pair) in chunk.chunks_exact(2).enumerate() {
                    tile[kp * TILE_M + mi] = pair[0] as u32 | (pair[1] as u32) << 16;
                }
            }
        }
        Self { m, chunks, words }
    }
}

/// One `B` tile from `rows` (≤ 16) input rows' chunk at `x` (rows `stride` values apart): word
/// `kp · 16 + i` is row `i`'s pair `kp`, zero for the rows past `rows`.
///
/// # Safety
/// The CPU must support AVX-512 F; `x` must be valid for reading 32 values at each of the
/// `rows` rows, `tile` for writing 256 words.
#[target_feature(enable = "avx512f")]
unsafe fn arrange_tile(x: *const u16, stride: usize, rows: usize, tile: *mut u32) {
    use std::arch::x86_64::*;
    debug_assert!(rows <= TILE_M);
    let mut v = [_mm512_setzero_ps(); 16];
    for (i, v) in v.iter_mut().take(rows).enumerate() {
        *v = _mm512_loadu_ps(x.add(i * stride) as *const f32);
    }
    transpose16(&mut v);
    for (kp, v) in v.iter().enumerate() {
        _mm512_storeu_ps(tile.add(kp * TILE_M) as *mut f32, *v);
    }
}

/// `ldtilecfg`'s 64-byte operand (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// A block of weight tiles (`wr[w]` rows each) against input tiles (`widths[t]` rows each),
    /// at most [`MAX_T`] of each, in the registers of `lay`.
    fn new(lay: Layout, wr: &[usize], widths: &[usize]) -> Self {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for (w, &r) in wr.iter().enumerate() {
            c.colsb[lay.a(w)] = 64;
            c.rows[lay.a(w)] = r as u8;
            for (t, &width) in widths.iter().enumerate() {
                c.colsb[lay.c(w, t)] = (4 * width) as u16;
                c.rows[lay.c(w, t)] = r as u8;
            }
        }
        for (t, &width) in widths.iter().enumerate() {
            c.colsb[lay.b(t)] = (4 * width) as u16;
            c.rows[lay.b(t)] = PAIRS as u8;
        }
        c
    }
}

/// Chunks ahead of the products that each weight row's lines are prefetched (into L2).
const AHEAD: usize = 8;

/// Weight tiles and input tiles per block at most (2 × 2: four `C`, two `A` and two `B`
/// registers, each operand used by two products of a chunk). Up to 16 input rows a block is one
/// tile of each (1 × 1): memory-bound, it streams 16 weight rows at a time, not 48 (as 3 × 1
/// did, which ran a one-row pass 10–20% slower: `kernel_rate`, docs/kernels.md).
const MAX_T: usize = 2;

/// Which tile register holds what in a block of `s × s` tiles (`s` weight tiles against `s`
/// input tiles, `s` 1 or 2): `C` in tmm0…, `A` from tmm4, `B` after the `A`s.
#[derive(Clone, Copy)]
struct Layout {
    s: usize,
}

impl Layout {
    fn c(self, w: usize, t: usize) -> usize {
        w * self.s + t
    }
    fn a(self, w: usize) -> usize {
        4 + w
    }
    fn b(self, t: usize) -> usize {
        4 + self.s + t
    }
}

/// Loads tile register `reg` (4–7) from `p`, rows `stride` bytes apart.
///
/// # Safety
/// AMX must be configured with that register; `p` must be valid for reading its rows.
#[inline(always)]
unsafe fn load(reg: usize, p: *const u8, stride: usize) {
    macro_rules! go {
        ($r:literal) => {
            asm!(
                concat!("tileloadd tmm", $r, ", [{p} + {s}*1]"),
                p = in(reg) p,
                s = in(reg) stride,
                options(nostack, readonly, preserves_flags),
            )
        };
    }
    match reg {
        4 => go!("4"),
        5 => go!("5"),
        6 => go!("6"),
        _ => go!("7"),
    }
}

/// `C` register `c` += `A` register `a` · `B` register `b`, as [`Layout`] pairs them.
///
/// # Safety
/// AMX must be configured with the three registers, their shapes matching.
#[inline(always)]
unsafe fn multiply(c: usize, a: usize, b: usize) {
    macro_rules! go {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
                options(nostack, nomem, preserves_flags),
            )
        };
    }
    match (c, a, b) {
        // 1 × 1
        (0, 4, 5) => go!("0", "4", "5"),
        // 2 × 2
        (0, 4, 6) => go!("0", "4", "6"),
        (1, 4, 7) => go!("1", "4", "7"),
        (2, 5, 6) => go!("2", "5", "6"),
        (3, 5, 7) => go!("3", "5", "7"),
        _ => unreachable!("no such tile pairing"),
    }
}

/// Where [`block_to`] writes weight row `r`'s output for input row `i`.
#[derive(Clone, Copy)]
pub enum Dest {
    /// At `r * ld + i`: each weight row's outputs side by side (`ld ≥ m`).
    Rows { ld: usize },
    /// At `i * ld + r`: each input row's outputs side by side (`ld ≥` the weight rows), as a
    /// linear layer's result `(m, out)` holds them, plus `bias[r]` where a bias is given (null:
    /// none; the same f32 sum as adding it after); each `C` tile goes through a 16 × 16
    /// register transpose on its way out.
    Inputs { ld: usize, bias: *const f32 },
}

/// `out[r * m + i] = w_r · x_i` for the weight rows in `w` (`w.len() / n` rows of `n > 0`
/// values) and the input rows of `x` (`m = x`'s rows): [`block_to`] with [`Dest::Rows`].
///
/// # Safety
/// As [`block_to`]; `out` must hold at least `rows · m` values.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn block(w: &[u16], x: &Bf16Tiles, n: usize, out: &mut [f32]) {
    debug_assert!(n > 0 && out.len() >= w.len() / n * x.m);
    block_to(w, x, n, out.as_mut_ptr(), Dest::Rows { ld: x.m });
}

/// `w_r · x_i` for the weight rows in `w` (`w.len() / n` rows of `n > 0` values) and the input
/// rows of `x` into `out` as `dest` places them: blocks of one tile of 16 weight rows against
/// one tile of 16 input rows, or two against two from 17 input rows (see [`MAX_T`]).
///
/// # Safety
/// [`available`] must be true; `x` must hold rows of `n` values (its chunks `⌈n / 32⌉`); `out`
/// must be valid for writing every place `dest` gives the `rows × m` outputs, and a
/// [`Dest::Inputs`] bias, unless null, for reading `rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn block_to(w: &[u16], x: &Bf16Tiles, n: usize, out: *mut f32, dest: Dest) {
    let (m, chunks) = (x.m, x.chunks);
    debug_assert!(n > 0 && chunks == n.div_ceil(CHUNK));
    // One C tile on its way to `Dest::Inputs`, 16 rows of 64 bytes.
    let mut staged = Staged([0.0; TILE_R * TILE_M]);
    let rows = w.len() / n;
    let whole = n / CHUNK;
    let input_tiles = m.div_ceil(TILE_M);
    let lay = Layout {
        s: input_tiles.min(MAX_T),
    };
    // A partial last chunk of a block's weight rows, zero-padded (the inputs are zero there too).
    let mut tail = [0u16; MAX_T * TILE_R * CHUNK];
    // The tiles' shapes as configured: rows of each weight tile, of each input tile, and how
    // many of each.
    let mut configured: Option<([usize; 2], [usize; 2], usize, usize)> = None;
    for r0 in (0..rows).step_by(lay.s * TILE_R) {
        let wr_all = [0, 1].map(|wi| rows.saturating_sub(r0 + wi * TILE_R).min(TILE_R));
        let wr = &wr_all[..lay.s.min((rows - r0).div_ceil(TILE_R))];
        // The rows whose lines are prefetched: this block's, then the next block's (this
        // call's rows only: past them the bytes are another task's).
        let block_end = rows.min(r0 + lay.s * TILE_R);
        let next_end = rows.min(r0 + 2 * lay.s * TILE_R);
        let wp = w.as_ptr().add(r0 * n) as *const u8;
        for t0 in (0..input_tiles).step_by(lay.s) {
            let widths_all = [0, 1].map(|t| (m.saturating_sub((t0 + t) * TILE_M)).min(TILE_M));
            let widths = &widths_all[..lay.s.min(input_tiles - t0)];
            // A new configuration only where the block's shape changes (the last rows).
            if configured != Some((wr_all, widths_all, wr.len(), widths.len())) {
                let config = TileConfig::new(lay, wr, widths);
                asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
                configured = Some((wr_all, widths_all, wr.len(), widths.len()));
            }
            for wi in 0..wr.len() {
                for t in 0..widths.len() {
                    zero(lay.c(wi, t));
                }
            }
            for c in 0..chunks {
                // Each weight row is its own stream, more than the hardware prefetcher follows:
                // up to 16 input rows (memory-bound), the line `AHEAD` chunks on of every row is
                // fetched into L2 in software. A 2 × 2 block is compute-bound, and there the
                // prefetches only take issue slots from its loads and products.
                let (rows_ahead, at) = if c + AHEAD < chunks {
                    (r0..block_end, c + AHEAD)
                } else {
                    (block_end..next_end, c + AHEAD - chunks)
                };
                if lay.s == 1 && at < chunks {
                    for r in rows_ahead {
                        let p = w.as_ptr().wrapping_add(r * n + CHUNK * at);
                        _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
                    }
                }
                for (wi, &r) in wr.iter().enumerate() {
                    if c < whole {
                        let p = wp.add(2 * (wi * TILE_R * n + CHUNK * c));
                        load(lay.a(wi), p, 2 * n);
                    } else {
                        let left = n - CHUNK * c;
                        let tail = &mut tail[wi * TILE_R * CHUNK..];
                        for k in 0..r {
                            let row = r0 + wi * TILE_R + k;
                            let src = &w[row * n + CHUNK * c..(row + 1) * n];
                            tail[k * CHUNK..k * CHUNK + left].copy_from_slice(src);
                        }
                        load(lay.a(wi), tail.as_ptr() as *const u8, 2 * CHUNK);
                    }
                }
                for t in 0..widths.len() {
                    let b = x
                        .words
                        .as_ptr()
                        .add(((t0 + t) * chunks + c) * PAIRS * TILE_M);
                    load(lay.b(t), b as *const u8, 64);
                }
                for wi in 0..wr.len() {
                    for t in 0..widths.len() {
                        multiply(lay.c(wi, t), lay.a(wi), lay.b(t));
                    }
                }
            }
            for (wi, &r) in wr.iter().enumerate() {
                for (t, &width) in widths.iter().enumerate() {
                    let (row, input) = (r0 + wi * TILE_R, (t0 + t) * TILE_M);
                    match dest {
                        Dest::Rows { ld } => {
                            store(lay.c(wi, t), out.add(row * ld + input), 4 * ld);
                        }
                        Dest::Inputs { ld, bias } => {
                            store(lay.c(wi, t), staged.0.as_mut_ptr(), 4 * TILE_M);
                            let bias = if bias.is_null() { bias } else { bias.add(row) };
                            let at = out.add(input * ld + row);
                            store_transposed(&staged, r, width, at, ld, bias);
                        }
                    }
                }
            }
        }
    }
    asm!("tilerelease", options(nostack, nomem, preserves_flags));
}

/// A `C` tile in memory: 16 rows (weight rows) of 16 values (input rows).
#[repr(C, align(64))]
struct Staged([f32; TILE_R * TILE_M]);

/// Writes the first `width` columns of `tile`'s first `r` rows transposed: column `i` (an input
/// row's outputs) as `r` values at `p + i · ld`, each plus `bias[k]` for row `k` unless `bias`
/// is null. Rows past `r` hold whatever an earlier tile left there; the masked stores leave
/// them out.
///
/// # Safety
/// `p + i · ld .. + r` must be valid for writing for every `i < width`, and `bias` null or
/// valid for reading `r` values; `r`, `width` ≤ 16.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_transposed(
    tile: &Staged,
    r: usize,
    width: usize,
    p: *mut f32,
    ld: usize,
    bias: *const f32,
) {
    use std::arch::x86_64::*;
    let mut v = [_mm512_setzero_ps(); 16];
    for (k, v) in v.iter_mut().enumerate() {
        *v = _mm512_load_ps(tile.0.as_ptr().add(k * TILE_M));
    }
    transpose16(&mut v);
    let mask: __mmask16 = if r >= 16 { 0xffff } else { (1 << r) - 1 };
    if !bias.is_null() {
        let b = _mm512_maskz_loadu_ps(mask, bias);
        for v in v.iter_mut().take(width) {
            *v = _mm512_add_ps(*v, b);
        }
    }
    for (i, v) in v.iter().take(width).enumerate() {
        _mm512_mask_storeu_ps(p.add(i * ld), mask, *v);
    }
}

/// Transposes 16 rows of 16 values in registers: row `c` becomes column `c`.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    let (lo, hi) = (
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
    );
    // u[g][j], 128-bit lane l: column 4l + j of rows 4g … 4g + 3.
    let mut u = [[_mm512_setzero_ps(); 4]; 4];
    for (g, u) in u.iter_mut().enumerate() {
        let [a, b, c, d] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
        let (ab_lo, ab_hi) = (_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        let (cd_lo, cd_hi) = (_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
        *u = [
            lo(ab_lo, cd_lo),
            hi(ab_lo, cd_lo),
            lo(ab_hi, cd_hi),
            hi(ab_hi, cd_hi),
        ];
    }
    // Lane l of u[0..4][j], in order, is column 4l + j.
    for j in 0..4 {
        let a_lo = _mm512_shuffle_f32x4::<0x44>(u[0][j], u[1][j]);
        let a_hi = _mm512_shuffle_f32x4::<0xEE>(u[0][j], u[1][j]);
        let b_lo = _mm512_shuffle_f32x4::<0x44>(u[2][j], u[3][j]);
        let b_hi = _mm512_shuffle_f32x4::<0xEE>(u[2][j], u[3][j]);
        r[j] = _mm512_shuffle_f32x4::<0x88>(a_lo, b_lo);
        r[4 + j] = _mm512_shuffle_f32x4::<0xDD>(a_lo, b_lo);
        r[8 + j] = _mm512_shuffle_f32x4::<0x88>(a_hi, b_hi);
        r[12 + j] = _mm512_shuffle_f32x4::<0xDD>(a_hi, b_hi);
    }
}

/// Clears `C` tile `t`.
///
/// # Safety
/// AMX must be configured with tile `t`.
#[inline(always)]
unsafe fn zero(t: usize) {
    match t {
        0 => asm!("tilezero tmm0", options(nostack, nomem, preserves_flags)),
        1 => asm!("tilezero tmm1", options(nostack, nomem, preserves_flags)),
        2 => asm!("tilezero tmm2", options(nostack, nomem, preserves_flags)),
        _ => asm!("tilezero tmm3", options(nostack, nomem, preserves_flags)),
    }
}

/// Stores `C` tile `t`'s rows at `p`, `stride` bytes apart.
///
/// # Safety
/// AMX must be configured with tile `t`; `p` must be valid for writing its rows.
#[inline(always)]
unsafe fn store(t: usize, p: *mut f32, stride: usize) {
    macro_rules! go {
        ($c:literal) => {
            asm!(
                concat!("tilestored [{p} + {s}*1], tmm", $c),
                p = in(reg) p,
                s = in(reg) stride,
                options(nostack, preserves_flags),
            )
        };
    }
    match t {
        0 => go!("0"),
        1 => go!("1"),
        2 => go!("2"),
        _ => go!("3"),
    }
}

/// `iters` × 4 independent `tdpbf16ps` on whole tiles (8,192 multiply-adds each): the
/// register-only loop of [`crate::peak`].
///
/// # Safety
/// [`available`] must be true.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn peak_loop(iters: u64) -> f32 {
    // The 2 × 2 block: C in tmm0–3, A in tmm4–5, B in tmm6–7.
    let config = TileConfig::new(Layout { s: 2 }, &[TILE_R; 2], &[TILE_M; 2]);
    asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
    // bf16 1.0 and 2^-24 in every operand, so the sums stay finite.
    let (one, tiny) = ([0x3f80u16; TILE_R * CHUNK], [0x3380u16; TILE_R * CHUNK]);
    for (reg, src) in [(4, &one), (5, &one), (6, &tiny), (7, &tiny)] {
        load(reg, src.as_ptr() as *const u8, 64);
    }
    for t in 0..4 {
        zero(t);
    }
    for _ in 0..iters {
        asm!(
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            options(nostack, nomem, preserves_flags),
        );
    }
    let mut out = [0f32; TILE_R * TILE_M];
    store(0, out.as_mut_ptr(), 4 * TILE_M);
    asm!("tilerelease", options(nostack, nomem, preserves_flags));
    out.iter().sum()
}

#[cfg(test)]
mod tile_rates {
    use super::*;

    /// Manual: `cargo test --release -p glance-nn tile_rates -- --ignored --nocapture`. What a
    /// tile load costs beside the products on this CPU: nanoseconds per loop of four products
    /// (8,192 multiply-adds each) with none, one, two or four tile loads from L1 between them,
    /// and four loads alone. On the Xeon of docs/kernels.md the loads did not overlap the
    /// products: each added about as much as it costs alone ("AMX's tile loads", there).
    #[test]
    #[ignore]
    fn tile_rates() {
        if !available() {
            println!("no AMX here");
            return;
        }
        // SAFETY: AMX is available (checked just above).
        unsafe { measure(200_000) };
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn measure(iters: u32) {
        let config = TileConfig::new(Layout { s: 2 }, &[TILE_R; 2], &[TILE_M; 2]);
        asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
        // Four tiles of bf16 2^-24: the sums stay finite.
        let buf = vec![0x3380u16; 4 * TILE_R * CHUNK];
        let tile = |i: usize| buf.as_ptr().add(i * TILE_R * CHUNK) as *const u8;
        for t in 0..4 {
            zero(t);
        }
        for (reg, i) in [(4, 0), (5, 1), (6, 2), (7, 3)] {
            load(reg, tile(i), 64);
        }
        let time = |label: &str, body: &mut dyn FnMut()| {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                body();
            }
            let ns = start.elapsed().as_secs_f64() * 1e9 / iters as f64;
            println!("{label:<34} {ns:6.1} ns a loop");
        };
        let products = || {
            multiply(0, 4, 6);
            multiply(1, 4, 7);
            multiply(2, 5, 6);
            multiply(3, 5, 7);
        };
        time("4 products", &mut || products());
        time("4 loads", &mut || {
            for (reg, i) in [(4, 0), (5, 1), (6, 2), (7, 3)] {
                load(reg, tile(i), 64);
            }
        });
        time("1 load + 4 products", &mut || {
            load(4, tile(0), 64);
            products();
        });
        time("2 loads + 4 products", &mut || {
            load(6, tile(2), 64);
            load(7, tile(3), 64);
            products();
        });
        time("4 loads + 4 products (2 x 2 block)", &mut || {
            load(4, tile(0), 64);
            load(6, tile(2), 64);
            multiply(0, 4, 6);
            load(7, tile(3), 64);
            multiply(1, 4, 7);
            load(5, tile(1), 64);
            multiply(2, 5, 6);
            multiply(3, 5, 7);
        });
        asm!("tilerelease", options(nostack, nomem, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::values;

    /// A product written to `Dest::Inputs` holds, bit for bit, the transpose of the same product
    /// written to `Dest::Rows` (with a bias: each value plus its row's bias), for whole and
    /// partial tiles of weight rows and of input rows, and writes nothing outside its columns
    /// (the result's other columns keep their values).
    #[test]
    fn outputs_transposed_equal_the_rows_transposed() {
        if !available() {
            return;
        }
        for (m, rows, n) in [
            (2, 3, 32),
            (16, 16, 64),
            (17, 35, 96),
            (50, 40, 600),
            (33, 70, 40),
        ] {
            let w: Vec<u16> = values(rows * n, 3)
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let x = Bf16Rows::new(&values(m * n, 5), m, n);
            let tiles = Bf16Tiles::new(&x);
            let mut by_rows = vec![0f32; rows * m];
            // SAFETY: AMX is available (checked above); `by_rows` holds rows · m values.
            unsafe { block(&w, &tiles, n, &mut by_rows) };
            // Columns 3 .. 3 + rows of a wider result whose other values must stay -7.
            let ld = rows + 5;
            let mut y = vec![-7f32; m * ld];
            // And once more with a bias.
            let bias = values(rows, 8);
            let mut yb = vec![-7f32; m * ld];
            // SAFETY: as above; `Dest::Inputs` writes `3 + i * ld + r` for i < m, r < rows, and
            // reads `bias[r]`.
            unsafe {
                let null = std::ptr::null();
                let at = y.as_mut_ptr().add(3);
                block_to(&w, &tiles, n, at, Dest::Inputs { ld, bias: null });
                let at = yb.as_mut_ptr().add(3);
                block_to(
                    &w,
                    &tiles,
                    n,
                    at,
                    Dest::Inputs {
                        ld,
                        bias: bias.as_ptr(),
                    },
                );
            }
            for i in 0..m {
                for c in 0..ld {
                    let (got, got_b) = (y[i * ld + c], yb[i * ld + c]);
                    if (3..3 + rows).contains(&c) {
                        let want = by_rows[(c - 3) * m + i];
                        let want_b = want + bias[c - 3];
                        assert_eq!(
                            got_b.to_bits(),
                            want_b.to_bits(),
                            "({m},{rows},{n}) [{i},{c}]"
                        );
                        assert_eq!(got.to_bits(), want.to_bits(), "({m},{rows},{n}) [{i},{c}]");
                    } else {
                        assert_eq!((got, got_b), (-7.0, -7.0), "({m},{rows},{n}) [{i},{c}]");
                    }
                }
            }
        }
    }

    /// The register-transposed arrangement of input tiles equals the one a value at a time.
    #[test]
    fn tiles_arranged_in_registers_equal_the_plain_arrangement() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        for (m, n) in [
            (1, 1),
            (3, 32),
            (16, 64),
            (17, 100),
            (40, 31),
            (5, 0),
            (0, 32),
        ] {
            let x = Bf16Rows::new(&values(m * n, 9), m, n);
            let (fast, plain) = (Bf16Tiles::arrange(&x, true), Bf16Tiles::arrange(&x, false));
            assert_eq!((fast.m, fast.chunks), (plain.m, plain.chunks));
            assert!(fast.words == plain.words, "({m}, {n})");
        }
    }

    #[test]
    fn sixteen_rows_transpose() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let tile = Staged(std::array::from_fn(|k| k as f32));
        let mut out = vec![0f32; 16 * 16];
        // SAFETY: AVX-512 F is present; `out` holds 16 rows of 16.
        unsafe { store_transposed(&tile, 16, 16, out.as_mut_ptr(), 16, std::ptr::null()) };
        for i in 0..16 {
            for r in 0..16 {
                assert_eq!(out[i * 16 + r], (r * 16 + i) as f32, "[{i},{r}]");
            }
        }
    }
}
