//! `InternVLProcessor` for images: dynamic tiling (`GotOcr2ImageProcessor`'s `crop_to_patches`,
//! which the InternVL processor always turns on): the image is resized to the tile grid whose
//! aspect ratio is closest to its own (`get_optimal_tiled_canvas`, between `min_patches` and
//! `max_patches` tiles), cut into tiles row-major, and followed by a thumbnail of the whole image
//! when there is more than one tile. Values go through the CLIP pipeline. In the prompt each
//! image's `<IMG_CONTEXT>` becomes `<img>`, `image_seq_length` × tiles `<IMG_CONTEXT>` tokens,
//! `</img>` — as transformers' PIL backend computes them (`image_processing_pil_got_ocr2.py`,
//! `processing_internvl.py`).
//!
//! Settings are read from `preprocessor_config.json` (published checkpoints) or from the
//! `image_processor` entry of `processor_config.json` (transformers 5); `image_seq_length` from
//! `processor_config.json` when present.

use super::config::InternVlConfig;
use crate::llava::{PreparedPrompt, PromptFormat};
use crate::processing::chat::{check_image_tokens, SizedImages};
use crate::processing::image::{
    image_processor_json, ImageProcessor, PreprocessorConfig, ResizeTo,
};
use crate::processing::sized::SizedPrompts;
use crate::processing::tokenizer::TextProcessor;
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use image::DynamicImage;
use serde_json::Value;
use std::path::Path;

/// The image placeholder of InternVL's chat template (and each image token).
pub const IMG_CONTEXT: &str = "<IMG_CONTEXT>";
const IMG_START: &str = "<img>";
const IMG_END: &str = "</img>";
const VIDEO: &str = "<video>";

/// transformers' `get_optimal_tiled_canvas`: `(columns, rows)` of the tile grid (between
/// `min_tiles` and `max_tiles` tiles) whose aspect ratio is closest to the image's; on a tie, the
/// later (larger) grid while the image's area exceeds half the grid's.
pub fn tiled_canvas(
    height: usize,
    width: usize,
    tile: (usize, usize),
    min_tiles: usize,
    max_tiles: usize,
) -> (usize, usize) {
    // get_all_supported_aspect_ratios: (w, h) pairs in loop order, stably sorted by area.
    let mut grids = Vec::new();
    for w in 1..=max_tiles {
        for h in 1..=max_tiles {
            if (min_tiles..=max_tiles).contains(&(w * h)) {
                grids.push((w, h));
            }
        }
    }
    grids.sort_by_key(|&(w, h)| w * h);
    let aspect = width as f64 / height as f64;
    let area = (width * height) as f64;
    let mut best_diff = f64::INFINITY;
    let mut best = (1, 1);
    for (w, h) in grids {
        let diff = (aspect - w as f64 / h as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (w, h);
        } else if diff == best_diff && area > 0.5 * (tile.0 * tile.1 * w * h) as f64 {
            best = (w, h);
        }
    }
    best
}

/// The image settings of an InternVL processor.
#[derive(Debug, Clone, PartialEq)]
pub struct InternImageSettings {
    /// Tile `(height, width)` in pixels (`size`).
    pub tile: (usize, usize),
    pub min_patches: usize,
    pub max_patches: usize,
}

/// One pre-processed image.
#[derive(Debug, Clone)]
pub struct InternPixels {
    /// `(tiles, 3, tile_h, tile_w)`: the grid's tiles row-major, then the thumbnail (if any).
    pub tiles: Tensor,
    /// `(columns, rows)` of the grid.
    pub grid: (usize, usize),
}

/// Image pre-processing of an InternVL checkpoint.
#[derive(Debug, Clone)]
pub struct InternImageProcessor {
    pub settings: InternImageSettings,
    /// The CLIP value settings; `size` is set per resize.
    base: PreprocessorConfig,
}

