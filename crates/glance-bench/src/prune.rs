//! Every pruning policy × budget (fractions of the visual tokens), side by side in one run
//! (`glance bench prune`).
//!
//! * **Time to first token** on a random-weight LLaVA at a real shape (unless the shape is
//!   `none`): CLIP ViT-L/14-336 (576 visual tokens, feature layer −2, as LLaVA-1.5-7B) with a
//!   ≥ 1B text backbone (`tinyllama-1.1b`: 22 layers, d2048, GQA 32/4). TTFT = vision encode
//!   (identical for every policy: measured once, best of `reps`) + scoring / selection +
//!   prefill + the first token's logits. Each (policy, budget) is timed `reps` times
//!   round-robin and the best kept; speedups are against the 100% row of the same run.
//! * With a model directory: the same TTFT table for that checkpoint (on a world test image),
//!   and, with `examples > 0`, **accuracy** on the first `examples` images of the world test
//!   split through the one evaluation runner ([`glance_engine::eval`], as `glance eval`): one
//!   question per family per image, the model's chat template, greedy decoding, scored by
//!   glance-world (normalised exact match; description object-level F1). The accuracy column is
//!   the mean over attribute / counting / spatial / existence; sign reading and description F1
//!   are reported separately.
//!
//! TTFT is timed on the engine's prefill path itself: [`glance_prune::prefill_llava`] is the plan
//! → pruning transform → prefill composition the engine runs for a pruned request (and, at 100%,
//! the plain prefill).
//!
//! At 100% every policy is the unpruned prefill (tested exactly), so that row is run once.

use crate::{bail_options, Context, Progress, Result};
use candle_core::{Device, Tensor};
use glance_core::SamplingParams;
use glance_decode::autoregressive::pick;
use glance_decode::Sampler;
use glance_engine::eval::{evaluate_specs, DescriptionScore, EvalOptions, EvalReport};
use glance_engine::{Engine, EngineOptions};
use glance_models::llava::{Llava, LlavaConfig, PromptFormat, WeightLayout};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_nn::{Mode, WeightFormat, WeightLoad};
use glance_prune::{prefill_llava, Budget, Policy, PruneSpec};
use glance_world::{Family, Split};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// What `glance bench prune` measures.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// A LLaVA checkpoint: TTFT on a world test image and, with `examples > 0`, accuracy.
    pub model: Option<PathBuf>,
    /// World test-split images to score per policy × budget.
    pub examples: usize,
    /// Policy names (empty: all).
    pub policies: Vec<String>,
    /// Budgets as fractions of the visual tokens (empty: 1, 0.5, 0.25, 0.125, 0.0625).
    pub budgets: Vec<f64>,
    /// Temperature of the text-relevance scores (`None`: the default).
    pub tau: Option<f32>,
    /// Text backbone preset of the random-weight real-shape TTFT; `none` skips it.
    pub shape: String,
    /// How the real-shape model holds its weights (the vision tower and projector in the
    /// format's companion: bf16 beside bf16 / q8 / q4).
    pub weights: WeightFormat,
    /// Question tokens in the real-shape prompt.
    pub question_tokens: usize,
    /// Timed repetitions per TTFT measurement.
    pub reps: usize,
    /// Threads for the tensor kernels (`None`: all cores).
    pub threads: Option<usize>,
}

/// The most timed repetitions per measurement.
pub const MAX_REPS: usize = 100;
/// The longest question of the real-shape prompt (it must fit the 4096-token context with the
/// 576 visual tokens).
pub const MAX_QUESTION_TOKENS: usize = 2048;

/// One (policy, budget) cell. At 100% the policy is `none` (every policy equals it).
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    pub policy: Policy,
    pub ratio: f64,
}

impl Cell {
    fn spec(&self, tau: Option<f32>) -> PruneSpec {
        let mut s = PruneSpec::new(self.policy, Budget::Ratio(self.ratio));
        if let Some(t) = tau {
            s.tau = t;
        }
        s
    }

    /// The row's name: `all` at 100%, else the policy's.
    pub fn name(&self) -> &'static str {
        if self.ratio >= 1.0 {
            "all"
        } else {
            self.policy.name()
        }
    }
}

