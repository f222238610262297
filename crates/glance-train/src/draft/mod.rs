//! `glance train draft`: an EAGLE / ViSpec draft head ([`glance_models::draft::DraftHead`]) for a
//! frozen LLaVA target, trained on the target's own greedy answers to world prompts.
//!
//! * [`samples`] — the data: world scenes and questions, answered greedily by the target
//!   (`Mode::Infer`); each sample keeps the rows the target's first layer saw and its final
//!   hidden state per row; a short → mixed → long curriculum with distractor images last;
//! * [`passes`] — the differentiable forward of one sample: pass 1 over every draft row with the
//!   target's (noised) hidden states, then passes 2..K that feed the draft's own predictions back
//!   ("training-time test"), under hand-built additive masks; the loss (soft-label cross-entropy
//!   against the target's distribution + smooth-L1 regression on the hidden states) and top-1
//!   agreement per depth;
//! * [`trainer`] — the loop: AdamW, checkpoints, resume, validation, `metrics.jsonl`, export of
//!   `OUT/head/` (`config.json` + `model.safetensors`, the names `DraftHead` reads);
//!   [`state`] — its checkpoints.
//!
//! The settings are one serialisable [`DraftTrainConfig`], saved in every checkpoint.
//!
//! Choices (defaults of [`DraftTrainConfig::vispec`]):
//!
//! * **Curriculum** — the first 15% of the steps short answers only, then 30% mixed (half long),
//!   then long (90% long answers). Short answers teach the first tokens after a question cheaply;
//!   long ones are where drafting pays and where the draft must keep the image in mind.
//! * **Distractors** (last stage, 10% of the samples): the draft's *visual inputs* — the image
//!   rows it reads, hence the adaptor's compressed tokens and the global feature (and, for the
//!   text-only head, the image rows' feature inputs) — come from another world image, while the
//!   target's hidden states and distributions stay those of the real one. The draft thus learns
//!   that the visual rows are a hint to weigh against the text context and the target's hidden
//!   states, not a source to copy from (a stale or mismatched image should cost acceptance, not
//!   derail the draft); the hidden states it reads carry the real image's content.
//! * **Noise** on the input hidden states: `U(-a, a)` with `a = 0.1 · RMS(h)` per sample —
//!   EAGLE's `U(-0.1, 0.1)` for hidden states of unit scale, made scale-free (glance-tiny's
//!   final-normed states are not of unit scale). Targets are never noised.
//! * **Hidden-state regression**: smooth-L1 with weight 0.2 beside the cross-entropy. The
//!   cross-entropy against the target's distribution is what acceptance measures and, with the
//!   multi-pass forward, also trains the fed-back states (EAGLE-3 drops the regression for that
//!   reason); a small weight keeps the predicted states near the target's, which is what `fc`
//!   reads at deeper drafts, without letting directions that do not move the logits dominate
//!   (per element, smooth-L1 runs at about half the cross-entropy per row in practice).
//! * **Passes**: 3 (draft depths 1–3), pass `k` weighted `0.8^(k-1)`: deeper rows are harder and
//!   matter less (a chain stops at the first rejection), but must not be ignored.

pub mod passes;
pub mod samples;
pub mod state;
pub mod trainer;
pub mod vocab;

use crate::config::{Budget, OptimSpec};
use crate::{Result, TrainError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use passes::{multipass_mask, Agreement, PassSettings};
pub use samples::{Length, Sample, SampleSource};
pub use trainer::{DraftObserver, DraftStepReport, DraftTrainer, EvalReport};

/// Fractions of the run in each curriculum stage and the share of long answers in each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curriculum {
    /// Steps before `short_until · total` draw short answers only.
    pub short_until: f64,
    /// Steps before `mixed_until · total` (and after the short stage) draw long answers with
    /// probability `mixed_long`.
    pub mixed_until: f64,
    pub mixed_long: f64,
    /// The last (long) stage: probability of a long answer.
    pub final_long: f64,
    /// The last stage: probability that a sample's visual inputs come from another image.
    pub distractor: f64,
}

/// Which curriculum stage a step is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CurriculumStage {
    Short,
    Mixed,
    Long,
}

impl Curriculum {
    /// The stage of 0-based `step` of `total` (`None` while a time budget is being probed: the
    /// first stage).
    pub fn stage(&self, step: u64, total: Option<u64>) -> CurriculumStage {
        let Some(total) = total else {
            return CurriculumStage::Short;
        };
        let f = step as f64 / total.max(1) as f64;
        if f < self.short_until {
            CurriculumStage::Short
        } else if f < self.mixed_until {
            CurriculumStage::Mixed
        } else {
            CurriculumStage::Long
        }
    }

    /// Probability of a long answer and of a distractor image in `stage`.
    pub fn mix(&self, stage: CurriculumStage) -> (f64, f64) {
        match stage {
            CurriculumStage::Short => (0.0, 0.0),
            CurriculumStage::Mixed => (self.mixed_long, 0.0),
            CurriculumStage::Long => (self.final_long, self.distractor),
        }
    }
}

