//! LLaVA-NeXT's "anyres" geometry and pixels: which grid of tiles an image gets
//! (`select_best_resolution` over `image_grid_pinpoints`), how the image is resized and padded onto
//! it, which part of the tiles' patch grid is unpadded, and the image's token count — all as
//! transformers computes them (`image_processing_utils.py`: `select_best_resolution`,
//! `get_patch_output_size`; `models/llava_next/image_processing_pil_llava_next.py`;
//! `modeling_llava_next.py`: `unpad_image`, `pack_image_features`;
//! `processing_llava_next.py`: `_get_number_of_features`).
//!
//! Reference: Liu et al., "LLaVA-NeXT: Improved reasoning, OCR, and world knowledge" (2024).

use crate::processing::image::{ImageProcessor, PreprocessorConfig, ResizeTo};
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use image::DynamicImage;
use std::ops::Range;

/// Checks `image_grid_pinpoints`: non-empty, each side a positive multiple of the tile size
/// (transformers cuts the padded image into whole tiles), at most 16 tiles a side.
pub fn check_pinpoints(pinpoints: &[[usize; 2]], tile: usize) -> Result<()> {
    if pinpoints.is_empty() {
        return Err(Error::Config("image_grid_pinpoints is empty".into()));
    }
    for &[h, w] in pinpoints {
        for side in [h, w] {
            if side == 0 || !side.is_multiple_of(tile) || side / tile > 16 {
                return Err(Error::Config(format!(
                    "image_grid_pinpoints entry [{h}, {w}] must be positive multiples of the \
                     vision tower's image_size {tile}, at most 16 tiles a side"
                )));
            }
        }
    }
    Ok(())
}

/// The anyres geometry of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anyres {
    /// `[height, width]` of each possible resolution, in pixels.
    pub pinpoints: Vec<[usize; 2]>,
    /// The vision tower's input side (pixels of one tile).
    pub tile: usize,
    /// Patches per tile side.
    pub grid: usize,
}

impl Anyres {
    /// transformers' `select_best_resolution` for an image of `height × width` pixels: the
    /// pinpoint keeping the most of the image's pixels, then wasting the fewest.
    pub fn best_resolution(&self, height: usize, width: usize) -> [usize; 2] {
        let (oh, ow) = (height as f64, width as f64);
        let mut best = self.pinpoints[0];
        let (mut max_effective, mut min_wasted) = (0i64, i64::MAX);
        for &[h, w] in &self.pinpoints {
            let scale = (w as f64 / ow).min(h as f64 / oh);
            let (dw, dh) = ((ow * scale) as i64, (oh * scale) as i64);
            let effective = (dw * dh).min((width * height) as i64);
            let wasted = (w * h) as i64 - effective;
            if effective > max_effective || (effective == max_effective && wasted < min_wasted) {
                max_effective = effective;
                min_wasted = wasted;
                best = [h, w];
            }
        }
        best
    }

    /// Tiles `(rows, cols)` of an image of `height × width` pixels.
    pub fn tiles(&self, height: usize, width: usize) -> (usize, usize) {
        let [h, w] = self.best_resolution(height, width);
        (h / self.tile, w / self.tile)
    }

    /// The rows and columns of the tiles' patch grid (`rows · grid × cols · grid`) that
    /// `unpad_image` keeps for an image of `height × width` pixels.
    pub fn unpadded(&self, height: usize, width: usize) -> (Range<usize>, Range<usize>) {
        let (tr, tc) = self.tiles(height, width);
        let (ch, cw) = (tr * self.grid, tc * self.grid);
        let (oh, ow) = (height as f64, width as f64);
        // Python's `int(round(x, 7))` for the positive sizes here.
        let round7 = |x: f64| ((x * 1e7).round() / 1e7) as usize;
        if ow / oh > cw as f64 / ch as f64 {
            let new_h = round7(oh * (cw as f64 / ow));
            let pad = ch.saturating_sub(new_h) / 2;
            (pad..ch - pad, 0..cw)
        } else {
            let new_w = round7(ow * (ch as f64 / oh));
            let pad = cw.saturating_sub(new_w) / 2;
            (0..ch, pad..cw - pad)
        }
    }

    /// Image tokens of an image of `height × width` pixels: the base image's `grid²`, then the
    /// unpadded grid with one newline token after each of its rows.
    pub fn tokens_for(&self, height: usize, width: usize) -> usize {
        let (rows, cols) = self.unpadded(height, width);
        self.grid * self.grid + rows.len() * (cols.len() + 1)
    }
}

/// One image as the model takes it: the base image and the tiles, and its original size.
#[derive(Debug, Clone)]
pub struct AnyresPixels {
    /// `(1 + tiles, 3, tile, tile)`: the whole image resized to one tile, then the tiles
    /// row-major.
    pub pixels: Tensor,
    /// `(height, width)` of the original image (transformers' `image_sizes`).
    pub size: (usize, usize),
}

