//! The memory-bound projection: what the acceptance measured on the small model would buy at a
//! size where decoding streams the weights from memory (≥ 1B parameters).
//!
//! On a random-weight text decoder of the projection's shape, with a 512-row prompt in the cache:
//!
//! * `t(k)`: one target forward over `k` rows under a tree mask (a `top_k`-ary tree, the shape
//!   drafting grows), plus the logits of every row — the verification pass; `t(1)` is one
//!   autoregressive decode step (one row, causal). The cost ratio is `c(k) = t(k) / t(1)`.
//! * `d`: one draft step of each head configuration at that shape — `fc` (and the global-feature
//!   injection), the one decoder layer and the target's LM head over one tree level of `top_k`
//!   rows — measured the same way, in units of `t(1)`.
//!
//! Every measurement is the best of the repetitions, interleaved, the caches rolled back between runs
//! ([`glance_nn::KvCache::mark`] / `rollback`). With the profile measured on the model (τ mean
//! tokens per round = tokens per target forward, k̄ mean rows verified per round, f̄ draft
//! forwards per round growing the tree, plus the round's first draft pass over the tokens just
//! emitted), the projected speedup over autoregressive decoding is
//!
//! ```text
//! τ / (c(k̄) + (1 + f̄) · d)
//! ```
//!
//! `c` between measured `k` is interpolated linearly (extrapolated from the last two points).
//! Not counted: the draft's prompt pass and the adaptor (once per request), top-k selection and
//! bookkeeping on the CPU.
//!
//! Beside it, the same formula **at the memory bound**, counted rather than measured: a pass costs
//! the weights it streams, so verifying any `k` costs `t(1)` (`c = 1`) and a draft step costs the
//! fraction of a decode step's weight bytes that it streams (its `fc`, injection and layer, and
//! the target's LM head). The gap between the two is what glance's multi-row kernels leave on the
//! table.

use super::{label, Column, Measured, SpecOptions};
use crate::{Context, Progress, Result};
use candle_core::{Device, Tensor};
use glance_decode::cost::time_pass;
use glance_decode::speculative::tree::level_mask;
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::{AttnMask, CausalLm, DraftLm, DraftPrompt, KvCache, Mode, TreeMask};
use serde::Serialize;
use serde_json::Value;
use std::time::Instant;

/// Rows of the prompt in the cache.
pub const PROMPT: usize = 512;
/// Verification sizes measured.
pub const KS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// Rows of the prompt that stand for an image (for the heads' adaptor and global feature).
const IMAGE_ROWS: std::ops::Range<usize> = 4..260;

/// A draft configuration's name and a time or cost.
type Timed = (&'static str, f64);

/// Parameters one decode step of `c` streams: every weight (the LM head included) but the
/// embedding table, of which one row.
fn streamed(c: &TextConfig) -> f64 {
    let emb = c.vocab_size * c.hidden_size;
    let tied = if c.tie_word_embeddings { emb } else { 0 };
    (c.num_parameters() + tied - emb + c.hidden_size) as f64
}

/// Parameters one draft step of a head streams: its `fc`, injection and layer, and the target's
/// LM head.
fn draft_streamed(d: &DraftConfig) -> Result<f64> {
    let layer = d.layer_config()?;
    let h = layer.hidden_size;
    let fc = 2 * h * h + h;
    let inject = if d.global_injection { 2 * h * h } else { 0 };
    Ok(streamed(&layer) + (fc + inject) as f64)
}

/// Seconds of one verification pass over `k` rows after the cache (a `top_k`-ary tree, one
/// causal row for `k = 1`), rolled back afterwards.
fn time_verify(model: &TextModel, cache: &mut KvCache, k: usize, top_k: usize) -> Result<f64> {
    let vocab = model.vocab_size();
    let ids: Vec<u32> = (0..k).map(|i| ((i * 31 + 7) % vocab) as u32).collect();
    let (mask, positions) = if k == 1 {
        (AttnMask::causal(), vec![PROMPT as u32])
    } else {
        let tree = TreeMask::k_ary(k, top_k);
        let positions = tree.positions(PROMPT as u32);
        (AttnMask::Tree(tree), positions)
    };
    Ok(time_pass(model, cache, &ids, &positions, &mask)?)
}

/// A draft head of one configuration at the random shape, its cache holding the prompt.
struct Draft {
    name: &'static str,
    head: DraftHead,
    cache: KvCache,
    context: glance_nn::DraftContext,
}

impl Draft {
    fn new(shape: &Value, c: &DraftConfig, prompt: (&Tensor, &Tensor)) -> Result<Self> {
        let config = DraftConfig::for_target(shape, c.adaptor_queries, c.global_injection)?;
        let vb = random_var_builder(3, &Device::Cpu);
        let head = DraftHead::from_var_builder(&vb, config, Mode::Infer)?;
        let positions: Vec<u32> = (0..PROMPT as u32).collect();
        let images = vec![IMAGE_ROWS.collect::<Vec<usize>>()];
        let start = head.start(&DraftPrompt {
            inputs: prompt.0,
            hidden: prompt.1,
            positions: &positions,
            images: &images,
        })?;
        let mut cache = head.new_cache();
        head.forward(
            &start.rows,
            &start.positions,
            &AttnMask::causal(),
            &mut cache,
        )?;
        Ok(Self {
            name: label(c),
            head,
            cache,
            context: start.context,
        })
    }

    /// Seconds of one tree level of `width` rows below the committed rows (the root's
    /// children: the mask [`level_mask`] gives them): fuse, the layer, the target's LM head.
    fn time_step(&mut self, model: &TextModel, hidden: &Tensor, width: usize) -> Result<f64> {
        let vocab = model.vocab_size();
        let ids: Vec<u32> = (0..width).map(|i| ((i * 17 + 5) % vocab) as u32).collect();
        // (width, hidden)
        let prev = hidden.narrow(0, PROMPT - width, width)?;
        let mask = level_mask(self.cache.len(), 0, &vec![Vec::new(); width])?;
        let positions = vec![PROMPT as u32; width];
        let mark = self.cache.mark();
        let start = Instant::now();
        let rows = self
            .head
            .fuse(&model.embed_tokens(&ids)?, &prev, &self.context)?;
        let out = self
            .head
            .forward(&rows, &positions, &mask, &mut self.cache)?;
        // (width, vocab)
        let logits: Vec<Vec<f32>> = model.logits(&out)?.to_vec2()?;
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(logits);
        self.cache.rollback(&mark)?;
        Ok(seconds)
    }
}

/// `c(k)` from the measured points, linear in between and beyond.
pub fn interpolate(points: &[(f64, f64)], k: f64) -> f64 {
    if !k.is_finite() || points.len() < 2 {
        return f64::NAN;
    }
    let i = points
        .windows(2)
        .position(|w| k <= w[1].0)
        .unwrap_or(points.len() - 2);
    let ((x0, y0), (x1, y1)) = (points[i], points[i + 1]);
    y0 + (y1 - y0) * (k - x0) / (x1 - x0)
}

/// One verification size.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyCost {
    pub k: usize,
    pub seconds: f64,
    /// `c(k) = t(k) / t(1)`.
    pub cost_ratio: f64,
}

