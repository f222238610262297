//! Image pre-processing equal to Hugging Face transformers' `CLIPImageProcessor` (the PIL / NumPy
//! backend, `CLIPImageProcessorPil` in transformers 5), pixel for pixel.
//!
//! Reference: `transformers/image_processing_backends.py` (`PilBackend`), `image_transforms.py`,
//! Pillow's `libImaging/Resample.c` and `AlphaComposite.c`. The pipeline, per image:
//!
//! 1. `convert_rgb` (`convert.rs`): alpha (and PNG `tRNS`) composited onto white (transformers 5;
//!    4.x dropped alpha), grayscale replicated, Pillow's 16-bit quirks;
//! 2. resize of the `uint8` image with Pillow's convolution resampler (`resample.rs`, bit-exact,
//!    including Pillow 13's choice of pass order, see [`vertical_first`]):
//!    shortest edge `n` → short side `n`, long side `int(n * long / short)`; or an exact size;
//! 3. centre crop at `top = (h - ch) // 2`, `left = (w - cw) // 2` (floor division), padding with
//!    zeros (i.e. `uint8` 0 before rescaling) when the image is smaller than the crop;
//! 4. rescale: `float32(float64(v) * rescale_factor)`;
//! 5. normalise in `float32`: `(x - float32(mean)) / float32(std)`.
//!
//! Steps 3–5 depend only on the `uint8` value and the channel, so they are one 256-entry table per
//! channel; only the cropped window of the resized image is computed (the resampler's output
//! pixels are independent, so this changes nothing).
//!
//! Quirks: EXIF orientation is not applied (neither does transformers); ICC profiles and PNG gamma
//! are ignored (as in Pillow); JPEG decoding (`image` / zune-jpeg) can differ from libjpeg-turbo by
//! a few levels per pixel, so JPEG inputs match transformers only approximately (PNG inputs are
//! bit-identical); a truncated JPEG is an error, as in Pillow (zune-jpeg alone would pad it).

mod config;
mod convert;
mod decode;
mod resample;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_io;

use std::path::Path;

use image::DynamicImage;

use glance_core::{Error, Result};

pub use config::{
    image_processor_json, CropSize, PreprocessorConfig, ResizeTo, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
};
pub use decode::{
    decode_image, decode_image_with_limit, load_image, png_header_only, read_image_bytes,
    DEFAULT_MAX_PIXELS,
};
pub use resample::{resize_u8, vertical_first, Filter, PRECISION_BITS};

/// Largest side accepted in `size` / `crop_size`.
pub const MAX_CONFIG_SIDE: usize = 8192;

/// `CLIPImageProcessor.preprocess` for one image.
#[derive(Debug, Clone)]
pub struct ImageProcessor {
    pub config: PreprocessorConfig,
}

impl ImageProcessor {
    /// Validates `config`: resampling filter known (when resizing), sizes in `1..=8192`, mean and
    /// std of 3 finite values with no zero std (when normalising), a finite rescale factor.
    pub fn new(config: PreprocessorConfig) -> Result<Self> {
        let side = |what: &str, n: usize| {
            if n == 0 || n > MAX_CONFIG_SIDE {
                Err(Error::Config(format!(
                    "{what} = {n} must be in 1..={MAX_CONFIG_SIDE}"
                )))
            } else {
                Ok(())
            }
        };
        if config.do_resize {
            Filter::from_pil(config.resample)?;
            match config.size {
                ResizeTo::ShortestEdge(n) => side("size.shortest_edge", n)?,
                ResizeTo::Exact { height, width } => {
                    side("size.height", height)?;
                    side("size.width", width)?;
                }
            }
        }
        if config.do_center_crop {
            side("crop_size.height", config.crop_size.height)?;
            side("crop_size.width", config.crop_size.width)?;
        }
        if config.do_rescale && !config.rescale_factor.is_finite() {
            return Err(Error::Config(format!(
                "rescale_factor = {} is not finite",
                config.rescale_factor
            )));
        }
        if config.do_normalize {
            for (name, v) in [
                ("image_mean", &config.image_mean),
                ("image_std", &config.image_std),
            ] {
                if v.len() != 3 {
                    return Err(Error::Config(format!(
                        "{name} has {} values, RGB needs 3",
                        v.len()
                    )));
                }
                if v.iter().any(|x| !x.is_finite() || !(*x as f32).is_finite()) {
                    return Err(Error::Config(format!(
                        "{name} = {v:?} holds a non-finite value"
                    )));
                }
            }
            if config.image_std.iter().any(|&s| s as f32 == 0.0) {
                return Err(Error::Config(format!(
                    "image_std = {:?} holds a zero",
                    config.image_std
                )));
            }
        }
        Ok(ImageProcessor { config })
    }

