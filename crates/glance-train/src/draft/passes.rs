//! One sample's differentiable multi-pass forward and its loss ("training-time test").
//!
//! Notation: the sample's sequence has rows `0..t`, the prompt `0..p`, the answer `p..t` (EOS
//! last). The target's hidden state `h_i` predicts token `x_{i+1}`, so the rows whose
//! predictions are the answer (EOS included) are `r = p-1 ..= t-2`: `m_1 = t - p` rows.
//!
//! * **Pass 1** (teacher forcing): every draft row of [`DraftLm::start`] over the whole sequence
//!   (row `r` reads `x_r` and the noised `h_{r-1}`), causal; the supervised rows are
//!   `r ∈ [p-1, t-2]`, at draft index `n - (t - r)` (rows after the image map 1:1 to target
//!   rows). Row `r`'s prediction `ĥ¹_r` is trained towards `h_r`.
//! * **Pass k ≥ 2**: one row per `r ∈ [p-1, t-1-k]` (`m_k = m_1 - k + 1` rows): input
//!   `fuse(emb(x_{r+k-1}), ĥ^{k-1}_r)` — the previous pass's prediction, not detached — at
//!   position `r + k - 1`; it attends to pass-1 keys of draft rows up to and including row `r`
//!   and to its own rows of passes `2..=k` ([`multipass_mask`]): exactly what the row sees at
//!   draft depth `k - 1` at inference. Target: `h_{r+k-1}` and the target's distribution there.
//!
//! Loss of pass `k` (weight `pass_decay^(k-1)`): the cross-entropy of the draft's logits (the
//! target's frozen `lm_head`) against the target's softmax at the same row (soft labels), plus
//! `hidden_weight ×` smooth-L1 (β = 1, mean over the hidden dimension) between the predicted and
//! the target's hidden state, summed over rows and divided by the caller's `norm` (the batch's
//! pass-1 rows), so the gradients of a batch's samples add up to the batch mean.
//!
//! [`DraftLm::start`]: glance_nn::DraftLm::start

use super::samples::Sample;
use crate::{Result, TrainError};
use candle_core::{Device, Tensor, D};
use glance_models::draft::DraftHead;
use glance_nn::{AttnMask, CausalLm, DraftLm, DraftPrompt};
use serde::{Deserialize, Serialize};

/// The loss's shape.
#[derive(Debug, Clone, Copy)]
pub struct PassSettings {
    pub passes: usize,
    pub hidden_weight: f64,
    pub pass_decay: f64,
}

/// What is perturbed in a training sample (nothing in validation).
#[derive(Clone, Copy, Default)]
pub struct Perturbation<'a> {
    /// Relative amplitude of the uniform noise on the input hidden states (0: none).
    pub noise: f64,
    pub noise_seed: u64,
    /// Visual features `(n_image, hidden)` of another image standing in for the sample's own in
    /// the draft's inputs (the target's hidden states and distributions stay the real ones).
    pub distractor: Option<&'a Tensor>,
}

/// Top-1 agreement with the target, per pass (= draft depth).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    /// Rows of each pass.
    pub rows: Vec<u64>,
    /// Rows whose top-1 equals the target's.
    pub hits: Vec<u64>,
    /// Rows whose top-1 equals the target's in this pass and every earlier one (the chain of
    /// drafts up to this depth would be accepted).
    pub chain: Vec<u64>,
}

impl Agreement {
    fn ensure(&mut self, k: usize) {
        for v in [&mut self.rows, &mut self.hits, &mut self.chain] {
            if v.len() < k {
                v.resize(k, 0);
            }
        }
    }

    pub fn add(&mut self, other: &Agreement) {
        self.ensure(other.rows.len());
        for k in 0..other.rows.len() {
            self.rows[k] += other.rows[k];
            self.hits[k] += other.hits[k];
            self.chain[k] += other.chain[k];
        }
    }

    /// Top-1 agreement of pass `k` (1-based); 0 without rows.
    pub fn accuracy(&self, k: usize) -> f64 {
        ratio(self.hits.get(k - 1), self.rows.get(k - 1))
    }

    /// Per depth `k`, the share of rows whose draft at `k` is accepted among those whose drafts
    /// of depths `1..k` are: `chain_rate(k) / chain_rate(k - 1)` (0 where no row reaches `k`).
    pub fn conditional_acceptance(&self) -> Vec<f64> {
        let mut above = 1.0;
        (1..=self.rows.len())
            .map(|k| {
                let chain = self.chain_rate(k);
                let a = if above > 0.0 { chain / above } else { 0.0 };
                above = chain;
                a.clamp(0.0, 1.0)
            })
            .collect()
    }

