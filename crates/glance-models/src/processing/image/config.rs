//! `preprocessor_config.json` of a `CLIPImageProcessor`, with transformers' defaults and its
//! legacy spellings of sizes (`get_size_dict`):
//!
//! * `size`: `{"shortest_edge": n}`, `{"height": h, "width": w}`, a bare int (= shortest edge, as
//!   CLIP's `default_to_square = False`) or `[h, w]`;
//! * `crop_size`: `{"height": h, "width": w}`, a bare int (= square) or `[h, w]`;
//! * `image_mean` / `image_std`: a list or one number (used for every channel);
//! * a `null` value means "the default", as in transformers.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value as Json;

use glance_core::{Error, Result};

/// The image processor's settings of a checkpoint in either layout: `preprocessor_config.json`
/// (published checkpoints), else the `image_processor` entry of `processor_config.json` (what
/// transformers 5's `processor.save_pretrained` writes). Returns the settings and the file read.
pub fn image_processor_json(dir: &Path) -> Result<(Json, std::path::PathBuf)> {
    let pre = dir.join("preprocessor_config.json");
    let proc = dir.join("processor_config.json");
    if pre.is_file() {
        return Ok((crate::checkpoint::read_json::<Json>(&pre)?, pre));
    }
    if proc.is_file() {
        let v: Json = crate::checkpoint::read_json(&proc)?;
        let inner = v.get("image_processor").cloned().ok_or_else(|| {
            Error::Config(format!("{}: no `image_processor` entry", proc.display()))
        })?;
        return Ok((inner, proc));
    }
    Err(Error::MissingFile {
        dir: dir.to_path_buf(),
        what: "preprocessor_config.json or processor_config.json (image settings)".into(),
    })
}

/// OpenAI CLIP's normalisation mean (transformers' `OPENAI_CLIP_MEAN`).
pub const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP's normalisation std (transformers' `OPENAI_CLIP_STD`).
pub const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// The resize target of `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeTo {
    /// The shorter side becomes `n`; the longer one `int(n * long / short)` (truncated).
    ShortestEdge(usize),
    /// Exactly `height x width`, aspect ratio ignored.
    Exact { height: usize, width: usize },
}

/// `crop_size`: the centre crop's `(height, width)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropSize {
    pub height: usize,
    pub width: usize,
}

/// Mirror of `preprocessor_config.json` (the fields `CLIPImageProcessor` reads; HF defaults when
/// absent or `null`; other keys are ignored).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Json")]
pub struct PreprocessorConfig {
    pub do_resize: bool,
    pub size: ResizeTo,
    /// PIL resampling code (3 = bicubic, 2 = bilinear, …; see [`super::Filter::from_pil`]).
    pub resample: i64,
    pub do_center_crop: bool,
    pub crop_size: CropSize,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: Vec<f64>,
    pub image_std: Vec<f64>,
    pub do_convert_rgb: bool,
}

impl Default for PreprocessorConfig {
    /// `CLIPImageProcessor()`'s defaults (224 px, bicubic, OpenAI CLIP mean / std).
    fn default() -> Self {
        PreprocessorConfig {
            do_resize: true,
            size: ResizeTo::ShortestEdge(224),
            resample: 3,
            do_center_crop: true,
            crop_size: CropSize {
                height: 224,
                width: 224,
            },
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: OPENAI_CLIP_MEAN.to_vec(),
            image_std: OPENAI_CLIP_STD.to_vec(),
            do_convert_rgb: true,
        }
    }
}

impl TryFrom<Json> for PreprocessorConfig {
    type Error = String;

    fn try_from(json: Json) -> std::result::Result<Self, String> {
        Self::from_json(&json)
    }
}

impl PreprocessorConfig {
    /// Reads `preprocessor_config.json` (JSON errors: [`Error::Json`]; fields of the wrong kind or
    /// size forms transformers' CLIP processor does not use: [`Error::Config`]).
    pub fn from_file(path: &Path) -> Result<Self> {
        let json: Json = crate::checkpoint::read_json(path)?;
        Self::from_json(&json).map_err(|msg| Error::Config(format!("{}: {msg}", path.display())))
    }

