//! `glance bench prune`: every pruning policy × budget (fractions of the visual tokens), side by
//! side in one run.
//!
//! * **Time to first token** on a random-weight LLaVA at a real shape (always, unless
//!   `--shape none`): CLIP ViT-L/14-336 (576 visual tokens, feature layer −2, as LLaVA-1.5-7B)
//!   with a ≥ 1B text backbone (`tinyllama-1.1b`: 22 layers, d2048, GQA 32/4). TTFT = vision
//!   encode (identical for every policy: measured once, best of `--reps`) + scoring / selection +
//!   prefill + the first token's logits. Each (policy, budget) is timed `--reps` times
//!   round-robin and the best kept; speedups are against the 100% row of the same run.
//! * With `--model DIR`: the same TTFT table for that checkpoint (on a world test image), and, with
//!   `--examples N > 0`, **accuracy** on the first `N` images of the world test split through the
//!   one evaluation runner ([`glance_engine::eval`], as `glance eval`): one question per family per
//!   image, the model's chat template, greedy decoding, scored by glance-world (normalised exact
//!   match; description object-level F1). The accuracy column is the mean over attribute /
//!   counting / spatial / existence; sign reading and description F1 are reported separately.
//!
//! TTFT is timed on the engine's prefill path itself: [`glance_prune::prefill_llava`] is the plan →
//! pruning transform → prefill composition the engine runs for a pruned request (and, at 100%, the
//! plain prefill).
//!
//! At 100% every policy is the unpruned prefill (tested exactly), so that row is run once.
//! Writes `prune.json`, `prune-ttft.svg` and (with accuracy) `prune-accuracy.svg` under `--out`.

use crate::plot::{write_line_plot, Axes, Series};
use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use clap::Args;
use glance_engine::eval::{EvalOptions, EvalReport};
use glance_engine::{Engine, EngineOptions};
use glance_models::llava::{Llava, LlavaConfig, PromptFormat, WeightLayout};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_nn::{CausalLm, Mode};
use glance_prune::{prefill_llava, Budget, Policy, PruneSpec};
use glance_world::{Family, Split};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct PruneBenchArgs {
    /// A LLaVA checkpoint: TTFT on a world test image and, with --examples > 0, accuracy on the
    /// world test split (meaningful for a world-trained model such as glance-tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// World test-split images to score per policy × budget (one question per family each).
    #[arg(long, default_value_t = 100)]
    pub examples: usize,
    /// Policies, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Budgets as fractions of the visual tokens, comma-separated (default 1,0.5,0.25,0.125,0.0625).
    #[arg(long, value_delimiter = ',')]
    pub budgets: Vec<f64>,
    /// Temperature of the text-relevance scores.
    #[arg(long, allow_negative_numbers = true)]
    pub tau: Option<f32>,
    /// Random-weight model for the real-shape TTFT: CLIP ViT-L/14-336 with a tinyllama-1.1b
    /// (22 layers, d2048, GQA 32/4), sheared-llama-2.7b (32 layers, d2560; 11 GB in f32) or
    /// llama-134m text backbone; `none` skips it.
    #[arg(long, default_value = "tinyllama-1.1b")]
    pub shape: String,
    /// Question tokens in the real-shape prompt (the template adds 10).
    #[arg(long, default_value_t = 12)]
    pub question_tokens: usize,
    /// Timed repetitions per TTFT measurement (the best is kept).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Threads for the tensor kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Output directory.
    #[arg(long, default_value = "bench-results/prune")]
    pub out: PathBuf,
}

/// The most timed repetitions per measurement.
const MAX_REPS: usize = 100;
/// The longest question of the real-shape prompt (it must fit the 4096-token context with the
/// 576 visual tokens).
const MAX_QUESTION_TOKENS: usize = 2048;

/// One (policy, budget) cell. At 100% the policy is `none` (every policy equals it).
#[derive(Clone, Copy)]
struct Cell {
    policy: Policy,
    ratio: f64,
}

