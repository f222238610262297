//! Sampling parameters, validated once at the edge.

use crate::{Error, Result, TokenId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most entries one `logit_bias` may hold (OpenAI allows 300; glance is generous).
pub const MAX_LOGIT_BIAS: usize = 1024;
/// The most top alternatives a token's log-probabilities may list (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Smallest positive temperature accepted by [`SamplingParams::validate`]. Below it, `logits / t`
/// overflows `f32` for ordinary logits (at `t = 1e-45` every logit above ~1e-7 becomes infinite)
/// and the draw is indistinguishable from greedy anyway: ask for greedy with `temperature = 0`.
pub const MIN_TEMPERATURE: f32 = 1e-3;

/// How to pick the next token. `temperature == 0` means greedy (argmax); then top-k / top-p /
/// min-p / seed are irrelevant. A positive temperature must be at least [`MIN_TEMPERATURE`].
///
/// The *processors* (`logit_bias`, `min_tokens`, `repetition_penalty`, `presence_penalty`,
/// `frequency_penalty`) rewrite the logits from the history of the generation before any
/// selection, greedy or sampled; each one's neutral value (the default) leaves them untouched.
/// See `glance_decode::sampler` for the order they apply in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Keep only tokens whose probability is at least `min_p` times the most likely one's
    /// (0 = off), in [0, 1].
    pub min_p: f32,
    /// Divides a positive logit (multiplies a negative one) of every token already in the prompt
    /// or the answer (1 = off, as Hugging Face and vLLM), in (0, 100].
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token already in the answer (0 = off), in [-2, 2].
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it is already in the answer (0 = off), in
    /// [-2, 2].
    pub frequency_penalty: f32,
    /// Added to the logits of the given token ids, each in [-100, 100] (empty = off).
    pub logit_bias: BTreeMap<TokenId, f32>,
    /// End-of-sequence tokens are masked until the answer has this many tokens (0 = off).
    pub min_tokens: usize,
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
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: BTreeMap::new(),
            min_tokens: 0,
        }
    }

    /// Seeded sampling at `temperature` with no truncation and no processor.
    pub fn sampled(temperature: f32, seed: u64) -> Self {
        Self {
            temperature,
            seed,
            ..Self::greedy()
        }
    }

    /// True when no processor changes the logits: every one at its neutral value.
    pub fn processors_neutral(&self) -> bool {
        self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && self.logit_bias.is_empty()
            && self.min_tokens == 0
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
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::InvalidParam(format!(
                "min_p must be in [0, 1], got {}",
                self.min_p
            )));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 100.0) {
            return Err(Error::InvalidParam(format!(
                "repetition_penalty must be in (0, 100], got {}",
                self.repetition_penalty
            )));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(Error::InvalidParam(format!(
                    "{name} must be in [-2, 2], got {v}"
                )));
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(Error::InvalidParam(format!(
                "logit_bias holds at most {MAX_LOGIT_BIAS} entries, got {}",
                self.logit_bias.len()
            )));
        }
        if let Some((id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(*b))
        {
            return Err(Error::InvalidParam(format!(
                "logit_bias of token {id} must be in [-100, 100], got {b}"
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
        let bad = [
            SamplingParams {
                min_p: 1.5,
                ..SamplingParams::greedy()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..SamplingParams::greedy()
            },
            SamplingParams {
                presence_penalty: 2.5,
                ..SamplingParams::greedy()
            },
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..SamplingParams::greedy()
            },
            SamplingParams {
                logit_bias: [(3, 101.0)].into(),
                ..SamplingParams::greedy()
            },
        ];
        for (p, name) in bad.iter().zip([
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
        ]) {
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        assert!(SamplingParams::greedy().processors_neutral());
        assert!(!SamplingParams {
            min_tokens: 2,
            ..SamplingParams::greedy()
        }
        .processors_neutral());
    }
}