/// One head configuration's draft step.
#[derive(Debug, Clone, Serialize)]
pub struct DraftStep {
    pub head: &'static str,
    pub rows: usize,
    pub seconds: f64,
    pub fraction_of_t1: f64,
    pub memory_bound_fraction_of_t1: f64,
}

/// One strategy × group projected.
#[derive(Debug, Clone, Serialize)]
pub struct ProjectionRow {
    pub strategy: String,
    pub temperature: f32,
    pub answers: &'static str,
    pub tokens_per_round: f64,
    pub mean_tree_rows: f64,
    pub draft_steps_per_round: f64,
    pub verify_cost: f64,
    pub draft_cost: f64,
    pub projected_speedup: f64,
    pub projected_speedup_without_draft_cost: f64,
    pub memory_bound_speedup: f64,
}

/// The memory-bound projection.
#[derive(Debug, Clone, Serialize)]
pub struct Projection {
    pub shape: String,
    pub parameters: usize,
    pub prompt_rows: usize,
    pub reps: usize,
    pub threads: usize,
    pub tree_top_k: usize,
    pub verify: Vec<VerifyCost>,
    pub draft_step: Vec<DraftStep>,
    pub draft_cost_method: &'static str,
    pub rows: Vec<ProjectionRow>,
    #[serde(skip)]
    pub layers: usize,
    #[serde(skip)]
    pub hidden: usize,
}

