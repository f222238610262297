//! `glance bench diffusion`: block-diffusion decoding of a converted model (Fast-dVLM) beside
//! autoregressive decoding, on the questions `glance eval` asks (the world test split: each
//! image's independent questions), greedy, short answers and descriptions reported apart.
//!
//! Columns: autoregressive decoding of the original model and of the converted one (its causal
//! mode, the reference the lossless modes must reproduce); threshold decoding at each τ and
//! linear and quadratic self-speculation, each at every block size; both self-speculative modes
//! with a dynamic block; and, with `--prune-keep`, the converted model's autoregressive,
//! self-speculative and threshold decoding with visual tokens pruned (adaptive policy).
//!
//! Per column and answer kind: tokens per forward pass after the prefill (NFE), decode tokens/s
//! and its ratio to the converted model's autoregressive decoding (interleaved: each question is
//! answered by every column in a rotating order, so machine noise hits all alike), accuracy (the
//! evaluation's scorer: exact match, description object F1), greedy answers that differ from the
//! reference (must be 0 for the lossless modes), and where the time goes: the share of decode
//! time in forward passes and the cost of one pass against one autoregressive step — the
//! wall-clock speedup is tokens per NFE divided by that cost.

use super::spec::{sampling, score};
use super::tally::{num, ratio, Kind, Tally};
use crate::args::{check_writable, model_dir};
use crate::plot::{write_line_plot, Axes, Series};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_decode::DiffusionSettings;
use glance_engine::eval::{DESCRIPTION_MAX_NEW_TOKENS, SHORT_MAX_NEW_TOKENS};
use glance_engine::{DecodeSpec, DiffusionMode, Engine, EngineOptions, Flow, ImageInput, Request};
use glance_prune::{Budget, Policy, PruneSpec};
use glance_world::Family;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DiffusionBenchArgs {
    /// The converted model (default: models/glance-tiny-dvlm).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The autoregressive model it was converted from (default: models/glance-tiny).
    #[arg(long)]
    pub original: Option<PathBuf>,
    /// Threads for the tensor kernels (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Both models as real-shape twins.
    #[command(flatten)]
    pub twin: crate::args::TwinArgs,
    /// How both models' text decoder weights are held: f32, bf16, f16, q8 or q4 (as `glance run
    /// --weights`).
    #[arg(long, value_parser = crate::args::parse_weights, default_value = "f32")]
    pub weights: glance_engine::WeightFormat,
    /// World test-split images; each brings one question per family.
    #[arg(long, default_value_t = 30)]
    pub n: usize,
    /// Index of the first image in the test split.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Block sizes of the threshold, linear and quadratic columns.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    pub blocks: Vec<usize>,
    /// Thresholds τ of the threshold columns.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9")]
    pub thresholds: Vec<f32>,
    /// Also measure with the visual tokens pruned to this share (adaptive policy); 0: skip.
    #[arg(long, default_value_t = 0.125)]
    pub prune_keep: f64,
    /// Block size of the pruned columns.
    #[arg(long, default_value_t = 16)]
    pub prune_block: usize,
    /// Longest description in tokens (short answers stop after 24).
    #[arg(long, default_value_t = DESCRIPTION_MAX_NEW_TOKENS)]
    pub max_new_tokens: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/diffusion.json")]
    pub json: PathBuf,
    /// The plot: tokens per forward pass against block size (descriptions).
    #[arg(long, default_value = "bench-results/diffusion-nfe.svg")]
    pub plot: PathBuf,
}

/// One strategy on one of the two models.
struct Column {
    name: String,
    /// 0: the original model; 1: the converted one.
    model: usize,
    decode: DecodeSpec,
    prune: Option<PruneSpec>,
    /// The mode's family for the plot (`linear`, `quadratic`, `threshold τ=…`).
    series: Option<String>,
    block: Option<usize>,
    /// Column whose greedy answers this one must reproduce exactly.
    reference: Option<usize>,
}

fn block_settings(block: usize, threshold: f32, dynamic: bool) -> DiffusionSettings {
    DiffusionSettings::sized(Some(block), Some(threshold), dynamic)
}

