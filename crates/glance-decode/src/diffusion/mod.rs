//! Block-diffusion decoding of a converted model (Fast-dVLM): the same weights draft a block of
//! tokens in parallel (bidirectional attention inside the block) and run causally.
//!
//! * **threshold** ([`threshold`]): a block `[x, M, …, M]` is denoised in passes; each pass
//!   unmasks every slot whose prediction has confidence ≥ τ (at least the most confident one).
//!   The finished block then runs causally into the cache, and that pass's last row gives the
//!   next block's first token. Lossy: tokens come from the bidirectional drafts.
//! * **linear self-speculation** ([`selfspec`]): one bidirectional pass drafts the `B − 1` masked
//!   slots of `[x, M, …, M]`, one causal pass verifies `[x, d₁ … d_{B−1}]`; the agreeing prefix
//!   and the causal model's own next token are emitted. Two passes per step.
//! * **quadratic self-speculation** ([`selfspec`]): one pass verifies the current drafts and, for
//!   every possible acceptance length, pre-drafts the next block ([`layout::QuadraticLayout`]).
//!   One pass per step.
//! * **dynamic block size** ([`BlockSize`]): the block doubles after a step that accepted every
//!   draft and halves after one that accepted fewer than a quarter of them.
//!
//! The self-speculative modes are lossless: verification is [`crate::speculative::verify`] on a
//! chain (greedy: the causal argmax; sampling: point-mass rejection sampling), and every pass runs
//! through [`glance_nn::CausalLm::forward_batch_invariant`], so a verified row equals the decode step of
//! the same token bit for bit — the emitted tokens are exactly the converted model's
//! autoregressive ones. Finished tokens' rows stay in the KV cache; speculative rows are dropped
//! with [`glance_nn::KvCache::keep_speculative`] / [`glance_nn::KvCache::rollback`].

pub mod layout;
pub mod selfspec;
pub mod threshold;

use crate::autoregressive::{FinishReason, GenerateConfig, Generation, Prefilled};
use crate::cost::CostModel;
use crate::sampler::Sampler;
use crate::speculative::plan::{best_chain, Acceptance, AUTO_MARGIN, EXPLORE_AFTER, WARM_UP_STEPS};
use crate::step::{DecodeState, Pass};
use crate::strategy::{DecodeStats, DecodeStrategy, StepLog, TokenSink};
use glance_core::{Error, Result, TokenId};
use glance_nn::{AttnMask, CausalLm, KvCache};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Largest block: a quadratic pass runs `B (B + 1)` rows, and the verification rows must stay
/// within the batch-invariant kernels' reach of one-token decoding.
pub const MAX_BLOCK: usize = 64;

/// Which block-diffusion mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiffusionMode {
    Threshold,
    Linear,
    Quadratic,
}

impl DiffusionMode {
    pub fn name(self) -> &'static str {
        match self {
            DiffusionMode::Threshold => "diffusion-threshold",
            DiffusionMode::Linear => "diffusion-linear",
            DiffusionMode::Quadratic => "diffusion-quadratic",
        }
    }
}

/// Block size, threshold and dynamic sizing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiffusionSettings {
    /// Tokens per block `B` (the first block size when dynamic).
    pub block: usize,
    /// Threshold mode: unmask slots with confidence ≥ τ.
    pub threshold: f32,
    /// Grow and shrink the block with acceptance.
    pub dynamic: bool,
    /// Bounds of the dynamic block size.
    pub min_block: usize,
    pub max_block: usize,
}

impl Default for DiffusionSettings {
    fn default() -> Self {
        Self {
            block: 8,
            threshold: 0.9,
            dynamic: false,
            min_block: 2,
            max_block: 32,
        }
    }
}

impl DiffusionSettings {
    /// Block `block` (default 8), threshold `threshold` (default 0.9), dynamic or not, the
    /// dynamic bounds `2 … 32` widened to take `block` in.
    pub fn sized(block: Option<usize>, threshold: Option<f32>, dynamic: bool) -> Self {
        let base = Self::default();
        let block = block.unwrap_or(base.block);
        Self {
            block,
            threshold: threshold.unwrap_or(base.threshold),
            dynamic,
            min_block: base.min_block.min(block),
            max_block: base.max_block.max(block),
        }
    }

