//! Pillow's convolution resampling (`src/libImaging/Resample.c`), re-implemented bit for bit for
//! 8-bit images with 1 or 3 interleaved channels.
//!
//! How Pillow resizes a `uint8` image (`Image.resize(size, resample)` with a filter other than
//! NEAREST, no `box`, no `reducing_gap`):
//!
//! * per axis, `precompute_coeffs`: `scale = in / out`; `filterscale = max(scale, 1)` (so a downscale
//!   widens the filter: antialiasing); `support = filter.support * filterscale`; for each output
//!   index `xx`, `center = (xx + 0.5) * scale`, the taps run over
//!   `[(int)(center - support + 0.5), (int)(center + support + 0.5))` clipped to the image, weight
//!   `filter((x - center + 0.5) / filterscale)`, normalised to sum 1 (in f64);
//! * `normalize_coeffs_8bpc`: each weight becomes `(int)(w * 2^22 ± 0.5)` (round half away from 0);
//! * two separable passes, each output sample being `clamp((2^21 + Σ pixel · weight) >> 22, 0, 255)`
//!   in 32-bit integers, so the intermediate image is rounded to `uint8` and the pass order
//!   matters: horizontal first (over the source rows the vertical pass will read), except that
//!   Pillow 13 goes vertical first when the height shrinks by more than twice the width's
//!   reduction ([`vertical_first`]; Pillow ≤ 12 was always horizontal first);
//! * a pass whose axis keeps its size is skipped (it would be the identity anyway).
//!
//! Integer sums are exact (wrapping, associative), so the loop order here is free: this file
//! restricts the work to an output window (the centre crop that follows), which changes nothing
//! in the pixels it does compute.

use std::ops::Range;

use glance_core::{Error, Result};

/// Fixed-point precision of Pillow's 8-bit resampling: `32 - 8 - 2` bits.
pub const PRECISION_BITS: u32 = 22;

/// The convolution filters of `PIL.Image.Resampling` (NEAREST, code 0, is a different algorithm in
/// Pillow and is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `Resampling.LANCZOS` (1): truncated sinc, support 3.
    Lanczos,
    /// `Resampling.BILINEAR` (2): triangle, support 1.
    Bilinear,
    /// `Resampling.BICUBIC` (3): Keys cubic with `a = -0.5`, support 2.
    Bicubic,
    /// `Resampling.BOX` (4): support 0.5.
    Box,
    /// `Resampling.HAMMING` (5): Hamming-windowed sinc, support 1.
    Hamming,
}

impl Filter {
    /// The filter for a PIL resampling code (`preprocessor_config.json`'s `resample`).
    pub fn from_pil(code: i64) -> Result<Self> {
        match code {
            1 => Ok(Filter::Lanczos),
            2 => Ok(Filter::Bilinear),
            3 => Ok(Filter::Bicubic),
            4 => Ok(Filter::Box),
            5 => Ok(Filter::Hamming),
            0 => Err(Error::Config(
                "resample = 0 (PIL NEAREST) is not supported; use 2 (bilinear) or 3 (bicubic)".into(),
            )),
            other => Err(Error::Config(format!(
                "resample = {other} is not a PIL resampling filter (1 lanczos, 2 bilinear, 3 bicubic, \
                 4 box, 5 hamming)"
            ))),
        }
    }

