//! Model sizes and training settings, with presets.
//!
//! A [`ModelSpec`] is the handful of sizes that define a glance world VLM; [`ModelSpec::hf_config`]
//! turns it into a standard HF `LlavaConfig` JSON (`vision_config`: `clip_vision_model`,
//! `text_config`: `llama`) that both glance and transformers load. The vocabulary, special-token ids
//! and image size come from glance-world.
//!
//! Design choices (see the crate docs): `vision_feature_layer = -1`, so the layer the vision
//! pretraining heads supervise is the layer LLaVA reads (no trained layer is thrown away), and
//! strategy `default` (patch tokens only, 256 at patch 14).

use crate::data::TurnMix;
use crate::token_drop::TokenDrop;
use crate::{Result, TrainError};
use glance_models::llava::LlavaConfig;
use glance_world::vocab;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Sizes of a LLaVA model for the glance world.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Vision patch side in pixels; must divide 224 (14 → 256 visual tokens).
    pub patch_size: usize,
    pub vision_layers: usize,
    pub vision_hidden: usize,
    pub vision_heads: usize,
    pub vision_intermediate: usize,
    pub text_layers: usize,
    pub text_hidden: usize,
    pub text_heads: usize,
    pub text_kv_heads: usize,
    pub text_intermediate: usize,
    pub max_positions: usize,
}

impl ModelSpec {
    /// For unit tests: patch 56 (16 visual tokens), two layers of width 32 on each side.
    pub fn tiny() -> Self {
        Self {
            patch_size: 56,
            vision_layers: 2,
            vision_hidden: 32,
            vision_heads: 2,
            vision_intermediate: 64,
            text_layers: 2,
            text_hidden: 32,
            text_heads: 2,
            text_kv_heads: 1,
            text_intermediate: 64,
            max_positions: 512,
        }
    }

    /// `--quick`: the real token layout (patch 14, 256 visual tokens) at a width that learns
    /// something visible in a few minutes.
    pub fn quick() -> Self {
        Self {
            patch_size: 14,
            vision_layers: 2,
            vision_hidden: 96,
            vision_heads: 2,
            vision_intermediate: 384,
            text_layers: 2,
            text_hidden: 128,
            text_heads: 2,
            text_kv_heads: 2,
            text_intermediate: 352,
            max_positions: 1024,
        }
    }

    /// glance-tiny: ViT 4L d192, decoder 4L d256 (≈5.5M parameters), the size of the PyTorch
    /// prototype of this recipe.
    pub fn base() -> Self {
        Self {
            patch_size: 14,
            vision_layers: 4,
            vision_hidden: 192,
            vision_heads: 3,
            vision_intermediate: 768,
            text_layers: 4,
            text_hidden: 256,
            text_heads: 4,
            text_kv_heads: 4,
            text_intermediate: 704,
            max_positions: 1024,
        }
    }

    /// Visual tokens per image (`(224 / patch)²`).
    pub fn image_tokens(&self) -> usize {
        let g = glance_world::IMAGE_SIZE as usize / self.patch_size;
        g * g
    }

    fn validate(&self) -> Result<()> {
        let size = glance_world::IMAGE_SIZE as usize;
        let bad = |m: String| Err(TrainError::Config(m));
        if self.patch_size == 0 || !size.is_multiple_of(self.patch_size) {
            return bad(format!(
                "patch size {} does not divide {size}",
                self.patch_size
            ));
        }
        if self.vision_heads == 0 || !self.vision_hidden.is_multiple_of(self.vision_heads) {
            return bad("vision_hidden must be a multiple of vision_heads".into());
        }
        if self.text_heads == 0
            || !self.text_hidden.is_multiple_of(self.text_heads)
            || !(self.text_hidden / self.text_heads).is_multiple_of(2)
        {
            return bad("text_hidden / text_heads must be a positive even head size".into());
        }
        if self.text_kv_heads == 0 || !self.text_heads.is_multiple_of(self.text_kv_heads) {
            return bad("text_heads must be a multiple of text_kv_heads".into());
        }
        if self.vision_layers == 0 || self.text_layers == 0 {
            return bad("both towers need at least one layer".into());
        }
        Ok(())
    }

