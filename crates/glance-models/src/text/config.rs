//! Typed mirror of the text part of a HF config (`LlamaConfig`, `MistralConfig`, `Qwen2Config`),
//! with each architecture's HF defaults. Handles both the transformers-4 (`rope_theta`,
//! `rope_scaling`) and transformers-5 (`rope_parameters`) spellings.

use glance_core::{Error, Result};
use glance_nn::{Activation, RopeScaling};
use serde::Deserialize;
use serde_json::Value;

/// Which decoder family (`text_config.model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextArch {
    Llama,
    Mistral,
    Qwen2,
}

impl TextArch {
    fn parse(model_type: Option<&str>) -> Result<Self> {
        match model_type.unwrap_or("llama") {
            "llama" => Ok(TextArch::Llama),
            "mistral" => Ok(TextArch::Mistral),
            // Qwen2-VL's and Qwen2.5-VL's decoders are Qwen2 with M-RoPE (`mrope_section`).
            "qwen2" | "qwen2_vl" | "qwen2_vl_text" | "qwen2_5_vl" | "qwen2_5_vl_text" => {
                Ok(TextArch::Qwen2)
            }
            other => Err(Error::Config(format!(
                "text model_type `{other}` is not supported (llama, mistral, qwen2)"
            ))),
        }
    }
}

/// Resolved text-decoder configuration.
#[derive(Debug, Clone)]
pub struct TextConfig {
    pub arch: TextArch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub hidden_act: Activation,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// Bias on q / k / v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Sliding-window size per layer (`None`: full causal attention).
    pub layer_windows: Vec<Option<usize>>,
    /// Multimodal RoPE (Qwen2-VL): how many of the `head_dim / 2` frequencies turn at a row's
    /// temporal, height and width position. `None`: 1-D RoPE.
    pub mrope_section: Option<Vec<usize>>,
}

/// Every field optional: defaults depend on the architecture.
#[derive(Debug, Default, Deserialize)]
struct Raw {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_act: Option<Activation>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
}