    fn support(self) -> f64 {
        match self {
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The kernel, with Pillow's exact expression order (no fused multiply-add).
    fn eval(self, x: f64) -> f64 {
        match self {
            Filter::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let x = x * std::f64::consts::PI;
                    // Pillow writes the constants as C floats: `0.54f + 0.46f * cos(x)`.
                    x.sin() / x * (0.54f32 as f64 + 0.46f32 as f64 * x.cos())
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// Fixed-point weights of one axis: output index `i` reads `count[i]` source samples from
/// `start[i]` with weights `weights[i * ksize ..][.. count[i]]` (each scaled by `2^22`).
#[derive(Debug, Clone)]
pub(crate) struct Coeffs {
    pub ksize: usize,
    pub start: Vec<usize>,
    pub count: Vec<usize>,
    pub weights: Vec<i32>,
}

impl Coeffs {
    /// `precompute_coeffs` + `normalize_coeffs_8bpc` for `in_size -> out_size` (box = whole axis).
    pub fn new(in_size: usize, out_size: usize, filter: Filter) -> Self {
        // Pillow: `scale = (double)(in1 - in0) / outSize` with `in0, in1` C floats.
        let scale = (in_size as f32 - 0.0f32) as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let ss = 1.0 / filterscale;

        let mut start = Vec::with_capacity(out_size);
        let mut count = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = 0.0 + (xx as f64 + 0.5) * scale;
            // C `(int)` casts truncate toward zero, as `as i64` does.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
            let n = (xmax - xmin).clamp(0, ksize as i64) as usize;
            let mut ww = 0.0;
            for (x, kx) in k.iter_mut().enumerate().take(n) {
                let w = filter.eval(((x as i64 + xmin) as f64 - center + 0.5) * ss);
                *kx = w;
                ww += w;
            }
            let row = &mut weights[xx * ksize..][..n];
            for (out, &w) in row.iter_mut().zip(&k[..n]) {
                let w = if ww != 0.0 { w / ww } else { w };
                let scaled = w * (1u32 << PRECISION_BITS) as f64;
                *out = if w < 0.0 {
                    (-0.5 + scaled) as i32
                } else {
                    (0.5 + scaled) as i32
                };
            }
            start.push(xmin as usize);
            count.push(n);
        }
        Coeffs {
            ksize,
            start,
            count,
            weights,
        }
    }

    fn taps(&self, i: usize) -> (usize, &[i32]) {
        (
            self.start[i],
            &self.weights[i * self.ksize..][..self.count[i]],
        )
    }

    /// Source range read by the output indices in `out` (empty when `out` is empty).
    fn source_span(&self, out: &Range<usize>) -> Range<usize> {
        if out.is_empty() {
            return 0..0;
        }
        let first = self.start[out.start];
        let last = (out.clone())
            .map(|i| self.start[i] + self.count[i])
            .max()
            .unwrap_or(first);
        first..last.max(first)
    }
}

#[inline(always)]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// An interleaved 8-bit image with `C` channels per pixel (row-major, no padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct U8Image<const C: usize> {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// Whether Pillow runs the vertical pass before the horizontal one. Pillow ≤ 12 always went
/// horizontal first; Pillow 13 (python-pillow/Pillow#9549, "if height is scaled down significantly
/// more than width, resize vertically first") goes vertical first when the height shrinks and
/// `in_h - out_h > 2 * (in_w - out_w)`. Found and checked against Pillow 13.0.0 on 3,000 random size
/// pairs; the order changes the rounding of the `uint8` intermediate image.
pub fn vertical_first(width: usize, height: usize, out_w: usize, out_h: usize) -> bool {
    out_h < height && (height - out_h) as i64 > 2 * (width as i64 - out_w as i64)
}

/// Resizes `src` (`width x height`, `C` interleaved channels) to `out_w x out_h` as Pillow's
/// `Image.resize((out_w, out_h), filter)` does, and returns only the output window
/// `rows x cols` (ranges in output coordinates, clipped to the output).
pub(crate) fn resize_window<const C: usize>(
    src: &[u8],
    (width, height): (usize, usize),
    (out_w, out_h): (usize, usize),
    filter: Filter,
    rows: Range<usize>,
    cols: Range<usize>,
) -> U8Image<C> {
    debug_assert_eq!(src.len(), width * height * C);
    let rows = rows.start.min(out_h)..rows.end.min(out_h);
    let cols = cols.start.min(out_w)..cols.end.min(out_w);
    let (win_w, win_h) = (cols.len(), rows.len());
    if win_w == 0 || win_h == 0 {
        return U8Image {
            width: win_w,
            height: win_h,
            data: Vec::new(),
        };
    }
    let need_h = out_w != width;
    let need_v = out_h != height;
    let data = match (need_h, need_v) {
        (false, false) => {
            let mut t = Vec::with_capacity(win_h * win_w * C);
            for y in rows {
                t.extend_from_slice(&src[(y * width + cols.start) * C..(y * width + cols.end) * C]);
            }
            t
        }
        (true, false) => {
            let hc = Coeffs::new(width, out_w, filter);
            horizontal::<C>(src, width, rows, 0, &hc, cols)
        }
        (false, true) => {
            let vc = Coeffs::new(height, out_h, filter);
            vertical::<C>(src, width, 0, cols, &vc, rows)
        }
        (true, true) => {
            let hc = Coeffs::new(width, out_w, filter);
            let vc = Coeffs::new(height, out_h, filter);
            if vertical_first(width, height, out_w, out_h) {
                // Vertical pass over the source columns the horizontal pass will read.
                let src_cols = hc.source_span(&cols);
                let tmp = vertical::<C>(src, width, 0, src_cols.clone(), &vc, rows);
                horizontal::<C>(&tmp, src_cols.len(), 0..win_h, src_cols.start, &hc, cols)
            } else {
                // Horizontal pass over the source rows the vertical pass will read.
                let src_rows = vc.source_span(&rows);
                let tmp = horizontal::<C>(src, width, src_rows.clone(), 0, &hc, cols);
                vertical::<C>(&tmp, win_w, src_rows.start, 0..win_w, &vc, rows)
            }
        }
    };
    U8Image {
        width: win_w,
        height: win_h,
        data,
    }
}

/// Horizontal pass. `src` rows are `stride` pixels wide and start at source column `x0`; reads
/// rows `rows` (indices into `src`) and returns them resampled to output columns `cols`.
fn horizontal<const C: usize>(
    src: &[u8],
    stride: usize,
    rows: Range<usize>,
    x0: usize,
    co: &Coeffs,
    cols: Range<usize>,
) -> Vec<u8> {
    let out_w = cols.len();
    let mut out = vec![0u8; rows.len() * out_w * C];
    let stride = stride * C;
    for (y, out_row) in rows.zip(out.chunks_exact_mut(out_w * C)) {
        let in_row = &src[y * stride..(y + 1) * stride];
        for (xx, out_px) in cols.clone().zip(out_row.chunks_exact_mut(C)) {
            let (xmin, k) = co.taps(xx);
            let px = &in_row[(xmin - x0) * C..(xmin - x0 + k.len()) * C];
            let mut acc = [HALF; C];
            for (p, &w) in px.chunks_exact(C).zip(k) {
                for c in 0..C {
                    acc[c] = acc[c].wrapping_add((p[c] as i32).wrapping_mul(w));
                }
            }
            for c in 0..C {
                out_px[c] = clip8(acc[c]);
            }
        }
    }
    out
}

/// Vertical pass. `src` rows are `stride` pixels wide, its first row is source row `y0`; returns
/// output rows `rows`, each holding the columns `cols` of `src`.
fn vertical<const C: usize>(
    src: &[u8],
    stride: usize,
    y0: usize,
    cols: Range<usize>,
    co: &Coeffs,
    rows: Range<usize>,
) -> Vec<u8> {
    let width = cols.len() * C;
    let stride = stride * C;
    let mut out = vec![0u8; rows.len() * width];
    let mut acc = vec![0i32; width];
    for (yy, out_row) in rows.zip(out.chunks_exact_mut(width)) {
        let (ymin, k) = co.taps(yy);
        acc.fill(HALF);
        for (j, &w) in k.iter().enumerate() {
            let y = ymin + j - y0;
            let in_row = &src[y * stride + cols.start * C..][..width];
            for (a, &p) in acc.iter_mut().zip(in_row) {
                *a = a.wrapping_add((p as i32).wrapping_mul(w));
            }
        }
        for (o, &a) in out_row.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    out
}

/// Resizes a whole interleaved 8-bit image (`channels` 1 or 3) exactly as Pillow's
/// `Image.resize((out_w, out_h), filter)` does for mode `L` / `RGB`.
pub fn resize_u8(
    src: &[u8],
    width: usize,
    height: usize,
    channels: usize,
    out_w: usize,
    out_h: usize,
    filter: Filter,
) -> Result<Vec<u8>> {
    if width == 0 || height == 0 || out_w == 0 || out_h == 0 {
        return Err(Error::Image(format!(
            "cannot resize a {width}x{height} image to {out_w}x{out_h}: sizes must be positive"
        )));
    }
    if src.len() != width * height * channels {
        return Err(Error::Image(format!(
            "pixel buffer holds {} bytes, a {width}x{height}x{channels} image needs {}",
            src.len(),
            width * height * channels
        )));
    }
    Ok(match channels {
        1 => {
            resize_window::<1>(
                src,
                (width, height),
                (out_w, out_h),
                filter,
                0..out_h,
                0..out_w,
            )
            .data
        }
        3 => {
            resize_window::<3>(
                src,
                (width, height),
                (out_w, out_h),
                filter,
                0..out_h,
                0..out_w,
            )
            .data
        }
        other => {
            return Err(Error::Image(format!(
                "resize supports 1 or 3 channels, not {other}"
            )))
        }
    })
}