    /// Share of rows whose drafts of depths `1..=k` are all accepted.
    pub fn chain_rate(&self, k: usize) -> f64 {
        ratio(self.chain.get(k - 1), self.rows.get(k - 1))
    }

    /// Expected tokens per target forward with a chain of all passes' depth (greedy, the bonus
    /// token included): `1 + Σ_k chain_rate(k)`.
    pub fn tokens_per_step(&self) -> f64 {
        1.0 + (1..=self.rows.len())
            .map(|k| self.chain_rate(k))
            .sum::<f64>()
    }
}

fn ratio(a: Option<&u64>, b: Option<&u64>) -> f64 {
    match (a, b) {
        (Some(&a), Some(&b)) if b > 0 => a as f64 / b as f64,
        _ => 0.0,
    }
}

/// The additive mask `(m, first + Σ blocks + m)` of a pass with `m = last_visible.len()` rows:
/// row `i` sees the first-pass keys `0..=last_visible[i]`, column `i` of each earlier block of
/// later-pass keys (`blocks`, each at least `m` long), and itself (column `i` of the own block).
/// Row-major, `0` visible, `-inf` hidden.
pub fn multipass_mask(first: usize, last_visible: &[usize], blocks: &[usize]) -> Result<Vec<f32>> {
    let m = last_visible.len();
    if let Some(&b) = blocks.iter().find(|&&b| b < m) {
        return Err(TrainError::Config(format!(
            "multi-pass mask: a block of {b} keys for {m} rows"
        )));
    }
    if let Some(&l) = last_visible.iter().find(|&&l| l >= first) {
        return Err(TrainError::Config(format!(
            "multi-pass mask: key {l} of {first} first-pass keys"
        )));
    }
    let cols = first + blocks.iter().sum::<usize>() + m;
    let mut data = vec![f32::NEG_INFINITY; m * cols];
    for (i, row) in data.chunks_exact_mut(cols).enumerate() {
        row[..=last_visible[i]].fill(0.0);
        let mut at = first;
        for &b in blocks.iter().chain(std::iter::once(&m)) {
            row[at + i] = 0.0;
            at += b;
        }
    }
    Ok(data)
}

/// One sample's loss (a scalar to back-propagate) and what it measured.
pub struct SampleLoss {
    pub loss: Tensor,
    /// Summed cross-entropy and smooth-L1 over all passes' rows (unweighted).
    pub ce: f64,
    pub reg: f64,
    pub agreement: Agreement,
    /// Each pass's predicted hidden states `(m_k, hidden)` (row `i` is `r = p-1+i`).
    pub predictions: Vec<Tensor>,
}

/// `h` `(t, hidden)` plus `U(-a, a)` noise, `a = rel · RMS(h)`, drawn from `seed`.
fn add_noise(h: &Tensor, rel: f64, seed: u64) -> Result<Tensor> {
    let vals: Vec<f32> = h.flatten_all()?.to_vec1()?;
    let ms = vals.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / vals.len().max(1) as f64;
    let a = rel * ms.sqrt();
    let mut rng = glance_core::Rng::new(seed);
    let noisy: Vec<f32> = vals
        .iter()
        .map(|v| v + ((2.0 * rng.next_f64() - 1.0) * a) as f32)
        .collect();
    Ok(Tensor::from_vec(noisy, h.shape(), h.device())?)
}

/// Smooth-L1 (β = 1) of `d` `(m, hidden)`, summed over rows and averaged over the hidden size.
fn smooth_l1(d: &Tensor) -> Result<Tensor> {
    let a = d.abs()?;
    let q = a.minimum(&a.ones_like()?)?;
    // 0.5 q² + (|d| − q): quadratic below 1, linear above.
    let l = ((q.sqr()? * 0.5)? + (a - q)?)?;
    Ok((l.sum_all()? / d.dim(1)? as f64)?)
}

/// The sample's rows with the image rows replaced by `visual` `(n_image, hidden)`.
fn swap_image(s: &Sample, visual: &Tensor) -> Result<Tensor> {
    let (a, n, t) = (s.image_rows[0], s.image_rows.len(), s.len());
    if visual.dim(0)? != n {
        return Err(TrainError::Config(format!(
            "a distractor of {} visual rows for an image of {n}",
            visual.dim(0)?
        )));
    }
    Ok(Tensor::cat(
        &[
            s.rows.narrow(0, 0, a)?,
            visual.clone(),
            s.rows.narrow(0, a + n, t - a - n)?,
        ],
        0,
    )?)
}

