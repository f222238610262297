//! The decoding-strategy seam: every way of turning a prefilled prompt into tokens implements
//! [`DecodeStrategy`]. A strategy gets the model (through the narrow [`CausalLm`] interface), the
//! [`Prefilled`] state (cache, hidden states and positions of every prompt row, the images) and
//! the [`Sampler`], and emits tokens in order through a callback that can stop it. It never sees
//! requests, tokenizers or images as files.
//!
//! Which strategy a request runs is a [`DecodeSpec`]; the engine turns a spec into a strategy
//! (and loads what the strategy needs, such as a draft head). Speculative decoding (ViSpec,
//! EAGLE) and block-diffusion decoding (Fast-dVLM) plug in here as further implementations,
//! reporting their own counters in [`DecodeStats`].

use crate::autoregressive::{GenerateConfig, Generation, Prefilled};
use crate::diffusion::DiffusionMode;
use crate::sampler::Sampler;
use crate::step::{run_alone, DecodeState};
use glance_core::{Error, Result, TokenId};
use glance_nn::CausalLm;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Receives each new token in order; returns `true` to stop after it.
pub type TokenSink<'a> = &'a mut dyn FnMut(TokenId) -> Result<bool>;

/// A way of decoding after a prefill.
pub trait DecodeStrategy: Send + Sync {
    /// The spec name (`ar`, …).
    fn name(&self) -> &'static str;

    /// The request's decoding state after `state` ([`crate::step`]): it runs until EOS,
    /// `config.max_new_tokens`, the model's context, or the sink asks to stop. Picks the first
    /// token from the prefill's last row.
    fn start(
        &self,
        model: &dyn CausalLm,
        state: Prefilled,
        sampler: Sampler,
        config: &GenerateConfig,
    ) -> Result<Box<dyn DecodeState>>;

    /// Decodes after `state` alone, step by step ([`run_alone`]). Under greedy sampling every
    /// lossless strategy returns exactly the tokens of [`crate::Autoregressive`].
    fn decode(
        &self,
        model: &dyn CausalLm,
        state: Prefilled,
        sampler: Sampler,
        config: &GenerateConfig,
        on_token: TokenSink<'_>,
    ) -> Result<Generation> {
        let state = self.start(model, state, sampler, config)?;
        run_alone(model, state, on_token)
    }
}

/// Which decoding strategy a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeSpec {
    /// One token per forward pass ([`crate::Autoregressive`]).
    #[default]
    #[serde(alias = "autoregressive")]
    Ar,
    /// Speculative decoding with a ViSpec draft head (vision adaptor, global visual feature):
    /// [`crate::Speculative`].
    Vispec,
    /// Speculative decoding with the text-only EAGLE-style head: the same head without the
    /// vision parts, the baseline ViSpec is measured against.
    Eagle,
    /// Block diffusion, threshold unmasking (Fast-dVLM; a converted model): lossy.
    DiffusionThreshold,
    /// Block diffusion, linear self-speculation: lossless.
    DiffusionLinear,
    /// Block diffusion, quadratic self-speculation: lossless, one pass per step.
    DiffusionQuadratic,
    /// The fastest lossless strategy the model offers, chosen per request from the measured
    /// cost model ([`crate::cost`]): cost-aware speculation with the request's best draft head
    /// where a draft can pay on this machine, else `ar`.
    Auto,
}

impl DecodeSpec {
    /// Every strategy glance can run.
    pub const ALL: [DecodeSpec; 7] = [
        DecodeSpec::Ar,
        DecodeSpec::Vispec,
        DecodeSpec::Eagle,
        DecodeSpec::DiffusionThreshold,
        DecodeSpec::DiffusionLinear,
        DecodeSpec::DiffusionQuadratic,
        DecodeSpec::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DecodeSpec::Ar => "ar",
            DecodeSpec::Vispec => "vispec",
            DecodeSpec::Eagle => "eagle",
            DecodeSpec::DiffusionThreshold => "diffusion-threshold",
            DecodeSpec::DiffusionLinear => "diffusion-linear",
            DecodeSpec::DiffusionQuadratic => "diffusion-quadratic",
            DecodeSpec::Auto => "auto",
        }
    }

    /// The block-diffusion mode of the strategy, if it is one.
    pub fn diffusion_mode(self) -> Option<DiffusionMode> {
        match self {
            DecodeSpec::DiffusionThreshold => Some(DiffusionMode::Threshold),
            DecodeSpec::DiffusionLinear => Some(DiffusionMode::Linear),
            DecodeSpec::DiffusionQuadratic => Some(DiffusionMode::Quadratic),
            _ => None,
        }
    }

    /// Whether greedy decoding with it returns exactly the autoregressive tokens of the model
    /// it runs.
    pub fn lossless(self) -> bool {
        self != DecodeSpec::DiffusionThreshold
    }

    /// The kind of draft head the strategy needs (`vispec`, `eagle`), if any.
    pub fn draft_kind(self) -> Option<&'static str> {
        match self {
            DecodeSpec::Vispec | DecodeSpec::Eagle => Some(self.name()),
            _ => None,
        }
    }
}

