//! Policy names, budgets and the full pruning request ([`PruneSpec`]) as a user gives them.

use crate::merge::{Hier, Pool};
use crate::select::{Adaptive, Mix, Random, Saliency, Text};
use crate::signals::{check_tau, DEFAULT_TAU};
use crate::Pruner;
use glance_core::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// A visual-token pruning policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    None,
    Random,
    Pool,
    Saliency,
    Text,
    Mix,
    Adaptive,
    FastV,
    Hier,
}

/// Where a policy acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Nothing is pruned.
    Off,
    /// Before the LLM: the prompt holds only the kept rows ([`Pruner`]).
    PreLlm,
    /// Inside the LLM: FastV's prefill drops rows after a layer.
    InLlm,
}

impl Policy {
    pub const ALL: [Policy; 9] = [
        Policy::None,
        Policy::Random,
        Policy::Pool,
        Policy::Saliency,
        Policy::Text,
        Policy::Mix,
        Policy::Adaptive,
        Policy::FastV,
        Policy::Hier,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Random => "random",
            Policy::Pool => "pool",
            Policy::Saliency => "saliency",
            Policy::Text => "text",
            Policy::Mix => "mix",
            Policy::Adaptive => "adaptive",
            Policy::FastV => "fastv",
            Policy::Hier => "hier",
        }
    }

    pub fn stage(self) -> Stage {
        match self {
            Policy::None => Stage::Off,
            Policy::FastV => Stage::InLlm,
            _ => Stage::PreLlm,
        }
    }

    /// Whether the policy reads the text query.
    pub fn uses_query(self) -> bool {
        matches!(self, Policy::Text | Policy::Mix | Policy::Adaptive)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        Policy::ALL
            .iter()
            .copied()
            .find(|p| p.name() == t)
            .ok_or_else(|| {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                Error::InvalidParam(format!(
                    "unknown pruning policy `{s}` (one of: {})",
                    names.join(", ")
                ))
            })
    }
}

/// How many visual tokens to keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// A fraction of the image's tokens, in `(0, 1]`.
    Ratio(f64),
    /// A number of tokens (≥ 1; more than the image has keeps all).
    Count(usize),
}

impl Budget {
    /// Tokens kept of `n`: `round(ratio · n)` at least 1, or the count capped at `n`.
    pub fn resolve(self, n: usize) -> usize {
        match self {
            Budget::Ratio(r) => ((r * n as f64).round() as usize).clamp(1, n.max(1)),
            Budget::Count(c) => c.min(n),
        }
    }

    /// Whether every token is kept whatever `n` is.
    pub fn is_all(self) -> bool {
        matches!(self, Budget::Ratio(r) if r >= 1.0)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Ratio(r) => write!(f, "{}%", r * 100.0),
            Budget::Count(c) => write!(f, "{c}"),
        }
    }
}

impl FromStr for Budget {
    type Err = Error;
    /// `0.25` or `25%` is a ratio, `64` a count (a number with a decimal point is always a ratio:
    /// `1.0` keeps everything, `1` keeps one token).
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let bad = || {
            let msg =
                format!("--keep must be a ratio in (0, 1], a percentage or a count ≥ 1, got `{s}`");
            Error::InvalidParam(msg)
        };
        let ratio = |r: f64| {
            if r > 0.0 && r <= 1.0 {
                Ok(Budget::Ratio(r))
            } else {
                Err(bad())
            }
        };
        if let Some(p) = t.strip_suffix('%') {
            return ratio(p.trim().parse::<f64>().map_err(|_| bad())? / 100.0);
        }
        if t.contains(['.', 'e', 'E']) {
            return ratio(t.parse::<f64>().map_err(|_| bad())?);
        }
        match t.parse::<usize>() {
            Ok(c) if c >= 1 => Ok(Budget::Count(c)),
            _ => Err(bad()),
        }
    }
}

/// How a LLaVA-NeXT image's budget is shared between its base image and its tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TileBudget {
    /// By size: the base image and the tile grid keep the same share of their tokens.
    #[default]
    Global,
    /// HiRED-style (Arif et al., "HiRED: Attention-Guided Token Dropping for Efficient Inference
    /// of High-Resolution Vision-Language Models", 2024): the base image keeps its size share; the
    /// rest is shared among the tiles in proportion to the base image's [CLS] attention over each
    /// tile's area, and each tile selects its own.
    PerTile,
}

