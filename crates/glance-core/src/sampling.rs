//! Sampling parameters, validated once at the edge.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// How to pick the next token. `temperature == 0` means greedy (argmax); then top-k / top-p / seed
/// are irrelevant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects greedy decoding.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
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

    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::InvalidParam(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
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
        for p in [0.0, 1.5, f32::NAN] {
            let bad_p = SamplingParams {
                top_p: p,
                ..SamplingParams::greedy()
            };
            assert!(bad_p.validate().is_err(), "top_p {p} accepted");
        }
    }
}
