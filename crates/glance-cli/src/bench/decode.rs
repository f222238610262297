//! `glance bench decode`: prefill and decode throughput of a text decoder, per thread count,
//! beside the memory-bandwidth bound (decode) and the GEMM rate (prefill) measured in the same
//! run ([`glance_bench::decode`]). This module reads the flags and prints the tables.

use anyhow::Result;
use clap::Args;
use glance_bench::decode::{DecodeBench, DecodeOptions, DecodeReport};
use glance_nn::WeightFormat;
use std::path::PathBuf;

#[derive(Args)]
pub struct DecodeArgs {
    /// A LLaVA model directory whose text decoder is measured.
    #[arg(long, conflicts_with = "random")]
    pub model: Option<PathBuf>,
    /// Instead of a checkpoint, a random-weight decoder of a preset shape: llama-134m (12 layers,
    /// d768), tinyllama-1.1b (22 layers, d2048, GQA 32/4), sheared-llama-2.7b (32 layers,
    /// d2560), llama-2-7b (32 layers, d4096), Qwen2.5-VL's decoders qwen2.5-vl-3b (36 layers,
    /// d2048, GQA 16/2, tied) and qwen2.5-vl-7b (28 layers, d3584, GQA 28/4), InternVL-2.5-4B's
    /// decoder internvl2.5-4b (Qwen2.5-3B: 36 layers, d2048, GQA 16/2, tied), or a whole random
    /// LLaVA: llava-7b (CLIP
    /// ViT-L/14-336 + Llama-2-7B; its text decoder is timed, its resident memory is the whole
    /// model's).
    #[arg(long, default_value = "llama-134m")]
    pub random: String,
    /// Weight formats to measure, comma-separated, each loaded in turn: f32, bf16, f16, q8, q4.
    #[arg(long, value_delimiter = ',', default_value = "f32", value_parser = crate::args::parse_weights)]
    pub weights: Vec<WeightFormat>,
    /// Prompt tokens for the prefill.
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// Tokens decoded after the prefill.
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Thread counts to measure, comma-separated (default: 1 and all cores).
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Repetitions per measurement (the best is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Also time one pass over k new rows after the prompt for each k here (comma-separated,
    /// 1 to 64; e.g. 1,2,4,8,16,32,64): the cost c(k) of verifying k draft tokens relative to
    /// one decode step, per format and thread count, beside this CPU's arithmetic peak.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<usize>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/decode.json")]
    pub json: PathBuf,
    /// With --model (default: glance-tiny): time the model's real-shape twin instead of
    /// --random weights.
    #[command(flatten)]
    pub twin: crate::args::TwinArgs,
}

pub fn run(args: DecodeArgs) -> Result<()> {
    let mut model = args.model;
    if args.twin.twin.is_some() && model.is_none() {
        model = Some(crate::args::model_dir(None)?);
    }
    let bench = DecodeBench::new(DecodeOptions {
        model,
        twin: args.twin.twin,
        random: args.random,
        weights: args.weights,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        threads: args.threads,
        reps: args.reps,
        rows: args.rows,
    })?;
    let m = &bench.model;
    println!(
        "model: {} — {:.1}M text parameters ({:.1}M in all), {} layers, hidden {}, vocab {}",
        m.label,
        m.parameters as f64 / 1e6,
        m.parameters_with_vision as f64 / 1e6,
        m.layers,
        m.hidden,
        m.vocab
    );
    let report = bench.run(&mut super::Bars::default())?;
    println!(
        "prompt {} tokens, decode {} tokens; formats {}\n",
        report.prompt_len,
        report.new_tokens,
        report
            .formats
            .iter()
            .map(|f| f.weights)
            .collect::<Vec<_>>()
            .join(", ")
    );
    print_report(&report);
    super::write_report(&args.json, &report)?;
    println!("\nwrote {}", args.json.display());
    Ok(())
}

/// The throughput table, then each format's `c(k)` curve per thread count.
fn print_report(report: &DecodeReport) {
    println!(
        "{:>6} {:>7} | {:>9} {:>12} {:>9} {:>8} | {:>9} {:>8} {:>7} | {:>9} {:>9} {:>7}",
        "format",
        "threads",
        "RSS GB",
        "load peak GB",
        "MB/token",
        "read GB/s",
        "prefill s",
        "GFLOP/s",
        "% GEMM",
        "ms/token",
        "bound ms",
        "% bound"
    );
    for r in &report.rows {
        let format = report.formats.iter().find(|f| f.weights == r.weights);
        let rss = format.and_then(|f| f.resident_bytes_after_load);
        let peak = format.and_then(|f| f.peak_resident_bytes_during_load);
        println!(
            "{:>6} {:>7} | {:>9.2} {:>12.2} {:>9.1} {:>8.1} | {:>9.3} {:>8.1} {:>6.0}% | {:>9.2} {:>9.2} {:>6.0}%",
            r.weights,
            r.threads,
            rss.unwrap_or(0) as f64 / 1e9,
            peak.unwrap_or(0) as f64 / 1e9,
            r.bytes_per_decode_step / 1e6,
            r.read_bandwidth_gb_s,
            r.prefill_s,
            r.prefill_gflop_s,
            100.0 * r.prefill_fraction_of_gemm,
            r.decode_ms_per_token,
            r.decode_bound_ms_per_token,
            100.0 * r.decode_fraction_of_bound
        );
    }
    let mut shown: Vec<(&str, usize)> = Vec::new();
    for r in &report.row_costs {
        if !shown.contains(&(r.weights, r.threads)) {
            shown.push((r.weights, r.threads));
            println!(
                "\n{} on {} thread(s): one row {:.2} ms; peak {}",
                r.weights,
                r.threads,
                r.one_row_ms,
                r.peak_gmac_s
                    .map_or("n/a".into(), |p| format!("{p:.0} GMAC/s"))
            );
            println!(
                "{:>5} {:>9} {:>7} {:>8} {:>8} {:>7}",
                "rows", "ms", "c(k)", "GOP/s", "% peak", "floor"
            );
        }
        println!(
            "{:>5} {:>9.2} {:>7.2} {:>8.1} {:>7} {:>7}",
            r.rows,
            r.ms,
            r.cost,
            r.gop_s,
            r.fraction_of_peak
                .map_or("n/a".into(), |p| format!("{:.0}%", 100.0 * p)),
            r.floor_cost.map_or("n/a".into(), |f| format!("{f:.2}")),
        );
    }
}
