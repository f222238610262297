//! The memory-bound projection: what the acceptance measured on the small model would buy at a
//! size where decoding streams the weights from memory (≥ 1B parameters).
//!
//! On a random-weight text decoder of `--random-shape`, with a 512-row prompt in the cache:
//!
//! * `t(k)`: one target forward over `k` rows under a tree mask (a `top_k`-ary tree, the shape
//!   drafting grows), plus the logits of every row — the verification pass; `t(1)` is one
//!   autoregressive decode step (one row, causal). The cost ratio is `c(k) = t(k) / t(1)`.
//! * `d`: one draft step of each head configuration at that shape — `fc` (and the global-feature
//!   injection), the one decoder layer and the target's LM head over one tree level of `top_k`
//!   rows — measured the same way, in units of `t(1)`.
//!
//! Every measurement is the best of `--reps`, interleaved, the caches rolled back between runs
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

use super::{label, Column, Measured, SpecBenchArgs};
use crate::bench::tally::num;
use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use glance_decode::TreeSettings;
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::{AttnMask, CausalLm, DraftLm, DraftPrompt, KvCache, Mode, TreeMask};
use serde_json::{json, Value};
use std::time::Instant;

/// Rows of the prompt in the cache.
const PROMPT: usize = 512;
/// Verification sizes measured.
const KS: [usize; 6] = [1, 2, 4, 8, 16, 32];
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

/// Parents of a `top_k`-ary tree of `k` rows, row 0 the root.
fn tree_parents(k: usize, top_k: usize) -> Vec<Option<usize>> {
    (0..k)
        .map(|i| (i > 0).then(|| (i - 1) / top_k.max(1)))
        .collect()
}

/// Seconds of one verification pass over `k` rows after the cache, rolled back afterwards.
fn time_verify(model: &TextModel, cache: &mut KvCache, k: usize, top_k: usize) -> Result<f64> {
    let vocab = model.vocab_size();
    let ids: Vec<u32> = (0..k).map(|i| ((i * 31 + 7) % vocab) as u32).collect();
    let (mask, positions) = if k == 1 {
        (AttnMask::causal(), vec![PROMPT as u32])
    } else {
        let tree = TreeMask::new(tree_parents(k, top_k))?;
        let positions = tree.positions(PROMPT as u32);
        (AttnMask::Tree(tree), positions)
    };
    let mark = cache.mark();
    let start = Instant::now();
    let hidden = model.forward(&model.embed_tokens(&ids)?, &positions, &mask, cache)?;
    let logits: Vec<Vec<f32>> = model.logits(&hidden)?.to_vec2()?;
    let seconds = start.elapsed().as_secs_f64();
    std::hint::black_box(logits);
    cache.rollback(&mark)?;
    Ok(seconds)
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

    /// Seconds of one tree level of `width` rows: fuse, the layer, the target's LM head.
    fn time_step(&mut self, model: &TextModel, hidden: &Tensor, width: usize) -> Result<f64> {
        let vocab = model.vocab_size();
        let ids: Vec<u32> = (0..width).map(|i| ((i * 17 + 5) % vocab) as u32).collect();
        let prev = hidden.narrow(0, PROMPT - width, width)?;
        let committed = self.cache.len();
        let kv = committed + width;
        let mut visible = vec![false; width * kv];
        for m in 0..width {
            visible[m * kv..m * kv + committed].fill(true);
            visible[m * kv + committed + m] = true;
        }
        let mask = AttnMask::visible(width, kv, visible)?;
        let positions = vec![PROMPT as u32; width];
        let mark = self.cache.mark();
        let start = Instant::now();
        let rows = self
            .head
            .fuse(&model.embed_tokens(&ids)?, &prev, &self.context)?;
        let out = self
            .head
            .forward(&rows, &positions, &mask, &mut self.cache)?;
        let logits: Vec<Vec<f32>> = model.logits(&out)?.to_vec2()?;
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(logits);
        self.cache.rollback(&mark)?;
        Ok(seconds)
    }
}