    /// The largest block these settings let a step take: `max_block` when dynamic, else
    /// `block`.
    pub fn largest_block(&self) -> usize {
        if self.dynamic {
            self.max_block
        } else {
            self.block
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidParam(m));
        for (name, b) in [
            ("block size", self.block),
            ("minimum block size", self.min_block),
            ("maximum block size", self.max_block),
        ] {
            if !(1..=MAX_BLOCK).contains(&b) {
                return bad(format!("the {name} must be in 1..={MAX_BLOCK}, got {b}"));
            }
        }
        if self.dynamic && !(self.min_block <= self.block && self.block <= self.max_block) {
            return bad(format!(
                "dynamic block size: need min {} ≤ block {} ≤ max {}",
                self.min_block, self.block, self.max_block
            ));
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return bad(format!(
                "the threshold τ must be in (0, 1], got {}",
                self.threshold
            ));
        }
        Ok(())
    }
}

/// The block-diffusion options a caller gave, before defaults fill them in: `glance run
/// --block / --threshold / --dynamic-block`, or a request's `glance.block / glance.threshold /
/// glance.dynamic_block`. [`DiffusionOptions::settings_for`] is the one check of both surfaces.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DiffusionOptions {
    pub block: Option<usize>,
    pub threshold: Option<f32>,
    pub dynamic: bool,
}

/// How a surface spells the three options in its errors.
#[derive(Debug, Clone, Copy)]
pub struct OptionNames {
    pub block: &'static str,
    pub threshold: &'static str,
    pub dynamic: &'static str,
    /// The draft tree's options ([`crate::DecodeSpec::parse_with`]).
    pub tree: &'static str,
}

impl OptionNames {
    /// `glance run`, `serve`, `eval`, … flags.
    pub const FLAGS: Self = Self {
        block: "--block",
        threshold: "--threshold",
        dynamic: "--dynamic-block",
        tree: "--draft-depth / --draft-top-k / --draft-budget / --chain",
    };
    /// Fields of a request body's `glance` object.
    pub const REQUEST: Self = Self {
        block: "glance.block",
        threshold: "glance.threshold",
        dynamic: "glance.dynamic_block",
        tree: "glance.tree",
    };
}

impl DiffusionOptions {
    pub fn any(&self) -> bool {
        self.block.is_some() || self.threshold.is_some() || self.dynamic
    }

    /// The settings these options give `spec` (`None` when none is given: the engine's or the
    /// model's apply). An option that does not apply to `spec` is refused naming both — any of
    /// them with a strategy that is not block diffusion, the threshold with a self-speculative
    /// mode (which accepts drafts by verification, not by confidence) — and a value out of
    /// range names the option and its range.
    pub fn settings_for(
        &self,
        spec: &crate::DecodeSpec,
        names: &OptionNames,
    ) -> Result<Option<DiffusionSettings>> {
        if !self.any() {
            return Ok(None);
        }
        let bad = |m: String| Err(Error::InvalidParam(m));
        let Some(mode) = spec.diffusion_mode() else {
            let given: Vec<&str> = [
                (self.block.is_some(), names.block),
                (self.threshold.is_some(), names.threshold),
                (self.dynamic, names.dynamic),
            ]
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, n)| *n)
            .collect();
            return bad(format!(
                "{} only appl{} to the block-diffusion strategies (diffusion-threshold, \
                 diffusion-linear, diffusion-quadratic), not `{spec}`",
                given.join(", "),
                if given.len() == 1 { "ies" } else { "y" }
            ));
        };
        if let Some(t) = self.threshold {
            if mode != DiffusionMode::Threshold {
                return bad(format!(
                    "{} only applies to diffusion-threshold, not `{spec}` (self-speculation \
                     accepts drafts by verification, not by confidence)",
                    names.threshold
                ));
            }
            if !(t > 0.0 && t <= 1.0) {
                return bad(format!("{} must be in (0, 1], got {t}", names.threshold));
            }
        }
        if let Some(b) = self.block {
            if !(1..=MAX_BLOCK).contains(&b) {
                return bad(format!(
                    "{} must be in 1..={MAX_BLOCK}, got {b}",
                    names.block
                ));
            }
        }
        let s = DiffusionSettings::sized(self.block, self.threshold, self.dynamic);
        s.validate()?;
        Ok(Some(s))
    }
}

/// The block size of the next step.
#[derive(Debug, Clone)]
pub struct BlockSize {
    size: usize,
    settings: DiffusionSettings,
    plan: Option<BlockPlan>,
}

