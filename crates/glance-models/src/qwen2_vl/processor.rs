//! `Qwen2VLProcessor` / `Qwen2_5_VLProcessor` for images: `smart_resize` to a multiple of
//! `patch_size × merge_size` within `[min_pixels, max_pixels]`, the CLIP value pipeline, the patch
//! rows the vision tower takes, `image_grid_thw`, and the prompt with each `<|image_pad|>`
//! expanded to the image's merged-token count — as transformers' PIL backend computes them
//! (`image_processing_pil_qwen2_vl.py`).
//!
//! Settings are read from `preprocessor_config.json` (published checkpoints: `min_pixels` /
//! `max_pixels`, or a `size` of `{min_pixels, max_pixels}`) or from the `image_processor` entry of
//! `processor_config.json` (transformers 5: `size` of `{shortest_edge, longest_edge}`).

use super::config::Qwen2VlConfig;
use crate::llava::{PreparedPrompt, PromptFormat};
use crate::processing::chat::{check_image_tokens, SizedImages};
use crate::processing::image::{ImageProcessor, PreprocessorConfig, ResizeTo};
use crate::processing::sized::SizedPrompts;
use crate::processing::tokenizer::TextProcessor;
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use image::DynamicImage;
use serde_json::Value;
use std::path::Path;

/// The image placeholder of Qwen's chat template.
pub const IMAGE_PAD: &str = "<|image_pad|>";
const VIDEO_PAD: &str = "<|video_pad|>";

/// transformers refuses images more elongated than this (`smart_resize`).
const MAX_ASPECT: f64 = 200.0;

/// The image settings of a Qwen2-VL processor.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenImageSettings {
    pub min_pixels: usize,
    pub max_pixels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
}