/// `c(k)` from the measured points, linear in between and beyond.
fn interpolate(points: &[(f64, f64)], k: f64) -> f64 {
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

/// Measures the costs at the random shape and prints and returns the projection.
pub fn project(
    args: &SpecBenchArgs,
    tree: &TreeSettings,
    cols: &[Column],
    m: &Measured,
    threads: usize,
) -> Result<Value> {
    let shape = presets::text_config_value(&args.random_shape)?;
    let config = presets::text_config(&args.random_shape)?;
    let params = config.num_parameters();
    eprintln!(
        "building the random-weight decoder `{}` ({:.2}B parameters) for the projection…",
        args.random_shape,
        params as f64 / 1e9
    );
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
            let inputs = model.embed_tokens(&ids)?;
            let mut cache = model.new_cache();
            let hidden = model.forward(&inputs, &positions, &AttnMask::causal(), &mut cache)?;
            let mut drafts: Vec<Draft> = Vec::new();
            for c in cols.iter().filter_map(|c| c.head.as_ref()) {
                if !drafts.iter().any(|d| d.name == label(&c.config)) {
                    drafts.push(Draft::new(&shape, &c.config, (&inputs, &hidden))?);
                }
            }
            let mut t = vec![f64::INFINITY; KS.len()];
            let mut d = vec![f64::INFINITY; drafts.len()];
            for _ in 0..args.reps {
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
    println!(
        "\nmemory-bound projection: random {} ({:.2}B parameters, {} layers, hidden {}), \
         {PROMPT}-row prompt in the cache, best of {}, {threads} threads",
        args.random_shape,
        params as f64 / 1e9,
        config.num_layers,
        config.hidden_size,
        args.reps
    );
    let row = |label: &str, f: &dyn Fn(usize) -> String| {
        let cells: Vec<String> = (0..KS.len()).map(f).collect();
        println!("{label:<26} {}", cells.join(" "));
    };
    row("verify k rows (tree)", &|i| format!("{:>7}", KS[i]));
    row("t(k) ms", &|i| format!("{:>7.1}", t[i] * 1e3));
    row("c(k) = t(k) / t(1)", &|i| format!("{:>7.2}", points[i].1));
    let target = streamed(&config);
    let mut draft_json = Vec::new();
    let mut bound = Vec::new();
    for (name, s) in &drafts {
        let head = cols
            .iter()
            .filter_map(|c| c.head.as_ref())
            .find(|h| label(&h.config) == *name)
            .context("every measured draft comes from a column")?;
        let shaped = DraftConfig::for_target(
            &shape,
            head.config.adaptor_queries,
            head.config.global_injection,
        )?;
        let fraction = draft_streamed(&shaped)? / target;
        bound.push((*name, fraction));
        println!(
            "draft step, {name} head (fc, one layer, LM head over {width} rows): {:.1} ms = {:.3} t(1); \
             at the memory bound {fraction:.3} t(1)",
            s * 1e3,
            s / t1
        );
        draft_json.push(
            json!({"head": name, "rows": width, "seconds": s, "fraction_of_t1": s / t1,
            "memory_bound_fraction_of_t1": fraction}),
        );
    }
    println!(
        "{:<22} {:>3} {:>12} | {:>5} {:>6} {:>6} {:>6} {:>7} | {:>9} {:>9}",
        "strategy", "T", "answers", "τ", "k̄", "steps", "c(k̄)", "draft", "projected", "bound"
    );
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
            let projected = tau / (ck + draft);
            let at_bound = tau / (1.0 + steps * find(&bound));
            println!(
                "{:<22} {:>3} {:>12} | {:>5.2} {:>6.1} {:>6.2} {:>6.2} {:>7.2} | {:>8.2}× {:>8.2}×",
                c.name,
                g.temperature,
                g.kind.name(),
                tau,
                k,
                steps,
                ck,
                draft,
                projected,
                at_bound
            );
            rows.push(json!({"strategy": c.name, "temperature": g.temperature,
                "answers": g.kind.name(), "tokens_per_round": num(tau), "mean_tree_rows": num(k),
                "draft_steps_per_round": num(steps), "verify_cost": num(ck),
                "draft_cost": num(draft), "projected_speedup": num(projected),
                "projected_speedup_without_draft_cost": num(tau / ck),
                "memory_bound_speedup": num(at_bound)}));
        }
    }
    println!(
        "(τ: tokens per round; k̄: rows verified per round; steps: draft steps per round; costs in \
         units of t(1); projected = τ / (c(k̄) + steps · draft step), measured; bound: the same \
         with c = 1 and the draft step's share of the weight bytes)"
    );
    let verify: Vec<Value> = KS
        .iter()
        .zip(&t)
        .map(|(&k, &s)| json!({"k": k, "seconds": s, "cost_ratio": s / t1}))
        .collect();
    Ok(json!({
        "shape": args.random_shape,
        "parameters": params,
        "prompt_rows": PROMPT,
        "reps": args.reps,
        "threads": threads,
        "tree_top_k": tree.top_k,
        "verify": verify,
        "draft_step": draft_json,
        "draft_cost_method": "measured: fc (+ injection), one decoder layer and the target's LM head over one tree level of top_k rows, in units of t(1), times (1 + draft forwards per round); memory_bound_speedup counts c(k) = 1 and a draft step as its share of the weight bytes a decode step streams",
        "rows": rows,
    }))
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
    fn trees_are_top_k_ary() {
        assert_eq!(
            tree_parents(6, 2),
            vec![None, Some(0), Some(0), Some(1), Some(1), Some(2)]
        );
        assert_eq!(tree_parents(3, 1), vec![None, Some(0), Some(1)]);
    }
}
