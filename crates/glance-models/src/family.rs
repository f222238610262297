//! Which architecture a checkpoint holds, read once from its `config.json` (`architectures`,
//! else `model_type`): the seam through which each family's config, processor and model load.

use crate::checkpoint::read_json;
use glance_core::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// A supported vision-language architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlavaForConditionalGeneration` (LLaVA-1.5 layout).
    Llava,
    /// `LlavaNextForConditionalGeneration` (LLaVA-1.6, anyres images): loads as
    /// [`crate::llava::Llava`].
    LlavaNext,
    /// `Qwen2VLForConditionalGeneration`.
    Qwen2Vl,
    /// `Qwen2_5_VLForConditionalGeneration`.
    Qwen25Vl,
    /// `InternVLForConditionalGeneration` (transformers' InternVL layout).
    InternVl,
}

/// `(architectures entry, model_type, family)`.
const KNOWN: &[(&str, &str, Family)] = &[
    ("LlavaForConditionalGeneration", "llava", Family::Llava),
    (
        "LlavaNextForConditionalGeneration",
        "llava_next",
        Family::LlavaNext,
    ),
    (
        "Qwen2VLForConditionalGeneration",
        "qwen2_vl",
        Family::Qwen2Vl,
    ),
    (
        "Qwen2_5_VLForConditionalGeneration",
        "qwen2_5_vl",
        Family::Qwen25Vl,
    ),
    (
        "InternVLForConditionalGeneration",
        "internvl",
        Family::InternVl,
    ),
];

/// Architectures users bring that glance recognises but does not run yet.
const NOT_YET: &[&str] = &["InternVLChatModel"];

impl Family {
    /// The family of a parsed `config.json`: the first `architectures` entry glance knows, else
    /// `model_type`.
    pub fn of_config(v: &Value) -> Result<Self> {
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for a in &archs {
            if let Some((_, _, f)) = KNOWN.iter().find(|(name, _, _)| name == a) {
                return Ok(*f);
            }
        }
        let model_type = v.get("model_type").and_then(Value::as_str);
        if let Some(mt) = model_type {
            if let Some((_, _, f)) = KNOWN.iter().find(|(_, t, _)| *t == mt) {
                return Ok(*f);
            }
        }
        let named = archs
            .first()
            .map(|s| s.to_string())
            .or(model_type.map(|s| format!("model_type `{s}`")))
            .unwrap_or_else(|| "a config without `architectures` or `model_type`".into());
        let later = if archs.iter().any(|a| NOT_YET.contains(a)) {
            " (not supported yet)"
        } else {
            ""
        };
        Err(Error::Config(format!(
            "unsupported architecture {named}{later}; glance runs {}",
            KNOWN
                .iter()
                .map(|(a, _, _)| *a)
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// The family of the checkpoint in `dir`.
    pub fn of_dir(dir: &Path) -> Result<Self> {
        let path = crate::checkpoint::required_file(dir, "config.json")?;
        let v: Value = read_json(&path)?;
        Self::of_config(&v).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// The family's name in messages ("Qwen2.5-VL").
    pub fn name(self) -> &'static str {
        match self {
            Family::Llava => "LLaVA",
            Family::LlavaNext => "LLaVA-NeXT",
            Family::Qwen2Vl => "Qwen2-VL",
            Family::Qwen25Vl => "Qwen2.5-VL",
            Family::InternVl => "InternVL",
        }
    }

    /// Whether the checkpoint loads as [`crate::llava::Llava`] (LLaVA-1.5 or LLaVA-NeXT).
    pub fn is_llava(self) -> bool {
        matches!(self, Family::Llava | Family::LlavaNext)
    }

    /// Whether the decoder turns rows with 3-D (M-RoPE) positions.
    pub fn uses_mrope(self) -> bool {
        matches!(self, Family::Qwen2Vl | Family::Qwen25Vl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn architectures_first_then_model_type_and_clear_refusals() {
        let f = |v: Value| Family::of_config(&v);
        assert_eq!(
            f(json!({"architectures": ["Qwen2_5_VLForConditionalGeneration"]})).unwrap(),
            Family::Qwen25Vl
        );
        assert_eq!(
            f(json!({"model_type": "qwen2_vl"})).unwrap(),
            Family::Qwen2Vl
        );
        assert_eq!(f(json!({"model_type": "llava"})).unwrap(), Family::Llava);
        assert_eq!(
            f(json!({"architectures": ["InternVLForConditionalGeneration"]})).unwrap(),
            Family::InternVl
        );
        assert_eq!(
            f(json!({"model_type": "internvl"})).unwrap(),
            Family::InternVl
        );
        assert_eq!(
            f(json!({"architectures": ["LlavaNextForConditionalGeneration"]})).unwrap(),
            Family::LlavaNext
        );
        let e = f(json!({"architectures": ["InternVLChatModel"]}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("InternVLChatModel") && e.contains("not supported yet"),
            "{e}"
        );
        assert!(f(json!({})).is_err());
    }
}
