//! `glance bench …`: benchmarks are commands that print a table and write JSON. Every ratio is
//! measured side by side in one run (this machine is shared and noisy).

mod decode;
mod diffusion;
mod machine;
mod prune;
mod serve;
mod serve_mix;
mod spec;
mod tally;

use anyhow::Result;
use clap::Subcommand;
use glance_engine::ImageInput;

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

/// The cost model as reports show it: the decode step in ms, `c(k)` at the timed row counts,
/// and each draft head's step and prompt-row costs in decode steps.
pub(crate) fn cost_report(cost: &glance_decode::CostModel) -> serde_json::Value {
    let step = cost.pass(1);
    let drafts: serde_json::Map<String, serde_json::Value> = cost
        .drafts
        .iter()
        .map(|(kind, d)| {
            let steps: Vec<f64> = d.step_s.iter().map(|s| s / step).collect();
            (
                kind.clone(),
                serde_json::json!({"step_in_decode_steps": steps, "prompt_row_in_decode_steps": d.row_s / step}),
            )
        })
        .collect();
    serde_json::json!({
        "key": cost.key,
        "decode_step_ms": step * 1e3,
        "c": cost.curve().into_iter().map(|(k, c)| serde_json::json!([k, c])).collect::<Vec<_>>(),
        "drafts": drafts,
        "measured_s": cost.measured_s,
    })
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

/// The most world test images a benchmark takes (the split has far more; this bounds a typo).
pub const MAX_IMAGES: usize = 100_000;

/// Checks `--n` world test images from `--start`.
pub fn check_test_images(n: usize, start: u64) -> Result<()> {
    if n == 0 || n > MAX_IMAGES {
        anyhow::bail!("--n must be between 1 and {MAX_IMAGES} (world test images)");
    }
    let last = start.checked_add(n as u64 - 1);
    if last.is_none_or(|l| glance_world::Split::Test.seed(l).is_err()) {
        anyhow::bail!("--start {start} with --n {n} runs past the end of the test split");
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
/// `start .. start + n`, in order, with a progress bar labelled `label`; returns the seconds
/// taken.
pub fn for_each_question(
    label: &str,
    n: usize,
    start: u64,
    mut f: impl FnMut(&glance_world::Example, &glance_world::Qa, &ImageInput) -> Result<()>,
) -> Result<f64> {
    use indicatif::{ProgressBar, ProgressStyle};
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{label} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} images (eta {{eta}})"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = std::time::Instant::now();
    for index in start..start + n as u64 {
        let ex = glance_world::sample(glance_world::Split::Test, index)?;
        let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
        for qa in ex.questions.iter().filter(|q| !q.follow_up) {
            f(&ex, qa, &image)?;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(t0.elapsed().as_secs_f64())
}
