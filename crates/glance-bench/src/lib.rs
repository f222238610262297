//! glance's benchmarks: each runs its measurement and returns a typed report — the rows of its
//! tables, the machine's yardsticks, the cost model — that serialises to the JSON `glance bench`
//! writes. Printing, JSON files and plots are the binary's (`crates/glance-cli/src/bench/`).
//! Every ratio is measured side by side in one run (a shared machine is noisy).
//!
//! * [`decode`]: prefill and decode throughput beside this machine's limits.
//! * [`prune`]: every pruning policy × budget: time to first token and accuracy.
//! * [`spec`]: autoregressive against speculative decoding, and the memory-bound projection.
//! * [`diffusion`]: block-diffusion decoding of a converted model.
//! * [`serve`]: the server under concurrent streaming clients, batching on and off, or a mix of
//!   request kinds.

pub mod decode;
pub mod diffusion;
mod error;
pub mod machine;
pub mod prune;
pub mod serve;
pub mod spec;
pub mod tally;

pub(crate) use error::bail_options;
pub use error::{BenchError, Context, Result};

use glance_engine::ImageInput;
use serde::Serialize;
use std::collections::BTreeMap;

/// Where a long benchmark tells its caller how far it got (the binary draws progress bars).
/// Every method does nothing by default.
pub trait Progress {
    /// A phase of `total` steps (images) starts, labelled `label`.
    fn start(&mut self, _label: &str, _total: u64) {}
    /// `done` steps of the phase are done; `note` says more (may be empty).
    fn advance(&mut self, _done: u64, _note: &str) {}
    /// The phase ended.
    fn finish(&mut self) {}
    /// A line for the user about what is being prepared (a random-weight model being built).
    fn note(&mut self, _text: &str) {}
}

/// No progress reports.
pub struct Silent;

impl Progress for Silent {}

/// The cost model as reports show it: the decode step in ms, `c(k)` at the timed row counts,
/// and each draft head's step and prompt-row costs in decode steps.
#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    pub key: String,
    pub decode_step_ms: f64,
    /// `(k, c(k))` at the timed row counts.
    pub c: Vec<(usize, f64)>,
    pub drafts: BTreeMap<String, DraftCostReport>,
    pub measured_s: f64,
}

/// A draft head's costs in decode steps.
#[derive(Debug, Clone, Serialize)]
pub struct DraftCostReport {
    /// One step over `n` rows (index `n - 1`).
    pub step_in_decode_steps: Vec<f64>,
    pub prompt_row_in_decode_steps: f64,
}

impl From<&glance_decode::CostModel> for CostReport {
    fn from(cost: &glance_decode::CostModel) -> Self {
        let step = cost.pass(1);
        let drafts = cost
            .drafts
            .iter()
            .map(|(kind, d)| {
                let report = DraftCostReport {
                    step_in_decode_steps: d.step_s.iter().map(|s| s / step).collect(),
                    prompt_row_in_decode_steps: d.row_s / step,
                };
                (kind.clone(), report)
            })
            .collect();
        Self {
            key: cost.key.clone(),
            decode_step_ms: step * 1e3,
            c: cost.curve(),
            drafts,
            measured_s: cost.measured_s,
        }
    }
}

/// The most world test images a benchmark takes (the split has far more; this bounds a typo).
pub const MAX_IMAGES: usize = 100_000;

/// Checks `n` world test images from `start` (the `--n` and `--start` of a benchmark).
pub fn check_test_images(n: usize, start: u64) -> Result<()> {
    if n == 0 || n > MAX_IMAGES {
        bail_options!("--n must be between 1 and {MAX_IMAGES} (world test images)");
    }
    let last = start.checked_add(n as u64 - 1);
    if last.is_none_or(|l| glance_world::Split::Test.seed(l).is_err()) {
        bail_options!("--start {start} with --n {n} runs past the end of the test split");
    }
    Ok(())
}

/// The first independent question of world test image `start` and the image: what the
/// question benchmarks answer once, untimed, before measuring.
pub fn warm_up_question(start: u64) -> Result<Option<(glance_world::Qa, ImageInput)>> {
    let ex = glance_world::sample(glance_world::Split::Test, start)?;
    let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
    Ok(ex
        .questions
        .into_iter()
        .find(|q| !q.follow_up)
        .map(|qa| (qa, image)))
}

/// Calls `f` on every independent question (no follow-up turns) of world test images
/// `start .. start + n`, in order, reporting each image to `progress` under `label`; returns
/// the seconds taken.
pub fn for_each_question(
    progress: &mut dyn Progress,
    label: &str,
    n: usize,
    start: u64,
    mut f: impl FnMut(&glance_world::Example, &glance_world::Qa, &ImageInput) -> Result<()>,
) -> Result<f64> {
    progress.start(label, n as u64);
    let t0 = std::time::Instant::now();
    for (done, index) in (start..start + n as u64).enumerate() {
        let ex = glance_world::sample(glance_world::Split::Test, index)?;
        let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
        for qa in ex.questions.iter().filter(|q| !q.follow_up) {
            f(&ex, qa, &image)?;
        }
        progress.advance(done as u64 + 1, "");
    }
    progress.finish();
    Ok(t0.elapsed().as_secs_f64())
}