impl Cell {
    fn spec(&self, tau: Option<f32>) -> PruneSpec {
        let mut s = PruneSpec::new(self.policy, Budget::Ratio(self.ratio));
        if let Some(t) = tau {
            s.tau = t;
        }
        s
    }
}

fn cells(args: &PruneBenchArgs) -> Result<(Vec<Policy>, Vec<f64>, Vec<Cell>)> {
    let policies: Vec<Policy> = if args.policies.is_empty() {
        Policy::ALL
            .iter()
            .copied()
            .filter(|&p| p != Policy::None)
            .collect()
    } else {
        let mut v = Vec::new();
        for p in &args.policies {
            let p: Policy = p.parse()?;
            if p != Policy::None && !v.contains(&p) {
                v.push(p);
            }
        }
        v
    };
    let budgets = if args.budgets.is_empty() {
        vec![1.0, 0.5, 0.25, 0.125, 0.0625]
    } else {
        args.budgets.clone()
    };
    if let Some(b) = budgets.iter().find(|&&b| !(b > 0.0 && b <= 1.0)) {
        bail!("budgets must be fractions in (0, 1], got {b}");
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
        tau: args.tau.unwrap_or(glance_prune::signals::DEFAULT_TAU),
        ..PruneSpec::default()
    }
    .validate()?;
    Ok((policies, budgets, cells))
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
    let encoding = encoding.context("at least one repetition")?;
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
            let logits: Vec<f32> = model
                .text()
                .logits(&p.state.last_hidden()?)?
                .squeeze(0)?
                .to_vec1()?;
            let _first = glance_decode::sampler::argmax(&logits);
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

/// Prints the TTFT table and returns its JSON.
fn report_ttft(label: &str, vision: f64, rows: &[Ttft]) -> Value {
    let base = rows
        .iter()
        .find(|r| r.cell.ratio >= 1.0)
        .map(|r| (vision + r.select_s + r.prefill_s, r.prefill_s));
    println!("\ntime to first token — {label}");
    println!(
        "vision encode {:.2} ms (every row includes it)",
        vision * 1e3
    );
    println!(
        "{:>9} {:>7} | {:>6} {:>6} | {:>9} {:>10} {:>9} | {:>8} {:>9}",
        "policy",
        "budget",
        "kept",
        "rows",
        "select ms",
        "prefill ms",
        "TTFT ms",
        "TTFT ×",
        "prefill ×"
    );
    let mut out = Vec::new();
    for r in rows {
        let ttft = vision + r.select_s + r.prefill_s;
        let (su, pu) = base.map_or((f64::NAN, f64::NAN), |(t, p)| (t / ttft, p / r.prefill_s));
        println!(
            "{:>9} {:>6.2}% | {:>6} {:>6} | {:>9.2} {:>10.2} {:>9.2} | {:>7.2}× {:>8.2}×",
            name(r.cell),
            r.cell.ratio * 100.0,
            r.kept,
            r.rows,
            r.select_s * 1e3,
            r.prefill_s * 1e3,
            ttft * 1e3,
            su,
            pu
        );
        out.push(json!({
            "policy": name(r.cell), "budget": r.cell.ratio, "kept_visual_tokens": r.kept, "prompt_rows": r.rows,
            "select_s": r.select_s, "prefill_s": r.prefill_s, "ttft_s": ttft,
            "ttft_speedup": su, "prefill_speedup": pu,
        }));
    }
    json!({ "label": label, "vision_encode_s": vision, "rows": out })
}

fn name(c: Cell) -> &'static str {
    if c.ratio >= 1.0 {
        "all"
    } else {
        c.policy.name()
    }
}

/// LLaVA-1.5-7B's vision shape with a text backbone preset, random weights.
fn shape_model(preset: &str) -> Result<(LlavaConfig, Llava)> {
    let config = presets::llava_config(preset)?;
    let vb = random_var_builder(0, &Device::Cpu);
    let model = Llava::from_var_builder(&vb, config.clone(), &WeightLayout::hub(), Mode::Infer)?;
    Ok((config, model))
}