/// Everything that defines a draft-training run (saved in its checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftTrainConfig {
    /// The target's model directory (a LLaVA checkpoint glance loads).
    pub target: PathBuf,
    /// Compressed tokens per image of the vision adaptor; `None`: no adaptor.
    pub adaptor_queries: Option<usize>,
    /// Fuse the global visual feature into every draft row.
    pub global_injection: bool,
    pub seed: u64,
    pub budget: Budget,
    /// Samples per optimiser step.
    pub batch: usize,
    /// Passes of the multi-step forward (1: plain teacher forcing).
    pub passes: usize,
    pub optim: OptimSpec,
    /// Weight of the smooth-L1 hidden-state term beside the cross-entropy.
    pub hidden_weight: f64,
    /// Pass `k`'s loss is weighted `pass_decay^(k-1)`.
    pub pass_decay: f64,
    /// Uniform noise on the input hidden states: `U(-a, a)` with `a = noise · RMS(h)`.
    pub noise: f64,
    pub curriculum: Curriculum,
    /// Distinct long-answer samples of the train split (drawn with replacement, cached).
    pub long_pool: usize,
    /// Distinct short-answer samples.
    pub short_pool: usize,
    /// Answer-length caps of the target's greedy decoding.
    pub max_new_long: usize,
    pub max_new_short: usize,
    /// Checkpoint every N steps (0: only at the end).
    pub checkpoint_every: u64,
    /// Validate every N steps (0: only at the end).
    pub eval_every: u64,
    /// Held-out validation samples (validation split), long and short answers.
    pub eval_long: usize,
    pub eval_short: usize,
    /// Memory for cached samples, MiB (beyond it samples are regenerated when drawn again).
    pub cache_mib: usize,
    /// Pruned prompts for a share of the training samples ([`SampleSource::with_token_drop`]).
    #[serde(default)]
    pub token_drop: Option<crate::TokenDrop>,
}

/// The most compressed tokens per image a vision adaptor may have (`--adaptor-queries`).
pub const MAX_ADAPTOR_QUERIES: usize = 1024;

impl DraftTrainConfig {
    /// The ViSpec head (adaptor of `queries` tokens, global injection) for `target`, trained
    /// for `budget`.
    pub fn vispec(target: PathBuf, queries: usize, budget: Budget) -> Self {
        Self {
            target,
            adaptor_queries: Some(queries),
            global_injection: true,
            seed: 0,
            budget,
            batch: 4,
            passes: 3,
            optim: OptimSpec {
                weight_decay: 0.0,
                ..OptimSpec::with_lr(1e-3, 50)
            },
            hidden_weight: 0.2,
            pass_decay: 0.8,
            noise: 0.1,
            curriculum: Curriculum {
                short_until: 0.15,
                mixed_until: 0.45,
                mixed_long: 0.5,
                final_long: 0.9,
                distractor: 0.1,
            },
            long_pool: 1000,
            short_pool: 300,
            max_new_long: 160,
            max_new_short: 24,
            checkpoint_every: 100,
            eval_every: 200,
            eval_long: 40,
            eval_short: 8,
            cache_mib: 1500,
            token_drop: None,
        }
    }

    /// The text-only EAGLE baseline: no adaptor, no injection, otherwise the same recipe.
    pub fn eagle(target: PathBuf, budget: Budget) -> Self {
        Self {
            adaptor_queries: None,
            global_injection: false,
            ..Self::vispec(target, 1, budget)
        }
    }

    /// `vispec` or `eagle`.
    pub fn kind(&self) -> glance_nn::DraftKind {
        if self.adaptor_queries.is_some() || self.global_injection {
            glance_nn::DraftKind::Vispec
        } else {
            glance_nn::DraftKind::Eagle
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(TrainError::Config(m.to_string()));
        if self.batch == 0 {
            return bad("--batch must be at least 1 (samples per step)");
        }
        if self.passes == 0 || self.passes > 8 {
            return Err(TrainError::Config(format!(
                "--passes must be in 1..=8, got {}",
                self.passes
            )));
        }
        if let Some(q) = self.adaptor_queries {
            if !(1..=MAX_ADAPTOR_QUERIES).contains(&q) {
                return Err(TrainError::Config(format!(
                    "--adaptor-queries must be in 1..={MAX_ADAPTOR_QUERIES}, got {q}"
                )));
            }
        }
        if self.long_pool == 0 || self.short_pool == 0 {
            return bad("both sample pools need at least one sample");
        }
        if self.max_new_long == 0 || self.max_new_short == 0 {
            return bad("answers need at least one token");
        }
        if !(0.0..=1.0).contains(&self.curriculum.distractor)
            || !(0.0..=1.0).contains(&self.curriculum.mixed_long)
            || !(0.0..=1.0).contains(&self.curriculum.final_long)
        {
            return bad("curriculum probabilities must be in [0, 1]");
        }
        let ok = |x: f64, positive: bool| x.is_finite() && (x > 0.0 || (!positive && x == 0.0));
        if !(ok(self.noise, false) && ok(self.hidden_weight, false) && ok(self.pass_decay, true)) {
            return bad("noise and hidden_weight must be ≥ 0, pass_decay > 0");
        }
        self.optim.validate()?;
        self.budget.validate()
    }
}