/// The policies, the budgets and the cells (the 100% cell first, then each budget's policies).
fn cells(o: &PruneOptions) -> Result<(Vec<Policy>, Vec<f64>, Vec<Cell>)> {
    let policies: Vec<Policy> = if o.policies.is_empty() {
        Policy::ALL
            .iter()
            .copied()
            .filter(|&p| p != Policy::None)
            .collect()
    } else {
        let mut v = Vec::new();
        for p in &o.policies {
            let p: Policy = p.parse()?;
            if p != Policy::None && !v.contains(&p) {
                v.push(p);
            }
        }
        v
    };
    let budgets = if o.budgets.is_empty() {
        vec![1.0, 0.5, 0.25, 0.125, 0.0625]
    } else {
        o.budgets.clone()
    };
    if let Some(b) = budgets.iter().find(|&&b| !(b > 0.0 && b <= 1.0)) {
        bail_options!("budgets must be fractions in (0, 1], got {b}");
    }
    let mut cells = Vec::new();
    if budgets.contains(&1.0) {
        cells.push(Cell {
            policy: Policy::None,
            ratio: 1.0,
        });
    }
    for &ratio in budgets.iter().filter(|&&b| b < 1.0) {
        cells.extend(policies.iter().map(|&policy| Cell { policy, ratio }));
    }
    PruneSpec {
        tau: o.tau.unwrap_or(glance_prune::signals::DEFAULT_TAU),
        ..PruneSpec::default()
    }
    .validate()?;
    Ok((policies, budgets, cells))
}

/// The TTFT of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct TtftRow {
    pub policy: &'static str,
    pub budget: f64,
    pub kept_visual_tokens: usize,
    pub prompt_rows: usize,
    pub select_s: f64,
    pub prefill_s: f64,
    pub ttft_s: f64,
    /// Against the 100% row (NaN without one).
    pub ttft_speedup: f64,
    pub prefill_speedup: f64,
}

/// One TTFT table: every cell on one image and prompt.
#[derive(Debug, Clone, Serialize)]
pub struct TtftTable {
    pub label: String,
    /// Every row includes it.
    pub vision_encode_s: f64,
    pub rows: Vec<TtftRow>,
}

/// The real-shape TTFT table and its shape.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeTtft {
    #[serde(flatten)]
    pub table: TtftTable,
    pub shape: String,
    pub weights: &'static str,
    pub text_parameters: usize,
}

/// A family's accuracy in an [`AccuracyRow`].
#[derive(Debug, Clone, Serialize)]
pub struct FamilyAccuracy {
    pub score: Option<f64>,
    pub questions: usize,
}

/// The accuracy of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyRow {
    pub policy: &'static str,
    pub budget: f64,
    pub mean_kept_visual_tokens: f64,
    /// By family name.
    pub families: BTreeMap<String, FamilyAccuracy>,
    /// The mean over attribute, counting, spatial and existence (NaN when one has no question).
    pub mean_accuracy: f64,
    pub sign_accuracy: Option<f64>,
    pub description: Option<DescriptionScore>,
    pub description_f1: Option<f64>,
    pub mean_ttft_s: f64,
    pub decode_tokens_per_s: f64,
}

impl AccuracyRow {
    /// The score of `family` (NaN without questions).
    pub fn score(&self, family: Family) -> f64 {
        self.families
            .get(family.name())
            .and_then(|f| f.score)
            .unwrap_or(f64::NAN)
    }
}

/// Accuracy on the world test split, per cell.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyTable {
    pub model: PathBuf,
    pub split: &'static str,
    pub examples: usize,
    pub rows: Vec<AccuracyRow>,
}

/// What `glance bench prune` reports (the JSON it writes).
#[derive(Debug, Clone, Serialize)]
pub struct PruneReport {
    pub bench: &'static str,
    pub threads: usize,
    pub budgets: Vec<f64>,
    pub policies: Vec<&'static str>,
    pub tau: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape_ttft: Option<ShapeTtft>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_ttft: Option<TtftTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<AccuracyTable>,
    /// The cells in the order of every table's rows.
    #[serde(skip)]
    pub cells: Vec<Cell>,
    #[serde(skip)]
    pub policy_list: Vec<Policy>,
}

