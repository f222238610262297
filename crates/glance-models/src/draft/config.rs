//! A draft head's `config.json`.

use crate::checkpoint::read_json;
use crate::text::TextConfig;
use glance_core::{Error, Result};
use glance_nn::DraftKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// `model_type` of a draft head directory.
pub const DRAFT_MODEL_TYPE: &str = "glance_draft";

/// Most compressed tokens per image an adaptor may produce.
const MAX_QUERIES: usize = 4096;

/// What a draft head directory's `config.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftConfig {
    /// Always [`DRAFT_MODEL_TYPE`].
    pub model_type: String,
    /// Compressed tokens per image of the vision adaptor; `None`: no adaptor.
    #[serde(default)]
    pub adaptor_queries: Option<usize>,
    /// Whether the global visual feature is fused into every draft row.
    #[serde(default)]
    pub global_injection: bool,
    /// The decoder layer's shape: the target's HF text config with `num_hidden_layers = 1`.
    pub text_config: Value,
    /// The tokens the head may propose, most frequent first (FR-Spec's reduced draft vocabulary:
    /// what the target emits on the draft's training data, `glance train draft-vocab`); `None`:
    /// the target's whole vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_vocab: Option<Vec<u32>>,
    /// How often the head's top-1 draft is accepted at each depth given that the depths above
    /// it were, on its held-out validation samples (`glance train draft --eval-head DIR
    /// --record`): what `--decode auto` chooses among heads by and plans its first rounds from.
    /// `None`: not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Vec<f64>>,
}

impl DraftConfig {
    /// A head shaped like the target whose HF text config is `target_text` (the `text_config` of
    /// a LLaVA `config.json`, or an LLM's whole config).
    pub fn for_target(
        target_text: &Value,
        adaptor_queries: Option<usize>,
        global_injection: bool,
    ) -> Result<Self> {
        let mut text = target_text.clone();
        let obj = text
            .as_object_mut()
            .ok_or_else(|| Error::Config("the target's text config is not an object".into()))?;
        obj.insert("num_hidden_layers".into(), Value::from(1));
        obj.remove("layer_types");
        let config = Self {
            model_type: DRAFT_MODEL_TYPE.into(),
            adaptor_queries,
            global_injection,
            text_config: text,
            draft_vocab: None,
            acceptance: None,
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(Error::Config(format!(
                "{} is not a draft head directory: it has no config.json",
                dir.display()
            )));
        }
        let config: Self = read_json(&path)?;
        config.validate()?;
        Ok(config)
    }

    /// Writes `dir/config.json` (`dir` created).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join("config.json");
        let json = serde_json::to_string_pretty(self).map_err(|e| Error::json(&path, e))?;
        std::fs::write(&path, json + "\n").map_err(|e| Error::io(&path, e))
    }

    /// `ViSpec` parts on: `vispec`; both off: `eagle`.
    pub fn kind(&self) -> DraftKind {
        if self.adaptor_queries.is_some() || self.global_injection {
            DraftKind::Vispec
        } else {
            DraftKind::Eagle
        }
    }

    /// The decoder layer's configuration.
    pub fn layer_config(&self) -> Result<TextConfig> {
        TextConfig::from_value(&self.text_config)
    }

    /// Checks the model type, the layer config, and the adaptor's size.
    pub fn validate(&self) -> Result<()> {
        if self.model_type != DRAFT_MODEL_TYPE {
            return Err(Error::Config(format!(
                "model_type is `{}`, expected `{DRAFT_MODEL_TYPE}` for a draft head",
                self.model_type
            )));
        }
        let layer = self.layer_config()?;
        if layer.num_layers != 1 {
            return Err(Error::Config(format!(
                "a draft head has one decoder layer, the config says {}",
                layer.num_layers
            )));
        }
        if let Some(q) = self.adaptor_queries {
            if q == 0 || q > MAX_QUERIES {
                return Err(Error::Config(format!(
                    "adaptor_queries must be in 1..={MAX_QUERIES}, got {q}"
                )));
            }
        }
        if let Some(ids) = &self.draft_vocab {
            check_vocab(ids, layer.vocab_size)?;
        }
        if let Some(a) = &self.acceptance {
            check_acceptance(a)?;
        }
        Ok(())
    }

    /// Keeps `by_depth` (conditional top-1 acceptance at depths 1, 2, …) as the head's measured
    /// acceptance, checked.
    pub fn set_acceptance(&mut self, by_depth: Vec<f64>) -> Result<()> {
        check_acceptance(&by_depth)?;
        self.acceptance = Some(by_depth);
        Ok(())
    }

    /// Keeps `ids` (most frequent first) as the head's reduced vocabulary, checked.
    pub fn set_draft_vocab(&mut self, ids: Vec<u32>) -> Result<()> {
        check_vocab(&ids, self.layer_config()?.vocab_size)?;
        self.draft_vocab = Some(ids);
        Ok(())
    }

    /// Checks that the head fits a target of `hidden` and `vocab` sizes.
    pub fn check_target(&self, hidden: usize, vocab: usize) -> Result<()> {
        let layer = self.layer_config()?;
        if layer.hidden_size != hidden || layer.vocab_size != vocab {
            return Err(Error::Config(format!(
                "the draft head is for a target of hidden size {} and vocabulary {}, this target \
                 has {hidden} and {vocab}",
                layer.hidden_size, layer.vocab_size
            )));
        }
        Ok(())
    }
}

