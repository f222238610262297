//! Real-shape twins: a small trained model embedded, function preserved, in the text decoder of a
//! real model's shape.
//!
//! glance-tiny fits in cache, so its speed says nothing about a real model. Its twin at, say,
//! TinyLlama-1.1B's shape streams the bytes and does the multiply-adds of a 1.1B decoder, yet
//! gives glance-tiny's answers (up to float rounding), so every decoding strategy can be timed at
//! the real shape with the acceptance it really has. The construction (`docs/twins.md`):
//!
//! * the small residual stream lives in the first `d_s` dims of the big one; padded dims stay 0;
//!   RMSNorm weights are scaled by `√(d_s/d_b)` and eps by `d_s/d_b`;
//! * small heads map onto big heads that keep the GQA grouping ([`map::TwinMap`]); a head of 64
//!   dims sits in one of 128 with rotary pair `j` at pair `2j` and the queries scaled by `√2`;
//! * padded query, key, value, gate and up rows are random; the `o_proj` / `down_proj` columns
//!   that read them, and every row writing a padded residual dim, are zero;
//! * layers beyond the small model's are random with zero output projections (identity blocks);
//! * the padded vocabulary is never produced: the twin's logits of ids `≥` the small vocabulary
//!   are masked ([`crate::text::TextModel::limit_vocab`]);
//! * the projector writes into the real dims only; the vision tower stays the small model's;
//! * draft heads and block-diffusion models get twins by the same rules.
//!
//! The twin is never written anywhere: [`backend::TwinBackend`] makes each tensor when the normal
//! loader asks for it, and the loader packs it in the wanted weight format at once.

mod backend;
mod map;

use crate::checkpoint::{read_json, required_file, var_builder};
use crate::draft::{DraftConfig, DraftHead};
use crate::llava::{Llava, LlavaConfig, WeightLayout};
use crate::presets;
use crate::text::TextConfig;
use backend::{decoder_site, Resolve, Site, TwinBackend};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::{Mode, WeightFormat, WeightLoad};
use map::TwinMap;
use serde_json::Value;
use std::path::Path;

/// The named twin shapes.
pub const TWIN_SHAPES: [&str; 6] = [
    "tinyllama-1.1b",
    "llava-7b",
    "llava-next-7b",
    "qwen2.5-vl-3b",
    "qwen2.5-vl-7b",
    "internvl2.5-4b",
];

/// The seed of every twin's random parts (each tensor draws its own stream by name).
const SEED: u64 = 0;

/// The text-decoder shape a twin takes: a name and the sizes (a HF text config).
#[derive(Debug, Clone, PartialEq)]
pub struct TwinShape {
    name: String,
    text: Value,
}

impl TwinShape {
    /// A named shape: `tinyllama-1.1b` (22 layers, d2048, 32 query / 4 KV heads of 64, 5632
    /// MLP units, vocabulary 32000), `llava-7b` (Llava-1.5-7B's Llama-2-7B: 32 layers, d4096,
    /// 32 / 32 heads of 128, 11008 units, vocabulary 32064), or the decoders of the seeds' models
    /// ([`presets`]): `llava-next-7b` (Mistral-7B, 32 / 8 heads, vocabulary 32064),
    /// `qwen2.5-vl-3b` (36 layers, d2048, 16 / 2 heads), `qwen2.5-vl-7b` (28 layers, d3584, 28 /
    /// 4 heads) and `internvl2.5-4b` (Qwen2.5-3B). A twin keeps the small model's kind of
    /// decoder (its RoPE, no attention biases), so it reads the bytes and does the multiply-adds
    /// of the shape's decoder; it is exact only where the small model fits the shape (the KV
    /// heads above all: glance-tiny's 4 do not fit the 3B / 4B decoders' 2, see [`map::TwinMap`]).
    pub fn preset(name: &str) -> Result<Self> {
        let text = match name {
            "tinyllama-1.1b" => presets::text_config_value(name)?,
            "llava-7b" | "llava-next-7b" => {
                let backbone = if name == "llava-7b" {
                    "llama-2-7b"
                } else {
                    "mistral-7b"
                };
                let mut v = presets::text_config_value(backbone)?;
                v["vocab_size"] = Value::from(presets::LLAVA_VOCAB);
                v
            }
            "qwen2.5-vl-3b" | "qwen2.5-vl-7b" | "internvl2.5-4b" => {
                presets::text_config_value(name)?
            }
            other => {
                return Err(Error::InvalidParam(format!(
                    "unknown twin shape `{other}` (available: {})",
                    TWIN_SHAPES.join(", ")
                )))
            }
        };
        Ok(Self {
            name: name.to_string(),
            text,
        })
    }

