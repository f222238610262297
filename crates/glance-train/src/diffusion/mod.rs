//! `glance train diffusion`: converts an autoregressive LLaVA model into a block-diffusion one
//! (Fast-dVLM) — the same weights then draft a block of tokens in parallel (bidirectional
//! attention inside the block) and verify it causally.
//!
//! * [`layout`] — the `[clean | noisy | noisy]` sequence of one sample, its attention mask and
//!   its targets (complementary masks, shifted prediction; drawn in the tests);
//! * [`trainer`] — the loop: AdamW over the text decoder (embeddings, layers, norm, LM head; the
//!   vision tower and projector stay frozen), checkpoints, resume, validation, `metrics.jsonl`,
//!   export of `OUT/model/`, a model directory like the source with a `block_diffusion` entry in
//!   `config.json`.
//!
//! Choices (defaults of [`DiffusionTrainConfig::new`]):
//!
//! * **Data**: the source model's own greedy answers to world prompts (descriptions for long
//!   answers, the other families for short ones; [`crate::draft::SampleSource`]). Training on the
//!   model's own outputs keeps its causal mode where it was (the causal loss starts near its
//!   minimum) and teaches the diffusion mode to predict exactly what verification will accept —
//!   the self-speculative modes are lossless with respect to the causal greedy output.
//! * **Loss**: `α · diffusion + β · causal`, each a mean cross-entropy over its targets, 0.5 / 0.5
//!   (Fast-dVLM's weights).
//! * **Block sizes**: annealed 2 → 4 → 8 → 16 → 32 over the first half of the run, then 32; each
//!   sample takes the stage's size with probability ½, else a smaller power of two uniformly, so
//!   that small blocks stay trained (dynamic block size decodes with any of them).
//! * **Mask patterns**: half the blocks mask a suffix after a uniform number of known tokens
//!   (`0..B`: the drafts of linear and quadratic self-speculation are such blocks), half mask each
//!   token with a per-block ratio `U(0, 1)` (threshold decoding unmasks in any order); the second
//!   noisy copy is the complement.
//! * **Optimiser**: AdamW, peak learning rate 3·10⁻⁴, no weight decay (the pretrained weights are
//!   the starting point, not a prior to shrink towards zero), cosine decay.

pub mod convert;
pub mod layout;
pub mod trainer;

use crate::config::{Budget, OptimSpec};
use crate::{Result, TrainError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use layout::{blocks, draw_masks, Layout, MaskPattern};
pub use trainer::{DiffusionObserver, DiffusionStepReport, DiffusionTrainer, EvalReport};

/// Everything that defines a conversion run (saved in its checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffusionTrainConfig {
    /// The autoregressive source model directory.
    pub from: PathBuf,
    pub seed: u64,
    pub budget: Budget,
    /// Samples per optimiser step.
    pub batch: usize,
    pub optim: OptimSpec,
    /// Weight of the diffusion loss.
    pub alpha: f64,
    /// Weight of the causal loss.
    pub beta: f64,
    /// Block sizes of the annealing, increasing.
    pub block_sizes: Vec<usize>,
    /// The annealing reaches the last block size at this fraction of the run.
    pub anneal_until: f64,
    /// Share of blocks masked as a suffix after known tokens (the rest: per-token ratio).
    pub prefix_share: f64,
    /// Probability that a sample is a long answer (a description).
    pub long_share: f64,
    pub long_pool: usize,
    pub short_pool: usize,
    pub max_new_long: usize,
    pub max_new_short: usize,
    /// Checkpoint every N steps (0: only at the end).
    pub checkpoint_every: u64,
    /// Validate every N steps (0: only at the end).
    pub eval_every: u64,
    pub eval_long: usize,
    pub eval_short: usize,
    /// Block sizes the validation measures draft acceptance at.
    pub eval_blocks: Vec<usize>,
    /// Memory for cached samples, MiB.
    pub cache_mib: usize,
    /// Pruned prompts for a share of the training samples
    /// ([`crate::draft::SampleSource::with_token_drop`]).
    #[serde(default)]
    pub token_drop: Option<crate::TokenDrop>,
}

impl DiffusionTrainConfig {
    /// The default recipe for converting `from`, trained for `budget`.
    pub fn new(from: PathBuf, budget: Budget) -> Self {
        Self {
            from,
            seed: 0,
            budget,
            batch: 4,
            optim: OptimSpec {
                weight_decay: 0.0,
                ..OptimSpec::with_lr(3e-4, 50)
            },
            alpha: 0.5,
            beta: 0.5,
            block_sizes: vec![2, 4, 8, 16, 32],
            anneal_until: 0.5,
            prefix_share: 0.5,
            long_share: 0.7,
            long_pool: 1000,
            short_pool: 300,
            max_new_long: 160,
            max_new_short: 24,
            checkpoint_every: 50,
            eval_every: 200,
            eval_long: 24,
            eval_short: 8,
            eval_blocks: vec![8, 16],
            cache_mib: 1500,
            token_drop: None,
        }
    }

    /// The largest block size of 0-based `step` of `total` (unknown: the first).
    pub fn stage_block(&self, step: u64, total: Option<u64>) -> usize {
        let n = self.block_sizes.len();
        let Some(total) = total else {
            return self.block_sizes[0];
        };
        let f = step as f64 / total.max(1) as f64;
        let k = if n <= 1 || self.anneal_until <= 0.0 {
            n - 1
        } else {
            ((f / self.anneal_until * (n - 1) as f64).floor() as usize).min(n - 1)
        };
        self.block_sizes[k]
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(TrainError::Config(m.to_string()));
        if self.batch == 0 {
            return bad("--batch must be at least 1 (samples per step)");
        }
        if self.block_sizes.is_empty()
            || self.block_sizes.iter().any(|&b| !(2..=256).contains(&b))
            || self.block_sizes.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(TrainError::Config(format!(
                "--blocks must be increasing, each in 2..=256, got {:?}",
                self.block_sizes
            )));
        }
        if self.eval_blocks.iter().any(|&b| !(2..=256).contains(&b)) {
            return bad("validation block sizes must be in 2..=256");
        }
        let prob = |x: f64| (0.0..=1.0).contains(&x);
        if !prob(self.prefix_share) || !prob(self.long_share) || !prob(self.anneal_until) {
            return bad("prefix_share, long_share and anneal_until must be in [0, 1]");
        }
        let weight = |x: f64| x.is_finite() && x >= 0.0;
        if !weight(self.alpha) || !weight(self.beta) || self.alpha + self.beta == 0.0 {
            return Err(TrainError::Config(format!(
                "alpha (--alpha, the diffusion loss weight; the causal loss gets 1 - alpha) and \
                 beta must be finite, >= 0 and not both 0, got alpha {} and beta {}",
                self.alpha, self.beta
            )));
        }
        if self.long_pool == 0 || self.short_pool == 0 {
            return bad("both sample pools need at least one sample");
        }
        if self.max_new_long == 0 || self.max_new_short == 0 {
            return bad("answers need at least one token");
        }
        self.optim.validate()?;
        self.budget.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_anneal_over_the_first_half() {
        let c = DiffusionTrainConfig::new(PathBuf::from("x"), Budget::Steps(1000));
        let at = |s| c.stage_block(s, Some(1000));
        assert_eq!(
            [at(0), at(130), at(260), at(380), at(500), at(999)],
            [2, 4, 8, 16, 32, 32]
        );
        assert_eq!(c.stage_block(500, None), 2);
        let mut bad = c.clone();
        bad.block_sizes = vec![8, 4];
        assert!(bad.validate().is_err());
        assert!(c.validate().is_ok());
    }
}
