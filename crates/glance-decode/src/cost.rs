//! The cost model cost-aware decoding plans with: what a target pass over `k` rows costs on this
//! machine, in this weight format, at this thread count (`c(k)`, relative to one row), and what a
//! draft step and a draft prompt row cost.
//!
//! Speculation pays only when the tokens a round accepts outweigh the round's time: `E[tokens] /
//! (drafting + pass(k))` against `1 / pass(1)`. On a cache-resident model `c(k) ≈ k` and nothing
//! can pay; on a memory-bound one a pass over 8 rows costs a few decode steps and a good draft
//! pays (Sequoia plans its trees from the same measured curve). The figures are measured once,
//! in a few seconds ([`CostModel::measure`]), and the caller keeps them (the engine caches them on
//! disk keyed by [`CostModel::key`]).

use crate::speculative::tree::draft_probs;
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_nn::{AttnMask, CausalLm, DraftLm, DraftPrompt, KvCache, TreeMask};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// Rows at which a target pass is timed; other row counts interpolate between them (and extend
/// linearly past the last).
pub const MEASURED_ROWS: [usize; 8] = [1, 2, 3, 4, 6, 8, 12, 16];
/// Sweeps over [`MEASURED_ROWS`].
const SWEEPS: usize = 3;
/// Draft step widths timed (rows of one draft forward: the frontier of a tree).
pub const DRAFT_WIDTHS: usize = 4;
/// Rows of context every timed pass attends over (a prompt is at least this long in practice;
/// attention over it is part of what a verification pass costs on a small model).
const CONTEXT_ROWS: usize = 256;
/// Each timing of a sweep is the fastest of at least this many runs ...
const MIN_RUNS: usize = 1;
/// ... and of as many more as fit in this many seconds (small models: noise is large next to
/// a sub-millisecond pass), up to [`MAX_RUNS`].
const MIN_SECONDS: f64 = 0.03;
const MAX_RUNS: usize = 50;

/// Measured costs on one (model, weight format, threads, machine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// What the figures depend on (the caller's description of model, format, threads, CPU).
    pub key: String,
    /// Rows of each timed pass, increasing, starting at 1.
    pub rows: Vec<usize>,
    /// Seconds of a target pass (forward and logits) over `rows[i]` rows.
    pub pass_s: Vec<f64>,
    /// Draft costs by head ([`draft_key`]: its kind, and its reduced vocabulary's size where it
    /// keeps one), measured when a head is first used.
    #[serde(default)]
    pub drafts: BTreeMap<String, DraftCost>,
    /// Seconds the target measurement took.
    pub measured_s: f64,
    /// Whether plans correct the figures by the clock as a request runs
    /// ([`crate::speculative::plan::Planner::slowdown`]): true for measured figures; a test that
    /// makes figures up to force a plan turns it off.
    #[serde(default = "yes")]
    pub clock_corrected: bool,
}

fn yes() -> bool {
    true
}

/// What a draft head costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftCost {
    /// Seconds of one draft step over `n` rows (index `n - 1`): the head's forward, the LM head
    /// and the probabilities a tree ranks by.
    pub step_s: Vec<f64>,
    /// Seconds per row of the head's prompt pass (its start, paid once per request).
    pub row_s: f64,
}

impl DraftCost {
    /// Seconds of a draft step over `n` rows (beyond the widths timed: linear in the extra rows).
    pub fn step(&self, n: usize) -> f64 {
        let n = n.max(1);
        match self.step_s.get(n - 1) {
            Some(&s) => s,
            None => {
                let last = self.step_s.len();
                let per_row = (self.step_s[last - 1] - self.step_s[0]) / (last - 1).max(1) as f64;
                self.step_s[last - 1] + per_row.max(0.0) * (n - last) as f64
            }
        }
    }
}

/// What a draft's step costs depend on besides the target: its kind (its parts), and how many
/// LM-head rows a step reads (the reduced vocabulary's size, FR-Spec).
pub fn draft_key(draft: &dyn DraftLm) -> String {
    match draft.vocab() {
        Some(ids) => format!("{} vocab {}", draft.kind(), ids.len()),
        None => draft.kind().to_string(),
    }
}