/// Cost-aware block sizes for linear self-speculation: each step takes the block whose expected
/// tokens (from this request's acceptance by draft position) per measured second — a drafting
/// pass and a verification pass over `B` rows — is best, and `B = 1` (a plain decode step, no
/// drafting pass) when no block beats it. As [`crate::speculative::plan`] does for draft trees,
/// the answer's first [`WARM_UP_STEPS`] steps are plain: a short answer (a word or a number and
/// the end of the sequence) ends before a block's two passes could pay for themselves.
#[derive(Debug, Clone)]
struct BlockPlan {
    cost: CostModel,
    acceptance: Acceptance,
    plain_streak: u32,
}

impl BlockPlan {
    /// Seconds of a linear step with `drafts` drafted slots.
    fn step_seconds(&self, drafts: usize) -> f64 {
        2.0 * self.cost.pass(drafts + 1)
    }

    fn choose(&self, limit: usize) -> usize {
        let plain = self.cost.pass(1);
        let max_drafts = limit.saturating_sub(1);
        let seconds = |d: usize| self.step_seconds(d);
        let best =
            best_chain(max_drafts, plain, |d| self.acceptance.at(d), seconds).or_else(|| {
                (self.plain_streak >= EXPLORE_AFTER)
                    .then(|| best_chain(max_drafts, plain, |_| 1.0, seconds))
                    .flatten()
            });
        best.map_or(1, |(d, _)| d + 1)
    }
}

/// Whether linear self-speculation is predicted to beat a decode step by [`AUTO_MARGIN`] under
/// `cost` with blocks of up to `max_block`, its drafts accepted as drafts usually are (the
/// prior of [`Acceptance`]): what `auto` asks before choosing it.
pub fn linear_pays_at_prior(cost: &CostModel, max_block: usize) -> bool {
    let prior = Acceptance::default();
    best_chain(
        max_block.saturating_sub(1),
        cost.pass(1),
        |d| prior.at(d),
        |d| 2.0 * cost.pass(d + 1),
    )
    .is_some_and(|(_, gain)| gain >= AUTO_MARGIN)
}

impl BlockSize {
    pub fn new(settings: &DiffusionSettings) -> Self {
        Self {
            size: settings.block,
            settings: settings.clone(),
            plan: None,
        }
    }

    /// Blocks planned from `cost` (linear self-speculation), up to the settings' largest block
    /// (`max_block` when dynamic, else `block`).
    pub fn cost_aware(settings: &DiffusionSettings, cost: CostModel) -> Self {
        Self {
            plan: Some(BlockPlan {
                cost,
                acceptance: Acceptance::default(),
                plain_streak: 0,
            }),
            ..Self::new(settings)
        }
    }

    pub fn get(&self) -> usize {
        self.size
    }

    /// The block of the next step for `x` at position `n` after `emitted` tokens (the prompt's
    /// pass's among them): the current size (or the planned one, 1 during the warm-up), cut so
    /// that positions `n ..` stay inside the context (`max`; `emit` guarantees room for `x`) and
    /// no slot lies past the token limit.
    pub fn fitted(&self, n: u32, emitted: usize, max: usize, config: &GenerateConfig) -> usize {
        let room = max.saturating_sub(n as usize).max(1);
        let wanted = config.max_new_tokens.saturating_sub(emitted) + 1;
        let limit = room.min(wanted);
        match &self.plan {
            None => self.size.min(limit),
            Some(_) if emitted <= WARM_UP_STEPS => 1,
            Some(p) => p.choose(limit.min(self.settings.largest_block())),
        }
    }

    /// After a step that accepted `accepted` of `offered` drafts: doubles when all were accepted,
    /// halves when fewer than a quarter were (within the bounds); fixed when not dynamic. A
    /// planned size records the acceptance instead.
    pub fn update(&mut self, accepted: usize, offered: usize) {
        if let Some(p) = &mut self.plan {
            if offered == 0 {
                p.plain_streak = p.plain_streak.saturating_add(1);
            } else {
                p.plain_streak = 0;
                p.acceptance.record(offered, accepted);
            }
            return;
        }
        if !self.settings.dynamic || offered == 0 {
            return;
        }
        if accepted >= offered {
            self.size = (self.size * 2).min(self.settings.max_block);
        } else if 4 * accepted < offered {
            self.size = (self.size / 2).max(self.settings.min_block);
        }
    }
}