impl InternImageProcessor {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let (json, path) = image_processor_json(dir)?;
        Self::from_json(&json).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    pub fn from_json(json: &Value) -> Result<Self> {
        let get = |k: &str| json.get(k).filter(|v| !v.is_null());
        let num = |k: &str, default: usize| -> Result<usize> {
            match get(k) {
                None => Ok(default),
                Some(x) => x
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| Error::Config(format!("`{k}` must be a whole number, got {x}"))),
            }
        };
        let mut values = json.clone();
        if let Some(o) = values.as_object_mut() {
            o.remove("crop_size");
            o.insert("do_center_crop".into(), Value::Bool(false));
            o.entry("resample").or_insert(Value::from(3));
            o.entry("size")
                .or_insert(serde_json::json!({"height": 384, "width": 384}));
        }
        let base = PreprocessorConfig::from_json(&values).map_err(Error::Config)?;
        let tile = match base.size {
            ResizeTo::Exact { height, width } => (height, width),
            _ => {
                return Err(Error::Config(
                    "`size` must be {\"height\": h, \"width\": w} (the tile size)".into(),
                ))
            }
        };
        let settings = InternImageSettings {
            tile,
            min_patches: num("min_patches", 1)?,
            max_patches: num("max_patches", 12)?,
        };
        if settings.min_patches == 0 || settings.max_patches > 64 || tile.0 == 0 || tile.1 == 0 {
            return Err(Error::Config(format!(
                "min_patches ({}) must be at least 1, max_patches ({}) at most 64 and the tile \
                 size positive",
                settings.min_patches, settings.max_patches
            )));
        }
        Ok(Self { settings, base })
    }

    /// `(columns, rows)` of an image's tile grid (`(1, 1)` without tiling).
    pub fn grid_for(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        if height == 0 || width == 0 {
            return Err(Error::Image(format!(
                "cannot tile a {width}x{height} image"
            )));
        }
        let s = &self.settings;
        if s.max_patches <= 1 {
            return Ok((1, 1));
        }
        Ok(tiled_canvas(
            height,
            width,
            s.tile,
            s.min_patches,
            s.max_patches,
        ))
    }

    /// Tiles an image of `height × width` becomes (transformers' `get_number_of_image_patches`).
    pub fn tiles_for(&self, height: usize, width: usize) -> Result<usize> {
        let (c, r) = self.grid_for(height, width)?;
        Ok(if c * r > 1 { c * r + 1 } else { 1 })
    }

    /// Resized to `height × width`: `(3, height, width)` channel-first values.
    fn resized(&self, img: &DynamicImage, height: usize, width: usize) -> Result<Vec<f32>> {
        let mut config = self.base.clone();
        config.do_resize = true;
        config.size = ResizeTo::Exact { height, width };
        ImageProcessor::new(config)?.preprocess(img)
    }

    /// Pre-processes one image: tiles, then the thumbnail.
    pub fn preprocess(&self, img: &DynamicImage, device: &Device) -> Result<InternPixels> {
        let (th, tw) = self.settings.tile;
        let (cols, rows) = self.grid_for(img.height() as usize, img.width() as usize)?;
        let (h, w) = (rows * th, cols * tw);
        // (3, rows · th, cols · tw) — values are per pixel, so tiles cut after normalising equal
        // tiles cut before.
        let plane = self.resized(img, h, w)?;
        let mut out = Vec::with_capacity((cols * rows + 1) * 3 * th * tw);
        for r in 0..rows {
            for c in 0..cols {
                for ch in 0..3 {
                    for y in 0..th {
                        let start = ch * h * w + (r * th + y) * w + c * tw;
                        out.extend_from_slice(&plane[start..start + tw]);
                    }
                }
            }
        }
        let mut n = cols * rows;
        if n > 1 {
            out.extend(self.resized(img, th, tw)?);
            n += 1;
        }
        Ok(InternPixels {
            tiles: Tensor::from_vec(out, (n, 3, th, tw), device)?,
            grid: (cols, rows),
        })
    }
}

/// Tokenizer, chat template and image processor of one InternVL checkpoint.
pub struct InternVlProcessor {
    pub text: TextProcessor,
    pub image: InternImageProcessor,
    /// Tokens per tile.
    pub image_seq_length: usize,
    image_token_id: u32,
}

