//! `glance bench prune`: every pruning policy × budget, side by side in one run
//! ([`glance_bench::prune`]): time to first token at a real shape and on `--model`, and accuracy
//! on the world test split. This module reads the flags, prints the tables and writes
//! `prune.json`, `prune-ttft.svg` and (with accuracy) `prune-accuracy.svg` under `--out`.

use crate::plot::{write_line_plot, Axes, Series};
use anyhow::Result;
use clap::Args;
use glance_bench::prune::{AccuracyRow, Cell, PruneOptions, PruneReport, TtftTable};
use glance_prune::Policy;
use glance_world::Family;
use std::path::PathBuf;

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
    /// How the real-shape model holds its weights: f32, bf16, f16, q8 or q4 (the vision tower
    /// and projector in bf16 beside bf16, q8 and q4).
    #[arg(long, default_value = "f32", value_parser = crate::args::parse_weights)]
    pub weights: glance_engine::WeightFormat,
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

/// Prints a TTFT table.
fn print_ttft(t: &TtftTable) {
    println!("\ntime to first token — {}", t.label);
    println!(
        "vision encode {:.2} ms (every row includes it)",
        t.vision_encode_s * 1e3
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
    for r in &t.rows {
        println!(
            "{:>9} {:>6.2}% | {:>6} {:>6} | {:>9.2} {:>10.2} {:>9.2} | {:>7.2}× {:>8.2}×",
            r.policy,
            r.budget * 100.0,
            r.kept_visual_tokens,
            r.prompt_rows,
            r.select_s * 1e3,
            r.prefill_s * 1e3,
            r.ttft_s * 1e3,
            r.ttft_speedup,
            r.prefill_speedup
        );
    }
}

/// Prints the accuracy table.
fn print_accuracy(rows: &[AccuracyRow]) {
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
    for s in rows {
        println!(
            "{:>9} {:>6.2}% | {:>5.0} | {:>6.3} {:>6.3} {:>6.3} {:>6.3} | {:>6.3} | {:>6.3} {:>6.3} | {:>8.1}",
            s.policy,
            s.budget * 100.0,
            s.mean_kept_visual_tokens,
            s.score(Family::Attribute),
            s.score(Family::Counting),
            s.score(Family::Spatial),
            s.score(Family::Existence),
            s.mean_accuracy,
            s.score(Family::Sign),
            s.score(Family::Description),
            s.mean_ttft_s * 1e3
        );
    }
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

/// The TTFT and accuracy plots.
fn plots(args: &PruneBenchArgs, report: &PruneReport) -> Result<()> {
    let ticks = budget_ticks(&report.budgets);
    let (policies, cells) = (&report.policy_list, &report.cells);
    if let Some(shape) = &report.shape_ttft {
        let speed: Vec<f64> = shape.table.rows.iter().map(|r| r.ttft_speedup).collect();
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
            &series(policies, cells, |i| speed[i]),
        )?;
    }
    if let Some(accuracy) = &report.accuracy {
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
            &series(policies, cells, |i| accuracy.rows[i].mean_accuracy),
        )?;
    }
    Ok(())
}

pub fn run(args: PruneBenchArgs) -> Result<()> {
    let options = PruneOptions {
        model: args.model.clone(),
        examples: args.examples,
        policies: args.policies.clone(),
        budgets: args.budgets.clone(),
        tau: args.tau,
        shape: args.shape.clone(),
        weights: args.weights,
        question_tokens: args.question_tokens,
        reps: args.reps,
        threads: args.threads,
    };
    let report = glance_bench::prune::run(&options, &mut super::Bars::default())?;
    for t in [
        report.shape_ttft.as_ref().map(|s| &s.table),
        report.model_ttft.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        print_ttft(t);
    }
    match &report.accuracy {
        Some(a) => print_accuracy(&a.rows),
        None if args.model.is_none() => println!(
            "\n(accuracy needs --model DIR of a world-trained checkpoint; only TTFT was measured)"
        ),
        None => {}
    }
    plots(&args, &report)?;
    let path = args.out.join("prune.json");
    super::write_report(&path, &report)?;
    println!("\nwrote {}", path.display());
    Ok(())
}
