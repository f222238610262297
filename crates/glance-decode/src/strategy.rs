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
use crate::diffusion::{DiffusionMode, DiffusionOptions, DiffusionSettings, OptionNames};
use crate::sampler::Sampler;
use crate::speculative::TreeSettings;
use crate::step::{run_alone, DecodeState};
use glance_core::{Error, Result, TokenId};
use glance_nn::{CausalLm, DraftKind};
use serde::Serialize;
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

/// Which decoding strategy a request asks for, with its settings. Each strategy carries only
/// the settings it takes, so a draft tree on an autoregressive request, or a block size on a
/// speculative one, cannot be built; [`DecodeSpec::validate`] checks the values. A setting left
/// `None` is the engine's (`EngineOptions::tree` / `EngineOptions::diffusion` in glance-engine),
/// else the model's. It prints and parses as its name (`ar`, `vispec`, `diffusion-linear`, …);
/// [`DecodeSpec::parse_with`] attaches the settings a surface (flags, a request body) gave.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum DecodeSpec {
    /// One token per forward pass ([`crate::Autoregressive`]).
    #[default]
    Autoregressive,
    /// Speculative decoding ([`crate::Speculative`]) with a draft head of `kind`: ViSpec's
    /// (vision adaptor, global visual feature) or the text-only EAGLE-style baseline.
    Speculative {
        kind: DraftKind,
        tree: Option<TreeSettings>,
    },
    /// Block diffusion ([`crate::BlockDiffusion`], Fast-dVLM) on a converted model: threshold
    /// unmasking (lossy) or linear / quadratic self-speculation (lossless).
    Diffusion {
        mode: DiffusionMode,
        settings: Option<DiffusionSettings>,
    },
    /// The fastest lossless strategy the model offers, chosen per request from the measured
    /// cost model ([`crate::cost`]): cost-aware speculation with the request's best draft head
    /// (growing `tree`) where a draft can pay on this machine, cost-aware linear diffusion on a
    /// converted model, else autoregressive.
    Auto { tree: Option<TreeSettings> },
}

impl DecodeSpec {
    /// Every strategy glance can run, with the engine's settings.
    pub const ALL: [DecodeSpec; 7] = [
        DecodeSpec::Autoregressive,
        DecodeSpec::speculative(DraftKind::Vispec),
        DecodeSpec::speculative(DraftKind::Eagle),
        DecodeSpec::diffusion(DiffusionMode::Threshold),
        DecodeSpec::diffusion(DiffusionMode::Linear),
        DecodeSpec::diffusion(DiffusionMode::Quadratic),
        DecodeSpec::Auto { tree: None },
    ];

    /// Speculative decoding with a `kind` head and the engine's tree.
    pub const fn speculative(kind: DraftKind) -> Self {
        DecodeSpec::Speculative { kind, tree: None }
    }

    /// Block diffusion in `mode` with the engine's (else the model's) settings.
    pub const fn diffusion(mode: DiffusionMode) -> Self {
        DecodeSpec::Diffusion {
            mode,
            settings: None,
        }
    }

    /// `auto` with the engine's tree.
    pub const fn auto() -> Self {
        DecodeSpec::Auto { tree: None }
    }

