//! `glance bench decode`: prefill and decode throughput of a text decoder, per thread count, beside
//! the memory-bandwidth bound (decode) and the GEMM rate (prefill) measured in the same run.
//!
//! The timed path is the engine's own: [`glance_decode::prefill`] and the autoregressive
//! [`DecodeStrategy`], each thread count on its own pool (`glance_engine::thread_pool`).

use super::machine::{copy_bandwidth, gemm_rate, read_bandwidth};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_core::SamplingParams;
use glance_decode::{Autoregressive, DecodeStrategy, GenerateConfig, Sampler};
use glance_engine::{Engine, EngineOptions};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::{CausalLm, Mode};
use serde_json::json;
use std::path::PathBuf;

#[derive(Args)]
pub struct DecodeArgs {
    /// A LLaVA model directory whose text decoder is measured.
    #[arg(long, conflicts_with = "random")]
    pub model: Option<PathBuf>,
    /// Instead of a checkpoint, a random-weight decoder of a preset shape: llama-134m (12 layers,
    /// d768), tinyllama-1.1b (22 layers, d2048, GQA 32/4) or sheared-llama-2.7b (32 layers,
    /// d2560).
    #[arg(long, default_value = "llama-134m")]
    pub random: String,
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
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/decode.json")]
    pub json: PathBuf,
}

/// Weight bytes a decode step streams (every matrix once; one embedding row), f32.
fn weight_bytes_per_token(c: &TextConfig) -> f64 {
    let emb = c.vocab_size * c.hidden_size;
    let tied_extra = if c.tie_word_embeddings { emb } else { 0 };
    let all = c.num_parameters() + tied_extra; // LM head read even when tied
    ((all - emb + c.hidden_size) * 4) as f64
}

/// KV bytes a decode step reads at cache length `len`.
fn kv_bytes(c: &TextConfig, len: usize) -> f64 {
    (2 * c.num_layers * len * c.num_kv_heads * c.head_dim * 4) as f64
}

/// FLOPs of a prefill of `n` tokens as executed (dense matmuls; attention over the full n×n
/// square; the LM head on the last row only).
fn prefill_flops(c: &TextConfig, n: usize) -> f64 {
    let emb = c.vocab_size * c.hidden_size;
    let head = if c.tie_word_embeddings { 0 } else { emb };
    let linear = c.num_parameters() - emb - head;
    let attn = 4 * n * n * c.num_heads * c.head_dim * c.num_layers;
    (2 * n * linear + attn + 2 * c.hidden_size * c.vocab_size) as f64
}

/// The most repetitions per measurement.
const MAX_REPS: usize = 100;

/// Best prefill time (with the first token's pick) and best mean decode-step time over
/// `args.reps` runs, in seconds.
fn time_model(
    model: &TextModel,
    ids: &[u32],
    positions: &[u32],
    args: &DecodeArgs,
) -> Result<(f64, f64)> {
    let x = model.embed_tokens(ids)?;
    let config = GenerateConfig {
        max_new_tokens: args.new_tokens,
        eos_token_ids: Vec::new(),
    };
    let (mut best_prefill, mut best_step) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..args.reps {
        let state = glance_decode::prefill(model, &x, positions)?;
        let sampler = Sampler::new(SamplingParams::greedy())?;
        let g = Autoregressive.decode(model, state, sampler, &config, &mut |_| Ok(false))?;
        if g.tokens.len() != args.new_tokens {
            bail!(
                "decoding stopped after {} of {} tokens",
                g.tokens.len(),
                args.new_tokens
            );
        }
        best_prefill = best_prefill.min(g.prefill.as_secs_f64());
        // `decode` covers the passes after the first token.
        best_step = best_step.min(g.decode.as_secs_f64() / (args.new_tokens - 1) as f64);
    }
    Ok((best_prefill, best_step))
}