    /// Any shape, from the sizes of a HF text config (tests use reduced shapes).
    pub fn custom(name: &str, text: Value) -> Self {
        Self {
            name: name.to_string(),
            text,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shape's sizes.
    pub fn sizes(&self) -> Result<TextConfig> {
        TextConfig::from_value(&self.text)
    }
}

impl std::str::FromStr for TwinShape {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::preset(s)
    }
}

impl std::fmt::Display for TwinShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The twin's HF text config: the small model's (`small`: its architecture, activation, RoPE,
/// biases, token ids, context) with the sizes of `big` and `rms_norm_eps` scaled by `d_s / d_b`.
pub fn twin_text_value(small: &Value, big: &TextConfig) -> Result<Value> {
    let parsed = TextConfig::from_value(small)?;
    let mut v = small.clone();
    let obj = v
        .as_object_mut()
        .ok_or_else(|| Error::Config("the text config is not an object".into()))?;
    let eps = parsed.rms_norm_eps * parsed.hidden_size as f64 / big.hidden_size as f64;
    for (key, value) in [
        ("hidden_size", big.hidden_size),
        ("intermediate_size", big.intermediate_size),
        ("num_hidden_layers", big.num_layers),
        ("num_attention_heads", big.num_heads),
        ("num_key_value_heads", big.num_kv_heads),
        ("head_dim", big.head_dim),
        ("vocab_size", big.vocab_size),
    ] {
        obj.insert(key.into(), Value::from(value));
    }
    obj.insert("rms_norm_eps".into(), Value::from(eps));
    // Per-layer attention types: the extra layers repeat the last (they are identities anyway).
    if let Some(Value::Array(types)) = obj.get_mut("layer_types") {
        if let Some(last) = types.last().cloned() {
            types.resize(big.num_layers, last);
        }
    }
    Ok(v)
}

/// The twin of the LLaVA config `small` (a whole `config.json`): its text config at `shape`.
pub fn twin_llava_value(small: &Value, shape: &TwinShape) -> Result<Value> {
    let text = small
        .get("text_config")
        .ok_or_else(|| Error::Config("config.json has no text_config".into()))?;
    let mut v = small.clone();
    v["text_config"] = twin_text_value(text, &shape.sizes()?)?;
    Ok(v)
}

/// The twin config of the LLaVA checkpoint `dir` at `shape`.
pub fn llava_config(dir: &Path, shape: &TwinShape) -> Result<LlavaConfig> {
    let path = required_file(dir, "config.json")?;
    let small: Value = read_json(&path)?;
    LlavaConfig::from_value(&twin_llava_value(&small, shape)?)
}

/// Refuses a twin whose weights in `format` would not fit in `available` bytes (when known):
/// e.g. the `llava-7b` twin in f32 needs about 27 GB.
pub fn check_fits(
    config: &LlavaConfig,
    format: WeightFormat,
    available: Option<u64>,
) -> Result<()> {
    let need = config.text.num_parameters() as f64 * format.bits_per_weight() / 8.0;
    match available {
        Some(avail) if need > 0.9 * avail as f64 => Err(Error::InvalidParam(format!(
            "a twin of {} parameters in {format} needs about {:.1} GB; this machine has {:.1} GB \
             available (try --weights bf16, q8 or q4)",
            config.text.num_parameters(),
            need / 1e9,
            avail as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

/// Loads the LLaVA checkpoint `dir` as its twin at `shape`, the text decoder's linear weights in
/// `format` (as [`Llava::load_as`]). Refused up front when the weights cannot fit in memory.
pub fn load_llava(
    dir: &Path,
    device: &Device,
    format: WeightFormat,
    shape: &TwinShape,
) -> Result<Llava> {
    let small = LlavaConfig::from_dir(dir)?;
    let config = llava_config(dir, shape)?;
    check_fits(&config, format, glance_nn::runtime::available_memory())?;
    let small_vb = var_builder(dir, DType::F32, device)?;
    let layout = WeightLayout::detect(&small_vb);
    let backend = TwinBackend {
        small: small_vb,
        map: TwinMap::new(&small.text, &config.text)?,
        resolve: llava_sites(&layout),
        seed: SEED,
    };
    let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
    let load = WeightLoad::new(format);
    let mut model = Llava::from_var_builder_as(&vb, config, &layout, Mode::Infer, &load)?;
    model.limit_vocab(small.text.vocab_size);
    Ok(model)
}

/// Loads the draft head `dir` as the twin that goes with its target's twin at `shape`.
pub fn load_draft(
    dir: &Path,
    device: &Device,
    format: WeightFormat,
    shape: &TwinShape,
) -> Result<DraftHead> {
    let small = DraftConfig::load(dir)?;
    let small_layer = small.layer_config()?;
    let mut big = shape.sizes()?;
    big.num_layers = small_layer.num_layers;
    let config = DraftConfig {
        text_config: twin_text_value(&small.text_config, &big)?,
        ..small
    };
    let small_vb = var_builder(dir, DType::F32, device)?;
    let backend = TwinBackend {
        small: small_vb,
        map: TwinMap::new(&small_layer, &config.layer_config()?)?,
        resolve: Box::new(draft_site),
        seed: SEED,
    };
    let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
    DraftHead::from_var_builder_as(&vb, config, Mode::Infer, &WeightLoad::new(format))
}

/// Sites of a LLaVA checkpoint's names under `layout`.
fn llava_sites(layout: &WeightLayout) -> Resolve {
    let text = format!("{}.", layout.text);
    let lm_head = format!("{}.weight", layout.lm_head);
    let projector = format!("{}.", layout.projector);
    Box::new(move |name: &str| {
        if name == lm_head {
            return Site::LmHead;
        }
        if let Some(rel) = name.strip_prefix(&text) {
            return decoder_site(rel).unwrap_or(Site::Same);
        }
        match name.strip_prefix(&projector) {
            Some("linear_1.weight") => Site::Projector1 { bias: false },
            Some("linear_1.bias") => Site::Projector1 { bias: true },
            Some("linear_2.weight") => Site::Projector2 { bias: false },
            Some("linear_2.bias") => Site::Projector2 { bias: true },
            _ => Site::Same,
        }
    })
}

/// Sites of a draft head's names ([`DraftHead::from_var_builder`]).
fn draft_site(name: &str) -> Site {
    match name {
        "fc.weight" | "inject.weight" => Site::Concat { bias: false },
        "fc.bias" => Site::Concat { bias: true },
        "norm.weight" | "adaptor.norm.weight" => Site::Norm,
        "adaptor.queries" => Site::AdaptorQueries,
        _ => {
            if let Some(leaf) = name.strip_prefix("adaptor.") {
                Site::Adaptor { leaf: leaf.into() }
            } else if let Some(leaf) = name.strip_prefix("layer.") {
                Site::Layer {
                    layer: 0,
                    leaf: leaf.into(),
                }
            } else {
                Site::Same
            }
        }
    }
}

#[cfg(test)]
mod tests;
