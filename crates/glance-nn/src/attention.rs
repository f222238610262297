//! Scaled dot-product attention with grouped-query heads, an arbitrary additive mask and optional
//! access to the attention probabilities.
//!
//! Masks are always explicit: tree verification, diffusion blocks and pruned prefixes differ from
//! plain decoding only in the mask and the position ids they pass.

use crate::{softmax_last_dim, Mode};
use candle_core::{DType, Device, Result, Tensor};

/// Which cache rows each new query row may attend to.
#[derive(Debug, Clone)]
pub enum AttnMask {
    /// Every query sees every key (encoders; bidirectional blocks with nothing cached).
    Full,
    /// The query at cache row `past + i` sees rows `j ≤ past + i`; with a sliding window `w` only
    /// rows with `past + i - j < w` (HF Mistral semantics).
    Causal { sliding_window: Option<usize> },
    /// Additive f32 mask `(t, past + t)`: `0` visible, `-inf` hidden.
    Custom(Tensor),
}

impl AttnMask {
    /// Plain causal attention without a window.
    pub fn causal() -> Self {
        AttnMask::Causal {
            sliding_window: None,
        }
    }

    /// The additive mask `(t, kv_len)` for `t` new rows appended after `kv_len - t` cached ones, or
    /// `None` when nothing is hidden.
    pub fn materialize(&self, t: usize, kv_len: usize, device: &Device) -> Result<Option<Tensor>> {
        match self {
            AttnMask::Full => Ok(None),
            AttnMask::Custom(m) => {
                let dims = m.dims2()?;
                if dims != (t, kv_len) {
                    candle_core::bail!("attention mask is {dims:?}, expected ({t}, {kv_len})")
                }
                Ok(Some(m.to_dtype(DType::F32)?))
            }
            AttnMask::Causal { sliding_window } => {
                let past = kv_len - t;
                let hides_something = t > 1 || sliding_window.is_some_and(|w| kv_len > w);
                if !hides_something {
                    return Ok(None);
                }
                let mut data = vec![0f32; t * kv_len];
                for i in 0..t {
                    let q = past + i;
                    for (j, d) in data[i * kv_len..(i + 1) * kv_len].iter_mut().enumerate() {
                        let outside_window = sliding_window.is_some_and(|w| q >= j + w);
                        if j > q || outside_window {
                            *d = f32::NEG_INFINITY;
                        }
                    }
                }
                Ok(Some(Tensor::from_vec(data, (t, kv_len), device)?))
            }
        }
    }
}

/// Attention output and, when asked for, the probabilities.
pub struct AttnOutput {
    /// `(1, h, t, d)`
    pub out: Tensor,
    /// `(1, h, t, s)` when requested.
    pub probs: Option<Tensor>,
}

/// `softmax(q kᵀ · scale + mask) v` with grouped-query heads.
///
/// * `q`: `(1, h, t, d)`; `k`, `v`: `(1, kv_h, s, d)` with `h` a multiple of `kv_h` (query head
///   `i` reads key/value head `i / (h / kv_h)`, as HF's `repeat_kv`);
/// * `mask`: additive `(t, s)`.
///
/// GQA is done without copying K/V: the query heads sharing a KV head are folded into the row
/// dimension of one matmul.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    mode: Mode,
    want_probs: bool,
) -> Result<AttnOutput> {
    let (b, h, t, d) = q.dims4()?;
    let (_, kv_h, s, _) = k.dims4()?;
    let n_rep = h / kv_h;
    // (b, kv_h, n_rep * t, d), scaled here: t·d multiplies instead of t·s.
    let qg = (q.reshape((b, kv_h, n_rep * t, d))? * scale)?;
    // (b, kv_h, n_rep * t, s)
    let scores = qg.matmul(&k.t()?)?;
    let scores = match mask {
        Some(m) => scores
            .reshape((b * kv_h * n_rep, t, s))?
            .broadcast_add(m)?
            .reshape((b, kv_h, n_rep * t, s))?,
        None => scores,
    };
    let probs = softmax_last_dim(&scores, mode)?;
    // (b, kv_h, n_rep * t, d) -> (b, h, t, d)
    let out = probs.matmul(v)?.reshape((b, h, t, d))?;
    let probs = if want_probs {
        Some(probs.reshape((b, h, t, s))?)
    } else {
        None
    };
    Ok(AttnOutput { out, probs })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: repeat K/V per query head and attend head by head.
    fn reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        scale: f64,
    ) -> Result<Tensor> {
        let (_, h, _, _) = q.dims4()?;
        let kv_h = k.dim(1)?;
        let mut outs = Vec::new();
        for i in 0..h {
            let qi = q.narrow(1, i, 1)?.squeeze(1)?.squeeze(0)?; // (t, d)
            let ki = k.narrow(1, i / (h / kv_h), 1)?.squeeze(1)?.squeeze(0)?;
            let vi = v.narrow(1, i / (h / kv_h), 1)?.squeeze(1)?.squeeze(0)?;
            let mut s = (qi.matmul(&ki.t()?)? * scale)?;
            if let Some(m) = mask {
                s = (s + m)?;
            }
            let p = candle_nn::ops::softmax(&s, 1)?;
            outs.push(p.matmul(&vi)?);
        }
        Tensor::stack(&outs, 0)?.unsqueeze(0)
    }

    #[test]
    fn gqa_with_masks_matches_reference() -> Result<()> {
        let dev = Device::Cpu;
        let (h, kv_h, t, past, d) = (6, 2, 4, 3, 8);
        let q = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, kv_h, past + t, d), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (1, kv_h, past + t, d), &dev)?;
        for mask in [
            AttnMask::Full,
            AttnMask::causal(),
            AttnMask::Causal {
                sliding_window: Some(3),
            },
        ] {
            let m = mask.materialize(t, past + t, &dev)?;
            let got = attention(&q, &k, &v, m.as_ref(), 0.3, Mode::Infer, false)?.out;
            let want = reference(&q, &k, &v, m.as_ref(), 0.3)?;
            let diff: f32 = (got - want)?.abs()?.max_all()?.to_scalar()?;
            assert!(diff < 1e-5, "{mask:?}: {diff}");
        }
        Ok(())
    }

    #[test]
    fn causal_mask_shape_and_window() -> Result<()> {
        let dev = Device::Cpu;
        let m = AttnMask::Causal {
            sliding_window: Some(2),
        }
        .materialize(2, 5, &dev)?
        .unwrap();
        let rows: Vec<Vec<f32>> = m.to_vec2()?;
        let vis = |r: &Vec<f32>| r.iter().map(|x| x.is_finite()).collect::<Vec<_>>();
        // query rows are cache rows 3 and 4; window 2.
        assert_eq!(vis(&rows[0]), [false, false, true, true, false]);
        assert_eq!(vis(&rows[1]), [false, false, false, true, true]);
        assert!(AttnMask::causal().materialize(1, 9, &dev)?.is_none());
        Ok(())
    }
}