/// The order in which `n` columns answer the `serial`-th question: the rows of a balanced Latin
/// square (Williams' design), so that over a cycle of questions (`n` of them, `2n` for odd `n`)
/// every column answers in every place equally often and follows every other column equally
/// often. A strategy that leaves the machine's caches cold for the next one (a draft head's
/// weights, a diffusion block's buffers) then slows every column alike; a plain rotation
/// always put the same column after it (on glance-tiny, `auto` after `eagle`).
pub fn column_order(n: usize, serial: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // First row 0, 1, n-1, 2, n-2, …; row r adds r (mod n); odd n also runs each row reversed.
    let first: Vec<usize> = (0..n)
        .map(|j| match j {
            0 => 0,
            j if j % 2 == 1 => j.div_ceil(2),
            j => n - j / 2,
        })
        .collect();
    let rows = if n.is_multiple_of(2) { n } else { 2 * n };
    let r = serial % rows;
    let mut order: Vec<usize> = first.iter().map(|&c| (c + r % n) % n).collect();
    if r >= n {
        order.reverse();
    }
    order
}

/// Greedy at 0, else plain sampling at `t` (no top-k / top-p) with `seed`.
pub fn sampling(t: f32, seed: u64) -> glance_core::SamplingParams {
    if t == 0.0 {
        glance_core::SamplingParams::greedy()
    } else {
        glance_core::SamplingParams::sampled(t, seed)
    }
}

/// The evaluation's score of an answer: exact match, or the description's object F1.
pub fn score(ex: &glance_world::Example, qa: &glance_world::Qa, text: &str) -> f64 {
    if qa.family == glance_world::Family::Description {
        glance_world::description_prf(text, &ex.scene.objects).f1
    } else {
        f64::from(u8::from(glance_world::exact_match(text, &qa.answer)))
    }
}

/// The most tokens an answer of `family` gets: `max_new_tokens` for descriptions, the
/// evaluation's short-answer cap (at most that) for the rest.
pub fn max_tokens(family: glance_world::Family, max_new_tokens: usize) -> usize {
    if family == glance_world::Family::Description {
        max_new_tokens
    } else {
        glance_engine::eval::SHORT_MAX_NEW_TOKENS.min(max_new_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_images_are_bounded_by_the_split() {
        assert!(check_test_images(1, 0).is_ok());
        assert!(check_test_images(0, 0).is_err());
        assert!(check_test_images(MAX_IMAGES + 1, 0).is_err());
        assert!(check_test_images(2, u64::MAX).is_err());
    }

    #[test]
    fn short_answers_are_capped() {
        use glance_world::Family;
        let short = glance_engine::eval::SHORT_MAX_NEW_TOKENS;
        assert_eq!(max_tokens(Family::Description, 500), 500);
        assert_eq!(max_tokens(Family::Counting, 500), short);
        assert_eq!(max_tokens(Family::Counting, 2), 2.min(short));
    }

    #[test]
    fn cost_reports_are_in_decode_steps() {
        let cost = glance_decode::CostModel {
            key: "k".into(),
            rows: vec![1, 2],
            pass_s: vec![0.01, 0.015],
            drafts: [(
                "eagle".to_string(),
                glance_decode::DraftCost {
                    step_s: vec![0.002],
                    row_s: 0.001,
                },
            )]
            .into(),
            measured_s: 1.0,
            clock_corrected: true,
        };
        let r = CostReport::from(&cost);
        assert!((r.decode_step_ms - 10.0).abs() < 1e-9);
        assert_eq!(r.c, vec![(1, 1.0), (2, 1.5)]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["c"][1], serde_json::json!([2, 1.5]));
        assert!(
            (v["drafts"]["eagle"]["step_in_decode_steps"][0]
                .as_f64()
                .unwrap()
                - 0.2)
                .abs()
                < 1e-9
        );
    }

    #[test]
    fn columns_answer_in_every_place_after_every_other_column_alike() {
        for n in 1..=7usize {
            let cycle = if n.is_multiple_of(2) { n } else { 2 * n };
            let mut place = vec![vec![0; n]; n];
            let mut after = vec![vec![0; n]; n];
            for serial in 0..cycle {
                let order = column_order(n, serial);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..n).collect::<Vec<_>>(),
                    "{n} {serial}: {order:?}"
                );
                for (k, &c) in order.iter().enumerate() {
                    place[c][k] += 1;
                }
                for w in order.windows(2) {
                    after[w[0]][w[1]] += 1;
                }
            }
            // Each column in each place, and each ordered pair of distinct columns adjacent, once
            // per n rows (twice for odd n).
            let per_cycle = cycle / n;
            assert!(
                place.iter().flatten().all(|&x| x == per_cycle),
                "{n}: {place:?}"
            );
            for (a, row) in after.iter().enumerate() {
                for (b, &x) in row.iter().enumerate() {
                    assert_eq!(x, if a == b { 0 } else { per_cycle }, "{n}: {after:?}");
                }
            }
            assert_eq!(column_order(n, cycle + 1), column_order(n, 1));
        }
    }
}
