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
            "qwen2" => Ok(TextArch::Qwen2),
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
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            TextArch::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let layer_windows = layer_windows(arch, &raw, num_layers)?;
        Ok(Self {
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
        })
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
        "default" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: need("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")? as usize,
        }),
        other => {
            return Err(Error::Config(format!(
                "rope scaling type `{other}` is not supported (default, linear, llama3)"
            )))
        }
    };
    Ok((theta, scaling))
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
}
