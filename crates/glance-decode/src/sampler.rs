//! Next-token selection from a logit row: the *processors* rewrite the logits from the
//! generation's history, then greedy argmax, or temperature → top-k → top-p → min-p → draw (the
//! warpers, in the order Hugging Face's `generate` applies them).
//!
//! **Processors**, in vLLM's order (`SamplingParams` in glance-core names their ranges):
//! `logit_bias` is added; end-of-sequence tokens are masked while the answer is shorter than
//! `min_tokens`; `repetition_penalty` divides a positive logit (multiplies a negative one) of every
//! token of the prompt or the answer; `frequency_penalty` × (times in the answer) and
//! `presence_penalty` (once in the answer) are subtracted. Every neutral value leaves the row
//! untouched and costs nothing. The history is the sampler's own: every token it picks
//! ([`Sampler::sample`]) or is told was emitted ([`Sampler::accept`], [`Sampler::observe`]) joins
//! it, so a strategy that verifies a draft path node by node (`crate::speculative::verify`)
//! processes each node's row given exactly the tokens before it — the distribution
//! autoregressive decoding would use there, which keeps lossless strategies lossless.
//!
//! **Grammar** ([`Sampler::with_grammar`], `crate::grammar`): last, every token the grammar
//! forbids after the history (and the path) is masked to `-inf`; each emitted token advances it.
//!
//! **Log-probabilities** ([`Sampler::with_logprobs`]): for every picked or accepted token, its
//! log-probability and the most likely alternatives under the log-softmax of the *processed*
//! logits (before temperature and truncation), pushed to a [`LogprobSink`] in emission order.
//!
//! A row with a NaN or `+inf` logit, or with no finite logit at all (every token masked to
//! `-inf`), is refused with [`Error::NonFinite`] instead of picking an arbitrary token: such
//! logits come from NaN / infinite weights or activations, and the text they would produce is
//! garbage. (`-inf` entries next to finite ones are ordinary masked tokens.)

use crate::grammar::Grammar;
use glance_core::{Error, Result, Rng, SamplingParams, TokenId};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A picked token's log-probability and the most likely alternatives, most likely first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: TokenId,
    pub logprob: f32,
    pub top: Vec<(TokenId, f32)>,
}

/// Where a sampler records [`TokenLogprob`]s, one per token in emission order; the caller keeps a
/// clone to read them as the tokens are emitted.
pub type LogprobSink = Arc<Mutex<Vec<TokenLogprob>>>;

/// Picks tokens from logits; owns the random stream so a seed fixes the whole generation, and the
/// history the processors read.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Every processor at its neutral value: rows are used as they are.
    neutral: bool,
    /// Distinct prompt tokens, sorted (read by the repetition penalty only).
    prompt: Vec<TokenId>,
    eos: Vec<TokenId>,
    /// Tokens of the answer so far.
    generated: usize,
    /// Times each token is in the answer (kept only when a penalty reads it).
    counts: HashMap<TokenId, u32>,
    logprobs: Option<(usize, LogprobSink)>,
    /// The grammar the answer follows (behind a lock: masking a path reads it through `&self`).
    grammar: Option<GrammarCell>,
}

/// A [`Grammar`] the sampler masks with; a clone is an independent copy.
#[derive(Debug)]
struct GrammarCell(Mutex<Grammar>);

