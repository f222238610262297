//! Next-token selection from a logit row: greedy argmax, or temperature → top-k → top-p → draw,
//! in the order Hugging Face's `generate` applies its warpers.
//!
//! A row with a NaN or `+inf` logit, or with no finite logit at all (every token masked to
//! `-inf`), is refused with [`Error::NonFinite`] instead of picking an arbitrary token: such
//! logits come from NaN / infinite weights or activations, and the text they would produce is
//! garbage. (`-inf` entries next to finite ones are ordinary masked tokens.)

use glance_core::{Error, Result, Rng, SamplingParams, TokenId};

/// Picks tokens from logits; owns the random stream so a seed fixes the whole generation.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Self { params, rng })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for one logit row; [`Error::NonFinite`] when the row holds a NaN or `+inf`
    /// or no finite value (see the module documentation).
    pub fn sample(&mut self, logits: &[f32]) -> Result<TokenId> {
        check_logits(logits)?;
        if self.params.is_greedy() {
            return Ok(argmax(logits));
        }
        let probs = self.distribution(logits);
        self.draw(&probs)
    }

    /// [`distribution`](Self::distribution) of a row that passes the checks of
    /// [`sample`](Self::sample).
    pub fn checked_distribution(&self, logits: &[f32]) -> Result<Vec<(TokenId, f32)>> {
        check_logits(logits)?;
        Ok(self.distribution(logits))
    }

    /// A token drawn from `probs` (`(token, probability)`, summing to 1) with the sampler's
    /// random stream.
    pub fn draw(&mut self, probs: &[(TokenId, f32)]) -> Result<TokenId> {
        let u = self.rng.next_f64() as f32;
        let mut acc = 0.0;
        for &(id, p) in probs {
            acc += p;
            if u < acc {
                return Ok(id);
            }
        }
        probs
            .iter()
            .rev()
            .find(|p| p.1 > 0.0)
            .map(|&(id, _)| id)
            .ok_or_else(|| Error::NonFinite("no token has a finite probability".into()))
    }

    /// A uniform draw in `[0, 1)` from the sampler's random stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// The warped distribution as `(token, probability)` in descending probability (ties by id),
    /// probabilities summing to 1.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(TokenId, f32)> {
        let t = self.params.temperature.max(f32::MIN_POSITIVE);
        let mut scored: Vec<(TokenId, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as TokenId, l / t))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.params.top_k > 0 {
            scored.truncate(self.params.top_k);
        }
        let max = scored.first().map_or(0.0, |s| s.1);
        let mut probs: Vec<(TokenId, f32)> = scored
            .into_iter()
            .map(|(i, l)| (i, (l - max).exp()))
            .collect();
        normalise(&mut probs);
        if self.params.top_p < 1.0 {
            // Keep the shortest prefix whose mass reaches top_p (at least one token).
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|&(_, p)| {
                    mass += p;
                    mass >= self.params.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep.max(1));
            normalise(&mut probs);
        }
        probs
    }
}

/// Refuses a logit row the sampler cannot decide on: any NaN or `+inf`, or no finite entry.
fn check_logits(logits: &[f32]) -> Result<()> {
    if let Some(i) = logits
        .iter()
        .position(|l| l.is_nan() || *l == f32::INFINITY)
    {
        return Err(Error::NonFinite(format!(
            "the logits hold {} (token {i}) among {} entries: the model's weights or activations \
             are not finite",
            logits[i],
            logits.len()
        )));
    }
    if !logits.iter().any(|l| l.is_finite()) {
        return Err(Error::NonFinite(format!(
            "none of the {} logits is finite (every token masked to -inf)",
            logits.len()
        )));
    }
    Ok(())
}

fn normalise(probs: &mut [(TokenId, f32)]) {
    let sum: f32 = probs.iter().map(|p| p.1).sum();
    if sum > 0.0 {
        probs.iter_mut().for_each(|p| p.1 /= sum);
    }
}

/// Index of the largest value; the first one on ties (as `torch.argmax`).
pub fn argmax(xs: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] || xs[best].is_nan() {
            best = i;
        }
    }
    best as TokenId
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    #[test]
    fn greedy_is_argmax_first_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NEG_INFINITY, -1.0]).unwrap(), 1);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
            (0..64)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let logits = [4.0f32, 3.0, 2.0, 1.0, 0.0];
        let d = Sampler::new(params(1.0, 2, 1.0, 0))
            .unwrap()
            .distribution(&logits);
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        // p(0) ≈ 0.636, p(0)+p(1) ≈ 0.87: top-p 0.8 keeps two tokens, 0.5 keeps one.
        let d = Sampler::new(params(1.0, 0, 0.8, 0))
            .unwrap()
            .distribution(&logits);
        assert_eq!(d.len(), 2);
        let d = Sampler::new(params(1.0, 0, 0.5, 0))
            .unwrap()
            .distribution(&logits);
        assert_eq!(d.len(), 1);
        assert!((d[0].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn samples_follow_the_distribution() {
        // 20k draws from a known 3-token distribution at T=1: each frequency within 1.5%.
        let logits = [2f32.ln(), 1f32.ln(), 1f32.ln()]; // 0.5, 0.25, 0.25
        let mut s = Sampler::new(params(1.0, 0, 1.0, 42)).unwrap();
        let mut counts = [0usize; 3];
        let n = 20_000;
        for _ in 0..n {
            counts[s.sample(&logits).unwrap() as usize] += 1;
        }
        for (c, want) in counts.iter().zip([0.5, 0.25, 0.25]) {
            assert!((*c as f64 / n as f64 - want).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn non_finite_logits_are_errors_not_tokens() {
        let nan = [0.5, f32::NAN, 1.0];
        let inf = [0.5, f32::INFINITY, 1.0];
        let masked = [f32::NEG_INFINITY; 4];
        for p in [SamplingParams::greedy(), params(0.7, 5, 0.9, 3)] {
            let mut s = Sampler::new(p).unwrap();
            for row in [&nan[..], &inf[..], &masked[..], &[][..]] {
                match s.sample(row) {
                    Err(Error::NonFinite(msg)) => assert!(msg.contains("finite"), "{msg}"),
                    other => panic!("{row:?} gave {other:?}"),
                }
            }
            // Masked tokens next to finite ones are fine, and never drawn.
            for _ in 0..32 {
                assert_eq!(s.sample(&[f32::NEG_INFINITY, 2.0]).unwrap(), 1);
            }
        }
    }

    #[test]
    fn invalid_params_are_rejected() {
        assert!(Sampler::new(params(-0.5, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 0.0, 0)).is_err());
        assert!(Sampler::new(params(1e-45, 0, 1.0, 0)).is_err());
        // The smallest accepted temperature stays finite on large logits (no inf - inf = NaN).
        let mut s = Sampler::new(params(glance_core::MIN_TEMPERATURE, 0, 1.0, 0)).unwrap();
        assert_eq!(s.sample(&[1e4, 3e4, -1e4]).unwrap(), 1);
    }
}