impl InternVlProcessor {
    pub fn from_dir(dir: &Path, config: &InternVlConfig) -> Result<Self> {
        let text = TextProcessor::from_dir(dir)?;
        let image = InternImageProcessor::from_dir(dir)?;
        let v = config.vision.image_size;
        if image.settings.tile != (v, v) {
            return Err(Error::Config(format!(
                "{}: the image processor's tile {:?} differs from the vision tower's {v}x{v}",
                dir.display(),
                image.settings.tile
            )));
        }
        let proc = dir.join("processor_config.json");
        let seq = if proc.is_file() {
            let p: Value = crate::checkpoint::read_json(&proc)?;
            p.get("image_seq_length").and_then(Value::as_u64)
        } else {
            None
        };
        let image_seq_length = seq.map_or(config.tokens_per_tile(), |n| n as usize);
        if image_seq_length != config.tokens_per_tile() {
            return Err(Error::Config(format!(
                "{}: image_seq_length {image_seq_length} differs from the {} tokens a tile gives",
                proc.display(),
                config.tokens_per_tile()
            )));
        }
        for token in [IMG_START, IMG_END] {
            if text.token_id(token).is_none() {
                return Err(Error::Config(format!(
                    "{}: the tokenizer has no `{token}` token",
                    dir.display()
                )));
            }
        }
        match text.token_id(IMG_CONTEXT) {
            Some(id) if id == config.image_token_id => {}
            other => {
                return Err(Error::Config(format!(
                    "{}: tokenizer.json and config.json disagree: `{IMG_CONTEXT}` is {other:?} \
                     in the tokenizer, image_token_id is {} in config.json",
                    dir.display(),
                    config.image_token_id
                )))
            }
        }
        Ok(Self {
            text,
            image,
            image_seq_length,
            image_token_id: config.image_token_id,
        })
    }

    /// The placeholder text.
    pub fn image_token(&self) -> &str {
        IMG_CONTEXT
    }
}

impl SizedPrompts for InternVlProcessor {
    fn text(&self) -> &TextProcessor {
        &self.text
    }

    fn family(&self) -> &'static str {
        "InternVL"
    }

    fn tokens_for(&self, height: usize, width: usize) -> Result<usize> {
        Ok(self.image.tiles_for(height, width)? * self.image_seq_length)
    }

    fn tokenize(
        &self,
        text: String,
        tokens: &[usize],
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        let expanded = SizedImages {
            placeholder: IMG_CONTEXT,
            open: IMG_START,
            close: IMG_END,
            video: VIDEO,
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
    fn tiled_canvas_matches_transformers_choices() {
        let t = (56, 56);
        // 3:2 → 3 columns, 2 rows; 10:1 → 6x1; 2:15 → 1x6.
        assert_eq!(tiled_canvas(200, 300, t, 1, 6), (3, 2));
        assert_eq!(tiled_canvas(28, 280, t, 1, 6), (6, 1));
        assert_eq!(tiled_canvas(150, 20, t, 1, 6), (1, 6));
        // Squares: ties between 1x1 and 2x2 go to 2x2 only once the image covers half of it.
        assert_eq!(tiled_canvas(60, 60, t, 1, 6), (1, 1));
        assert_eq!(tiled_canvas(112, 112, t, 1, 6), (2, 2));
        // min_patches excludes the single tile.
        assert_eq!(tiled_canvas(60, 60, t, 2, 6), (2, 2));
    }

    #[test]
    fn settings_and_tile_counts() {
        let p = InternImageProcessor::from_json(&serde_json::json!({
            "size": {"height": 56, "width": 56}, "max_patches": 6}))
        .unwrap();
        assert_eq!(p.settings.tile, (56, 56));
        assert_eq!(p.tiles_for(200, 300).unwrap(), 7);
        assert_eq!(p.tiles_for(60, 60).unwrap(), 1);
        assert!(p.tiles_for(0, 60).is_err());
        assert!(InternImageProcessor::from_json(&serde_json::json!({
            "size": {"shortest_edge": 56}}))
        .is_err());
    }
}