    /// The HF `config.json` of this model (transformers `LlavaConfig` layout).
    pub fn hf_config(&self) -> Result<Value> {
        self.validate()?;
        let id = |t: &str| {
            vocab::token_id(t)
                .ok_or_else(|| TrainError::Config(format!("world vocabulary lacks {t}")))
        };
        let (bos, eos, pad, image) = (
            id(vocab::BOS)?,
            id(vocab::EOS)?,
            id(vocab::PAD)?,
            id(vocab::IMAGE)?,
        );
        Ok(json!({
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "dtype": "float32",
            "image_token_index": image,
            "image_seq_length": self.image_tokens(),
            "projector_hidden_act": "gelu",
            "multimodal_projector_bias": true,
            "vision_feature_layer": -1,
            "vision_feature_select_strategy": "default",
            "tie_word_embeddings": false,
            "text_config": {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": vocab::vocab_size(),
                "hidden_size": self.text_hidden,
                "intermediate_size": self.text_intermediate,
                "num_hidden_layers": self.text_layers,
                "num_attention_heads": self.text_heads,
                "num_key_value_heads": self.text_kv_heads,
                "head_dim": self.text_hidden / self.text_heads,
                "hidden_act": "silu",
                "max_position_embeddings": self.max_positions,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
                "attention_bias": false,
                "mlp_bias": false,
                "tie_word_embeddings": false,
                "bos_token_id": bos,
                "eos_token_id": eos,
                "pad_token_id": pad,
                "initializer_range": 0.02,
            },
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": self.vision_hidden,
                "intermediate_size": self.vision_intermediate,
                "num_hidden_layers": self.vision_layers,
                "num_attention_heads": self.vision_heads,
                "num_channels": 3,
                "image_size": glance_world::IMAGE_SIZE,
                "patch_size": self.patch_size,
                "hidden_act": "quick_gelu",
                "layer_norm_eps": 1e-5,
                "projection_dim": self.vision_hidden,
            },
        }))
    }

    /// The parsed config glance runs with.
    pub fn llava_config(&self) -> Result<LlavaConfig> {
        Ok(LlavaConfig::from_value(&self.hf_config()?)?)
    }
}

/// Which stage of the recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Vision tower alone, dense per-patch targets and a [CLS] object-set head.
    Vision,
    /// Projector + decoder on packed QA turns, vision tower frozen.
    Llava,
    /// Everything but the training heads, on packed QA turns.
    #[serde(rename = "e2e", alias = "end_to_end")]
    EndToEnd,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Vision, Stage::Llava, Stage::EndToEnd];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Vision => "vision",
            Stage::Llava => "llava",
            Stage::EndToEnd => "e2e",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Optimiser and schedule of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimSpec {
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps (at least the probe steps of a time-budgeted stage).
    pub warmup: u64,
    /// Cosine decay ends at `lr * min_lr_ratio`.
    pub min_lr_ratio: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global-norm clipping threshold (0 = off).
    pub clip_norm: f64,
}

impl OptimSpec {
    /// AdamW (0.9, 0.95), wd 0.05, clip 1.0, cosine to 10% (the PyTorch prototype's settings).
    pub fn with_lr(lr: f64, warmup: u64) -> Self {
        Self {
            lr,
            warmup,
            min_lr_ratio: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.05,
            clip_norm: 1.0,
        }
    }
}

/// The highest peak learning rate accepted (AdamW diverges long before it).
pub const MAX_LR: f64 = 1.0;