fn columns(args: &DiffusionBenchArgs) -> Vec<Column> {
    let plain = |name: &str, model, prune: Option<PruneSpec>| Column {
        name: name.into(),
        model,
        decode: DecodeSpec::Autoregressive,
        prune,
        series: None,
        block: None,
        reference: None,
    };
    let mut cols = vec![plain("ar (original)", 0, None), plain("ar", 1, None)];
    let diffusion = |name: String,
                     mode: DiffusionMode,
                     s: DiffusionSettings,
                     series: Option<String>,
                     prune: Option<PruneSpec>,
                     reference: usize| {
        let decode = DecodeSpec::Diffusion {
            mode,
            settings: Some(s.clone()),
        };
        Column {
            name,
            model: 1,
            block: (!s.dynamic).then_some(s.block),
            reference: decode.lossless().then_some(reference),
            decode,
            prune,
            series,
        }
    };
    for (decode, short) in [
        (DiffusionMode::Linear, "linear"),
        (DiffusionMode::Quadratic, "quadratic"),
    ] {
        for &b in &args.blocks {
            let s = block_settings(b, 0.9, false);
            cols.push(diffusion(
                format!("{short} B={b}"),
                decode,
                s,
                Some(short.into()),
                None,
                1,
            ));
        }
        let s = block_settings(8, 0.9, true);
        cols.push(diffusion(
            format!("{short} dynamic"),
            decode,
            s,
            None,
            None,
            1,
        ));
    }
    // `auto` on the converted model: cost-aware linear blocks up to the model's block size, or
    // plain decoding, as this machine's measured costs say.
    cols.push(Column {
        name: "auto".into(),
        decode: DecodeSpec::auto(),
        reference: Some(1),
        ..plain("auto", 1, None)
    });
    for &tau in &args.thresholds {
        for &b in &args.blocks {
            cols.push(diffusion(
                format!("threshold τ={tau} B={b}"),
                DiffusionMode::Threshold,
                block_settings(b, tau, false),
                Some(format!("threshold τ={tau}")),
                None,
                1,
            ));
        }
    }
    if args.prune_keep > 0.0 {
        let prune = Some(PruneSpec::new(
            Policy::Adaptive,
            Budget::Ratio(args.prune_keep),
        ));
        let keep = format!("{:.1}%", 100.0 * args.prune_keep);
        let reference = cols.len();
        cols.push(plain(&format!("ar + prune {keep}"), 1, prune.clone()));
        let b = args.prune_block;
        for (decode, short, tau) in [
            (DiffusionMode::Linear, "linear", 0.9),
            (DiffusionMode::Quadratic, "quadratic", 0.9),
            (DiffusionMode::Threshold, "threshold τ=0.9", 0.9),
        ] {
            cols.push(diffusion(
                format!("{short} B={b} + prune {keep}"),
                decode,
                block_settings(b, tau, false),
                None,
                prune.clone(),
                reference,
            ));
        }
    }
    cols
}

fn validate(args: &DiffusionBenchArgs) -> Result<()> {
    super::check_test_images(args.n, args.start)?;
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    if args.blocks.is_empty() {
        bail!("--blocks needs at least one block size");
    }
    for &b in args.blocks.iter().chain([&args.prune_block]) {
        block_settings(b, 0.9, false)
            .validate()
            .context("--blocks / --prune-block")?;
    }
    for &t in &args.thresholds {
        block_settings(4, t, false)
            .validate()
            .context("--thresholds")?;
    }
    if !(0.0..=1.0).contains(&args.prune_keep) {
        bail!("--prune-keep must be a share in [0, 1] (0: no pruned columns)");
    }
    check_writable(&args.json)
}

/// Per answer kind, a tally per column.
struct Measured {
    tallies: [Vec<Tally>; 2],
    questions: usize,
    seconds: f64,
}

