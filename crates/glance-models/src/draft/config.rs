//! A draft head's `config.json`.

use crate::checkpoint::read_json;
use crate::text::TextConfig;
use glance_core::{Error, Result};
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

    /// `ViSpec` parts on: `vispec`; both off: `eagle`.
    pub fn kind(&self) -> &'static str {
        if self.adaptor_queries.is_some() || self.global_injection {
            "vispec"
        } else {
            "eagle"
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