impl OptimSpec {
    /// Checks every hyper-parameter against its range; each refusal names the setting (`--lr`
    /// for the learning rate, the flag every trainer has), the range and the value. NaN fails
    /// every range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainError::Config(m));
        if !(self.lr > 0.0 && self.lr <= MAX_LR) {
            return bad(format!(
                "--lr (the peak learning rate) must be in (0, {MAX_LR}], got {}",
                self.lr
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad(format!(
                "min_lr_ratio must be in [0, 1], got {}",
                self.min_lr_ratio
            ));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(format!("AdamW {name} must be in [0, 1), got {b}"));
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return bad(format!(
                "AdamW eps must be finite and > 0, got {}",
                self.eps
            ));
        }
        for (name, v) in [
            ("weight_decay", self.weight_decay),
            ("clip_norm (0: off)", self.clip_norm),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return bad(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        Ok(())
    }
}

/// How long a stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Exactly this many optimiser steps.
    Steps(u64),
    /// As many steps as fit in this many seconds, fixed after timing the warm-up steps.
    Seconds(f64),
}

impl Budget {
    /// At least one step, or a positive finite time.
    pub fn validate(&self) -> crate::Result<()> {
        match *self {
            Budget::Steps(0) => Err(crate::TrainError::Config(
                "--steps must be at least 1 (the run needs at least one step)".into(),
            )),
            Budget::Seconds(s) if !(s.is_finite() && s > 0.0) => {
                Err(crate::TrainError::Config(format!(
                    "--minutes (the time budget) must be finite and > 0, got {}",
                    s / 60.0
                )))
            }
            _ => Ok(()),
        }
    }
}

/// One stage of the recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    pub stage: Stage,
    pub budget: Budget,
    /// Images per optimiser step.
    pub images_per_step: usize,
    /// QA turns packed per image (LLaVA and end-to-end stages).
    pub turns_per_image: usize,
    pub optim: OptimSpec,
    /// Curriculum: scenes have at most `curriculum_start` objects at step 0, growing linearly to
    /// the world's maximum (6) at `curriculum_until` × the stage's steps. `None`: no curriculum.
    pub curriculum_start: Option<usize>,
    pub curriculum_until: f64,
    /// Visual-token drop augmentation (QA stages; `None`: every image keeps all its tokens).
    #[serde(default)]
    pub token_drop: Option<TokenDrop>,
    /// Weight of the word–patch alignment term (QA stages; [`crate::align`]); `None`: off.
    #[serde(default)]
    pub align: Option<f64>,
    /// How each image's turns are drawn (QA stages): dialogues, relation questions, the spatial
    /// weight. The default is v1's independent turns.
    #[serde(default)]
    pub mix: TurnMix,
}

/// Everything a training run needs besides the output directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub model: ModelSpec,
    pub stages: Vec<StageSpec>,
    /// Seed of the initial weights. The data order is fixed by the world's train split.
    pub seed: u64,
    /// Write a checkpoint every this many steps (and at the end of every stage).
    pub checkpoint_every: u64,
    /// Validate every this many steps of a QA stage (0 = only at the end of each stage).
    pub eval_every: u64,
    /// Validation questions per family.
    pub eval_per_family: usize,
    /// Longest generated answer at validation.
    pub eval_max_new_tokens: usize,
    /// Threads a batch is split over ([`crate::step::batch_grads`]). Part of the configuration
    /// because it fixes how gradients are summed (a resumed run must use the same count).
    #[serde(default = "one")]
    pub workers: usize,
}

fn one() -> usize {
    1
}