fn measure(engines: &[Engine; 2], args: &DiffusionBenchArgs, cols: &[Column]) -> Result<Measured> {
    let mut tallies: [Vec<Tally>; 2] = std::array::from_fn(|_| {
        cols.iter()
            .map(|c| Tally {
                mismatches: c.reference.map(|_| 0),
                ..Tally::default()
            })
            .collect()
    });
    let max_tokens = |f: Family| {
        if f == Family::Description {
            args.max_new_tokens
        } else {
            SHORT_MAX_NEW_TOKENS.min(args.max_new_tokens)
        }
    };
    let ask = |c: &Column, question: &str, image: &ImageInput, max: usize| {
        let request = Request {
            sampling: sampling(0.0, 0),
            max_new_tokens: max,
            decode: c.decode.clone(),
            prune: c.prune.clone(),
            ..Request::chat(question, vec![image.clone()])
        };
        engines[c.model]
            .generate(&request, &mut |_| Flow::Continue)
            .with_context(|| format!("{} on `{question}`", c.name))
    };
    // Warm-up: every column answers the first question once, untimed.
    if let Some((qa, image)) = super::warm_up_question(args.start)? {
        for c in cols {
            ask(c, &qa.question, &image, max_tokens(qa.family))?;
        }
    }
    let mut serial = 0usize;
    let seconds = super::for_each_question("diffusion", args.n, args.start, |ex, qa, image| {
        let group = &mut tallies[Kind::of(qa.family) as usize];
        let mut ids: Vec<Vec<u32>> = vec![Vec::new(); cols.len()];
        for k in 0..cols.len() {
            let c = (k + serial) % cols.len();
            let r = ask(&cols[c], &qa.question, image, max_tokens(qa.family))?;
            let text = engines[cols[c].model]
                .processor()
                .text
                .decode(&r.token_ids, true)?;
            group[c].add(&r, qa.family, score(ex, qa, &text));
            ids[c] = r.token_ids;
        }
        for (c, col) in cols.iter().enumerate() {
            if let (Some(r), Some(m)) = (col.reference, group[c].mismatches.as_mut()) {
                *m += usize::from(ids[c] != ids[r]);
            }
        }
        serial += 1;
        Ok(())
    })?;
    Ok(Measured {
        tallies,
        questions: serial,
        seconds,
    })
}

/// Milliseconds per forward pass (forward and logits time over passes).
fn ms_per_pass(t: &Tally) -> f64 {
    ratio(t.forward_us as f64 / 1e3, t.forwards as f64)
}

/// Mean accepted drafts per step (self-speculation) or tokens decided per pass (threshold).
fn mean_accepted(t: &Tally) -> f64 {
    let (mut n, mut s) = (0u64, 0u64);
    for (a, &c) in t.accepted_length.iter().enumerate() {
        n += c;
        s += a as u64 * c;
    }
    ratio(s as f64, n as f64)
}

fn report(cols: &[Column], m: &Measured) -> Value {
    let mut groups = Vec::new();
    for kind in Kind::ALL {
        let ts = &m.tallies[kind as usize];
        let ar = &ts[1];
        let ar_tps = ar.tokens_per_s();
        // Decode time of one autoregressive step of the converted model.
        let ar_step_ms = ratio(ar.decode_s * 1e3, ar.forwards as f64);
        println!(
            "\n{} answers ({} questions, greedy)",
            kind.name(),
            ts[0].questions
        );
        println!(
            "{:<30} {:>8} {:>9} {:>8} {:>8} {:>6} {:>8} {:>7} {:>7}",
            "strategy",
            "tok/NFE",
            "tok/s",
            "speedup",
            "accuracy",
            "diff",
            "accepted",
            "ms/pass",
            "cost"
        );
        let mut rows = Vec::new();
        for (c, t) in cols.iter().zip(ts) {
            let cost = ratio(ms_per_pass(t), ar_step_ms);
            let pass_ms = ms_per_pass(t);
            println!(
                "{:<30} {:>8.2} {:>9.0} {:>7.2}x {:>8.3} {:>6} {:>8} {:>7} {:>7}",
                c.name,
                t.tokens_per_forward(),
                t.tokens_per_s(),
                t.tokens_per_s() / ar_tps,
                t.accuracy(),
                t.mismatches.map_or("-".into(), |m| m.to_string()),
                if c.decode.diffusion_mode().is_some() {
                    format!("{:.2}", mean_accepted(t))
                } else {
                    "-".into()
                },
                if pass_ms.is_finite() {
                    format!("{pass_ms:.2}")
                } else {
                    "-".into()
                },
                if cost.is_finite() {
                    format!("{cost:.2}")
                } else {
                    "-".into()
                },
            );
            let mut v = t.to_json(&c.name, ar_tps);
            v["decode"] = json!(c.decode.name());
            v["model"] = json!(if c.model == 0 {
                "original"
            } else {
                "converted"
            });
            v["block"] = json!(c.block);
            v["settings"] = json!(c.decode.diffusion_settings());
            v["pruned"] = json!(c.prune.is_some());
            v["steps"] = json!(t.steps);
            v["block_tokens"] = json!(t.block_tokens);
            v["iterations"] = json!(t.iterations);
            v["accepted_length"] = json!(t.accepted_length);
            v["mean_accepted"] = num(mean_accepted(t));
            v["forward_share"] = num(ratio(t.forward_us as f64 / 1e6, t.decode_s));
            v["ms_per_pass"] = num(pass_ms);
            v["pass_cost_vs_ar_step"] = num(cost);
            rows.push(v);
        }
        let retention = ratio(ts[1].accuracy(), ts[0].accuracy());
        println!(
            "converted (causal) keeps {:.1}% of the original's {}",
            100.0 * retention,
            if kind == Kind::Description {
                "description F1"
            } else {
                "mean accuracy"
            }
        );
        groups.push(json!({
            "kind": kind.name(),
            "questions": ts[0].questions,
            "retention": num(retention),
            "ar_step_ms": num(ar_step_ms),
            "columns": rows,
        }));
    }
    json!({ "groups": groups, "questions": m.questions, "seconds": m.seconds })
}