/// The real-shape TTFT: a LLaVA-1.5 style prompt around 576 image tokens.
fn shape_ttft(args: &PruneBenchArgs, cells: &[Cell]) -> Result<Value> {
    eprintln!(
        "building the random-weight `{}` model at LLaVA-1.5-7B's vision shape…",
        args.shape
    );
    let (config, model) = shape_model(&args.shape)?;
    let n = config.image_tokens_per_image();
    let word = |i: usize| (100 + (i * 7919) % 31_000) as u32;
    let question: Vec<u32> = (0..args.question_tokens).map(word).collect();
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
    let pixels = Tensor::from_vec(pix, (3, s, s), &Device::Cpu)?;
    let params = config.text.num_parameters();
    let label = format!(
        "random weights: CLIP ViT-L/14-336 ({n} visual tokens) + {} ({:.2}B parameters), {}-row prompt",
        args.shape,
        params as f64 / 1e9,
        ids.len()
    );
    let (vision, rows) =
        measure_ttft(&model, &pixels, &ids, &question, cells, args.tau, args.reps)?;
    let mut v = report_ttft(&label, vision, &rows);
    v["shape"] = json!(args.shape);
    v["text_parameters"] = json!(params);
    Ok(v)
}

/// The families whose mean is the accuracy column (sign reading and descriptions are reported
/// separately).
const MEAN_FAMILIES: [Family; 4] = [
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

fn acc(r: &EvalReport, f: Family) -> f64 {
    r.score(f).unwrap_or(f64::NAN)
}

/// Scores every cell on the first `examples` images of the world test split, through the one
/// evaluation runner (the image encoded once for every cell).
fn accuracy(
    engine: &Engine,
    cells: &[Cell],
    tau: Option<f32>,
    examples: usize,
) -> Result<Vec<EvalReport>> {
    let specs: Vec<PruneSpec> = cells.iter().map(|c| c.spec(tau)).collect();
    crate::eval::evaluate_with_progress(engine, &EvalOptions::new(Split::Test, examples), &specs)
}

/// Prints the accuracy table; returns its rows as JSON.
fn report_accuracy(cells: &[Cell], scores: &[EvalReport]) -> Value {
    println!("\naccuracy on the world test split (mean = attribute, counting, spatial, existence)");
    println!(
        "{:>9} {:>7} | {:>5} | {:>6} {:>6} {:>6} {:>6} | {:>6} | {:>6} {:>6} | {:>8}",
        "policy",
        "budget",
        "kept",
        "attr",
        "count",
        "spat",
        "exist",
        "mean",
        "sign",
        "descF1",
        "TTFT ms"
    );
    let mut rows = Vec::new();
    for (c, s) in cells.iter().zip(scores) {
        println!(
            "{:>9} {:>6.2}% | {:>5.0} | {:>6.3} {:>6.3} {:>6.3} {:>6.3} | {:>6.3} | {:>6.3} {:>6.3} | {:>8.1}",
            name(*c),
            c.ratio * 100.0,
            s.prune.mean_kept_visual_tokens,
            acc(s, Family::Attribute),
            acc(s, Family::Counting),
            acc(s, Family::Spatial),
            acc(s, Family::Existence),
            mean_accuracy(s),
            acc(s, Family::Sign),
            acc(s, Family::Description),
            s.timing.mean_ttft_s * 1e3
        );
        let fam: serde_json::Map<String, Value> = s
            .families
            .iter()
            .map(|f| {
                (
                    f.family.name().to_string(),
                    json!({"score": f.score, "questions": f.questions}),
                )
            })
            .collect();
        rows.push(json!({"policy": name(*c), "budget": c.ratio,
            "mean_kept_visual_tokens": s.prune.mean_kept_visual_tokens,
            "families": fam, "mean_accuracy": mean_accuracy(s), "sign_accuracy": s.score(Family::Sign),
            "description": s.description, "description_f1": s.score(Family::Description),
            "mean_ttft_s": s.timing.mean_ttft_s, "decode_tokens_per_s": s.timing.decode_tokens_per_s}));
    }
    json!(rows)
}

fn budget_ticks(budgets: &[f64]) -> Vec<(f64, String)> {
    budgets
        .iter()
        .map(|&b| (b, format!("{}%", b * 100.0)))
        .collect()
}

/// One line per policy through the shared 100% point: `value(cell index)`.
fn series(policies: &[Policy], cells: &[Cell], value: impl Fn(usize) -> f64) -> Vec<Series> {
    let full = cells.iter().position(|c| c.ratio >= 1.0);
    policies
        .iter()
        .map(|&p| Series {
            name: p.name().to_string(),
            points: full
                .into_iter()
                .chain(
                    cells
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| c.policy == p && c.ratio < 1.0)
                        .map(|(i, _)| i),
                )
                .map(|i| (cells[i].ratio, value(i)))
                .collect(),
        })
        .collect()
}