impl TrainConfig {
    /// A preset: `quick` (minutes) or `base` (the full recipe) with every stage. Stage budgets
    /// are steps; [`TrainConfig::with_minutes`] turns them into a time budget.
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "quick" => Ok(Self {
                model: ModelSpec::quick(),
                stages: vec![
                    StageSpec::new(
                        Stage::Vision,
                        Budget::Steps(150),
                        8,
                        0,
                        OptimSpec::with_lr(1e-3, 10),
                    ),
                    StageSpec::new(
                        Stage::Llava,
                        Budget::Steps(400),
                        4,
                        8,
                        OptimSpec::with_lr(2e-3, 20),
                    ),
                    StageSpec::new(
                        Stage::EndToEnd,
                        Budget::Steps(40),
                        4,
                        8,
                        OptimSpec::with_lr(3e-4, 5),
                    ),
                ],
                seed: 0,
                checkpoint_every: 100,
                eval_every: 200,
                eval_per_family: 20,
                eval_max_new_tokens: 80,
                workers: 1,
            }),
            "base" => Ok(Self {
                model: ModelSpec::base(),
                stages: vec![
                    StageSpec {
                        curriculum_start: Some(3),
                        ..StageSpec::new(
                            Stage::Vision,
                            Budget::Steps(3000),
                            16,
                            0,
                            OptimSpec::with_lr(1e-3, 100),
                        )
                    },
                    StageSpec {
                        curriculum_start: Some(2),
                        ..StageSpec::new(
                            Stage::Llava,
                            Budget::Steps(6000),
                            8,
                            8,
                            OptimSpec::with_lr(1e-3, 100),
                        )
                    },
                    StageSpec::new(
                        Stage::EndToEnd,
                        Budget::Steps(1000),
                        8,
                        8,
                        OptimSpec::with_lr(2e-4, 50),
                    ),
                ],
                seed: 0,
                checkpoint_every: 200,
                eval_every: 1000,
                eval_per_family: 70,
                eval_max_new_tokens: 120,
                workers: 1,
            }),
            other => Err(TrainError::Config(format!(
                "unknown preset `{other}` (quick, base)"
            ))),
        }
    }

    /// Splits `minutes` of training time over the stages in proportion to their step budgets.
    pub fn with_minutes(mut self, minutes: f64) -> Result<Self> {
        if !(minutes > 0.0 && minutes.is_finite()) {
            return Err(TrainError::Config(format!(
                "--minutes must be positive, got {minutes}"
            )));
        }
        let weight = |s: &StageSpec| match s.budget {
            Budget::Steps(n) => {
                n as f64
                    * (s.images_per_step as f64)
                    * if s.stage == Stage::Vision { 0.4 } else { 1.0 }
            }
            Budget::Seconds(x) => x,
        };
        let total: f64 = self.stages.iter().map(weight).sum();
        if total <= 0.0 {
            return Err(TrainError::Config("no stage has any budget".into()));
        }
        for s in &mut self.stages {
            let share = weight(s) / total;
            s.budget = Budget::Seconds(minutes * 60.0 * share);
        }
        Ok(self)
    }

    /// Keeps only `stages`, in recipe order.
    pub fn only(mut self, stages: &[Stage]) -> Self {
        self.stages.retain(|s| stages.contains(&s.stage));
        self
    }

    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        if self.stages.is_empty() {
            return Err(TrainError::Config("no stages to run".into()));
        }
        if self.workers == 0 {
            return Err(TrainError::Config("workers must be ≥ 1".into()));
        }
        if self.eval_per_family > 0 && self.eval_max_new_tokens == 0 {
            return Err(TrainError::Config(
                "eval_max_new_tokens must be ≥ 1 when validating".into(),
            ));
        }
        for s in &self.stages {
            if s.images_per_step == 0 {
                return Err(TrainError::Config(format!(
                    "stage {}: images_per_step must be ≥ 1",
                    s.stage
                )));
            }
            if s.stage != Stage::Vision && s.turns_per_image == 0 {
                return Err(TrainError::Config(format!(
                    "stage {}: turns_per_image must be ≥ 1",
                    s.stage
                )));
            }
            if let Some(d) = &s.token_drop {
                if s.stage == Stage::Vision {
                    return Err(TrainError::Config(
                        "token drop applies to the QA stages only".into(),
                    ));
                }
                d.validate()?;
            }
            if let Some(w) = s.align {
                if s.stage == Stage::Vision || !(w >= 0.0 && w.is_finite()) {
                    return Err(TrainError::Config(format!(
                        "stage {}: the alignment weight must be ≥ 0 and applies to the QA stages, got {w}",
                        s.stage
                    )));
                }
            }
            s.mix.validate()?;
            s.budget.validate()?;
            s.optim.validate().map_err(|e| match e {
                TrainError::Config(m) => TrainError::Config(format!("stage {}: {m}", s.stage)),
                other => other,
            })?;
        }
        Ok(())
    }
}

/// A command-line augmentation weight (`--align`, `--token-drop`): absent or 0 means off
/// (`None`), a finite positive value (at most `max`, if given) is on. NaN, infinities, negative
/// values and values above `max` are [`TrainError::Config`] naming the flag — a NaN must not
/// quietly mean "off".
pub fn augmentation_flag(flag: &str, value: Option<f64>, max: Option<f64>) -> Result<Option<f64>> {
    let Some(v) = value.filter(|&v| v != 0.0) else {
        return Ok(None);
    };
    if v.is_finite() && v > 0.0 && max.is_none_or(|m| v <= m) {
        return Ok(Some(v));
    }
    let range = match max {
        Some(m) => format!("in [0, {m}]"),
        None => ">= 0".to_string(),
    };
    Err(TrainError::Config(format!(
        "{flag} must be a finite number {range} (0: off), got {v}"
    )))
}

impl StageSpec {
    pub fn new(
        stage: Stage,
        budget: Budget,
        images_per_step: usize,
        turns_per_image: usize,
        optim: OptimSpec,
    ) -> Self {
        Self {
            stage,
            budget,
            images_per_step,
            turns_per_image,
            optim,
            curriculum_start: None,
            curriculum_until: 0.5,
            token_drop: None,
            align: None,
            mix: TurnMix::default(),
        }
    }

