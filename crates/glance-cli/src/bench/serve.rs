//! `glance bench serve`: a real `glance serve` under concurrent streaming clients, with and
//! without continuous batching, or under a mix of request kinds ([`glance_bench::serve`]). This
//! module reads the flags, prints the table and writes the JSON and (plain waves) SVG plots.

use crate::plot::{write_line_plot, Axes, Series};
use anyhow::Result;
use clap::Args;
use glance_bench::serve::mix::MixReport;
use glance_bench::serve::{Outcome, ServeOptions, ServeRow, WaveFigures};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ServeBenchArgs {
    /// The real model measured (default: glance-tiny).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The random-weight text shape measured beside it (`none` to skip).
    #[arg(long, default_value = "llama-134m")]
    pub shape: String,
    /// Concurrent clients, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub clients: Vec<usize>,
    /// Requests each client sends, one after the other.
    #[arg(long, default_value_t = 2)]
    pub requests: usize,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Text-only prompts (a short prefill: the decode steps dominate).
    #[arg(long)]
    pub no_image: bool,
    /// Every answer runs to `--max-tokens` (`ignore_eos`): decode throughput, not answer length,
    /// decides the figures.
    #[arg(long)]
    pub ignore_eos: bool,
    /// With batching: most prompt rows prefilled between two decode steps.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Threads of the engine (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The real model as its real-shape twin.
    #[command(flatten)]
    pub twin: crate::args::TwinArgs,
    /// How the real model's text decoder weights are held: f32, bf16, f16, q8 or q4 (as `glance
    /// run --weights`).
    #[arg(long, value_parser = crate::args::parse_weights, default_value = "f32")]
    pub weights: glance_engine::WeightFormat,
    /// Request kinds (ar, vispec, eagle, prune, diffusion, auto), comma-separated: measure each
    /// kind alone and all of them mixed, batching on, on the real model only (`diffusion` needs a
    /// converted model such as models/glance-tiny-dvlm).
    #[arg(long, value_delimiter = ',')]
    pub mix: Vec<String>,
    /// Where to write the JSON results (the plots go beside it).
    #[arg(long, default_value = "bench-results/serve.json")]
    pub json: PathBuf,
}

pub fn run(args: ServeBenchArgs) -> Result<()> {
    let options = ServeOptions {
        model: PathBuf::new(),
        shape: args.shape.clone(),
        clients: args.clients.clone(),
        requests: args.requests,
        max_tokens: args.max_tokens,
        no_image: args.no_image,
        ignore_eos: args.ignore_eos,
        prefill_chunk: args.prefill_chunk,
        threads: args.threads,
        twin: args.twin.twin.clone(),
        weights: args.weights,
        mix: args.mix.clone(),
    };
    // Every count is checked before anything loads or runs.
    options.validate()?;
    crate::args::check_writable(&args.json)?;
    let options = ServeOptions {
        model: crate::args::model_dir(args.model.as_deref())?,
        ..options
    };
    match glance_bench::serve::run(&options, &mut super::Bars::default())? {
        Outcome::Plain(report) => {
            print_rows(&report.rows);
            super::write_report(&args.json, &report)?;
            let plots = write_plots(&args.json, &report.rows)?;
            println!("wrote {} and {}", args.json.display(), plots.join(", "));
        }
        Outcome::Mix(report) => {
            print_mix(&report);
            super::write_report(&args.json, &report)?;
            println!("wrote {}", args.json.display());
        }
    }
    Ok(())
}

/// The columns every serving table shares.
const FIGURES: &str = "tokens     tok/s  × 1 cli  TTFT p50  TTFT p99  TPOT p50  TPOT p99";

/// A row's shared columns (TPOT with `decimals` decimals).
fn figures(f: &WaveFigures, decimals: usize) -> String {
    format!(
        "{:>6} {:>9.1} {:>8.2} {:>7.0}ms {:>7.0}ms {:>7.decimals$}ms {:>7.decimals$}ms",
        f.tokens,
        f.tokens_per_s,
        f.speedup_vs_one_client,
        f.ttft_p50_s * 1e3,
        f.ttft_p99_s * 1e3,
        f.tpot_p50_s * 1e3,
        f.tpot_p99_s * 1e3
    )
}

fn print_rows(rows: &[ServeRow]) {
    println!(
        "{:<22} {:>7} {:>8} {FIGURES}",
        "model", "clients", "batching"
    );
    for r in rows {
        let batching = if r.batching { "on" } else { "off" };
        let shown = figures(&r.figures, 1);
        println!("{:<22} {:>7} {batching:>8} {shown}", r.model, r.clients);
    }
}

fn print_mix(report: &MixReport) {
    println!(
        "{:<10} {:>7} {:<10} {FIGURES}  sequences per step",
        "workload", "clients", "kind"
    );
    for r in &report.rows {
        let composition: Vec<String> = r
            .sequences_per_step
            .iter()
            .map(|(s, n)| format!("{s} {n:.2}"))
            .collect();
        println!(
            "{:<10} {:>7} {:<10} {}  {}",
            r.workload,
            r.clients,
            r.kind,
            figures(&r.figures, 2),
            composition.join(" · ")
        );
    }
}

/// A plot: its file suffix, the row's figure and its scale, the title and the y label.
type Plot = (
    &'static str,
    fn(&WaveFigures) -> f64,
    f64,
    &'static str,
    &'static str,
);

/// Throughput and TPOT p99 against clients, one line per (model, batching).
fn write_plots(json_path: &Path, rows: &[ServeRow]) -> Result<Vec<String>> {
    let mut keys: Vec<(&str, bool)> = Vec::new();
    for r in rows {
        let k = (r.model.as_str(), r.batching);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let series = |metric: fn(&WaveFigures) -> f64, scale: f64| -> Vec<Series> {
        keys.iter()
            .map(|&(m, b)| Series {
                name: format!("{m}, batching {}", if b { "on" } else { "off" }),
                points: rows
                    .iter()
                    .filter(|r| r.model == m && r.batching == b)
                    .map(|r| (r.clients as f64, metric(&r.figures) * scale))
                    .collect(),
            })
            .collect()
    };
    let ticks: Vec<(f64, String)> = [1, 2, 4, 8, 16, 32, 64]
        .iter()
        .filter(|&&c| rows.iter().any(|r| r.clients == c))
        .map(|&c| (c as f64, c.to_string()))
        .collect();
    let stem = json_path.with_extension("");
    let mut written = Vec::new();
    let plots: [Plot; 2] = [
        (
            "throughput",
            |r| r.tokens_per_s,
            1.0,
            "glance serve: aggregate throughput",
            "tokens/s",
        ),
        (
            "tpot",
            |r| r.tpot_p99_s,
            1e3,
            "glance serve: time per output token (p99)",
            "ms",
        ),
    ];
    for (suffix, metric, scale, title, y) in plots {
        let path = PathBuf::from(format!("{}-{suffix}.svg", stem.display()));
        let axes = Axes {
            title,
            x_label: "concurrent clients",
            y_label: y,
            x_ticks: &ticks,
            log2_x: true,
        };
        write_line_plot(&path, &axes, &series(metric, scale))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}