/// The TTFT measurement of one cell.
struct Ttft {
    cell: Cell,
    kept: usize,
    rows: usize,
    select_s: f64,
    prefill_s: f64,
}

/// Times every cell on one image and prompt; returns the vision time and the rows.
fn measure_ttft(
    model: &Llava,
    pixels: &Tensor,
    ids: &[u32],
    query: &[u32],
    cells: &[Cell],
    tau: Option<f32>,
    reps: usize,
) -> Result<(f64, Vec<Ttft>)> {
    let mut vision = f64::INFINITY;
    let mut encoding = None;
    for _ in 0..reps {
        let start = Instant::now();
        encoding = Some(model.encode_image(pixels)?);
        vision = vision.min(start.elapsed().as_secs_f64());
    }
    let Some(encoding) = encoding else {
        bail_options!("--reps must be at least 1");
    };
    let mut rows: Vec<Ttft> = cells
        .iter()
        .map(|&cell| Ttft {
            cell,
            kept: 0,
            rows: 0,
            select_s: f64::INFINITY,
            prefill_s: f64::INFINITY,
        })
        .collect();
    for _ in 0..reps {
        for r in rows.iter_mut() {
            let start = Instant::now();
            let p = prefill_llava(model, ids, &[&encoding], query, &r.cell.spec(tau))?;
            let mut greedy = Sampler::new(SamplingParams::greedy())?;
            let _first = pick(model.text(), &p.state.last_hidden()?, &mut greedy)?;
            let total = start.elapsed().as_secs_f64();
            let select = p.stats.select_time.as_secs_f64();
            if total < r.select_s + r.prefill_s {
                (r.select_s, r.prefill_s) = (select, total - select);
            }
            (r.kept, r.rows) = (p.stats.kept_visual_tokens, p.state.prompt_len());
        }
    }
    Ok((vision, rows))
}

/// The TTFT table of measured rows, speedups against the 100% row.
fn ttft_table(label: String, vision: f64, rows: &[Ttft]) -> TtftTable {
    let base = rows
        .iter()
        .find(|r| r.cell.ratio >= 1.0)
        .map(|r| (vision + r.select_s + r.prefill_s, r.prefill_s));
    let rows = rows
        .iter()
        .map(|r| {
            let ttft = vision + r.select_s + r.prefill_s;
            let (su, pu) = base.map_or((f64::NAN, f64::NAN), |(t, p)| (t / ttft, p / r.prefill_s));
            TtftRow {
                policy: r.cell.name(),
                budget: r.cell.ratio,
                kept_visual_tokens: r.kept,
                prompt_rows: r.rows,
                select_s: r.select_s,
                prefill_s: r.prefill_s,
                ttft_s: ttft,
                ttft_speedup: su,
                prefill_speedup: pu,
            }
        })
        .collect();
    TtftTable {
        label,
        vision_encode_s: vision,
        rows,
    }
}

/// LLaVA-1.5-7B's vision shape with a text backbone preset, random weights held in `format`.
fn shape_model(preset: &str, format: WeightFormat) -> Result<(LlavaConfig, Llava)> {
    let config = presets::llava_config(preset)?;
    let vb = random_var_builder(0, &Device::Cpu);
    let load = WeightLoad::new(format);
    let layout = WeightLayout::hub();
    let model = Llava::from_var_builder_as(&vb, config.clone(), &layout, Mode::Infer, &load)?;
    Ok((config, model))
}