    /// Most objects a scene may have at `step` of `total` (the curriculum).
    pub fn max_objects(&self, step: u64, total: u64) -> usize {
        let max = glance_world::scene::MAX_OBJECTS;
        match self.curriculum_start {
            None => max,
            Some(start) => {
                let end = (total as f64 * self.curriculum_until).max(1.0);
                let frac = (step as f64 / end).min(1.0);
                let n = start as f64 + frac * (max as f64 - start as f64);
                (n.floor() as usize).clamp(1, max)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_split_over_stages_and_curriculum_grows() {
        let c = TrainConfig::preset("base")
            .unwrap()
            .with_minutes(240.0)
            .unwrap();
        let secs: f64 = c
            .stages
            .iter()
            .map(|s| match s.budget {
                Budget::Seconds(x) => x,
                Budget::Steps(_) => panic!("still steps"),
            })
            .sum();
        assert!((secs - 240.0 * 60.0).abs() < 1e-6);
        let s = &c.stages[1];
        assert_eq!(s.max_objects(0, 1000), 2);
        assert_eq!(s.max_objects(250, 1000), 4);
        assert_eq!(s.max_objects(900, 1000), 6);
        assert!(TrainConfig::preset("quick")
            .unwrap()
            .with_minutes(0.0)
            .is_err());
        c.model.llava_config().unwrap();
        ModelSpec::tiny().llava_config().unwrap();
        assert_eq!(ModelSpec::base().image_tokens(), 256);
    }

    #[test]
    fn optimiser_settings_are_checked_naming_the_setting() {
        for (edit, want) in [
            (
                (|o: &mut OptimSpec| o.lr = -1e-3) as fn(&mut OptimSpec),
                "--lr",
            ),
            (|o| o.lr = f64::NAN, "--lr"),
            (|o| o.lr = 0.0, "(0, 1]"),
            (|o| o.lr = f64::INFINITY, "--lr"),
            (|o| o.beta2 = 1.0, "beta2"),
            (|o| o.eps = 0.0, "eps"),
            (|o| o.weight_decay = f64::NAN, "weight_decay"),
            (|o| o.clip_norm = -1.0, "clip_norm"),
            (|o| o.min_lr_ratio = 2.0, "min_lr_ratio"),
        ] {
            let mut o = OptimSpec::with_lr(1e-3, 10);
            edit(&mut o);
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            let mut c = TrainConfig::preset("quick").unwrap();
            c.stages[0].optim = o;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("stage vision") && e.contains(want), "{e}");
        }
        assert!(OptimSpec::with_lr(1e-3, 10).validate().is_ok());
        let e = Budget::Seconds(f64::NAN)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--minutes"), "{e}");
    }

    #[test]
    fn augmentation_flags_refuse_nan_and_out_of_range() {
        assert_eq!(augmentation_flag("--align", None, None).unwrap(), None);
        assert_eq!(augmentation_flag("--align", Some(0.0), None).unwrap(), None);
        assert_eq!(
            augmentation_flag("--align", Some(0.5), None).unwrap(),
            Some(0.5)
        );
        assert_eq!(
            augmentation_flag("--token-drop", Some(1.0), Some(1.0)).unwrap(),
            Some(1.0)
        );
        for (flag, v, max) in [
            ("--align", f64::NAN, None),
            ("--align", f64::INFINITY, None),
            ("--align", -0.1, None),
            ("--token-drop", f64::NAN, Some(1.0)),
            ("--token-drop", 1.5, Some(1.0)),
            ("--token-drop", -1.0, Some(1.0)),
        ] {
            match augmentation_flag(flag, Some(v), max) {
                Err(TrainError::Config(m)) => assert!(m.contains(flag), "{m}"),
                other => panic!("{flag} {v}: {other:?}"),
            }
        }
        // The stage checks catch a NaN that reaches a config some other way (a JSON file).
        let mut c = TrainConfig::preset("quick").unwrap();
        c.stages[1].align = Some(f64::NAN);
        assert!(c.validate().is_err());
        let mut c = TrainConfig::preset("quick").unwrap();
        c.stages[1].token_drop = Some(TokenDrop::every_policy(f64::NAN));
        assert!(c.validate().is_err());
    }
}