    /// Builds the config from parsed JSON (an object); the error names the offending key.
    pub fn from_json(json: &Json) -> std::result::Result<Self, String> {
        let obj = json
            .as_object()
            .ok_or("preprocessor config must be a JSON object")?;
        let d = Self::default();
        let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let flag = |k: &str, default: bool| match get(k) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or(format!("`{k}` must be true or false, got {v}")),
        };
        let size = match get("size") {
            None => d.size,
            Some(v) => parse_size(v).map_err(|e| format!("`size`: {e}"))?,
        };
        let crop_size = match get("crop_size") {
            None => d.crop_size,
            Some(v) => parse_crop(v).map_err(|e| format!("`crop_size`: {e}"))?,
        };
        let resample = match get("resample") {
            None => d.resample,
            Some(v) => v
                .as_i64()
                .ok_or(format!("`resample` must be an integer, got {v}"))?,
        };
        let rescale_factor = match get("rescale_factor") {
            None => d.rescale_factor,
            Some(v) => v
                .as_f64()
                .ok_or(format!("`rescale_factor` must be a number, got {v}"))?,
        };
        let floats = |k: &str, default: Vec<f64>| match get(k) {
            None => Ok(default),
            Some(Json::Number(n)) => Ok(vec![n.as_f64().unwrap_or(f64::NAN); 3]),
            Some(Json::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_f64()
                        .ok_or(format!("`{k}` must hold numbers, got {x}"))
                })
                .collect(),
            Some(v) => Err(format!(
                "`{k}` must be a number or a list of numbers, got {v}"
            )),
        };
        Ok(PreprocessorConfig {
            do_resize: flag("do_resize", d.do_resize)?,
            size,
            resample,
            do_center_crop: flag("do_center_crop", d.do_center_crop)?,
            crop_size,
            do_rescale: flag("do_rescale", d.do_rescale)?,
            rescale_factor,
            do_normalize: flag("do_normalize", d.do_normalize)?,
            image_mean: floats("image_mean", d.image_mean)?,
            image_std: floats("image_std", d.image_std)?,
            do_convert_rgb: flag("do_convert_rgb", d.do_convert_rgb)?,
        })
    }

    /// `(height, width)` of the pixel tensor this config produces: the crop size when it crops,
    /// else the exact resize size. When the output depends on the image (shortest-edge resize
    /// without a crop, or neither resize nor crop) this is the nominal `(n, n)` of the shortest
    /// edge, or `(0, 0)`: use [`PreprocessorConfig::output_size_for`] then.
    pub fn output_size(&self) -> (usize, usize) {
        if self.do_center_crop {
            return (self.crop_size.height, self.crop_size.width);
        }
        match (self.do_resize, self.size) {
            (true, ResizeTo::Exact { height, width }) => (height, width),
            (true, ResizeTo::ShortestEdge(n)) => (n, n),
            (false, _) => (0, 0),
        }
    }

    /// `(height, width)` of the output for an input image of `height x width`.
    pub fn output_size_for(&self, height: usize, width: usize) -> (usize, usize) {
        if self.do_center_crop {
            return (self.crop_size.height, self.crop_size.width);
        }
        if self.do_resize {
            self.resize_target(height, width)
        } else {
            (height, width)
        }
    }

    /// `(height, width)` after the resize step (transformers' `get_resize_output_image_size`).
    pub fn resize_target(&self, height: usize, width: usize) -> (usize, usize) {
        match self.size {
            ResizeTo::Exact { height, width } => (height, width),
            ResizeTo::ShortestEdge(n) => {
                let (short, long) = if width <= height {
                    (width, height)
                } else {
                    (height, width)
                };
                // Python: int(n * long / short) -- exact product, correctly rounded division.
                let new_long = if short == 0 {
                    0
                } else {
                    ((n as u64 * long as u64) as f64 / short as f64) as usize
                };
                if width <= height {
                    (new_long, n)
                } else {
                    (n, new_long)
                }
            }
        }
    }
}

fn as_size(v: &Json) -> std::result::Result<usize, String> {
    v.as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| format!("sizes must be non-negative integers, got {v}"))
}

fn parse_size(v: &Json) -> std::result::Result<ResizeTo, String> {
    match v {
        Json::Number(_) => Ok(ResizeTo::ShortestEdge(as_size(v)?)),
        Json::Array(a) if a.len() == 2 => Ok(ResizeTo::Exact {
            height: as_size(&a[0])?,
            width: as_size(&a[1])?,
        }),
        Json::Array(a) if a.len() == 1 => Ok(ResizeTo::ShortestEdge(as_size(&a[0])?)),
        Json::Object(o) => {
            let key = |k: &str| o.get(k).filter(|v| !v.is_null());
            if key("longest_edge").is_some()
                || key("max_height").is_some()
                || key("max_width").is_some()
            {
                return Err(format!(
                    "{v}: `longest_edge` / `max_height` / `max_width` sizes are not supported \
                     (CLIP uses `shortest_edge` or `height` + `width`)"
                ));
            }
            match (key("shortest_edge"), key("height"), key("width")) {
                (Some(s), _, _) => Ok(ResizeTo::ShortestEdge(as_size(s)?)),
                (None, Some(h), Some(w)) => Ok(ResizeTo::Exact {
                    height: as_size(h)?,
                    width: as_size(w)?,
                }),
                _ => Err(format!(
                    "{v}: needs `shortest_edge` or `height` and `width`"
                )),
            }
        }
        other => Err(format!(
            "{other}: expected an integer, [height, width] or an object"
        )),
    }
}

fn parse_crop(v: &Json) -> std::result::Result<CropSize, String> {
    match v {
        Json::Number(_) => {
            let n = as_size(v)?;
            Ok(CropSize {
                height: n,
                width: n,
            })
        }
        Json::Array(a) if a.len() == 2 => Ok(CropSize {
            height: as_size(&a[0])?,
            width: as_size(&a[1])?,
        }),
        Json::Object(o) => match (o.get("height"), o.get("width")) {
            (Some(h), Some(w)) => Ok(CropSize {
                height: as_size(h)?,
                width: as_size(w)?,
            }),
            _ => Err(format!("{v}: needs `height` and `width`")),
        },
        other => Err(format!(
            "{other}: expected an integer, [height, width] or an object"
        )),
    }
}