/// Block-diffusion decoding of a converted model whose mask token is `mask`.
pub struct BlockDiffusion {
    mode: DiffusionMode,
    settings: DiffusionSettings,
    mask: TokenId,
    /// Plan linear blocks from measured costs ([`BlockDiffusion::cost_aware`]).
    cost: Option<CostModel>,
}

impl BlockDiffusion {
    pub fn new(mode: DiffusionMode, settings: DiffusionSettings, mask: TokenId) -> Result<Self> {
        settings.validate()?;
        Ok(Self {
            mode,
            settings,
            mask,
            cost: None,
        })
    }

    /// Linear self-speculation with each step's block planned from `cost` ([`BlockSize`]);
    /// other modes are refused.
    pub fn cost_aware(mut self, cost: CostModel) -> Result<Self> {
        cost.check()?;
        if self.mode != DiffusionMode::Linear {
            return Err(Error::InvalidParam(format!(
                "cost-aware blocks are planned for diffusion-linear, not {}",
                self.mode.name()
            )));
        }
        self.cost = Some(cost);
        Ok(self)
    }

    pub fn settings(&self) -> &DiffusionSettings {
        &self.settings
    }
}

impl DecodeStrategy for BlockDiffusion {
    fn name(&self) -> &'static str {
        self.mode.name()
    }

    fn start(
        &self,
        model: &dyn CausalLm,
        state: Prefilled,
        sampler: Sampler,
        config: &GenerateConfig,
    ) -> Result<Box<dyn DecodeState>> {
        if self.mask as usize >= model.vocab_size() {
            return Err(Error::InvalidParam(format!(
                "the mask token {} is outside the vocabulary ({})",
                self.mask,
                model.vocab_size()
            )));
        }
        let common = Common::new(model, state, sampler, config, self.mask)?;
        Ok(match self.mode {
            DiffusionMode::Threshold => Box::new(threshold::ThresholdState::new(
                common,
                BlockSize::new(&self.settings),
                self.settings.threshold,
            )),
            DiffusionMode::Linear | DiffusionMode::Quadratic => {
                let quadratic = self.mode == DiffusionMode::Quadratic;
                let block = match &self.cost {
                    Some(cost) if !quadratic => BlockSize::cost_aware(&self.settings, cost.clone()),
                    _ => BlockSize::new(&self.settings),
                };
                Box::new(selfspec::SelfSpecState::new(common, quadratic, block))
            }
        })
    }
}

/// What every mode's state shares: the first token comes from the prefill's last hidden state
/// (its pick is counted in the prefill time, as time to first token); `x` at position `n` is
/// the last emitted token, not in the cache.
pub(crate) struct Common {
    pub x: TokenId,
    pub n: u32,
    pub cache: KvCache,
    pub sampler: Sampler,
    pub config: GenerateConfig,
    /// The mask token.
    pub mask: TokenId,
    /// The model's context (positions).
    pub max: usize,
    pub tokens: Vec<TokenId>,
    pub tally: Tally,
    prompt_len: usize,
    prefill: std::time::Duration,
    /// When decoding started.
    start: Instant,
    /// `x` is the prefill's token, not emitted yet.
    first: bool,
    pub ended: Option<FinishReason>,
    /// When the open pass was handed out.
    pass_clock: Option<Instant>,
}

impl Common {
    fn new(
        model: &dyn CausalLm,
        state: Prefilled,
        mut sampler: Sampler,
        config: &GenerateConfig,
        mask: TokenId,
    ) -> Result<Self> {
        let start = Instant::now();
        let x = crate::autoregressive::pick(model, &state.last_hidden()?, &mut sampler)?;
        Ok(Self {
            x,
            n: state.last_pos() + 1,
            prompt_len: state.prompt_len(),
            prefill: state.elapsed + start.elapsed(),
            cache: state.cache,
            sampler,
            config: config.clone(),
            mask,
            max: model.max_positions(),
            tokens: Vec::new(),
            tally: Tally::default(),
            start: Instant::now(),
            first: true,
            ended: None,
            pass_clock: None,
        })
    }

    /// Whether the generation has ended; emits the first token before the first step.
    pub fn over(&mut self, on_token: TokenSink<'_>) -> Result<bool> {
        if self.ended.is_some() {
            return Ok(true);
        }
        if std::mem::take(&mut self.first) {
            if self.config.max_new_tokens == 0 {
                self.ended = Some(FinishReason::Length);
                return Ok(true);
            }
            return self.emit(self.x, self.n - 1, on_token);
        }
        Ok(false)
    }