impl std::str::FromStr for TileBudget {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "global" => Ok(Self::Global),
            "per-tile" | "tile" => Ok(Self::PerTile),
            other => Err(Error::InvalidParam(format!(
                "unknown tile budget `{other}` (global or per-tile)"
            ))),
        }
    }
}

/// A full pruning request: the policy, the budget and the policies' knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct PruneSpec {
    pub policy: Policy,
    pub budget: Budget,
    /// Temperature of the cosine-based scores (text relevance; [CLS]-cosine saliency).
    pub tau: f32,
    /// Seed of `random`.
    pub seed: u64,
    /// Share of the budget `mix` gives to saliency.
    pub mix_saliency_share: f32,
    /// FastV's pruning layer `l` (rows are dropped after decoder layer `l`, i.e. before layer
    /// index `l`); `None` → `min(2, layers - 1)` (FastV's K = 2).
    pub fastv_layer: Option<usize>,
    /// LLaVA-NeXT: how each image's budget is shared between its base image and tiles.
    pub tiles: TileBudget,
}

impl Default for PruneSpec {
    fn default() -> Self {
        Self::new(Policy::None, Budget::Ratio(1.0))
    }
}

impl PruneSpec {
    pub fn new(policy: Policy, budget: Budget) -> Self {
        Self {
            policy,
            budget,
            tau: DEFAULT_TAU,
            seed: 0,
            mix_saliency_share: 0.5,
            fastv_layer: None,
            tiles: TileBudget::Global,
        }
    }

    /// Checks the knobs (not the budget against an image: that happens per image).
    pub fn validate(&self) -> Result<()> {
        check_tau(self.tau)?;
        if !(0.0..=1.0).contains(&self.mix_saliency_share) {
            return Err(Error::InvalidParam(format!(
                "the mix share must be in [0, 1], got {}",
                self.mix_saliency_share
            )));
        }
        if self.tiles == TileBudget::PerTile && self.policy.stage() != Stage::PreLlm {
            return Err(Error::InvalidParam(format!(
                "a per-tile budget needs a policy that selects before the LLM, not `{}`",
                self.policy
            )));
        }
        if self.fastv_layer == Some(0) {
            return Err(Error::InvalidParam("the FastV layer must be ≥ 1".into()));
        }
        Ok(())
    }

    /// Whether this request changes nothing (policy `none`, or a budget of everything).
    pub fn is_noop(&self) -> bool {
        self.policy == Policy::None || self.budget.is_all()
    }

    /// The pre-LLM selector of this request; `None` for `none` and `fastv`.
    pub fn pruner(&self) -> Option<Box<dyn Pruner>> {
        let tau = self.tau;
        Some(match self.policy {
            Policy::None | Policy::FastV => return None,
            Policy::Random => Box::new(Random { seed: self.seed }),
            Policy::Pool => Box::new(Pool),
            Policy::Saliency => Box::new(Saliency { tau }),
            Policy::Text => Box::new(Text { tau }),
            Policy::Mix => Box::new(Mix {
                tau,
                saliency_share: self.mix_saliency_share,
            }),
            Policy::Adaptive => Box::new(Adaptive { tau }),
            Policy::Hier => Box::new(Hier { tau }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_and_resolve() {
        assert_eq!("0.25".parse::<Budget>().unwrap(), Budget::Ratio(0.25));
        assert_eq!("12.5%".parse::<Budget>().unwrap(), Budget::Ratio(0.125));
        assert_eq!("64".parse::<Budget>().unwrap(), Budget::Count(64));
        assert_eq!("1.0".parse::<Budget>().unwrap(), Budget::Ratio(1.0));
        for bad in ["0", "0.0", "1.5", "-3", "abc", "", "150%", "nan"] {
            assert!(bad.parse::<Budget>().is_err(), "{bad}");
        }
        assert_eq!(Budget::Ratio(0.125).resolve(576), 72);
        assert_eq!(Budget::Ratio(0.0625).resolve(576), 36);
        assert_eq!(Budget::Ratio(0.01).resolve(16), 1);
        assert_eq!(Budget::Count(1000).resolve(576), 576);
    }

    #[test]
    fn policies_parse_by_name() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        let e = "bogus".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("adaptive") && e.contains("bogus"), "{e}");
    }
}