impl CostModel {
    /// Times target passes over [`MEASURED_ROWS`] rows (a chain under the tree mask, as a
    /// verification pass runs) after [`CONTEXT_ROWS`] rows of context: [`SWEEPS`] sweeps over
    /// the row counts after one warm-up pass, each count's fastest run kept (a burst of load
    /// slows one sweep of a count, not all). Load only ever slows a pass, so the figures are then
    /// made non-decreasing from above: a count timed slower than a larger one gets the larger's
    /// time.
    pub fn measure(model: &dyn CausalLm, key: String) -> Result<Self> {
        let start = Instant::now();
        let context = CONTEXT_ROWS.min(model.max_positions() / 2);
        let rows: Vec<usize> = MEASURED_ROWS
            .iter()
            .copied()
            .filter(|&k| context + k <= model.max_positions())
            .collect();
        let mut cache = model.new_cache();
        if context > 0 {
            let xs = model.embed_tokens(&vec![0; context])?;
            let positions: Vec<u32> = (0..context as u32).collect();
            model.forward(&xs, &positions, &AttnMask::causal(), &mut cache)?;
        }
        time_chain(model, &mut cache, 1)?;
        let mut pass_s = vec![f64::INFINITY; rows.len()];
        for _ in 0..SWEEPS {
            for (i, &k) in rows.iter().enumerate() {
                pass_s[i] = pass_s[i].min(fastest(|| time_chain(model, &mut cache, k))?);
            }
        }
        for i in (0..pass_s.len().saturating_sub(1)).rev() {
            pass_s[i] = pass_s[i].min(pass_s[i + 1]);
        }
        let model = Self {
            key,
            rows,
            pass_s,
            drafts: BTreeMap::new(),
            measured_s: start.elapsed().as_secs_f64(),
            clock_corrected: true,
        };
        model.check()?;
        Ok(model)
    }

    /// Times `draft`'s steps at widths 1..=[`DRAFT_WIDTHS`] and its prompt pass, with the
    /// target's LM head, and records them under the head's kind.
    pub fn measure_draft(&mut self, target: &dyn CausalLm, draft: &dyn DraftLm) -> Result<()> {
        let hidden = target.hidden_size();
        let dev = target.device();
        let t = CONTEXT_ROWS.min(target.max_positions() / 2).max(2);
        let zeros = Tensor::zeros((t, hidden), candle_core::DType::F32, dev)?;
        let positions: Vec<u32> = (0..t as u32).collect();
        let prompt = DraftPrompt {
            inputs: &zeros,
            hidden: &zeros,
            positions: &positions,
            images: &[],
        };
        let mut cache = draft.new_cache();
        let clock = Instant::now();
        let start = draft.start(&prompt)?;
        draft.forward(
            &start.rows,
            &start.positions,
            &AttnMask::causal(),
            &mut cache,
        )?;
        let row_s = clock.elapsed().as_secs_f64() / t as f64;
        let next = *start.positions.last().unwrap_or(&0) + 1;
        let mut step_s = vec![f64::INFINITY; DRAFT_WIDTHS];
        for _ in 0..SWEEPS {
            for (i, best) in step_s.iter_mut().enumerate() {
                let n = i + 1;
                let ids = vec![0; n];
                let prev = Tensor::zeros((n, hidden), candle_core::DType::F32, dev)?;
                *best = best.min(fastest(|| {
                    let mark = cache.mark();
                    let clock = Instant::now();
                    let rows = draft.fuse(&target.embed_tokens(&ids)?, &prev, &start.context)?;
                    let out =
                        draft.forward(&rows, &vec![next; n], &AttnMask::causal(), &mut cache)?;
                    draft_probs(target, draft, &out)?;
                    let s = clock.elapsed().as_secs_f64();
                    cache.rollback(&mark)?;
                    Ok(s)
                })?);
            }
        }
        for i in (0..step_s.len().saturating_sub(1)).rev() {
            step_s[i] = step_s[i].min(step_s[i + 1]);
        }
        self.drafts
            .insert(draft_key(draft), DraftCost { step_s, row_s });
        Ok(())
    }