    /// Emits `t`, predicted by the row at `pos`; `true` when the generation ends with it.
    pub fn emit(&mut self, t: TokenId, pos: u32, on_token: TokenSink<'_>) -> Result<bool> {
        let r = crate::autoregressive::emit(
            t,
            &mut self.tokens,
            pos,
            self.max,
            &self.config,
            on_token,
        )?;
        if r.is_some() {
            self.ended = r;
        }
        Ok(r.is_some())
    }

    /// A batch-invariant pass of `ids` at `positions` under `mask`, the logits of rows `logits`
    /// wanted; timed until [`Common::passed`].
    pub fn pass(
        &mut self,
        ids: Vec<TokenId>,
        positions: Vec<u32>,
        mask: AttnMask,
        logits: std::ops::Range<usize>,
    ) -> Pass {
        self.tally.forwards += 1;
        self.pass_clock = Some(Instant::now());
        Pass {
            ids,
            positions,
            mask,
            invariant: true,
            logits,
        }
    }

    /// The open pass's outputs arrived.
    pub fn passed(&mut self) {
        if let Some(t) = self.pass_clock.take() {
            self.tally.forward_us += t.elapsed().as_micros() as u64;
        }
    }

    /// The generation so far, as mode `name`.
    pub fn generation(self, name: &str) -> Generation {
        let stats = DecodeStats {
            tokens_per_step: self.tally.step_starts.counts(self.tokens.len()),
            ..self.tally.stats(name)
        };
        Generation {
            tokens: self.tokens,
            finish: self.ended.unwrap_or(FinishReason::Stop),
            prompt_len: self.prompt_len,
            prefill: self.prefill,
            decode: self.start.elapsed(),
            stats,
        }
    }
}

/// Counters of a run, turned into [`DecodeStats`].
#[derive(Default)]
pub(crate) struct Tally {
    pub forwards: u64,
    pub steps: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    pub block_tokens: u64,
    pub iterations: u64,
    pub forward_us: u64,
    /// Steps by accepted drafts (self-speculation) or tokens decided per pass (threshold).
    pub accepted_length: Vec<u64>,
    /// Steps by block size.
    pub block_size: Vec<u64>,
    /// Where each step's tokens begin.
    pub(crate) step_starts: StepLog,
}

impl Tally {
    pub fn step(&mut self, block: usize, offered: usize, accepted: usize) {
        self.steps += 1;
        self.block_tokens += block as u64;
        self.draft_tokens += offered as u64;
        self.accepted_tokens += accepted as u64;
        bump(&mut self.accepted_length, accepted);
        bump(&mut self.block_size, block);
    }

    pub fn stats(self, name: &str) -> DecodeStats {
        let mut s = DecodeStats::new(name, self.forwards);
        for (k, v) in [
            ("steps", self.steps),
            ("draft_tokens", self.draft_tokens),
            ("accepted_tokens", self.accepted_tokens),
            ("block_tokens", self.block_tokens),
            ("iterations", self.iterations),
            ("time_forward_us", self.forward_us),
        ] {
            s.counters.insert(k.into(), v);
        }
        s.histograms
            .insert("accepted_length".into(), self.accepted_length);
        s.histograms.insert("block_size".into(), self.block_size);
        s
    }
}