/// `LlavaNextImageProcessor` (the PIL backend) for one model.
#[derive(Debug, Clone)]
pub struct AnyresProcessor {
    pub geometry: Anyres,
    /// The CLIP value settings (convert, resample, rescale, normalise); sizes set per step.
    base: PreprocessorConfig,
}

impl AnyresProcessor {
    /// `config`: the image processor's settings (its `size` / `crop_size` must give one tile);
    /// `pinpoints` from its `image_grid_pinpoints`.
    pub fn new(config: PreprocessorConfig, geometry: Anyres) -> Result<Self> {
        let (h, w) = config.output_size();
        if (h, w) != (geometry.tile, geometry.tile) {
            return Err(Error::Config(format!(
                "the image processor produces {h}x{w} pixels but the vision tower takes {t}x{t}",
                t = geometry.tile
            )));
        }
        check_pinpoints(&geometry.pinpoints, geometry.tile)?;
        let mut base = config;
        base.do_center_crop = false;
        Ok(Self { geometry, base })
    }

    /// `(3, height, width)` pixels of `img` resized (if needed) to `height × width`.
    fn resized(&self, img: &DynamicImage, height: usize, width: usize) -> Result<Vec<f32>> {
        let mut config = self.base.clone();
        config.do_resize = true;
        config.size = ResizeTo::Exact { height, width };
        ImageProcessor::new(config)?.preprocess(img)
    }

    /// Pre-processes one image: the base image (resized to one tile, aspect not kept), then the
    /// image resized into its best resolution keeping its aspect (`get_patch_output_size`),
    /// zero-padded centred (`uint8` 0, top `(H − h) // 2`) and cut into tiles row-major.
    pub fn preprocess(&self, img: &DynamicImage, device: &Device) -> Result<AnyresPixels> {
        let g = &self.geometry;
        let (height, width) = (img.height() as usize, img.width() as usize);
        if height == 0 || width == 0 {
            return Err(Error::Image(format!("{width}x{height} image")));
        }
        let t = g.tile;
        let [bh, bw] = g.best_resolution(height, width);
        let (sh, sw) = (bh as f64 / height as f64, bw as f64 / width as f64);
        let (nh, nw) = if sw < sh {
            (((height as f64 * sw).ceil() as usize).min(bh), bw)
        } else {
            (bh, ((width as f64 * sh).ceil() as usize).min(bw))
        };
        let resized = self.resized(img, nh.max(1), nw.max(1))?;
        let (nh, nw) = (nh.max(1), nw.max(1));
        let zero = ImageProcessor::new(self.base.clone())?.value_of(0);
        let (top, left) = ((bh - nh) / 2, (bw - nw) / 2);
        let (rows, cols) = (bh / t, bw / t);
        let mut out = self.resized(img, t, t)?;
        out.reserve(rows * cols * 3 * t * t);
        for tr in 0..rows {
            for tc in 0..cols {
                for (ch, &pad) in zero.iter().enumerate() {
                    let plane = &resized[ch * nh * nw..(ch + 1) * nh * nw];
                    for y in tr * t..(tr + 1) * t {
                        for x in tc * t..(tc + 1) * t {
                            let inside =
                                (top..top + nh).contains(&y) && (left..left + nw).contains(&x);
                            out.push(if inside {
                                plane[(y - top) * nw + (x - left)]
                            } else {
                                pad
                            });
                        }
                    }
                }
            }
        }
        Ok(AnyresPixels {
            pixels: Tensor::from_vec(out, (1 + rows * cols, 3, t, t), device)?,
            size: (height, width),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Anyres {
        Anyres {
            pinpoints: crate::llava::config::DEFAULT_PINPOINTS.to_vec(),
            tile: 336,
            grid: 24,
        }
    }

    #[test]
    fn best_resolution_and_token_counts_of_llava_v1_6() {
        let g = geometry();
        // transformers: LlavaNextProcessor on llava-hf/llava-v1.6-mistral-7b-hf.
        assert_eq!(g.best_resolution(480, 640), [672, 672]);
        assert_eq!(g.tokens_for(480, 640), 2340);
        assert_eq!(g.best_resolution(100, 1000), [336, 1008]);
        assert_eq!(g.tokens_for(100, 1000), 1160);
        // Every pinpoint keeps all of a small square; the first wastes the least.
        assert_eq!(g.best_resolution(336, 336), [336, 672]);
        assert_eq!(g.tokens_for(336, 336), 1176);
        // A square image of the grid's aspect: nothing unpadded.
        assert_eq!(g.unpadded(672, 672), (0..48, 0..48));
        assert_eq!(g.tokens_for(672, 672), 576 + 48 * 49);
    }
}