/// A reduced draft vocabulary: at least one token, each once, every one a token of the target.
fn check_vocab(ids: &[u32], vocab: usize) -> Result<()> {
    if ids.is_empty() {
        return Err(Error::Config("draft_vocab is empty".into()));
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::Config(format!(
            "draft_vocab holds token {id}, outside the target's vocabulary of {vocab}"
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    if let Some(&id) = ids.iter().find(|&&id| !seen.insert(id)) {
        return Err(Error::Config(format!("draft_vocab holds token {id} twice")));
    }
    Ok(())
}

/// Most depths a head's recorded acceptance may hold.
const MAX_ACCEPTANCE_DEPTHS: usize = 64;

/// Measured acceptance: one rate in `[0, 1]` per depth, at least one, at most
/// [`MAX_ACCEPTANCE_DEPTHS`].
fn check_acceptance(by_depth: &[f64]) -> Result<()> {
    if by_depth.is_empty() || by_depth.len() > MAX_ACCEPTANCE_DEPTHS {
        return Err(Error::Config(format!(
            "acceptance holds {} depths, expected 1..={MAX_ACCEPTANCE_DEPTHS}",
            by_depth.len()
        )));
    }
    if let Some((d, a)) = by_depth
        .iter()
        .enumerate()
        .find(|(_, a)| !(0.0..=1.0).contains(*a))
    {
        return Err(Error::Config(format!(
            "acceptance at depth {} is {a}, outside [0, 1]",
            d + 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head for a small target, with neither a vocabulary nor an acceptance.
    fn small() -> DraftConfig {
        let text = serde_json::json!({
            "vocab_size": 50, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5
        });
        DraftConfig::for_target(&text, None, false).unwrap()
    }

    #[test]
    fn a_reduced_vocabulary_is_checked_and_kept() {
        let mut c = small();
        assert!(c.draft_vocab.is_none());
        for bad in [vec![], vec![3, 50], vec![4, 2, 4]] {
            assert!(c.set_draft_vocab(bad.clone()).is_err(), "{bad:?}");
        }
        c.set_draft_vocab(vec![9, 2, 0]).unwrap();
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["draft_vocab"], serde_json::json!([9, 2, 0]));
        let back: DraftConfig = serde_json::from_value(json).unwrap();
        back.validate().unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn measured_acceptance_is_checked_and_kept() {
        let mut c = small();
        assert!(serde_json::to_value(&c)
            .unwrap()
            .get("acceptance")
            .is_none());
        for bad in [vec![], vec![0.9, 1.5], vec![f64::NAN], vec![0.5; 65]] {
            assert!(c.set_acceptance(bad.clone()).is_err(), "{bad:?}");
        }
        c.set_acceptance(vec![0.92, 0.9, 0.0]).unwrap();
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["acceptance"], serde_json::json!([0.92, 0.9, 0.0]));
        let back: DraftConfig = serde_json::from_value(json).unwrap();
        back.validate().unwrap();
        assert_eq!(back, c);
        let mut bad = serde_json::to_value(&c).unwrap();
        bad["acceptance"] = serde_json::json!([-0.1]);
        let back: DraftConfig = serde_json::from_value(bad).unwrap();
        assert!(back.validate().unwrap_err().to_string().contains("depth 1"));
    }
}
