//! `glance bench …`: each benchmark runs in the glance-bench library, which returns a typed
//! report; this module turns flags into its options, prints the report's tables, and writes
//! its JSON and plots. Every ratio is measured side by side in one run (this machine is shared
//! and noisy).

mod decode;
mod diffusion;
mod prune;
mod serve;
mod spec;

use anyhow::Result;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode throughput of the text decoder beside this machine's limits: the
    /// memory-bandwidth bound for decode and the GEMM rate for prefill, measured in the same run.
    Decode(decode::DecodeArgs),
    /// Every visual-token pruning policy × budget: time to first token (on a random-weight model
    /// at LLaVA-1.5-7B's 576-token shape, and on --model) and world test accuracy (with --model).
    Prune(prune::PruneBenchArgs),
    /// Autoregressive vs speculative decoding (ViSpec, EAGLE, ablation heads) on the world test
    /// split at each temperature: tokens per target forward, acceptance by draft depth and by
    /// position in the answer, decode speed side by side, greedy equality, accuracy; and the
    /// speedup projected at a memory-bound ≥ 1B shape.
    Spec(spec::SpecBenchArgs),
    /// `glance serve` under 1–16 concurrent streaming clients, with and without continuous
    /// batching: aggregate tokens/s, time to first token and per output token (p50 / p99).
    Serve(serve::ServeBenchArgs),
    /// Block-diffusion decoding of a converted model (Fast-dVLM) on the world test split:
    /// autoregressive decoding of the original and the converted model, threshold, linear and
    /// quadratic self-speculation at each block size, dynamic blocks, with pruning: tokens per
    /// forward (NFE), tokens/s side by side, accuracy and description F1, greedy equality.
    Diffusion(diffusion::DiffusionBenchArgs),
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Decode(a) => decode::run(a),
        BenchCommand::Prune(a) => prune::run(a),
        BenchCommand::Spec(a) => spec::run(a),
        BenchCommand::Serve(a) => serve::run(a),
        BenchCommand::Diffusion(a) => diffusion::run(a),
    }
}

/// Writes `value` as pretty JSON to `path`, creating parent directories.
pub fn write_json(path: &std::path::Path, value: &serde_json::Value) -> Result<()> {
    use anyhow::Context;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes a benchmark's report as pretty JSON to `path` (through a JSON value, so its keys are
/// sorted as every JSON glance writes).
pub fn write_report(path: &std::path::Path, report: &impl serde::Serialize) -> Result<()> {
    write_json(path, &serde_json::to_value(report)?)
}

/// A benchmark's progress on stderr: a bar per phase (`LABEL [elapsed] bar done/total images`)
/// and its notes as lines.
#[derive(Default)]
pub struct Bars {
    bar: Option<ProgressBar>,
}

impl glance_bench::Progress for Bars {
    fn start(&mut self, label: &str, total: u64) {
        self.finish();
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{label} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} images{{msg}} (eta {{eta}})"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        self.bar = Some(bar);
    }

    fn advance(&mut self, done: u64, note: &str) {
        if let Some(b) = &self.bar {
            b.set_position(done);
            if !note.is_empty() {
                b.set_message(format!(", {note}"));
            }
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }

    fn note(&mut self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }
}

/// `v` to `decimals`, `-` when not finite, right-aligned in `width`.
pub fn cell(v: f64, width: usize, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:>width$.decimals$}")
    } else {
        format!("{:>width$}", "-")
    }
}
