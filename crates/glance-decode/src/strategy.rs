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

    /// Decodes after `state` until EOS, `config.max_new_tokens`, the model's context, or the sink
    /// asks to stop. Under greedy sampling every lossless strategy returns exactly the tokens of
    /// [`crate::Autoregressive`].
    fn decode(
        &self,
        model: &dyn CausalLm,
        state: Prefilled,
        sampler: Sampler,
        config: &GenerateConfig,
        on_token: TokenSink<'_>,
    ) -> Result<Generation>;
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
}