    /// The figures are usable: rows increasing from 1, one positive time per row.
    pub fn check(&self) -> Result<()> {
        let ok = !self.rows.is_empty()
            && self.rows[0] == 1
            && self.rows.windows(2).all(|w| w[0] < w[1])
            && self.rows.len() == self.pass_s.len()
            && self.pass_s.iter().all(|s| s.is_finite() && *s > 0.0)
            && self.drafts.values().all(|d| {
                !d.step_s.is_empty()
                    && d.step_s.iter().all(|s| s.is_finite() && *s >= 0.0)
                    && d.row_s.is_finite()
                    && d.row_s >= 0.0
            });
        if ok {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "cost model `{}`: unusable figures (rows {:?})",
                self.key, self.rows
            )))
        }
    }

    /// Seconds of a target pass over `k ≥ 1` rows: linear between the timed row counts, and
    /// beyond the last along the last segment's slope.
    pub fn pass(&self, k: usize) -> f64 {
        let k = k.max(1);
        let i = self.rows.partition_point(|&r| r < k);
        if i < self.rows.len() && self.rows[i] == k {
            return self.pass_s[i];
        }
        // Between rows[i - 1] and rows[i], or past the end (i == len ≥ 1).
        let (a, b) = if i < self.rows.len() {
            (i - 1, i)
        } else if self.rows.len() >= 2 {
            (self.rows.len() - 2, self.rows.len() - 1)
        } else {
            return self.pass_s[0] * k as f64;
        };
        let (ra, rb) = (self.rows[a] as f64, self.rows[b] as f64);
        let slope = ((self.pass_s[b] - self.pass_s[a]) / (rb - ra)).max(0.0);
        self.pass_s[a] + slope * (k as f64 - ra)
    }

    /// `c(k)`: a pass over `k` rows in decode steps.
    pub fn c(&self, k: usize) -> f64 {
        self.pass(k) / self.pass_s[0]
    }

    /// The costs of `draft`'s steps, if measured.
    pub fn draft(&self, draft: &dyn DraftLm) -> Option<&DraftCost> {
        self.drafts.get(&draft_key(draft))
    }

    /// `c(k)` at the timed row counts, for reports: `(k, c(k))`.
    pub fn curve(&self) -> Vec<(usize, f64)> {
        self.rows.iter().map(|&k| (k, self.c(k))).collect()
    }
}

/// Seconds of one target pass over `k` rows after those in `cache` (a chain under the tree
/// mask, as a verification pass runs), the rows rolled back after.
fn time_chain(model: &dyn CausalLm, cache: &mut KvCache, k: usize) -> Result<f64> {
    let mask = TreeMask::chain(k);
    let positions = mask.positions(cache.len() as u32);
    time_pass(model, cache, &vec![0; k], &positions, &AttnMask::Tree(mask))
}

/// Seconds of one target pass over the rows of `ids` at `positions` under `mask` after those in
/// `cache`: embedding, forward and the logits of every row (what a verification pass computes).
/// The rows are rolled back after, so the cache is as it was.
pub fn time_pass(
    model: &dyn CausalLm,
    cache: &mut KvCache,
    ids: &[u32],
    positions: &[u32],
    mask: &AttnMask,
) -> Result<f64> {
    let mark = cache.mark();
    let clock = Instant::now();
    // (rows, hidden)
    let xs = model.embed_tokens(ids)?;
    let hidden = model.forward(&xs, positions, mask, cache)?;
    // (rows, vocab)
    let logits: Vec<Vec<f32>> = model.logits(&hidden)?.to_vec2()?;
    let s = clock.elapsed().as_secs_f64();
    std::hint::black_box(logits);
    cache.rollback(&mark)?;
    Ok(s)
}

/// The fastest of at least [`MIN_RUNS`] runs of `f`, and of more while they take under
/// [`MIN_SECONDS`] in all (at most [`MAX_RUNS`]).
fn fastest(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let (mut best, mut total, mut runs) = (f64::INFINITY, 0.0, 0);
    while runs < MIN_RUNS || (total < MIN_SECONDS && runs < MAX_RUNS) {
        let s = f()?;
        best = best.min(s);
        total += s;
        runs += 1;
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(rows: &[usize], pass_s: &[f64]) -> CostModel {
        CostModel {
            key: "test".into(),
            rows: rows.to_vec(),
            pass_s: pass_s.to_vec(),
            drafts: BTreeMap::new(),
            measured_s: 0.0,
            clock_corrected: true,
        }
    }

    #[test]
    fn passes_interpolate_between_timed_rows_and_extrapolate_past_them() {
        let m = model(&[1, 2, 4, 8], &[1.0, 1.2, 1.6, 3.2]);
        m.check().unwrap();
        assert_eq!(m.pass(1), 1.0);
        assert!((m.pass(3) - 1.4).abs() < 1e-12);
        assert!((m.pass(6) - 2.4).abs() < 1e-12);
        assert!((m.pass(12) - 4.8).abs() < 1e-12);
        assert!((m.c(8) - 3.2).abs() < 1e-12);
        assert_eq!(m.pass(0), 1.0);
    }

    #[test]
    fn unusable_figures_are_refused() {
        assert!(model(&[2, 4], &[1.0, 2.0]).check().is_err());
        assert!(model(&[1, 4], &[1.0, f64::NAN]).check().is_err());
        assert!(model(&[1, 1], &[1.0, 1.0]).check().is_err());
        assert!(model(&[1], &[]).check().is_err());
    }

    #[test]
    fn draft_steps_extend_linearly_past_the_timed_widths() {
        let d = DraftCost {
            step_s: vec![1.0, 1.5, 2.0],
            row_s: 0.1,
        };
        assert_eq!(d.step(2), 1.5);
        assert!((d.step(5) - 3.0).abs() < 1e-12);
        assert_eq!(d.step(0), 1.0);
    }
}