/// transformers' `smart_resize`: `(height, width)` rounded to multiples of `factor` (Python's
/// round-half-to-even), then scaled down (floor) into `max_pixels` or up (ceil) to `min_pixels`,
/// keeping the aspect ratio as closely as the grid allows.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    if height == 0 || width == 0 || factor == 0 {
        return Err(Error::Image(format!(
            "cannot resize a {width}x{height} image"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if h.max(w) / h.min(w) > MAX_ASPECT {
        return Err(Error::Image(format!(
            "a {width}x{height} image is too elongated: the aspect ratio must be below \
             {MAX_ASPECT}, got {}",
            h.max(w) / h.min(w)
        )));
    }
    let mut h_bar = (h / f).round_ties_even() as usize * factor;
    let mut w_bar = (w / f).round_ties_even() as usize * factor;
    if h_bar * w_bar > max_pixels {
        let beta = ((height * width) as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max((h / beta / f).floor() as usize * factor);
        w_bar = factor.max((w / beta / f).floor() as usize * factor);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / (height * width) as f64).sqrt();
        h_bar = (h * beta / f).ceil() as usize * factor;
        w_bar = (w * beta / f).ceil() as usize * factor;
    }
    Ok((h_bar, w_bar))
}

/// One pre-processed image.
#[derive(Debug, Clone)]
pub struct QwenPixels {
    /// Patch rows `(grid_h · grid_w, channels · temporal · patch · patch)`, in the vision tower's
    /// order: blocks of `merge × merge` patches, row-major over blocks.
    pub patches: Tensor,
    /// `image_grid_thw`: `[1, grid_h, grid_w]` in patches.
    pub grid_thw: [usize; 3],
}

/// Image pre-processing of a Qwen2-VL checkpoint.
#[derive(Debug, Clone)]
pub struct QwenImageProcessor {
    pub settings: QwenImageSettings,
    /// The CLIP value settings (convert, resample, rescale, normalise); `size` is set per image.
    base: PreprocessorConfig,
}

impl QwenImageProcessor {
    /// Reads `preprocessor_config.json`, else `processor_config.json`'s `image_processor`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let (json, path) = crate::processing::image::image_processor_json(dir)?;
        Self::from_json(&json).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Builds the processor from the image processor's JSON settings.
    pub fn from_json(json: &Value) -> Result<Self> {
        let get = |k: &str| json.get(k).filter(|v| !v.is_null());
        let size = get("size");
        let from_size = |k: &str| size.and_then(|s| s.get(k)).filter(|v| !v.is_null());
        let num = |v: Option<&Value>, what: &str| -> Result<Option<usize>> {
            match v {
                None => Ok(None),
                Some(x) => x.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                    Error::Config(format!("`{what}` must be a whole number, got {x}"))
                }),
            }
        };
        // Explicit keys win over `size`, as the processor's __init__ applies them last.
        let min_pixels = num(get("min_pixels"), "min_pixels")?
            .or(num(from_size("shortest_edge"), "size.shortest_edge")?)
            .or(num(from_size("min_pixels"), "size.min_pixels")?)
            .unwrap_or(56 * 56);
        let max_pixels = num(get("max_pixels"), "max_pixels")?
            .or(num(from_size("longest_edge"), "size.longest_edge")?)
            .or(num(from_size("max_pixels"), "size.max_pixels")?)
            .unwrap_or(28 * 28 * 1280);
        let settings = QwenImageSettings {
            min_pixels,
            max_pixels,
            patch_size: num(get("patch_size"), "patch_size")?.unwrap_or(14),
            temporal_patch_size: num(get("temporal_patch_size"), "temporal_patch_size")?
                .unwrap_or(2),
            merge_size: num(get("merge_size"), "merge_size")?.unwrap_or(2),
        };
        if min_pixels == 0 || min_pixels > max_pixels {
            return Err(Error::Config(format!(
                "min_pixels ({min_pixels}) must be positive and at most max_pixels ({max_pixels})"
            )));
        }
        for (k, v) in [
            ("patch_size", settings.patch_size),
            ("temporal_patch_size", settings.temporal_patch_size),
            ("merge_size", settings.merge_size),
        ] {
            crate::text::size_in_range(k, v, 1024)?;
        }
        // The CLIP value pipeline with the Qwen processor's defaults; no crop, size set per image.
        let mut values = json.clone();
        if let Some(o) = values.as_object_mut() {
            o.remove("size");
            o.remove("crop_size");
            o.insert("do_center_crop".into(), Value::Bool(false));
            o.entry("resample").or_insert(Value::from(3));
        }
        let base = PreprocessorConfig::from_json(&values).map_err(Error::Config)?;
        Ok(Self { settings, base })
    }

    /// The factor both sides are rounded to: `patch_size × merge_size`.
    pub fn factor(&self) -> usize {
        self.settings.patch_size * self.settings.merge_size
    }

    /// `image_grid_thw` of an image of `height × width` pixels.
    pub fn grid_for(&self, height: usize, width: usize) -> Result<[usize; 3]> {
        let s = &self.settings;
        let (h, w) = smart_resize(height, width, self.factor(), s.min_pixels, s.max_pixels)?;
        Ok([1, h / s.patch_size, w / s.patch_size])
    }

    /// Merged tokens (what the prompt holds) of an image of `height × width` pixels.
    pub fn tokens_for(&self, height: usize, width: usize) -> Result<usize> {
        let [t, h, w] = self.grid_for(height, width)?;
        Ok(t * h * w / (self.settings.merge_size * self.settings.merge_size))
    }

    /// Pre-processes one image: resize, values, patch rows.
    pub fn preprocess(&self, img: &DynamicImage, device: &Device) -> Result<QwenPixels> {
        let s = &self.settings;
        let (height, width) = (img.height() as usize, img.width() as usize);
        let (rh, rw) = smart_resize(height, width, self.factor(), s.min_pixels, s.max_pixels)?;
        let mut config = self.base.clone();
        config.do_resize = true;
        config.size = ResizeTo::Exact {
            height: rh,
            width: rw,
        };
        // (3, rh, rw) channel-first f32, as the PIL backend gives before `patchify`.
        let plane = ImageProcessor::new(config)?.preprocess(img)?;
        let (p, m, tp) = (s.patch_size, s.merge_size, s.temporal_patch_size);
        let (gh, gw) = (rh / p, rw / p);
        let c = 3;
        let row_len = c * tp * p * p;
        let mut out = Vec::with_capacity(gh * gw * row_len);
        // Rows ordered (gh/m, gw/m, m, m); each row (C, T, p, p) with the frame repeated T times.
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for ih in 0..m {
                    for iw in 0..m {
                        let (py, px) = ((bh * m + ih) * p, (bw * m + iw) * p);
                        for ch in 0..c {
                            for _ in 0..tp {
                                for y in 0..p {
                                    let start = ch * rh * rw + (py + y) * rw + px;
                                    out.extend_from_slice(&plane[start..start + p]);
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(QwenPixels {
            patches: Tensor::from_vec(out, (gh * gw, row_len), device)?,
            grid_thw: [1, gh, gw],
        })
    }
}

/// Tokenizer, chat template and image processor of one Qwen2-VL checkpoint.
pub struct QwenVlProcessor {
    pub text: TextProcessor,
    pub image: QwenImageProcessor,
    image_token_id: u32,
}

impl QwenVlProcessor {
    pub fn from_dir(dir: &Path, config: &Qwen2VlConfig) -> Result<Self> {
        let text = TextProcessor::from_dir(dir)?;
        let image = QwenImageProcessor::from_dir(dir)?;
        if image.settings.patch_size != config.vision.patch_size
            || image.settings.merge_size != config.vision.spatial_merge_size
            || image.settings.temporal_patch_size != config.vision.temporal_patch_size
        {
            return Err(Error::Config(format!(
                "{}: the image processor's patch / merge / temporal sizes {:?} differ from the \
                 vision tower's ({}, {}, {})",
                dir.display(),
                image.settings,
                config.vision.patch_size,
                config.vision.spatial_merge_size,
                config.vision.temporal_patch_size
            )));
        }
        match text.token_id(IMAGE_PAD) {
            Some(id) if id == config.image_token_id => {}
            other => {
                return Err(Error::Config(format!(
                    "{}: tokenizer.json and config.json disagree: `{IMAGE_PAD}` is {other:?} in \
                     the tokenizer, image_token_id is {} in config.json",
                    dir.display(),
                    config.image_token_id
                )))
            }
        }
        Ok(Self {
            text,
            image,
            image_token_id: config.image_token_id,
        })
    }

    /// The placeholder text.
    pub fn image_token(&self) -> &str {
        IMAGE_PAD
    }
}

impl SizedPrompts for QwenVlProcessor {
    fn text(&self) -> &TextProcessor {
        &self.text
    }

    fn family(&self) -> &'static str {
        "Qwen2-VL"
    }

    fn tokens_for(&self, height: usize, width: usize) -> Result<usize> {
        self.image.tokens_for(height, width)
    }

    fn tokenize(
        &self,
        text: String,
        tokens: &[usize],
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        let expanded = SizedImages {
            placeholder: IMAGE_PAD,
            open: "",
            close: "",
            video: VIDEO_PAD,
            family: self.family(),
        }
        .expand(&text, tokens)?;
        let ids = match format {
            PromptFormat::Raw => self.text.encode_raw(&expanded)?,
            PromptFormat::Chat => self.text.encode_prompt(&expanded)?,
        };
        let image_tokens = check_image_tokens(&ids, self.image_token_id, tokens.iter().sum())?;
        Ok(PreparedPrompt {
            text,
            ids,
            image_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_rounds_half_to_even_and_fits_the_pixel_range() {
        // 42 / 28 = 1.5 and 70 / 28 = 2.5 both round to 2 (Python's round).
        assert_eq!(smart_resize(42, 70, 28, 1, 1 << 30).unwrap(), (56, 56));
        // Too many pixels: floored into max_pixels.
        let (h, w) = smart_resize(200, 300, 28, 3136, 15680).unwrap();
        assert_eq!((h, w), (84, 140));
        assert!(h * w <= 15680);
        // Too few: ceiled up to min_pixels.
        assert_eq!(smart_resize(30, 40, 28, 3136, 15680).unwrap(), (56, 84));
        // Already on the grid: kept.
        assert_eq!(smart_resize(84, 112, 28, 3136, 15680).unwrap(), (84, 112));
        assert!(smart_resize(1, 201, 28, 3136, 15680).is_err());
        assert!(smart_resize(0, 10, 28, 3136, 15680).is_err());
    }

    #[test]
    fn settings_from_both_layouts() {
        let hub: Value = serde_json::json!({"min_pixels": 100, "max_pixels": 1000,
            "size": {"min_pixels": 100, "max_pixels": 1000}, "patch_size": 14});
        let v5: Value = serde_json::json!({"size": {"shortest_edge": 100, "longest_edge": 1000}});
        let a = QwenImageProcessor::from_json(&hub).unwrap().settings;
        let b = QwenImageProcessor::from_json(&v5).unwrap().settings;
        assert_eq!(a, b);
        assert_eq!((a.min_pixels, a.max_pixels, a.merge_size), (100, 1000, 2));
        let bad: Value = serde_json::json!({"min_pixels": 1000, "max_pixels": 100});
        assert!(QwenImageProcessor::from_json(&bad).is_err());
    }
}