pub fn run(args: PruneBenchArgs) -> Result<()> {
    if args.reps == 0 || args.reps > MAX_REPS {
        bail!("--reps must be between 1 and {MAX_REPS}");
    }
    if args.question_tokens == 0 || args.question_tokens > MAX_QUESTION_TOKENS {
        bail!("--question-tokens must be between 1 and {MAX_QUESTION_TOKENS}");
    }
    let (policies, budgets, cells) = cells(&args)?;
    let threads = glance_engine::resolve_threads(args.threads).context("--threads")?;
    let pool = glance_engine::thread_pool(threads)?;
    let mut report = json!({"bench": "prune", "threads": threads, "budgets": budgets,
        "policies": policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "tau": args.tau.unwrap_or(glance_prune::signals::DEFAULT_TAU)});
    let ticks = budget_ticks(&budgets);
    if args.shape != "none" {
        let v = pool.install(|| shape_ttft(&args, &cells))?;
        let speed: Vec<f64> = v["rows"].as_array().map_or(vec![], |r| {
            r.iter()
                .map(|x| x["ttft_speedup"].as_f64().unwrap_or(f64::NAN))
                .collect()
        });
        let axes = Axes {
            title: "Time-to-first-token speedup (576-token shape)",
            x_label: "visual tokens kept",
            y_label: "TTFT speedup vs 100% (×)",
            x_ticks: &ticks,
            log2_x: true,
        };
        write_line_plot(
            &args.out.join("prune-ttft.svg"),
            &axes,
            &series(&policies, &cells, |i| speed[i]),
        )?;
        report["shape_ttft"] = v;
    }
    if let Some(dir) = &args.model {
        let engine = Engine::load(dir, EngineOptions::default().with_threads(Some(threads)))
            .with_context(|| format!("loading {}", dir.display()))?;
        let ex = glance_world::sample(Split::Test, 0)?;
        let qa = ex
            .questions
            .first()
            .context("the world example has no question")?;
        let processor = engine.processor().llava()?;
        let prompt = processor.prepare(&qa.question, 1, PromptFormat::Chat)?;
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
                args.tau,
                args.reps,
            )
        })?;
        report["model_ttft"] = report_ttft(&label, vision, &rows);
        if args.examples > 0 {
            let scores = accuracy(&engine, &cells, args.tau, args.examples)?;
            let rows = report_accuracy(&cells, &scores);
            report["accuracy"] =
                json!({"model": dir, "split": "test", "examples": args.examples, "rows": rows});
            let axes = Axes {
                title: "World test accuracy vs visual-token budget",
                x_label: "visual tokens kept",
                y_label: "accuracy (attribute, counting, spatial, existence)",
                x_ticks: &ticks,
                log2_x: true,
            };
            write_line_plot(
                &args.out.join("prune-accuracy.svg"),
                &axes,
                &series(&policies, &cells, |i| mean_accuracy(&scores[i])),
            )?;
        }
    } else {
        println!(
            "\n(accuracy needs --model DIR of a world-trained checkpoint; only TTFT was measured)"
        );
    }
    let path = args.out.join("prune.json");
    super::write_json(&path, &report)?;
    println!("\nwrote {}", path.display());
    Ok(())
}
