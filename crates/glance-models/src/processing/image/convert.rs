//! `convert_rgb` of transformers 5 (`image_transforms.convert_to_rgb`) on what the `image` crate
//! decodes, with Pillow's mode semantics:
//!
//! * an image with alpha (`"A" in image.getbands()` or a `transparency` entry: PNG `tRNS`, which the
//!   `image` crate expands into an alpha channel) is converted to RGBA and alpha-composited onto an
//!   opaque white background with Pillow's integer `ImagingAlphaComposite`, then made RGB.
//!   (transformers 4.x called `image.convert("RGB")`, which drops alpha instead; the fixtures of
//!   this repository are made with 5.24, see `scripts/make_fixtures.py`.)
//! * otherwise `image.convert("RGB")`: grayscale is replicated, palettes are already expanded by
//!   the PNG decoder.
//! * 16-bit PNGs: Pillow opens 16-bit RGB / RGBA / gray+alpha by keeping the high byte of each
//!   sample (`v >> 8`; gray+alpha becomes RGBA), but 16-bit grayscale opens as mode `I;16`, whose
//!   conversion to RGB *clips* (`min(v, 255)`): a typical 16-bit grayscale photo comes out almost
//!   white. We reproduce both, since the model was trained on what transformers feeds it.
//! * float images (not produced by the PNG/JPEG decoders) are converted by the `image` crate.
//!
//! A gray result is kept as one channel: resampling is per channel, so resizing one channel and
//! replicating it gives the same pixels as Pillow's resize of the replicated RGB image.

use std::borrow::Cow;

use image::DynamicImage;

use glance_core::{Error, Result};

/// An 8-bit image after `convert_rgb`: `channels` is 1 (gray, stands for R = G = B) or 3 (RGB).
#[derive(Debug, Clone)]
pub(crate) struct RgbLike<'a> {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub data: Cow<'a, [u8]>,
}

/// Pillow's `alpha_composite(white, (v, a))` for one colour sample (`AlphaComposite.c`, scalar
/// path, destination alpha 255): 7 extra bits of precision, rounded divisions by 255.
#[inline]
pub(crate) fn composite_on_white(v: u8, a: u8) -> u8 {
    const PREC: u32 = 7;
    if a == 0 {
        return 255;
    }
    let (v, a) = (v as u32, a as u32);
    let dst_a = 255u32;
    let blend = dst_a * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PREC) / outa255;
    let coef2 = 255 * (1 << PREC) - coef1;
    let tmp = v * coef1 + 255 * coef2 + (0x80 << PREC);
    let shifted = ((tmp >> 8) + tmp) >> 8; // SHIFTFORDIV255
    (shifted >> PREC) as u8
}

/// What `convert_rgb` gives for `img` (see the module docs). With `do_convert_rgb = false` the
/// image must already be 8-bit RGB (transformers would otherwise feed 1 or 4 channels on).
pub(crate) fn to_rgb_like(img: &DynamicImage, do_convert_rgb: bool) -> Result<RgbLike<'_>> {
    let (width, height) = (img.width() as usize, img.height() as usize);
    if width == 0 || height == 0 {
        return Err(Error::Image(format!(
            "image is {width}x{height}: it has no pixels"
        )));
    }
    let gray = |data: Vec<u8>| RgbLike {
        width,
        height,
        channels: 1,
        data: Cow::Owned(data),
    };
    let rgb = |data: Vec<u8>| RgbLike {
        width,
        height,
        channels: 3,
        data: Cow::Owned(data),
    };
    if !do_convert_rgb {
        return match img {
            DynamicImage::ImageRgb8(b) => Ok(RgbLike {
                width,
                height,
                channels: 3,
                data: Cow::Borrowed(b.as_raw()),
            }),
            _ => Err(Error::Image(format!(
                "do_convert_rgb is false but the image is {:?}, not 8-bit RGB",
                img.color()
            ))),
        };
    }
    Ok(match img {
        DynamicImage::ImageLuma8(b) => RgbLike {
            width,
            height,
            channels: 1,
            data: Cow::Borrowed(b.as_raw()),
        },
        DynamicImage::ImageRgb8(b) => RgbLike {
            width,
            height,
            channels: 3,
            data: Cow::Borrowed(b.as_raw()),
        },
        DynamicImage::ImageLumaA8(b) => gray(
            b.as_raw()
                .chunks_exact(2)
                .map(|p| composite_on_white(p[0], p[1]))
                .collect(),
        ),
        DynamicImage::ImageRgba8(b) => rgb(composite_rgba(
            b.as_raw().chunks_exact(4).map(|p| [p[0], p[1], p[2], p[3]]),
        )),
        // Mode `I;16` -> RGB clips to 255 (Pillow `I16_RGB`).
        DynamicImage::ImageLuma16(b) => {
            gray(b.as_raw().iter().map(|&v| v.min(255) as u8).collect())
        }
        // 16-bit gray+alpha opens as RGBA from the high bytes (`LA;16B`).
        DynamicImage::ImageLumaA16(b) => gray(
            b.as_raw()
                .chunks_exact(2)
                .map(|p| composite_on_white((p[0] >> 8) as u8, (p[1] >> 8) as u8))
                .collect(),
        ),
        DynamicImage::ImageRgb16(b) => rgb(b.as_raw().iter().map(|&v| (v >> 8) as u8).collect()),
        DynamicImage::ImageRgba16(b) => rgb(composite_rgba(b.as_raw().chunks_exact(4).map(|p| {
            [
                (p[0] >> 8) as u8,
                (p[1] >> 8) as u8,
                (p[2] >> 8) as u8,
                (p[3] >> 8) as u8,
            ]
        }))),
        // Float (and future) variants: only other decoders produce them; let `image` quantise.
        other if other.color().has_alpha() => {
            let b = other.to_rgba8();
            rgb(composite_rgba(
                b.as_raw().chunks_exact(4).map(|p| [p[0], p[1], p[2], p[3]]),
            ))
        }
        other => rgb(other.to_rgb8().into_raw()),
    })
}

fn composite_rgba(pixels: impl Iterator<Item = [u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(pixels.size_hint().0 * 3);
    for [r, g, b, a] in pixels {
        out.extend_from_slice(&[
            composite_on_white(r, a),
            composite_on_white(g, a),
            composite_on_white(b, a),
        ]);
    }
    out
}