impl fmt::Display for DecodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DecodeSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ar" | "autoregressive" => Ok(DecodeSpec::Ar),
            "vispec" => Ok(DecodeSpec::Vispec),
            "eagle" => Ok(DecodeSpec::Eagle),
            "diffusion-threshold" => Ok(DecodeSpec::DiffusionThreshold),
            "diffusion-linear" => Ok(DecodeSpec::DiffusionLinear),
            "diffusion-quadratic" => Ok(DecodeSpec::DiffusionQuadratic),
            "auto" => Ok(DecodeSpec::Auto),
            _ => {
                let known: Vec<&str> = Self::ALL.iter().map(|d| d.name()).collect();
                Err(Error::InvalidParam(format!(
                    "unknown decoding strategy `{s}` (available: {})",
                    known.join(", ")
                )))
            }
        }
    }
}

/// What a strategy did, for the response and for metrics: target forward passes after the
/// prefill, and named counters / per-position histograms of the strategy's own (e.g. drafts,
/// accepted tokens by draft position).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecodeStats {
    pub strategy: String,
    /// Forward passes of the model after the prefill.
    pub forward_passes: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub histograms: BTreeMap<String, Vec<u64>>,
    /// Why `auto` chose `strategy` (`None` when the request named it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<String>,
    /// Tokens each step emitted, in order: the prefill's first token, then one entry per step
    /// (a target pass for `ar`, a draft-and-verify round for `vispec` / `eagle`, a block for
    /// the diffusion strategies). Every entry is at least 1 and they sum to the tokens generated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens_per_step: Vec<u32>,
}

impl DecodeStats {
    pub fn new(strategy: &str, forward_passes: u64) -> Self {
        Self {
            strategy: strategy.to_string(),
            forward_passes,
            ..Self::default()
        }
    }
}

/// Where each step after the first began (the tokens emitted before it), turned into
/// [`DecodeStats::tokens_per_step`] once `total` tokens are out. The first step (the prefill's
/// token) begins at 0; a step that emitted nothing (the generation ended before it) is left out.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepLog {
    starts: Vec<u32>,
}

impl StepLog {
    /// A step begins after `emitted` tokens.
    pub(crate) fn begin(&mut self, emitted: usize) {
        self.starts.push(emitted as u32);
    }

    pub(crate) fn counts(&self, total: usize) -> Vec<u32> {
        let mut bounds = Vec::with_capacity(self.starts.len() + 2);
        bounds.push(0);
        bounds.extend(&self.starts);
        bounds.push(total as u32);
        bounds
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .filter(|&n| n > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_by_name_and_unknown_ones_list_the_choices() {
        for d in DecodeSpec::ALL {
            assert_eq!(d.name().parse::<DecodeSpec>().unwrap(), d);
        }
        assert_eq!(
            "Autoregressive".parse::<DecodeSpec>().unwrap(),
            DecodeSpec::Ar
        );
        let e = "bogus".parse::<DecodeSpec>().unwrap_err().to_string();
        assert!(e.contains("bogus") && e.contains("ar"), "{e}");
    }

    #[test]
    fn step_logs_count_the_tokens_of_each_step() {
        let mut log = StepLog::default();
        assert_eq!(log.counts(0), Vec::<u32>::new());
        assert_eq!(log.counts(1), vec![1]);
        log.begin(1);
        log.begin(4);
        log.begin(4); // ended before emitting: left out
        assert_eq!(log.counts(4), vec![1, 3]);
        log.begin(6);
        assert_eq!(log.counts(7), vec![1, 3, 2, 1]);
    }
}