impl TextConfig {
    /// Parses a text config object (the `text_config` of a LLaVA config, or a whole LLM config).
    pub fn from_value(v: &Value) -> Result<Self> {
        let raw: Raw = serde_json::from_value(v.clone())
            .map_err(|e| Error::Config(format!("text_config: {e}")))?;
        let arch = TextArch::parse(raw.model_type.as_deref())?;
        // (vocab, hidden, intermediate, layers, heads, kv_heads, max_pos) defaults per HF class.
        let (vocab, hidden, inter, layers, heads, kv, max_pos) = match arch {
            TextArch::Llama => (32000, 4096, 11008, 32, 32, None, 2048),
            TextArch::Mistral => (32000, 4096, 14336, 32, 32, Some(8), 4096 * 32),
            TextArch::Qwen2 => (151936, 4096, 22016, 32, 32, Some(32), 32768),
        };
        let hidden_size = raw.hidden_size.unwrap_or(hidden);
        let num_heads = raw.num_attention_heads.unwrap_or(heads);
        let num_kv_heads = raw.num_key_value_heads.or(kv).unwrap_or(num_heads);
        let num_layers = raw.num_hidden_layers.unwrap_or(layers);
        // Before `layer_windows` allocates one entry per layer.
        size_in_range("text_config.num_hidden_layers", num_layers, MAX_LAYERS)?;
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(Error::Config(format!(
                "num_attention_heads ({num_heads}) must be a positive multiple of num_key_value_heads ({num_kv_heads})"
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(hidden_size / num_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "head_dim must be even and positive, got {head_dim}"
            )));
        }
        let (rope_theta, rope_scaling) = parse_rope(&raw)?;
        let mrope_section = parse_mrope_section(&raw)?;
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            TextArch::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let layer_windows = layer_windows(arch, &raw, num_layers)?;
        let config = Self {
            arch,
            vocab_size: raw.vocab_size.unwrap_or(vocab),
            hidden_size,
            intermediate_size: raw.intermediate_size.unwrap_or(inter),
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            hidden_act: raw.hidden_act.unwrap_or(Activation::Silu),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(max_pos),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            layer_windows,
            mrope_section,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks every size, epsilon and RoPE parameter for a value that cannot describe a real
    /// model: zero or absurd sizes, non-positive or non-finite epsilons, θ and scaling factors,
    /// a sliding window of 0. Such configs load fine and give NaN logits (or ignore the
    /// checkpoint's layers), so they are refused here, naming the field and the value.
    pub fn validate(&self) -> Result<()> {
        for (field, value, max) in [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH),
            ("num_hidden_layers", self.num_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_kv_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
        ] {
            size_in_range(&format!("text_config.{field}"), value, max)?;
        }
        positive_below_one("text_config.rms_norm_eps", self.rms_norm_eps)?;
        if !(self.rope_theta > 0.0 && (self.rope_theta as f32).is_finite()) {
            return Err(Error::Config(format!(
                "text_config.rope_theta must be a positive finite number, got {}",
                self.rope_theta
            )));
        }
        let positive = |field: &str, v: f64| {
            if v > 0.0 && (v as f32).is_finite() {
                Ok(())
            } else {
                Err(Error::Config(format!(
                    "text_config rope scaling `{field}` must be a positive finite number, got {v}"
                )))
            }
        };
        match &self.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => positive("factor", *factor)?,
            Some(RopeScaling::Factors(factors)) => {
                if factors.len() != self.head_dim / 2 {
                    return Err(Error::Config(format!(
                        "text_config rope frequency factors: {} given, head_dim {} needs {}",
                        factors.len(),
                        self.head_dim,
                        self.head_dim / 2
                    )));
                }
                for &f in factors {
                    positive("frequency factor", f64::from(f))?;
                }
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("high_freq_factor", *high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(Error::Config(format!(
                        "text_config rope scaling `high_freq_factor` ({high_freq_factor}) must be \
                         larger than `low_freq_factor` ({low_freq_factor})"
                    )));
                }
                size_in_range(
                    "text_config rope scaling `original_max_position_embeddings`",
                    *original_max_position_embeddings,
                    MAX_POSITIONS,
                )?;
            }
        }
        if let Some(section) = &self.mrope_section {
            if section.len() != 3 || section.iter().sum::<usize>() != self.head_dim / 2 {
                return Err(Error::Config(format!(
                    "text_config mrope_section must have 3 parts summing to head_dim / 2 = {}, \
                     got {section:?}",
                    self.head_dim / 2
                )));
            }
        }
        if self.layer_windows.contains(&Some(0)) {
            return Err(Error::Config(
                "text_config.sliding_window must be at least 1, got 0".into(),
            ));
        }
        Ok(())
    }

    /// Bytes of the KV cache over `rows` rows: f32 keys and values of every layer's KV heads.
    pub fn kv_bytes(&self, rows: usize) -> usize {
        2 * self.num_layers * rows * self.num_kv_heads * self.head_dim * 4
    }

    /// Parameters of the decoder (embeddings and LM head counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (h, i, hd) = (self.hidden_size, self.intermediate_size, self.head_dim);
        let q = self.num_heads * hd;
        let kv = self.num_kv_heads * hd;
        let attn = h * q + 2 * h * kv + q * h;
        let mlp = 3 * h * i;
        let per_layer = attn + mlp + 2 * h;
        let emb = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { emb };
        emb + head + self.num_layers * per_layer + h
    }
}

/// Upper bounds that no real checkpoint reaches (each well above the largest published model),
/// so that a typo or a hostile config cannot ask for terabytes.
const MAX_VOCAB: usize = 1 << 24;
const MAX_WIDTH: usize = 1 << 20;
const MAX_LAYERS: usize = 1024;
const MAX_HEADS: usize = 1 << 12;
const MAX_HEAD_DIM: usize = 1 << 12;
const MAX_POSITIONS: usize = 1 << 26;

/// `Error::Config` unless `1 <= value <= max`.
pub(crate) fn size_in_range(field: &str, value: usize, max: usize) -> Result<()> {
    if value == 0 || value > max {
        return Err(Error::Config(format!(
            "{field} must be in 1..={max}, got {value}"
        )));
    }
    Ok(())
}