pub fn run(args: DecodeArgs) -> Result<()> {
    if args.prompt_len == 0 || args.new_tokens < 2 || args.reps == 0 || args.reps > MAX_REPS {
        bail!("--prompt-len ≥ 1, --new-tokens ≥ 2 and --reps in 1..={MAX_REPS} are required");
    }
    let cores = glance_engine::cores();
    let thread_counts = if args.threads.is_empty() {
        if cores > 1 {
            vec![1, cores]
        } else {
            vec![1]
        }
    } else {
        args.threads.clone()
    };
    for &t in &thread_counts {
        glance_engine::resolve_threads(Some(t)).context("--threads")?;
    }
    let config = match &args.model {
        Some(dir) => {
            glance_models::llava::LlavaConfig::from_dir(dir)
                .with_context(|| format!("loading {}", dir.display()))?
                .text
        }
        None => presets::text_config(&args.random)?,
    };
    let context = config.max_position_embeddings;
    if args
        .prompt_len
        .checked_add(args.new_tokens)
        .is_none_or(|n| n >= context)
    {
        bail!(
            "--prompt-len {} + --new-tokens {} must stay below the model's context ({context})",
            args.prompt_len,
            args.new_tokens
        );
    }
    let (label, owned_engine, owned_text);
    let model: &TextModel = match &args.model {
        Some(dir) => {
            owned_engine = Engine::load(dir, EngineOptions::single_request())
                .with_context(|| format!("loading {}", dir.display()))?;
            label = dir.display().to_string();
            owned_engine.model().text()
        }
        None => {
            eprintln!(
                "building random-weight decoder `{}` ({:.0}M parameters)…",
                args.random,
                config.num_parameters() as f64 / 1e6
            );
            let vb = random_var_builder(0, &candle_core::Device::Cpu);
            owned_text = TextModel::load(&vb, &vb.pp("lm_head"), &config, Mode::Infer)?;
            label = format!("random {}", args.random);
            &owned_text
        }
    };
    let c = model.config().clone();
    let params = c.num_parameters();
    let ids: Vec<u32> = (0..args.prompt_len)
        .map(|i| ((i * 7919 + 13) % c.vocab_size) as u32)
        .collect();
    let positions: Vec<u32> = (0..args.prompt_len as u32).collect();
    let mean_kv = args.prompt_len + args.new_tokens / 2;
    let step_bytes = weight_bytes_per_token(&c) + kv_bytes(&c, mean_kv);
    let flops = prefill_flops(&c, args.prompt_len);

    println!(
        "model: {label} — {:.1}M parameters, {} layers, hidden {}, vocab {}",
        params as f64 / 1e6,
        c.num_layers,
        c.hidden_size,
        c.vocab_size
    );
    println!(
        "prompt {} tokens, decode {} tokens; {:.1} MB streamed per decode step\n",
        args.prompt_len,
        args.new_tokens,
        step_bytes / 1e6
    );
    println!(
        "{:>7} | {:>10} {:>10} {:>8} | {:>10} {:>10} {:>8} | {:>10} {:>10} {:>8}",
        "threads",
        "read GB/s",
        "copy GB/s",
        "GEMM GF/s",
        "prefill s",
        "GFLOP/s",
        "% GEMM",
        "ms/token",
        "bound ms",
        "% bound"
    );
    let mut rows = Vec::new();
    for &t in &thread_counts {
        // Every kernel (candle's GEMM, glance's matvec, rayon-parallel element-wise ops) runs on
        // a pool of exactly `t` threads.
        let pool = glance_engine::thread_pool(t)?;
        let bandwidth = read_bandwidth(t, args.reps.max(3))?;
        let copy = copy_bandwidth(t, args.reps.max(3))?;
        let (gemm, best_prefill, best_step) = pool.install(|| -> Result<(f64, f64, f64)> {
            let gemm = gemm_rate(1024, 1024, 1024, args.reps.max(3))?;
            let (prefill, step) = time_model(model, &ids, &positions, &args)?;
            Ok((gemm, prefill, step))
        })?;
        let prefill_rate = flops / best_prefill;
        let bound = step_bytes / bandwidth;
        println!(
            "{:>7} | {:>10.1} {:>10.1} {:>8.1} | {:>10.3} {:>10.1} {:>7.0}% | {:>10.2} {:>10.2} {:>7.0}%",
            t,
            bandwidth / 1e9,
            copy / 1e9,
            gemm / 1e9,
            best_prefill,
            prefill_rate / 1e9,
            100.0 * prefill_rate / gemm,
            best_step * 1e3,
            bound * 1e3,
            100.0 * bound / best_step
        );
        rows.push(json!({
            "threads": t,
            "read_bandwidth_gb_s": bandwidth / 1e9,
            "copy_bandwidth_gb_s": copy / 1e9,
            "gemm_gflop_s": gemm / 1e9,
            "prefill_s": best_prefill,
            "prefill_tokens_per_s": args.prompt_len as f64 / best_prefill,
            "prefill_gflop_s": prefill_rate / 1e9,
            "prefill_fraction_of_gemm": prefill_rate / gemm,
            "decode_ms_per_token": best_step * 1e3,
            "decode_tokens_per_s": 1.0 / best_step,
            "decode_bound_ms_per_token": bound * 1e3,
            "decode_fraction_of_bound": bound / best_step,
            "decode_bound_by_copy_bandwidth_ms_per_token": step_bytes / copy * 1e3,
        }));
    }
    let report = json!({
        "bench": "decode",
        "model": label,
        "parameters": params,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "bytes_per_decode_step": step_bytes,
        "prefill_flops": flops,
        "rows": rows,
    });
    super::write_json(&args.json, &report)?;
    println!("\nwrote {}", args.json.display());
    Ok(())
}
