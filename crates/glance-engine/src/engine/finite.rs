//! Non-finite output: every path that produces logits refuses NaN / infinite ones
//! ([`Error::NonFinite`]), and the error names the first layer whose output is not finite.
//!
//! The check itself is cheap — the sampler checks each logit row it picks from
//! (`glance_decode::Sampler::sample`), and [`Engine::prompt_logits`] scans the logits it returns.
//! Only on failure is the prompt run again, one stage at a time (each image's vision tower and
//! projector, the prompt rows, every decoder layer, the final norm, the LM head), to find where
//! the first non-finite value appears.

use super::Engine;
use crate::request::Prompt;
use candle_core::{DType, Tensor};
use glance_core::{Error, Result};
use glance_nn::{AttnMask, CausalLm};

/// Whether every value of `t` is finite.
pub(crate) fn all_finite(t: &Tensor) -> Result<bool> {
    let values: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    Ok(values.iter().all(|v| v.is_finite()))
}

impl Engine {
    /// `e` with the first non-finite stage of `prompt`'s forward pass named, when `e` is
    /// [`Error::NonFinite`]; any other error unchanged.
    pub(crate) fn explain_non_finite(&self, e: Error, prompt: &Prompt) -> Error {
        match e {
            Error::NonFinite(msg) => {
                let place = self
                    .locate_non_finite(prompt)
                    .unwrap_or_else(|e| format!("locating it failed: {e}"));
                Error::NonFinite(format!("{msg}; {place}"))
            }
            other => other,
        }
    }

    /// [`Engine::explain_non_finite`] for prompt rows already embedded (the batching path).
    pub(crate) fn explain_non_finite_rows(
        &self,
        e: Error,
        rows: &Tensor,
        positions: &[u32],
    ) -> Error {
        match e {
            Error::NonFinite(msg) => {
                let place = self
                    .locate_in_rows(rows, positions)
                    .unwrap_or_else(|e| format!("locating it failed: {e}"));
                Error::NonFinite(format!("{msg}; {place}"))
            }
            other => other,
        }
    }

    /// Where `prompt`'s forward pass first gives a non-finite value, in words.
    fn locate_non_finite(&self, prompt: &Prompt) -> Result<String> {
        let rendered = self.render(prompt, false, false, None)?;
        let encoded = self.encode_all(&rendered.images)?;
        for (i, e) in encoded.iter().enumerate() {
            let enc = &e.entry.encoding;
            if !all_finite(enc.vision_hidden())? {
                return Ok(format!(
                    "the first non-finite output is image {i}'s vision tower (its feature layer)"
                ));
            }
            if !all_finite(enc.features())? {
                return Ok(format!(
                    "the first non-finite output is image {i}'s multimodal projector"
                ));
            }
        }
        let plan = self.plan(&rendered.prompt.ids, &encoded)?;
        self.locate_in_rows(&plan.rows()?, &plan.positions())
    }

    /// Runs prompt rows `(t, hidden)` through the decoder one layer at a time and names the
    /// first stage whose output is not finite.
    fn locate_in_rows(&self, rows: &Tensor, positions: &[u32]) -> Result<String> {
        if !all_finite(rows)? {
            return Ok(
                "the first non-finite output is the prompt rows (token embeddings or projected \
                 image features)"
                    .into(),
            );
        }
        let text = self.model.text();
        let layers = text.num_layers();
        let mut cache = text.new_cache();
        let mut x = rows.clone();
        let causal = AttnMask::causal();
        for i in 0..layers {
            (x, _) = text.forward_layers(&x, positions, &causal, &mut cache, i..i + 1, None)?;
            if !all_finite(&x)? {
                return Ok(format!(
                    "the first non-finite output is decoder layer {i} (of 0..{layers}) on the \
                     prompt"
                ));
            }
        }
        let normed = text.final_norm(&x)?;
        if !all_finite(&normed)? {
            return Ok("the first non-finite output is the decoder's final norm".into());
        }
        // The last row is the one the first token is picked from.
        let last = normed.narrow(0, normed.dim(0)? - 1, 1)?;
        if !all_finite(&text.logits(&last)?)? {
            return Ok("the first non-finite output is the LM head".into());
        }
        Ok(
            "every layer's output on the prompt is finite: a later decoding step gave the first \
            non-finite value"
                .into(),
        )
    }
}