fn plot(path: &std::path::Path, cols: &[Column], m: &Measured) -> Result<()> {
    let ts = &m.tallies[Kind::Description as usize];
    let mut series: Vec<Series> = Vec::new();
    for (c, t) in cols.iter().zip(ts) {
        let (Some(name), Some(b)) = (&c.series, c.block) else {
            continue;
        };
        let point = (b as f64, t.tokens_per_forward());
        match series.iter_mut().find(|s| &s.name == name) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                name: name.clone(),
                points: vec![point],
            }),
        }
    }
    let ticks: Vec<(f64, String)> = cols
        .iter()
        .filter_map(|c| c.block)
        .map(|b| (b as f64, b.to_string()))
        .collect();
    write_line_plot(
        path,
        &Axes {
            title: "Block diffusion on descriptions: tokens per forward pass",
            x_label: "block size B",
            y_label: "tokens per forward pass (NFE)",
            x_ticks: &ticks,
            log2_x: true,
        },
        &series,
    )
}

pub fn run(args: DiffusionBenchArgs) -> Result<()> {
    validate(&args)?;
    glance_engine::resolve_threads(args.threads).context("--threads")?;
    let converted = match &args.model {
        Some(d) => d.clone(),
        None => model_dir(Some(Path::new("glance-tiny-dvlm")))?,
    };
    let original = model_dir(args.original.as_deref())?;
    let load = |dir: &PathBuf| {
        let options = EngineOptions {
            weights: args.weights,
            ..EngineOptions::default()
        }
        .with_threads(args.threads)
        .with_twin(args.twin.twin.clone());
        Engine::load(dir, options)
            .with_context(|| format!("loading the model in {}", dir.display()))
    };
    let engines = [load(&original)?, load(&converted)?];
    if engines[1].model().config().block_diffusion.is_none() {
        bail!(
            "{} is not converted for block diffusion (no `block_diffusion` in config.json): \
             convert it with `glance train diffusion --from DIR`",
            converted.display()
        );
    }
    let cols = columns(&args);
    println!(
        "{} (converted) against {} on the world test split, images {}..{}; {} threads; {} columns",
        converted.display(),
        original.display(),
        args.start,
        args.start + args.n as u64,
        engines[1].threads(),
        cols.len()
    );
    let measured = measure(&engines, &args, &cols)?;
    let mut json = report(&cols, &measured);
    json["model"] = json!(converted.display().to_string());
    json["original"] = json!(original.display().to_string());
    json["images"] = json!(args.n);
    json["threads"] = json!(engines[1].threads());
    json["weights"] = json!(args.weights.name());
    if let Some(cost) = engines[1].measured_cost() {
        json["cost_model"] = super::cost_report(&cost);
    }
    plot(&args.plot, &cols, &measured)?;
    super::write_json(&args.json, &json)?;
    println!(
        "\nwrote {} and {} ({:.0} s)",
        args.json.display(),
        args.plot.display(),
        measured.seconds
    );
    let mismatches: usize = measured
        .tallies
        .iter()
        .flatten()
        .filter_map(|t| t.mismatches)
        .sum();
    if mismatches > 0 {
        bail!(
            "{mismatches} greedy self-speculative answers differ from the converted model's \
             autoregressive ones: the lossless contract is broken"
        );
    }
    Ok(())
}