pub(crate) fn bump(h: &mut Vec<u64>, i: usize) {
    if h.len() <= i {
        h.resize(i + 1, 0);
    }
    h[i] += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(slope: f64) -> CostModel {
        let rows: Vec<usize> = (1..=32).collect();
        CostModel {
            key: "test".into(),
            pass_s: rows.iter().map(|&k| 1.0 + slope * (k - 1) as f64).collect(),
            rows,
            drafts: Default::default(),
            measured_s: 0.0,
            clock_corrected: true,
        }
    }

    #[test]
    fn planned_blocks_follow_the_cost_curve_and_the_acceptance() {
        let s = DiffusionSettings {
            block: 16,
            ..DiffusionSettings::default()
        };
        let config = GenerateConfig {
            max_new_tokens: 100,
            eos_token_ids: vec![],
        };
        // A pass over k rows costs k steps: never a block (two passes for at most k tokens).
        assert!(!linear_pays_at_prior(&curve(1.0), 16));
        let b = BlockSize::cost_aware(&s, curve(1.0));
        // Tokens emitted once the first one and the warm-up's plain steps are out.
        let past = WARM_UP_STEPS + 1;
        assert_eq!(b.fitted(10, past, 1000, &config), 1);
        // Nearly flat: a large block; cut by the context and the token limit.
        assert!(linear_pays_at_prior(&curve(0.02), 16));
        let mut b = BlockSize::cost_aware(&s, curve(0.02));
        assert!(b.fitted(10, past, 1000, &config) >= 8);
        assert_eq!(b.fitted(10, past, 14, &config), 4);
        assert_eq!(b.fitted(10, 98, 1000, &config), 3);
        // The warm-up: plain steps while a short answer could still end.
        for emitted in 0..past {
            assert_eq!(b.fitted(10, emitted, 1000, &config), 1, "{emitted}");
        }
        // Drafts that are never accepted: plain steps, and a block again after a streak.
        for _ in 0..10 {
            b.update(0, 15);
        }
        assert_eq!(b.fitted(10, past, 1000, &config), 1);
        for _ in 0..EXPLORE_AFTER {
            b.update(0, 0);
        }
        assert!(b.fitted(10, past, 1000, &config) > 1);
    }

    #[test]
    fn the_block_grows_on_full_acceptance_and_shrinks_on_little() {
        let s = DiffusionSettings {
            block: 8,
            dynamic: true,
            min_block: 2,
            max_block: 16,
            ..DiffusionSettings::default()
        };
        let mut b = BlockSize::new(&s);
        b.update(7, 7);
        assert_eq!(b.get(), 16);
        b.update(15, 15);
        assert_eq!(b.get(), 16);
        b.update(5, 15);
        assert_eq!(b.get(), 16);
        b.update(3, 15);
        assert_eq!(b.get(), 8);
        for _ in 0..5 {
            b.update(0, 7);
        }
        assert_eq!(b.get(), 2);
        let mut fixed = BlockSize::new(&DiffusionSettings::default());
        fixed.update(7, 7);
        assert_eq!(fixed.get(), 8);
    }

    #[test]
    fn settings_are_checked() {
        assert!(DiffusionSettings::default().validate().is_ok());
        for bad in [
            DiffusionSettings {
                block: 0,
                ..Default::default()
            },
            DiffusionSettings {
                block: 65,
                ..Default::default()
            },
            DiffusionSettings {
                threshold: 0.0,
                ..Default::default()
            },
            DiffusionSettings {
                threshold: f32::NAN,
                ..Default::default()
            },
            DiffusionSettings {
                dynamic: true,
                block: 64,
                max_block: 32,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn options_that_do_not_apply_are_refused_naming_both() {
        use crate::DecodeSpec as D;
        let (linear, threshold_mode, quadratic) = (
            D::diffusion(DiffusionMode::Linear),
            D::diffusion(DiffusionMode::Threshold),
            D::diffusion(DiffusionMode::Quadratic),
        );
        let flags = &OptionNames::FLAGS;
        let threshold = DiffusionOptions {
            threshold: Some(0.5),
            ..Default::default()
        };
        let e = threshold
            .settings_for(&linear, flags)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--threshold") && e.contains("diffusion-linear"),
            "{e}"
        );
        let s = threshold.settings_for(&threshold_mode, flags).unwrap();
        assert_eq!(s.unwrap().threshold, 0.5);
        let block = DiffusionOptions {
            block: Some(8),
            dynamic: true,
            ..Default::default()
        };
        let e = block
            .settings_for(&D::Autoregressive, &OptionNames::REQUEST)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("glance.block, glance.dynamic_block") && e.contains("`ar`"),
            "{e}"
        );
        assert!(block.settings_for(&quadratic, flags).is_ok());
        assert_eq!(
            DiffusionOptions::default()
                .settings_for(&D::Autoregressive, flags)
                .unwrap(),
            None
        );
        for (o, want) in [
            (
                DiffusionOptions {
                    block: Some(0),
                    ..Default::default()
                },
                "--block must be in 1..=64, got 0",
            ),
            (
                DiffusionOptions {
                    threshold: Some(f32::NAN),
                    ..Default::default()
                },
                "--threshold must be in (0, 1], got NaN",
            ),
        ] {
            let e = o
                .settings_for(&threshold_mode, flags)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