/// Indices of the row-wise maxima of `x` `(m, vocab)`.
fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    Ok(x.argmax(D::Minus1)?.to_vec1::<u32>()?)
}

/// The draft's pick of each row of logits `(m, vocab)`: the argmax over the whole vocabulary,
/// or over the head's reduced vocabulary where it keeps one (what it proposes when decoding;
/// the first of equal logits in the list wins).
fn draft_pick(x: &Tensor, vocab: Option<&[u32]>) -> Result<Vec<u32>> {
    let Some(ids) = vocab else {
        return argmax(x);
    };
    let rows: Vec<Vec<f32>> = x.detach().to_vec2()?;
    Ok(rows
        .iter()
        .map(|row| {
            let mut best = ids[0];
            for &id in &ids[1..] {
                if row[id as usize] > row[best as usize] {
                    best = id;
                }
            }
            best
        })
        .collect())
}

/// The multi-pass forward of `s` through `head` (in `Mode::Train` for training) with the
/// target `lm`'s LM head, its loss divided by `norm`, and the agreement per pass.
pub fn sample_loss(
    head: &DraftHead,
    lm: &dyn CausalLm,
    s: &Sample,
    settings: &PassSettings,
    perturb: &Perturbation<'_>,
    norm: f64,
) -> Result<SampleLoss> {
    let dev: &Device = s.rows.device();
    let (t, p) = (s.len(), s.prompt_len);
    let m1 = t - p;
    if p < 2 || m1 == 0 || s.image_rows.last().is_some_and(|&r| r + 1 >= p) {
        return Err(TrainError::Config(format!(
            "a sample needs text after the image and an answer ({p} prompt rows, {m1} answer)"
        )));
    }
    // (t, hidden) each
    let inputs = match perturb.distractor {
        Some(v) => swap_image(s, v)?,
        None => s.rows.clone(),
    };
    let hidden_in = if perturb.noise > 0.0 {
        add_noise(&s.hidden, perturb.noise, perturb.noise_seed)?
    } else {
        s.hidden.clone()
    };
    let positions = s.positions.clone();
    let start = head.start(&DraftPrompt {
        inputs: &inputs,
        hidden: &hidden_in,
        positions: &positions,
        images: std::slice::from_ref(&s.image_rows),
    })?;
    let global = start.context.global.as_ref();
    // (n, hidden): draft rows; row r ∈ [p-1, t-2] at index n - (t - r).
    let n = start.rows.dim(0)?;
    let first_row = n + p - 1 - t;
    let causal = AttnMask::Causal.materialize(None, n, n, dev)?;
    let (h1, k1, v1) = head.step_after(&start.rows, &start.positions, causal.as_ref(), None)?;
    // (1, kv_heads, ·, head_dim): keys / values of every pass so far.
    let (mut keys, mut values) = (vec![k1], vec![v1]);
    let mut blocks: Vec<usize> = Vec::new();
    // (m_k, hidden): the previous pass's predictions for r = p-1, p, …
    let mut prev = h1.narrow(0, first_row, m1)?;
    let mut chain_ok = vec![true; m1];
    let mut agreement = Agreement::default();
    agreement.ensure(settings.passes);
    let (mut ce_sum, mut reg_sum) = (0f64, 0f64);
    let mut total: Option<Tensor> = None;
    let mut predictions = Vec::with_capacity(settings.passes);
    for k in 1..=settings.passes {
        let m = m1 + 1 - k;
        if m == 0 {
            break;
        }
        // (m, hidden)
        let pred = if k == 1 {
            prev.clone()
        } else {
            // x_{r+k-1}: clean token embeddings of answer rows.
            let emb = s.rows.narrow(0, p + k - 2, m)?;
            let xs = head.fuse_rows(&emb, &prev.narrow(0, 0, m)?, global)?;
            let pos: Vec<u32> = (0..m).map(|i| (p + k - 2 + i) as u32).collect();
            let last_visible: Vec<usize> = (0..m).map(|i| first_row + i).collect();
            let mask = multipass_mask(n, &last_visible, &blocks)?;
            let cols = mask.len() / m;
            let mask = Tensor::from_vec(mask, (m, cols), dev)?;
            let (pk, pv) = (Tensor::cat(&keys, 2)?, Tensor::cat(&values, 2)?);
            let (hk, kk, vk) = head.step_after(&xs, &pos, Some(&mask), Some((&pk, &pv)))?;
            keys.push(kk);
            values.push(vk);
            blocks.push(m);
            hk
        };
        // Targets at rows r + k - 1.
        let want_h = s.hidden.narrow(0, p + k - 2, m)?;
        let want_logits = lm.logits(&want_h)?;
        // (m, vocab), no gradient: the target is frozen.
        let want_p = candle_nn::ops::softmax_last_dim(&want_logits)?;
        let logits = lm.logits(&pred)?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let ce = (want_p * logp)?.sum_all()?.neg()?;
        let reg = smooth_l1(&(&pred - &want_h)?)?;
        ce_sum += ce.to_scalar::<f32>()? as f64;
        reg_sum += reg.to_scalar::<f32>()? as f64;
        let w = settings.pass_decay.powi(k as i32 - 1) / norm;
        let term = ((ce + (reg * settings.hidden_weight)?)? * w)?;
        total = Some(match total {
            None => term,
            Some(acc) => (acc + term)?,
        });
        let (got, want) = (draft_pick(&logits, head.vocab())?, argmax(&want_logits)?);
        agreement.rows[k - 1] += m as u64;
        for i in 0..m {
            let hit = got[i] == want[i];
            chain_ok[i] &= hit;
            agreement.hits[k - 1] += hit as u64;
            agreement.chain[k - 1] += chain_ok[i] as u64;
        }
        predictions.push(pred.clone());
        prev = pred;
    }
    Ok(SampleLoss {
        loss: total.expect("the first pass always has rows"),
        ce: ce_sum,
        reg: reg_sum,
        agreement,
        predictions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditional_acceptance_divides_each_chain_by_the_one_above() {
        let a = Agreement {
            rows: vec![100, 100, 50, 40],
            hits: vec![90, 80, 30, 20],
            chain: vec![90, 72, 27, 0],
        };
        let c = a.conditional_acceptance();
        let want = [0.9, 0.8, 0.54 / 0.72, 0.0];
        assert_eq!(c.len(), 4);
        for (got, want) in c.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{c:?}");
        }
        // A depth no row reaches after a depth nothing passed: 0, not NaN.
        let none = Agreement {
            rows: vec![10, 10],
            hits: vec![0, 5],
            chain: vec![0, 0],
        };
        assert_eq!(none.conditional_acceptance(), vec![0.0, 0.0]);
        assert!(Agreement::default().conditional_acceptance().is_empty());
    }

    #[test]
    fn a_reduced_vocabulary_picks_only_its_own_tokens() {
        // (2, 5)
        let x = Tensor::new(
            &[[0.1f32, 0.9, 0.3, 0.2, 0.0], [0.5, 0.1, 0.1, 0.4, 0.45]],
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(draft_pick(&x, None).unwrap(), vec![1, 0]);
        assert_eq!(draft_pick(&x, Some(&[3, 2, 4])).unwrap(), vec![2, 4]);
        assert_eq!(draft_pick(&x, Some(&[0])).unwrap(), vec![0, 0]);
    }

    /// Five first-pass keys, rows seeing keys 0..=2 and 0..=3, one earlier block of three keys:
    /// drawn by hand (`.` visible, `x` hidden).
    #[test]
    fn mask_matches_the_drawing() {
        let got = multipass_mask(5, &[2, 3], &[3]).unwrap();
        let drawn = [
            // first pass | pass 2 | own
            "...xx .xx .x",
            "....x x.x x.",
        ];
        let want: Vec<f32> = drawn
            .iter()
            .flat_map(|r| r.chars().filter(|c| *c != ' '))
            .map(|c| if c == '.' { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        assert_eq!(got, want);
        // Pass 2 (no earlier blocks): first-pass prefix and the diagonal.
        let got = multipass_mask(3, &[1, 2], &[]).unwrap();
        let want = [
            0.0,
            0.0,
            f32::NEG_INFINITY,
            0.0,
            f32::NEG_INFINITY,
            0.0,
            0.0,
            0.0,
            f32::NEG_INFINITY,
            0.0,
        ];
        assert_eq!(got, want);
        assert!(multipass_mask(3, &[1, 2], &[1]).is_err());
        assert!(multipass_mask(3, &[3], &[]).is_err());
    }

    #[test]
    fn agreement_rates() {
        let a = Agreement {
            rows: vec![10, 9, 8],
            hits: vec![8, 6, 4],
            chain: vec![8, 5, 2],
        };
        assert!((a.accuracy(2) - 6.0 / 9.0).abs() < 1e-12);
        assert!((a.chain_rate(3) - 0.25).abs() < 1e-12);
        assert!((a.tokens_per_step() - (1.0 + 0.8 + 5.0 / 9.0 + 0.25)).abs() < 1e-12);
    }
}