/// The real-shape TTFT: a LLaVA-1.5 style prompt around 576 image tokens.
fn shape_ttft(o: &PruneOptions, cells: &[Cell]) -> Result<ShapeTtft> {
    let (config, model) = shape_model(&o.shape, o.weights)?;
    let n = config.image_tokens_per_image();
    let word = |i: usize| (100 + (i * 7919) % 31_000) as u32;
    let question: Vec<u32> = (0..o.question_tokens).map(word).collect();
    // "<s> USER: <image>×576 \n {question} ASSISTANT:"
    let mut ids = vec![1, 3148, 1001, 29901];
    ids.extend(std::iter::repeat_n(config.image_token_id, n));
    ids.push(13);
    ids.extend(&question);
    ids.extend([319, 1799, 9047, 13566, 29901]);
    let s = config.vision.image_size;
    let pix: Vec<f32> = (0..3 * s * s)
        .map(|i| (((i * 37) % 255) as f32 / 127.5 - 1.0) * 1.5)
        .collect();
    // (3, s, s)
    let pixels = Tensor::from_vec(pix, (3, s, s), &Device::Cpu)?;
    let params = config.text.num_parameters();
    let label = format!(
        "random {} weights: CLIP ViT-L/14-336 ({n} visual tokens) + {} ({:.2}B parameters), {}-row prompt",
        o.weights,
        o.shape,
        params as f64 / 1e9,
        ids.len()
    );
    let (vision, rows) = measure_ttft(&model, &pixels, &ids, &question, cells, o.tau, o.reps)?;
    Ok(ShapeTtft {
        table: ttft_table(label, vision, &rows),
        shape: o.shape.clone(),
        weights: o.weights.name(),
        text_parameters: params,
    })
}

/// The families whose mean is the accuracy column (sign reading and descriptions are reported
/// separately).
pub const MEAN_FAMILIES: [Family; 4] = [
    Family::Attribute,
    Family::Counting,
    Family::Spatial,
    Family::Existence,
];

/// The accuracy of one cell (NaN when one of [`MEAN_FAMILIES`] has no question).
fn mean_accuracy(r: &EvalReport) -> f64 {
    if MEAN_FAMILIES.iter().any(|&f| r.score(f).is_none()) {
        return f64::NAN;
    }
    r.mean_of(&MEAN_FAMILIES).unwrap_or(f64::NAN)
}

/// The accuracy row of one cell's evaluation.
fn accuracy_row(c: &Cell, s: &EvalReport) -> AccuracyRow {
    let families = s
        .families
        .iter()
        .map(|f| {
            let acc = FamilyAccuracy {
                score: f.score,
                questions: f.questions,
            };
            (f.family.name().to_string(), acc)
        })
        .collect();
    AccuracyRow {
        policy: c.name(),
        budget: c.ratio,
        mean_kept_visual_tokens: s.prune.mean_kept_visual_tokens,
        families,
        mean_accuracy: mean_accuracy(s),
        sign_accuracy: s.score(Family::Sign),
        description: s.description,
        description_f1: s.score(Family::Description),
        mean_ttft_s: s.timing.mean_ttft_s,
        decode_tokens_per_s: s.timing.decode_tokens_per_s,
    }
}

/// Scores every cell on the first `examples` images of the world test split, through the one
/// evaluation runner (the image encoded once for every cell).
fn accuracy(
    engine: &Engine,
    cells: &[Cell],
    tau: Option<f32>,
    examples: usize,
    progress: &mut dyn Progress,
) -> Result<Vec<EvalReport>> {
    let specs: Vec<PruneSpec> = cells.iter().map(|c| c.spec(tau)).collect();
    progress.start("eval", examples as u64);
    let reports = evaluate_specs(
        engine,
        &EvalOptions::new(Split::Test, examples),
        &specs,
        &mut |p| {
            let note = format!("{} questions", p.questions_done);
            progress.advance(p.images_done as u64, &note);
        },
    );
    progress.finish();
    Ok(reports?)
}

