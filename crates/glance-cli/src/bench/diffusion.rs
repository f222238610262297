//! `glance bench diffusion`: block-diffusion decoding of a converted model (Fast-dVLM) beside
//! autoregressive decoding on the world test split ([`glance_bench::diffusion`], which says
//! what each column is). This module reads the flags, prints a table per answer kind and
//! writes the JSON and the plot of tokens per forward pass against block size.

use crate::args::{check_writable, model_dir};
use crate::plot::{write_line_plot, Axes, Series};
use anyhow::Result;
use clap::Args;
use glance_bench::diffusion::{DiffusionBench, DiffusionOptions, DiffusionReport};
use glance_bench::tally::Kind;
use glance_engine::eval::DESCRIPTION_MAX_NEW_TOKENS;
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

/// A figure to `decimals`, `-` when not finite.
fn figure(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "-".into()
    }
}

fn print(r: &DiffusionReport) {
    for g in &r.groups {
        println!("\n{} answers ({} questions, greedy)", g.kind, g.questions);
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
        for c in &g.columns {
            let t = &c.tally;
            println!(
                "{:<30} {:>8.2} {:>9.0} {:>7.2}x {:>8.3} {:>6} {:>8} {:>7} {:>7}",
                t.strategy,
                t.tokens_per_forward,
                t.decode_tokens_per_s,
                t.speedup,
                t.accuracy,
                t.greedy_mismatches.map_or("-".into(), |m| m.to_string()),
                if c.settings.is_some() {
                    format!("{:.2}", c.mean_accepted)
                } else {
                    "-".into()
                },
                figure(c.ms_per_pass, 2),
                figure(c.pass_cost_vs_ar_step, 2),
            );
        }
        println!(
            "converted (causal) keeps {:.1}% of the original's {}",
            100.0 * g.retention,
            if g.answer_kind == Kind::Description {
                "description F1"
            } else {
                "mean accuracy"
            }
        );
    }
}

fn plot(path: &Path, r: &DiffusionReport) -> Result<()> {
    let mut series: Vec<Series> = Vec::new();
    let descriptions = r.groups.iter().find(|g| g.answer_kind == Kind::Description);
    for (c, row) in r
        .columns
        .iter()
        .zip(descriptions.map_or(&[][..], |g| &g.columns[..]))
    {
        let (Some(name), Some(b)) = (&c.series, c.block) else {
            continue;
        };
        let point = (b as f64, row.tally.tokens_per_forward);
        match series.iter_mut().find(|s| &s.name == name) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                name: name.clone(),
                points: vec![point],
            }),
        }
    }
    let ticks: Vec<(f64, String)> = r
        .columns
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
    let converted = match &args.model {
        Some(d) => d.clone(),
        None => model_dir(Some(Path::new("glance-tiny-dvlm")))?,
    };
    let original = model_dir(args.original.as_deref())?;
    let options = DiffusionOptions {
        model: converted.clone(),
        original: original.clone(),
        threads: args.threads,
        twin: args.twin.twin.clone(),
        weights: args.weights,
        n: args.n,
        start: args.start,
        blocks: args.blocks.clone(),
        thresholds: args.thresholds.clone(),
        prune_keep: args.prune_keep,
        prune_block: args.prune_block,
        max_new_tokens: args.max_new_tokens,
    };
    options.validate()?;
    check_writable(&args.json)?;
    let bench = DiffusionBench::load(options)?;
    println!(
        "{} (converted) against {} on the world test split, images {}..{}; {} threads; {} columns",
        converted.display(),
        original.display(),
        args.start,
        args.start + args.n as u64,
        bench.threads(),
        bench.columns()
    );
    let report = bench.run(&mut super::Bars::default())?;
    print(&report);
    plot(&args.plot, &report)?;
    super::write_report(&args.json, &report)?;
    println!(
        "\nwrote {} and {} ({:.0} s)",
        args.json.display(),
        args.plot.display(),
        report.seconds
    );
    Ok(report.check()?)
}