impl GrammarCell {
    fn lock(&self) -> std::sync::MutexGuard<'_, Grammar> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clone for GrammarCell {
    fn clone(&self) -> Self {
        GrammarCell(Mutex::new(self.lock().clone()))
    }
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Self {
            neutral: params.processors_neutral(),
            params,
            rng,
            prompt: Vec::new(),
            eos: Vec::new(),
            generated: 0,
            counts: HashMap::new(),
            logprobs: None,
            grammar: None,
        })
    }

    /// The prompt's tokens (for the repetition penalty) and the end-of-sequence tokens (masked
    /// before `min_tokens`).
    pub fn with_context(mut self, prompt: &[TokenId], eos: &[TokenId]) -> Self {
        if self.params.repetition_penalty != 1.0 {
            self.prompt = prompt.to_vec();
            self.prompt.sort_unstable();
            self.prompt.dedup();
        }
        self.eos = eos.to_vec();
        self
    }

    /// Records every token's log-probability and its `top` (at most
    /// [`glance_core::MAX_TOP_LOGPROBS`]) most likely alternatives in `sink`.
    pub fn with_logprobs(mut self, top: usize, sink: LogprobSink) -> Self {
        self.logprobs = Some((top.min(glance_core::MAX_TOP_LOGPROBS), sink));
        self
    }

    /// Masks every token `grammar` forbids (after the other processors).
    pub fn with_grammar(mut self, grammar: Grammar) -> Self {
        self.grammar = Some(GrammarCell(Mutex::new(grammar)));
        self.neutral = false;
        self
    }

    /// Whether the answer so far is complete under the grammar (`None`: no grammar).
    pub fn grammar_complete(&self) -> Option<bool> {
        self.grammar.as_ref().map(|g| g.lock().is_complete())
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for one logit row, which joins the history; [`Error::NonFinite`] when the
    /// row holds a NaN or `+inf` or no finite value (see the module documentation).
    pub fn sample(&mut self, logits: &[f32]) -> Result<TokenId> {
        check_logits(logits)?;
        let row = self.processed(logits, &[]);
        if !self.neutral {
            check_logits(&row)?;
        }
        let token = if self.params.is_greedy() {
            argmax(&row)
        } else {
            let probs = self.distribution(&row);
            let u = self.rng.next_f64() as f32;
            pick_at(&probs, u)?
        };
        self.record(token, &row);
        self.push(token);
        Ok(token)
    }

    /// Tells the sampler `token` was emitted after the row `logits` (a strategy that chose it
    /// itself, e.g. by rejection sampling against [`Self::checked_distribution`]): it joins the
    /// history, with its log-probability when they are recorded.
    pub fn accept(&mut self, token: TokenId, logits: &[f32]) {
        if self.logprobs.is_some() {
            let row = self.processed(logits, &[]);
            self.record(token, &row);
        }
        self.push(token);
    }

    /// Tokens emitted without a causal row of their own (no log-probability is recorded): they
    /// join the history.
    pub fn observe(&mut self, tokens: &[TokenId]) {
        tokens.iter().for_each(|&t| self.push(t));
    }

    /// The row after the processors, given the history and then `path` (tokens after it that a
    /// strategy is still deciding on); borrowed when every processor is neutral.
    pub fn processed<'a>(&self, logits: &'a [f32], path: &[TokenId]) -> Cow<'a, [f32]> {
        if self.neutral {
            return Cow::Borrowed(logits);
        }
        let p = &self.params;
        let mut row = logits.to_vec();
        for (&id, &bias) in &p.logit_bias {
            if let Some(l) = row.get_mut(id as usize) {
                *l += bias;
            }
        }
        if self.generated + path.len() < p.min_tokens {
            for &e in &self.eos {
                if let Some(l) = row.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let mut counts = Cow::Borrowed(&self.counts);
        if !path.is_empty() {
            let c = counts.to_mut();
            path.iter().for_each(|&t| *c.entry(t).or_insert(0) += 1);
        }
        let r = p.repetition_penalty;
        if r != 1.0 {
            let mut seen: Vec<TokenId> = self.prompt.clone();
            seen.extend(counts.keys());
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = row.get_mut(t as usize).filter(|l| l.is_finite()) {
                    let v = if *l > 0.0 { *l / r } else { *l * r };
                    *l = v.clamp(f32::MIN, f32::MAX);
                }
            }
        }
        let (f, pres) = (p.frequency_penalty, p.presence_penalty);
        if f != 0.0 || pres != 0.0 {
            for (&t, &c) in counts.iter() {
                if let Some(l) = row.get_mut(t as usize) {
                    *l -= f * c as f32 + pres;
                }
            }
        }
        if let Some(g) = &self.grammar {
            g.lock().mask(&mut row, path);
        }
        Cow::Owned(row)
    }

    /// The warped distribution of the processed row (see [`Self::processed`]), after the checks
    /// of [`Self::sample`]; `path` as for [`Self::processed`].
    pub fn checked_distribution(
        &self,
        logits: &[f32],
        path: &[TokenId],
    ) -> Result<Vec<(TokenId, f32)>> {
        check_logits(logits)?;
        let row = self.processed(logits, path);
        check_logits(&row)?;
        Ok(self.distribution(&row))
    }

    /// A token drawn from `probs` (`(token, probability)`, summing to 1) with the sampler's
    /// random stream.
    pub fn draw(&mut self, probs: &[(TokenId, f32)]) -> Result<TokenId> {
        let u = self.rng.next_f64() as f32;
        pick_at(probs, u)
    }

    /// A uniform draw in `[0, 1)` from the sampler's random stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// The warped distribution of a row as it is (no processor) as `(token, probability)` in
    /// descending probability (ties by id), probabilities summing to 1.
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
        if self.params.min_p > 0.0 {
            // Sorted: the first is the most likely.
            let floor = probs.first().map_or(0.0, |p| p.1) * self.params.min_p;
            let keep = probs.iter().take_while(|p| p.1 >= floor).count();
            probs.truncate(keep.max(1));
            normalise(&mut probs);
        }
        probs
    }

    fn push(&mut self, token: TokenId) {
        self.generated += 1;
        if let Some(g) = &self.grammar {
            g.lock().advance(token);
        }
        let p = &self.params;
        if p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            *self.counts.entry(token).or_insert(0) += 1;
        }
    }

    fn record(&self, token: TokenId, row: &[f32]) {
        if let Some((top, sink)) = &self.logprobs {
            let entry = logprobs(row, token, *top);
            sink.lock().expect("not poisoned").push(entry);
        }
    }
}