    pub fn name(&self) -> &'static str {
        match self {
            DecodeSpec::Autoregressive => "ar",
            DecodeSpec::Speculative { kind, .. } => kind.name(),
            DecodeSpec::Diffusion { mode, .. } => mode.name(),
            DecodeSpec::Auto { .. } => "auto",
        }
    }

    /// The block-diffusion mode of the strategy, if it is one.
    pub fn diffusion_mode(&self) -> Option<DiffusionMode> {
        match self {
            DecodeSpec::Diffusion { mode, .. } => Some(*mode),
            _ => None,
        }
    }

    /// The kind of draft head the strategy needs, if it names one.
    pub fn draft_kind(&self) -> Option<DraftKind> {
        match self {
            DecodeSpec::Speculative { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// The draft tree the request gives (`None`: the engine's, or not a speculative strategy).
    pub fn tree(&self) -> Option<&TreeSettings> {
        match self {
            DecodeSpec::Speculative { tree, .. } | DecodeSpec::Auto { tree } => tree.as_ref(),
            _ => None,
        }
    }

    /// The block-diffusion settings the request gives (`None`: the engine's or the model's, or
    /// not a diffusion strategy).
    pub fn diffusion_settings(&self) -> Option<&DiffusionSettings> {
        match self {
            DecodeSpec::Diffusion { settings, .. } => settings.as_ref(),
            _ => None,
        }
    }

    pub fn is_auto(&self) -> bool {
        matches!(self, DecodeSpec::Auto { .. })
    }

    /// Whether greedy decoding with it returns exactly the autoregressive tokens of the model
    /// it runs.
    pub fn lossless(&self) -> bool {
        self.diffusion_mode() != Some(DiffusionMode::Threshold)
    }

    /// Checks the settings' values.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = self.tree() {
            t.validate()?;
        }
        if let Some(d) = self.diffusion_settings() {
            d.validate()?;
        }
        Ok(())
    }

    /// The strategy `name` with the settings a surface gave: a draft `tree` (speculative
    /// strategies and `auto` only) and block-diffusion `diffusion` options (the diffusion
    /// strategies only, [`DiffusionOptions::settings_for`]). A setting that does not apply to
    /// `name` is refused naming both, in the surface's spelling (`names`).
    pub fn parse_with(
        name: &str,
        tree: Option<TreeSettings>,
        diffusion: &DiffusionOptions,
        names: &OptionNames,
    ) -> Result<Self> {
        let mut spec: DecodeSpec = name.parse()?;
        let settings = diffusion.settings_for(&spec, names)?;
        match &mut spec {
            DecodeSpec::Speculative { tree: t, .. } | DecodeSpec::Auto { tree: t } => *t = tree,
            DecodeSpec::Autoregressive | DecodeSpec::Diffusion { .. } if tree.is_some() => {
                return Err(Error::InvalidParam(format!(
                    "{}: a draft tree applies only to the speculative strategies (vispec, \
                     eagle, auto), not `{name}`",
                    names.tree
                )))
            }
            DecodeSpec::Diffusion { settings: s, .. } => *s = settings,
            DecodeSpec::Autoregressive => {}
        }
        spec.validate()?;
        Ok(spec)
    }
}

impl fmt::Display for DecodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DecodeSpec {
    type Err = Error;

    /// The strategy by name, with the engine's settings.
    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim().to_ascii_lowercase();
        if name == "autoregressive" {
            return Ok(DecodeSpec::Autoregressive);
        }
        Self::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(DecodeSpec::name).collect();
                Error::InvalidParam(format!(
                    "unknown decoding strategy `{s}` (available: {})",
                    known.join(", ")
                ))
            })
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
            DecodeSpec::Autoregressive
        );
        let e = "bogus".parse::<DecodeSpec>().unwrap_err().to_string();
        assert!(e.contains("bogus") && e.contains("ar"), "{e}");
    }

    #[test]
    fn settings_attach_only_to_the_strategies_they_belong_to() {
        let flags = &OptionNames::FLAGS;
        let none = DiffusionOptions::default();
        let chain = TreeSettings::chain(3);
        let s = DecodeSpec::parse_with("eagle", Some(chain.clone()), &none, flags).unwrap();
        assert_eq!(
            s,
            DecodeSpec::Speculative {
                kind: DraftKind::Eagle,
                tree: Some(chain.clone())
            }
        );
        assert_eq!(s.tree(), Some(&chain));
        let auto = DecodeSpec::parse_with("auto", Some(chain.clone()), &none, flags).unwrap();
        assert!(auto.is_auto() && auto.tree() == Some(&chain));
        let e = DecodeSpec::parse_with("ar", Some(chain.clone()), &none, flags)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--draft-depth") && e.contains("`ar`"), "{e}");
        let e = DecodeSpec::parse_with("diffusion-linear", Some(chain), &none, flags)
            .unwrap_err()
            .to_string();
        assert!(e.contains("draft tree"), "{e}");
        let block = DiffusionOptions {
            block: Some(16),
            ..DiffusionOptions::default()
        };
        let d = DecodeSpec::parse_with("diffusion-quadratic", None, &block, flags).unwrap();
        assert_eq!(d.diffusion_mode(), Some(DiffusionMode::Quadratic));
        assert_eq!(d.diffusion_settings().map(|s| s.block), Some(16));
        assert!(DecodeSpec::parse_with("vispec", None, &block, flags).is_err());
        // Values are checked too, whoever built the spec.
        let bad = DecodeSpec::Speculative {
            kind: DraftKind::Vispec,
            tree: Some(TreeSettings::chain(0)),
        };
        assert!(bad.validate().is_err());
        assert!(
            DecodeSpec::parse_with("eagle", Some(TreeSettings::chain(0)), &none, flags).is_err()
        );
        assert!(!DecodeSpec::diffusion(DiffusionMode::Threshold).lossless());
        assert!(DecodeSpec::ALL.iter().filter(|d| !d.lossless()).count() == 1);
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
