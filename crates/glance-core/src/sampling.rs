//! Sampling parameters, validated once at the edge.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// Smallest positive temperature accepted by [`SamplingParams::validate`]. Below it, `logits / t`
/// overflows `f32` for ordinary logits (at `t = 1e-45` every logit above ~1e-7 becomes infinite)
/// and the draw is indistinguishable from greedy anyway: ask for greedy with `temperature = 0`.
pub const MIN_TEMPERATURE: f32 = 1e-3;

/// How to pick the next token. `temperature == 0` means greedy (argmax); then top-k / top-p / seed
/// are irrelevant. A positive temperature must be at least [`MIN_TEMPERATURE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects greedy decoding, otherwise at least [`MIN_TEMPERATURE`].
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off; a k at or above the vocabulary size keeps every
    /// token, i.e. is also off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches p (1.0 = off).
    pub top_p: f32,
    /// Seed of the sampler's random stream: the same seed gives the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// True when the sampler is an argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field's range: `temperature` is 0 (greedy) or a finite number
    /// ≥ [`MIN_TEMPERATURE`]; `top_p` is in (0, 1]. Every `top_k` is valid (see the field).
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(Error::InvalidParam(format!(
                "temperature must be a finite number >= 0, got {t}"
            )));
        }
        if t > 0.0 && t < MIN_TEMPERATURE {
            return Err(Error::InvalidParam(format!(
                "temperature {t:e} is too small: use 0 for greedy decoding or at least {MIN_TEMPERATURE}"
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidParam(format!(
                "top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_out_of_range() {
        assert!(SamplingParams::greedy().validate().is_ok());
        let bad_t = SamplingParams {
            temperature: -1.0,
            ..SamplingParams::greedy()
        };
        assert!(bad_t.validate().is_err());
        let nan_t = SamplingParams {
            temperature: f32::NAN,
            ..SamplingParams::greedy()
        };
        assert!(nan_t.validate().is_err());
        for t in [1e-45, 1e-4, f32::INFINITY] {
            let tiny = SamplingParams {
                temperature: t,
                ..SamplingParams::greedy()
            };
            assert!(tiny.validate().is_err(), "temperature {t} accepted");
        }
        for t in [MIN_TEMPERATURE, 0.7, 100.0] {
            let ok = SamplingParams {
                temperature: t,
                top_k: usize::MAX,
                ..SamplingParams::greedy()
            };
            assert!(ok.validate().is_ok(), "temperature {t} refused");
        }
        for p in [0.0, 1.5, f32::NAN] {
            let bad_p = SamplingParams {
                top_p: p,
                ..SamplingParams::greedy()
            };
            assert!(bad_p.validate().is_err(), "top_p {p} accepted");
        }
    }
}