/// `token`'s log-probability under the log-softmax of `row`, and the `top` most likely tokens
/// (ties by id; masked tokens never listed).
pub fn logprobs(row: &[f32], token: TokenId, top: usize) -> TokenLogprob {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    let log_z = max + sum.ln() as f32;
    let lp = |t: TokenId| row.get(t as usize).map_or(f32::NEG_INFINITY, |l| l - log_z);
    let mut idx: Vec<TokenId> = (0..row.len() as TokenId)
        .filter(|&i| row[i as usize].is_finite())
        .collect();
    let order =
        |a: &TokenId, b: &TokenId| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let k = top.min(idx.len());
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
    }
    idx.truncate(k);
    idx.sort_by(order);
    TokenLogprob {
        token,
        logprob: lp(token),
        top: idx.into_iter().map(|t| (t, lp(t))).collect(),
    }
}

/// The token at cumulative probability `u` of `probs`.
fn pick_at(probs: &[(TokenId, f32)], u: f32) -> Result<TokenId> {
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
            top_k,
            top_p,
            ..SamplingParams::sampled(temperature, seed)
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

    #[test]
    fn processors_rewrite_logits_from_the_history() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: [(0, 1.0)].into(),
            min_tokens: 1,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p).unwrap().with_context(&[1, 1], &[4]);
        let logits = [1.0f32, 2.0, -1.0, 0.5, 3.0];
        // Bias on 0, prompt token 1 halved, EOS (4) masked before the first token.
        assert_eq!(
            s.processed(&logits, &[]).as_ref(),
            &[2.0, 1.0, -1.0, 0.5, f32::NEG_INFINITY]
        );
        s.observe(&[2, 2]);
        // Token 2: -1 × 2, then 2 × 0.25 + 0.5; EOS allowed again.
        assert_eq!(
            s.processed(&logits, &[]).as_ref(),
            &[2.0, 1.0, -3.0, 0.5, 3.0]
        );
        // A path token counts as history: 0.5 / 2 - 0.25 - 0.5.
        assert_eq!(s.processed(&logits, &[3])[3], -0.5);
        assert_eq!(s.processed(&logits, &[])[3], 0.5);
        // Neutral settings borrow the row.
        let n = Sampler::new(SamplingParams::greedy()).unwrap();
        assert!(matches!(n.processed(&logits, &[]), Cow::Borrowed(_)));
    }

    #[test]
    fn penalties_steer_greedy_decoding_away_from_repeats() {
        let logits = [1.0f32, 0.9, 0.0];
        let run = |p: SamplingParams| {
            let mut s = Sampler::new(p).unwrap();
            (0..4)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(SamplingParams::greedy()), vec![0, 0, 0, 0]);
        let presence = SamplingParams {
            presence_penalty: 0.5,
            ..SamplingParams::greedy()
        };
        // 0 (1.0), then 1 (0.9 > 0.5), then 0 (0.5 > 0.4) and 0 again (presence, not frequency).
        assert_eq!(run(presence), vec![0, 1, 0, 0]);
        let frequency = SamplingParams {
            frequency_penalty: 0.2,
            ..SamplingParams::greedy()
        };
        // 0: 1.0; 1: 0.9 > 0.8; 0: 0.8 > 0.7; 1: 0.7 > 0.6.
        assert_eq!(run(frequency), vec![0, 1, 0, 1]);
        let bias = SamplingParams {
            logit_bias: [(2, 5.0)].into(),
            ..SamplingParams::greedy()
        };
        assert_eq!(run(bias), vec![2, 2, 2, 2]);
    }

    #[test]
    fn min_p_keeps_tokens_near_the_most_likely() {
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let s = Sampler::new(SamplingParams {
            min_p: 0.2,
            ..SamplingParams::sampled(1.0, 0)
        })
        .unwrap();
        let d = s.distribution(&logits);
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!((d[0].1 - 0.5 / 0.95).abs() < 1e-5);
    }

    #[test]
    fn logprobs_are_the_processed_log_softmax_in_emission_order() {
        let l = logprobs(&[0.0, 3f32.ln(), f32::NEG_INFINITY], 0, 5);
        assert!((l.logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 0]);
        assert!((l.top[0].1 - 0.75f32.ln()).abs() < 1e-6);
        let sink = LogprobSink::default();
        let p = SamplingParams {
            logit_bias: [(1, 1.0)].into(),
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p).unwrap().with_logprobs(1, sink.clone());
        let row = [1.0f32, 0.5, 0.0];
        assert_eq!(s.sample(&row).unwrap(), 1);
        s.accept(2, &row);
        let got = sink.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        // After the bias: logits [1, 1.5, 0].
        let z = (1f32.exp() + 1.5f32.exp() + 1.0).ln();
        assert!((got[0].logprob - (1.5 - z)).abs() < 1e-6, "{got:?}");
        assert_eq!((got[1].token, got[1].top[0].0), (2, 1));
        assert!((got[1].logprob - (0.0 - z)).abs() < 1e-6);
    }
}
