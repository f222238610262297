//! The two signals of AdaFV's adaptive compression (saliency and text relevance), each made a
//! probability distribution over the `n` candidate tokens so that they are comparable before
//! mixing.
//!
//! * **Saliency** (what the image itself finds important): the vision tower's [CLS]→patch attention
//!   at the feature layer, averaged over heads and renormalised over the candidates (FasterVLM /
//!   VisionZip); without attention probabilities, `softmax(cos([CLS], patch) / τ)`.
//! * **Relevance** (what the question asks about): each query token's pre-LLM embedding attends
//!   over the projected visual tokens (same space: the LLM's input space) with
//!   `softmax_x(cos(q, x) / τ)`; the distributions are averaged over the query tokens. A word that
//!   matches nothing spreads its mass evenly, so function words do not steer the choice; a content
//!   word ("red", "triangle") concentrates its mass on the tokens that show it. τ is `--tau`.

use crate::{to_vec_f32, PruneInput};
use candle_core::{Tensor, D};
use glance_core::{Error, Result};
use glance_nn::{softmax_last_dim, Mode};

/// Default temperature of the cosine-based scores: tuned for `adaptive` on glance-tiny's
/// validation split (`glance eval --split val --prune adaptive --tau …`: 0.03 and 0.05 best at 12.5%
/// and 6.25% of the tokens, 0.5 worst). Other models may want another value (`--tau`).
pub const DEFAULT_TAU: f32 = 0.05;

/// Saliency of every candidate token, summing to 1.
pub fn saliency(input: &PruneInput, tau: f32) -> Result<Vec<f32>> {
    let n = input.len()?;
    if let Some(att) = &input.cls_attention {
        let (_, cols) = att.dims2()?;
        if cols != n {
            return Err(Error::InvalidParam(format!(
                "[CLS] attention covers {cols} tokens, expected {n}"
            )));
        }
        // (heads, n) -> (n)
        let mean = to_vec_f32(&att.mean(0)?)?;
        return Ok(normalise(mean));
    }
    match (&input.vision, &input.cls) {
        (Some(v), Some(cls)) => {
            // (1, d) · (d, n) of unit rows -> (1, n) cosines
            let cos = unit_rows(&cls.unsqueeze(0)?)?.matmul(&unit_rows(v)?.t()?)?;
            softmax_scores(&cos, tau)
        }
        _ => Err(Error::InvalidParam(
            "saliency needs the vision tower's [CLS] (attention or hidden state); this input has neither".into(),
        )),
    }
}

/// Relevance of every candidate token to the text query, summing to 1.
pub fn relevance(input: &PruneInput, tau: f32) -> Result<Vec<f32>> {
    let q = match &input.query {
        Some(q) if q.dim(0)? > 0 => q,
        _ => return Err(Error::InvalidParam(
            "text-relevance pruning needs a text query (the question), and this prompt has none"
                .into(),
        )),
    };
    let (tokens, qd) = (&input.tokens, q.dim(1)?);
    if qd != tokens.dim(1)? {
        return Err(Error::InvalidParam(format!(
            "query embeddings have width {qd}, visual tokens {}",
            tokens.dim(1)?
        )));
    }
    // (q, d) · (d, n) -> (q, n) cosines
    let cos = unit_rows(q)?.matmul(&unit_rows(tokens)?.t()?)?;
    softmax_scores(&cos, tau)
}

/// Checks a temperature.
pub fn check_tau(tau: f32) -> Result<()> {
    if !(tau.is_finite() && tau > 0.0) {
        return Err(Error::InvalidParam(format!(
            "--tau must be a positive number, got {tau}"
        )));
    }
    Ok(())
}

/// `(m, n)` cosines → the mean over rows of `softmax(cos / τ)`, `(n)`.
fn softmax_scores(cos: &Tensor, tau: f32) -> Result<Vec<f32>> {
    check_tau(tau)?;
    let p = softmax_last_dim(&(cos / tau as f64)?, Mode::Infer)?;
    Ok(normalise(to_vec_f32(&p.mean(0)?)?))
}

/// Rows scaled to unit length (zero rows stay zero), `(m, d)`.
fn unit_rows(x: &Tensor) -> Result<Tensor> {
    let x = x.to_dtype(candle_core::DType::F32)?;
    let norm = (x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()? + 1e-12)?;
    Ok(x.broadcast_div(&norm)?)
}

/// Non-negative scores scaled to sum 1 (negative and NaN entries count as 0; all-zero → uniform).
pub fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    v.iter_mut().for_each(|x| {
        if x.is_nan() || *x < 0.0 {
            *x = 0.0
        }
    });
    let sum: f64 = v.iter().map(|&x| x as f64).sum();
    if !(sum > 0.0 && sum.is_finite()) {
        let u = 1.0 / v.len().max(1) as f32;
        return vec![u; v.len()];
    }
    v.iter().map(|&x| (x as f64 / sum) as f32).collect()
}