    /// `ImageProcessor::new(PreprocessorConfig::from_file(path)?)`.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::new(PreprocessorConfig::from_file(path)?)
    }

    /// `(height, width)` of what [`ImageProcessor::preprocess`] returns for `img`.
    pub fn output_size_for(&self, img: &DynamicImage) -> (usize, usize) {
        self.config
            .output_size_for(img.height() as usize, img.width() as usize)
    }

    /// Channel-first `f32` pixels, shape `(3, H, W)`, row-major: transformers' `pixel_values[0]`.
    pub fn preprocess(&self, img: &DynamicImage) -> Result<Vec<f32>> {
        let cfg = &self.config;
        let src = convert::to_rgb_like(img, cfg.do_convert_rgb)?;
        let (h, w) = (src.height, src.width);
        let (rh, rw) = if cfg.do_resize {
            cfg.resize_target(h, w)
        } else {
            (h, w)
        };
        if rh == 0 || rw == 0 {
            return Err(Error::Image(format!("{w}x{h} image resizes to {rw}x{rh}")));
        }
        if (rh as u64) * (rw as u64) > DEFAULT_MAX_PIXELS {
            return Err(Error::Image(format!(
                "{w}x{h} image would be resized to {rw}x{rh}: aspect ratio too extreme"
            )));
        }
        let (oh, ow) = if cfg.do_center_crop {
            (cfg.crop_size.height, cfg.crop_size.width)
        } else {
            (rh, rw)
        };
        // Centre-crop offsets in resized coordinates (negative: the crop pads).
        let top = (rh as i64 - oh as i64).div_euclid(2);
        let left = (rw as i64 - ow as i64).div_euclid(2);
        let rows = top.max(0) as usize..((top + oh as i64).min(rh as i64)) as usize;
        let cols = left.max(0) as usize..((left + ow as i64).min(rw as i64)) as usize;

        let filter = if cfg.do_resize {
            Filter::from_pil(cfg.resample)?
        } else {
            Filter::Bicubic
        };
        let c = src.channels;
        let window: Vec<u8> = match c {
            1 => {
                resample::resize_window::<1>(
                    &src.data,
                    (w, h),
                    (rw, rh),
                    filter,
                    rows.clone(),
                    cols.clone(),
                )
                .data
            }
            _ => {
                resample::resize_window::<3>(
                    &src.data,
                    (w, h),
                    (rw, rh),
                    filter,
                    rows.clone(),
                    cols.clone(),
                )
                .data
            }
        };
        let win_w = cols.len();

        let lut = self.value_table();
        let mut out = vec![0f32; 3 * oh * ow];
        for (ch, plane) in out.chunks_exact_mut(oh * ow).enumerate() {
            let lut = &lut[ch];
            let pad = lut[0];
            let src_c = if c == 1 { 0 } else { ch };
            for (i, out_row) in plane.chunks_exact_mut(ow).enumerate() {
                let y = top + i as i64;
                if y < rows.start as i64 || y >= rows.end as i64 {
                    out_row.fill(pad);
                    continue;
                }
                let win_row = &window[(y as usize - rows.start) * win_w * c..][..win_w * c];
                for (j, o) in out_row.iter_mut().enumerate() {
                    let x = left + j as i64;
                    *o = if x < cols.start as i64 || x >= cols.end as i64 {
                        pad
                    } else {
                        lut[win_row[(x as usize - cols.start) * c + src_c] as usize]
                    };
                }
            }
        }
        Ok(out)
    }

    /// [`ImageProcessor::preprocess`] as a `(3, H, W)` `f32` tensor on `device`.
    pub fn preprocess_tensor(
        &self,
        img: &DynamicImage,
        device: &candle_core::Device,
    ) -> Result<candle_core::Tensor> {
        let (h, w) = self.output_size_for(img);
        let data = self.preprocess(img)?;
        Ok(candle_core::Tensor::from_vec(data, (3, h, w), device)?)
    }

    /// What steps 4–5 make of the `uint8` value `v` in each channel (a padded pixel's values).
    pub fn value_of(&self, v: u8) -> [f32; 3] {
        let lut = self.value_table();
        [lut[0][v as usize], lut[1][v as usize], lut[2][v as usize]]
    }

    /// Steps 4–5 for every `uint8` value, per channel (bit-identical to NumPy's arithmetic).
    fn value_table(&self) -> [[f32; 256]; 3] {
        let cfg = &self.config;
        let mut lut = [[0f32; 256]; 3];
        for (c, table) in lut.iter_mut().enumerate() {
            for (v, out) in table.iter_mut().enumerate() {
                let mut x = if cfg.do_rescale {
                    (v as f64 * cfg.rescale_factor) as f32
                } else {
                    v as f32
                };
                if cfg.do_normalize {
                    x = (x - cfg.image_mean[c] as f32) / cfg.image_std[c] as f32;
                }
                *out = x;
            }
        }
        lut
    }
}