/// Measures the costs at the random shape `shape_name` and projects every measured group.
pub fn project(
    shape_name: &str,
    o: &SpecOptions,
    cols: &[Column],
    m: &Measured,
    threads: usize,
    progress: &mut dyn Progress,
) -> Result<Projection> {
    let tree = &o.tree;
    let shape = presets::text_config_value(shape_name)?;
    let config = presets::text_config(shape_name)?;
    let params = config.num_parameters();
    progress.note(&format!(
        "building the random-weight decoder `{shape_name}` ({:.2}B parameters) for the projection…",
        params as f64 / 1e9
    ));
    let pool = glance_engine::thread_pool(threads)?;
    let width = tree.top_k.min(tree.budget);
    let (t, drafts) = pool
        .install(|| -> Result<(Vec<f64>, Vec<Timed>)> {
            let vb = random_var_builder(0, &Device::Cpu);
            let model = TextModel::load(&vb, &vb.pp("lm_head"), &config, Mode::Infer)?;
            let vocab = model.vocab_size();
            let ids: Vec<u32> = (0..PROMPT)
                .map(|i| ((i * 7919 + 13) % vocab) as u32)
                .collect();
            let positions: Vec<u32> = (0..PROMPT as u32).collect();
            // (PROMPT, hidden)
            let inputs = model.embed_tokens(&ids)?;
            let prefilled = glance_decode::prefill(&model, &inputs, &positions)?;
            let (mut cache, hidden) = (prefilled.cache, prefilled.hidden);
            let mut drafts: Vec<Draft> = Vec::new();
            for c in cols.iter().filter_map(|c| c.head.as_ref()) {
                if !drafts.iter().any(|d| d.name == label(&c.config)) {
                    drafts.push(Draft::new(&shape, &c.config, (&inputs, &hidden))?);
                }
            }
            let mut t = vec![f64::INFINITY; KS.len()];
            let mut d = vec![f64::INFINITY; drafts.len()];
            for _ in 0..o.reps {
                for (best, &k) in t.iter_mut().zip(&KS) {
                    *best = best.min(time_verify(&model, &mut cache, k, tree.top_k)?);
                }
                for (best, draft) in d.iter_mut().zip(drafts.iter_mut()) {
                    *best = best.min(draft.time_step(&model, &hidden, width)?);
                }
            }
            Ok((t, drafts.iter().map(|x| x.name).zip(d).collect()))
        })
        .context("the memory-bound projection")?;
    let t1 = t[0];
    let points: Vec<(f64, f64)> = KS
        .iter()
        .zip(&t)
        .map(|(&k, &s)| (k as f64, s / t1))
        .collect();
    let target = streamed(&config);
    let mut draft_step = Vec::new();
    let mut bound = Vec::new();
    for (name, s) in &drafts {
        let Some(head) = cols
            .iter()
            .filter_map(|c| c.head.as_ref())
            .find(|h| label(&h.config) == *name)
        else {
            continue;
        };
        let shaped = DraftConfig::for_target(
            &shape,
            head.config.adaptor_queries,
            head.config.global_injection,
        )?;
        let fraction = draft_streamed(&shaped)? / target;
        bound.push((*name, fraction));
        draft_step.push(DraftStep {
            head: name,
            rows: width,
            seconds: *s,
            fraction_of_t1: s / t1,
            memory_bound_fraction_of_t1: fraction,
        });
    }
    let mut rows = Vec::new();
    for g in &m.groups {
        for (c, x) in cols.iter().zip(&g.tallies).filter(|(_, x)| x.rounds > 0) {
            let Some(h) = &c.head else { continue };
            let find = |v: &[Timed]| {
                v.iter()
                    .find(|(n, _)| *n == label(&h.config))
                    .map_or(f64::NAN, |x| x.1)
            };
            let d = find(&drafts) / t1;
            let tau = x.tokens_per_forward();
            let k = x.mean_tree_rows();
            let steps = 1.0 + x.draft_forwards_per_round();
            let ck = interpolate(&points, k);
            let draft = steps * d;
            rows.push(ProjectionRow {
                strategy: c.name.clone(),
                temperature: g.temperature,
                answers: g.kind.name(),
                tokens_per_round: tau,
                mean_tree_rows: k,
                draft_steps_per_round: steps,
                verify_cost: ck,
                draft_cost: draft,
                projected_speedup: tau / (ck + draft),
                projected_speedup_without_draft_cost: tau / ck,
                memory_bound_speedup: tau / (1.0 + steps * find(&bound)),
            });
        }
    }
    let verify = KS
        .iter()
        .zip(&t)
        .map(|(&k, &s)| VerifyCost {
            k,
            seconds: s,
            cost_ratio: s / t1,
        })
        .collect();
    Ok(Projection {
        shape: shape_name.to_string(),
        parameters: params,
        prompt_rows: PROMPT,
        reps: o.reps,
        threads,
        tree_top_k: tree.top_k,
        verify,
        draft_step,
        draft_cost_method: "measured: fc (+ injection), one decoder layer and the target's LM head over one tree level of top_k rows, in units of t(1), times (1 + draft forwards per round); memory_bound_speedup counts c(k) = 1 and a draft step as its share of the weight bytes a decode step streams",
        rows,
        layers: config.num_layers,
        hidden: config.hidden_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_is_linear_and_extrapolates() {
        let p = [(1.0, 1.0), (2.0, 1.2), (4.0, 1.6)];
        assert!((interpolate(&p, 1.5) - 1.1).abs() < 1e-12);
        assert!((interpolate(&p, 3.0) - 1.4).abs() < 1e-12);
        assert!((interpolate(&p, 8.0) - 2.4).abs() < 1e-12);
        assert!(interpolate(&p, f64::NAN).is_nan());
    }

    #[test]
    fn a_decode_step_streams_every_weight_but_the_embedding_table() {
        let c = presets::text_config("llama-134m").unwrap();
        let emb = (c.vocab_size * c.hidden_size) as f64;
        let all = c.num_parameters() as f64;
        let s = streamed(&c);
        if c.tie_word_embeddings {
            assert_eq!(s, all + c.hidden_size as f64);
        } else {
            assert_eq!(s, all - emb + c.hidden_size as f64);
        }
    }
}