/// `Error::Config` unless `0 < value < 1` (normalisation epsilons).
pub(crate) fn positive_below_one(field: &str, value: f64) -> Result<()> {
    if !(value > 0.0 && value < 1.0) {
        return Err(Error::Config(format!(
            "{field} must be a positive number below 1, got {value}"
        )));
    }
    Ok(())
}

/// A whole positive number from a float field (`original_max_position_embeddings`).
fn whole(kind: &str, k: &str, v: f64) -> Result<usize> {
    if v >= 1.0 && v.fract() == 0.0 && v <= MAX_POSITIONS as f64 {
        Ok(v as usize)
    } else {
        Err(Error::Config(format!(
            "rope scaling `{kind}`: `{k}` must be a whole number in 1..={MAX_POSITIONS}, got {v}"
        )))
    }
}

/// `rope_theta` and the scaling, from either spelling.
fn parse_rope(raw: &Raw) -> Result<(f64, Option<RopeScaling>)> {
    let params = raw.rope_parameters.as_ref().filter(|v| v.is_object());
    let theta = params
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .or(raw.rope_theta)
        .unwrap_or(10000.0);
    let scaling_src = match (params, raw.rope_scaling.as_ref().filter(|v| v.is_object())) {
        (_, Some(s)) => Some(s),
        (Some(p), None) => Some(p),
        (None, None) => None,
    };
    let Some(s) = scaling_src else {
        return Ok((theta, None));
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    let need =
        |k: &str| num(k).ok_or_else(|| Error::Config(format!("rope scaling `{kind}` needs `{k}`")));
    let scaling = match kind {
        // M-RoPE's frequencies are the default ones ([`parse_mrope_section`] reads its sections).
        "default" | "mrope" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: need("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: whole(
                kind,
                "original_max_position_embeddings",
                need("original_max_position_embeddings")?,
            )?,
        }),
        other => {
            return Err(Error::Config(format!(
                "rope scaling type `{other}` is not supported (default, linear, llama3)"
            )))
        }
    };
    Ok((theta, scaling))
}

/// `mrope_section` of the RoPE settings (`rope_scaling` of published Qwen2-VL configs, with
/// `type: mrope`; `rope_parameters` of transformers 5).
fn parse_mrope_section(raw: &Raw) -> Result<Option<Vec<usize>>> {
    let section = [raw.rope_scaling.as_ref(), raw.rope_parameters.as_ref()]
        .into_iter()
        .flatten()
        .find_map(|v| v.get("mrope_section"));
    let Some(section) = section else {
        return Ok(None);
    };
    serde_json::from_value(section.clone())
        .map(Some)
        .map_err(|e| Error::Config(format!("mrope_section: {e}")))
}