/// Checks the options and runs every measurement they ask for.
pub fn run(o: &PruneOptions, progress: &mut dyn Progress) -> Result<PruneReport> {
    if o.reps == 0 || o.reps > MAX_REPS {
        bail_options!("--reps must be between 1 and {MAX_REPS}");
    }
    if o.question_tokens == 0 || o.question_tokens > MAX_QUESTION_TOKENS {
        bail_options!("--question-tokens must be between 1 and {MAX_QUESTION_TOKENS}");
    }
    let (policies, budgets, cells) = cells(o)?;
    let threads = glance_engine::resolve_threads(o.threads).context("--threads")?;
    let pool = glance_engine::thread_pool(threads)?;
    let mut report = PruneReport {
        bench: "prune",
        threads,
        budgets,
        policies: policies.iter().map(|p| p.name()).collect(),
        tau: o.tau.unwrap_or(glance_prune::signals::DEFAULT_TAU),
        shape_ttft: None,
        model_ttft: None,
        accuracy: None,
        cells: cells.clone(),
        policy_list: policies,
    };
    if o.shape != "none" {
        progress.note(&format!(
            "building the random-weight `{}` model at LLaVA-1.5-7B's vision shape…",
            o.shape
        ));
        report.shape_ttft = Some(pool.install(|| shape_ttft(o, &cells))?);
    }
    let Some(dir) = &o.model else {
        return Ok(report);
    };
    let engine = Engine::load(dir, EngineOptions::default().with_threads(Some(threads)))
        .with_context(|| format!("loading {}", dir.display()))?;
    let ex = glance_world::sample(Split::Test, 0)?;
    let Some(qa) = ex.questions.first() else {
        bail_options!("the world example has no question");
    };
    let processor = engine.processor().llava()?;
    let prompt = processor.prepare(&qa.question, 1, PromptFormat::Chat)?;
    // (3, s, s)
    let pixels = processor.image.preprocess_tensor(
        &image::DynamicImage::ImageRgb8(ex.image.clone()),
        &Device::Cpu,
    )?;
    let query = processor.query_ids(&qa.question)?;
    let label = format!(
        "{} on world test image 0, {}-row prompt",
        dir.display(),
        prompt.ids.len()
    );
    let (vision, rows) = engine.install(|| {
        measure_ttft(
            engine.model().llava()?,
            &pixels,
            &prompt.ids,
            &query,
            &cells,
            o.tau,
            o.reps,
        )
    })?;
    report.model_ttft = Some(ttft_table(label, vision, &rows));
    if o.examples > 0 {
        let scores = accuracy(&engine, &cells, o.tau, o.examples, progress)?;
        report.accuracy = Some(AccuracyTable {
            model: dir.clone(),
            split: "test",
            examples: o.examples,
            rows: cells
                .iter()
                .zip(&scores)
                .map(|(c, s)| accuracy_row(c, s))
                .collect(),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> PruneOptions {
        PruneOptions {
            model: None,
            examples: 0,
            policies: vec!["random".into(), "random".into()],
            budgets: vec![1.0, 0.5, 0.25],
            tau: None,
            shape: "none".into(),
            weights: WeightFormat::F32,
            question_tokens: 12,
            reps: 1,
            threads: None,
        }
    }

    #[test]
    fn cells_run_the_full_budget_once_then_each_policy_per_budget() {
        let (policies, budgets, all) = cells(&options()).unwrap();
        assert_eq!(policies, vec![Policy::Random]);
        assert_eq!(budgets, vec![1.0, 0.5, 0.25]);
        let names: Vec<(&str, f64)> = all.iter().map(|c| (c.name(), c.ratio)).collect();
        assert_eq!(names, vec![("all", 1.0), ("random", 0.5), ("random", 0.25)]);
        let bad = PruneOptions {
            budgets: vec![1.5],
            ..options()
        };
        assert!(cells(&bad).is_err());
    }

    #[test]
    fn speedups_are_against_the_full_row() {
        let cell = |ratio| Cell {
            policy: Policy::Random,
            ratio,
        };
        let t = |ratio, prefill_s| Ttft {
            cell: cell(ratio),
            kept: 0,
            rows: 0,
            select_s: 0.0,
            prefill_s,
        };
        let table = ttft_table("x".into(), 1.0, &[t(1.0, 3.0), t(0.5, 1.0)]);
        assert_eq!(table.rows[0].ttft_speedup, 1.0);
        assert_eq!(table.rows[1].ttft_speedup, 2.0);
        assert_eq!(table.rows[1].prefill_speedup, 3.0);
        let alone = ttft_table("x".into(), 1.0, &[t(0.5, 1.0)]);
        assert!(alone.rows[0].ttft_speedup.is_nan());
    }
}