/// Which layers use a sliding window, as each HF class decides it.
fn layer_windows(arch: TextArch, raw: &Raw, num_layers: usize) -> Result<Vec<Option<usize>>> {
    let window = match arch {
        TextArch::Llama => None,
        TextArch::Mistral => raw.sliding_window,
        TextArch::Qwen2 if raw.use_sliding_window.unwrap_or(false) => raw.sliding_window,
        TextArch::Qwen2 => None,
    };
    if let Some(types) = &raw.layer_types {
        if types.len() != num_layers {
            return Err(Error::Config(format!(
                "layer_types has {} entries for {num_layers} layers",
                types.len()
            )));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(None),
                "sliding_attention" => Ok(window.or(raw.sliding_window)),
                other => Err(Error::Config(format!(
                    "layer type `{other}` is not supported"
                ))),
            })
            .collect();
    }
    let first_windowed = match arch {
        TextArch::Qwen2 => raw.max_window_layers.unwrap_or(28),
        _ => 0,
    };
    Ok((0..num_layers)
        .map(|i| if i >= first_windowed { window } else { None })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llama_defaults_like_llava_1_5() {
        // The text_config of llava-hf/llava-1.5-7b-hf lists only a few fields.
        let c =
            TextConfig::from_value(&json!({"model_type": "llama", "vocab_size": 32064})).unwrap();
        assert_eq!(
            (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads),
            (4096, 32, 32, 32)
        );
        assert_eq!(
            (c.head_dim, c.intermediate_size, c.vocab_size),
            (128, 11008, 32064)
        );
        assert!(!c.tie_word_embeddings && !c.qkv_bias);
        assert_eq!(c.layer_windows, vec![None; 32]);
        // ~6.7B parameters.
        assert!((6_600_000_000..6_800_000_000).contains(&c.num_parameters()));
        // LLaVA-1.5-7B's KV cache: 1 MiB per row (32 layers × 32 heads × 128 × K and V × f32).
        assert_eq!(c.kv_bytes(1), 1 << 20);
        assert_eq!(c.kv_bytes(576), 576 << 20);
    }

    #[test]
    fn qwen2_has_biases_and_v5_rope_parameters() {
        let c = TextConfig::from_value(&json!({
            "model_type": "qwen2", "hidden_size": 56, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}
        }))
        .unwrap();
        assert!(c.qkv_bias && !c.o_bias);
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.rope_scaling, None);
        assert_eq!(c.head_dim, 14);
    }

    #[test]
    fn mistral_window_and_rope_scaling_and_errors() {
        let c = TextConfig::from_value(&json!({
            "model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 24,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}
        }))
        .unwrap();
        assert_eq!(c.layer_windows, vec![Some(24); 2]);
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        assert!(TextConfig::from_value(&json!({"model_type": "gpt2"})).is_err());
        assert!(TextConfig::from_value(
            &json!({"num_attention_heads": 6, "num_key_value_heads": 4})
        )
        .is_err());
        assert!(
            TextConfig::from_value(&json!({"rope_scaling": {"type": "yarn", "factor": 4.0}}))
                .is_err()
        );
    }

    /// The `Error::Config` message of a config that must be refused.
    fn refused(v: serde_json::Value) -> String {
        match TextConfig::from_value(&v) {
            Err(Error::Config(m)) => m,
            other => panic!("{v} accepted or wrong error: {other:?}"),
        }
    }

    #[test]
    fn values_that_give_nan_logits_are_refused_naming_the_field() {
        let llama3 = |k: &str, v: serde_json::Value| {
            let mut s = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
            s[k] = v;
            json!({"rope_scaling": s})
        };
        for (config, field) in [
            (json!({"rope_theta": 0.0}), "rope_theta"),
            (json!({"rope_theta": -1.0}), "rope_theta"),
            (json!({"rope_theta": 1e300}), "rope_theta"),
            (
                json!({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}}),
                "rope_theta",
            ),
            (json!({"rms_norm_eps": -1e-6}), "rms_norm_eps"),
            (json!({"rms_norm_eps": 0.0}), "rms_norm_eps"),
            (
                json!({"model_type": "mistral", "sliding_window": 0}),
                "sliding_window",
            ),
            (
                json!({"rope_scaling": {"rope_type": "linear", "factor": 0.0}}),
                "factor",
            ),
            (
                json!({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}),
                "factor",
            ),
            (llama3("factor", json!(0.0)), "factor"),
            (llama3("low_freq_factor", json!(4.0)), "high_freq_factor"),
            (llama3("high_freq_factor", json!(-1.0)), "high_freq_factor"),
            (
                llama3("original_max_position_embeddings", json!(0)),
                "original_max_position_embeddings",
            ),
            (
                llama3("original_max_position_embeddings", json!(-64.0)),
                "original_max_position_embeddings",
            ),
            (json!({"num_hidden_layers": 0}), "num_hidden_layers"),
            (
                json!({"num_hidden_layers": 1u64 << 40}),
                "num_hidden_layers",
            ),
            (json!({"vocab_size": 0}), "vocab_size"),
            (json!({"hidden_size": 0, "head_dim": 8}), "hidden_size"),
            (json!({"intermediate_size": 0}), "intermediate_size"),
            (
                json!({"max_position_embeddings": 0}),
                "max_position_embeddings",
            ),
            (json!({"hidden_size": 1u64 << 40}), "hidden_size"),
        ] {
            let msg = refused(config.clone());
            assert!(msg.contains(field), "{config}: {msg}");
        }
        // A Qwen2 window that is switched off is not checked (as HF ignores it).
        assert!(
            TextConfig::from_value(&json!({"model_type": "qwen2", "sliding_window": 0,
            "use_sliding_window": false}))
            .is_ok()
        );
    }
}
