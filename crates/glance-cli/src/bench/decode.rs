//! `glance bench decode`: prefill and decode throughput of a text decoder, per thread count, beside
//! the memory-bandwidth bound (decode) and the GEMM rate (prefill) measured in the same run.
//!
//! The timed path is the engine's own: [`glance_decode::prefill`] and the autoregressive
//! [`DecodeStrategy`], each thread count on its own pool (`glance_engine::thread_pool`).
//!
//! With `--weights f32,bf16,q8,q4` each weight format is loaded in turn (the previous model
//! dropped first) and measured against its own bound: the bytes its weights stream per token
//! (as held, scales included) over the measured read bandwidth. Resident memory is read from
//! `/proc/self/status` after each load, and its peak during the load (`VmHWM`, reset before each
//! load). Random weights are drawn one tensor at a time and packed
//! as they are drawn, so a 7B shape never exists in f32.

use super::machine::{copy_bandwidth, gemm_rate, read_bandwidth};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_core::SamplingParams;
use glance_decode::{Autoregressive, DecodeStrategy, GenerateConfig, Sampler};
use glance_engine::{Engine, EngineOptions};
use glance_models::llava::{Llava, WeightLayout};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::{AttnMask, CausalLm, KvCache, Mode, WeightFormat, WeightLoad};
use serde_json::json;
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

/// Weight bytes a decode step streams: every linear matrix once as held (scales included), one
/// embedding row and the norms.
fn weight_bytes_per_token(model: &TextModel) -> f64 {
    let c = model.config();
    let row = c.hidden_size * model.embedding_bytes_per_value();
    let norms = (2 * c.num_layers + 1) * c.hidden_size * 4;
    (model.linear_weight_bytes() + row + norms) as f64
}

/// Resident memory of this process (`VmRSS`), bytes; `None` where /proc is not available. Freed
/// heap pages are handed back to the system first (glibc keeps them otherwise, and a model
/// measured after another would be charged for its predecessor's memory).
pub fn resident_bytes() -> Option<u64> {
    glance_nn::runtime::release_free_memory();
    glance_nn::runtime::resident_bytes()
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

/// A model measured by this run: its text decoder, and the whole LLaVA model when it is one.
enum Loaded {
    Text(Box<TextModel>),
    Llava(Box<Llava>),
    Engine(Box<Engine>),
}

impl Loaded {
    fn text(&self) -> &TextModel {
        match self {
            Loaded::Text(t) => t,
            Loaded::Llava(l) => l.text(),
            Loaded::Engine(e) => e.model().text(),
        }
    }
}

/// Loads the model of `args` with its linear weights in `format`.
fn load(args: &DecodeArgs, format: WeightFormat) -> Result<Loaded> {
    let load = WeightLoad::new(format);
    let cpu = candle_core::Device::Cpu;
    if let Some(dir) = &args.model {
        let options = EngineOptions::single_request()
            .with_weights(format)
            .with_twin(args.twin.twin.clone());
        let engine = Engine::load(dir, options)
            .with_context(|| format!("loading {} with {format} weights", dir.display()))?;
        return Ok(Loaded::Engine(Box::new(engine)));
    }
    let vb = random_var_builder(0, &cpu);
    if let Some(config) = presets::llava_preset(&args.random) {
        let model =
            Llava::from_var_builder_as(&vb, config?, &WeightLayout::hub(), Mode::Infer, &load)?;
        return Ok(Loaded::Llava(Box::new(model)));
    }
    let config = presets::text_config(&args.random)?;
    let model = TextModel::load_as(&vb, &vb.pp("lm_head"), &config, Mode::Infer, &load)?;
    Ok(Loaded::Text(Box::new(model)))
}

/// Parameters of the whole model `args` names (the text decoder's, plus the vision tower's and
/// projector's for a LLaVA preset), for a memory estimate before loading.
fn all_parameters(args: &DecodeArgs, text: &TextConfig) -> Result<usize> {
    Ok(match presets::llava_preset(&args.random) {
        Some(c) if args.model.is_none() => {
            let c = c?;
            let v = &c.vision;
            let per_layer =
                4 * v.hidden_size * v.hidden_size + 2 * v.hidden_size * v.intermediate_size;
            let proj = v.hidden_size * text.hidden_size + text.hidden_size * text.hidden_size;
            text.num_parameters() + v.num_hidden_layers * per_layer + proj
        }
        _ => text.num_parameters(),
    })
}

pub fn run(mut args: DecodeArgs) -> Result<()> {
    if args.twin.twin.is_some() && args.model.is_none() {
        args.model = Some(crate::args::model_dir(None)?);
    }
    if args.prompt_len == 0 || args.new_tokens < 2 || args.reps == 0 || args.reps > MAX_REPS {
        bail!("--prompt-len ≥ 1, --new-tokens ≥ 2 and --reps in 1..={MAX_REPS} are required");
    }
    if let Some(k) = args.rows.iter().find(|&&k| k == 0 || k > MAX_ROWS) {
        bail!("--rows {k}: each row count must be in 1..={MAX_ROWS}");
    }
    if args.weights.is_empty() {
        bail!("--weights needs at least one format");
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
        Some(dir) => match &args.twin.twin {
            Some(shape) => glance_models::twin::llava_config(dir, shape).map(|c| c.text),
            None => match glance_models::family::Family::of_dir(dir)? {
                f if f.is_llava() => {
                    glance_models::llava::LlavaConfig::from_dir(dir).map(|c| c.text)
                }
                glance_models::family::Family::InternVl => {
                    glance_models::internvl::InternVlConfig::from_dir(dir).map(|c| c.text)
                }
                _ => glance_models::qwen2_vl::Qwen2VlConfig::from_dir(dir).map(|c| c.text),
            },
        }
        .with_context(|| format!("loading {}", dir.display()))?,
        None => match presets::llava_preset(&args.random) {
            Some(c) => c?.text,
            None => presets::text_config(&args.random)?,
        },
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
    // Refuse a format whose weights cannot fit before spending minutes drawing them.
    let params = all_parameters(&args, &config)?;
    if let Some(avail) = glance_nn::runtime::available_memory() {
        for &f in &args.weights {
            let need = params as f64 * f.bits_per_weight() / 8.0;
            if need > 0.95 * avail as f64 {
                bail!(
                    "{f} weights of this model need about {:.1} GB; this machine has {:.1} GB \
                     available (try --weights q4,q8,bf16)",
                    need / 1e9,
                    avail as f64 / 1e9
                );
            }
        }
    }
    let label = match &args.model {
        Some(dir) => match &args.twin.twin {
            Some(shape) => format!("{} (twin {shape})", dir.display()),
            None => dir.display().to_string(),
        },
        None => format!("random {}", args.random),
    };
    let c = config;
    let ids: Vec<u32> = (0..args.prompt_len)
        .map(|i| ((i * 7919 + 13) % c.vocab_size) as u32)
        .collect();
    let positions: Vec<u32> = (0..args.prompt_len as u32).collect();
    let mean_kv = args.prompt_len + args.new_tokens / 2;
    let flops = prefill_flops(&c, args.prompt_len);
    println!(
        "model: {label} — {:.1}M text parameters ({:.1}M in all), {} layers, hidden {}, vocab {}",
        c.num_parameters() as f64 / 1e6,
        params as f64 / 1e6,
        c.num_layers,
        c.hidden_size,
        c.vocab_size
    );
    println!(
        "prompt {} tokens, decode {} tokens; formats {}\n",
        args.prompt_len,
        args.new_tokens,
        args.weights
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Copy bandwidth and GEMM rate once per thread count, shared by every format (the read
    // bandwidth is measured beside each decode, below).
    let mut yardsticks = Vec::new();
    for &t in &thread_counts {
        let copy = copy_bandwidth(t, args.reps.max(3))?;
        let pool = glance_engine::thread_pool(t)?;
        let gemm = pool.install(|| gemm_rate(1024, 1024, 1024, args.reps.max(3)))?;
        yardsticks.push((t, copy, gemm));
    }
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
    let mut rows = Vec::new();
    let mut rows_json = Vec::new();
    let mut formats = Vec::new();
    let mut first_step_bytes = None;
    for &format in &args.weights {
        let rss_before = resident_bytes();
        // The high-water mark of this load alone (VmHWM), taken before the release of free pages.
        let peak_known = glance_nn::runtime::reset_peak_resident();
        let start = std::time::Instant::now();
        let loaded = load(&args, format)?;
        let load_s = start.elapsed().as_secs_f64();
        let load_peak = glance_nn::runtime::peak_resident_bytes().filter(|_| peak_known);
        let rss = resident_bytes();
        let model = loaded.text();
        let weight_bytes = weight_bytes_per_token(model);
        let step_bytes = weight_bytes + kv_bytes(&c, mean_kv);
        first_step_bytes.get_or_insert(step_bytes);
        let mut rss_after_decode = None;
        for &(t, copy, gemm) in &yardsticks {
            // The read bandwidth again, just before this format's timing: the machine is shared
            // and its bandwidth moves over minutes, so each bound is taken side by side with the
            // decode it judges.
            let bandwidth = read_bandwidth(t, args.reps.max(3))?;
            // Every kernel (candle's GEMM, glance's matvec, rayon-parallel element-wise ops) runs on
            // a pool of exactly `t` threads.
            let pool = glance_engine::thread_pool(t)?;
            let (best_prefill, best_step) =
                pool.install(|| time_model(model, &ids, &positions, &args))?;
            rss_after_decode = resident_bytes();
            let prefill_rate = flops / best_prefill;
            let bound = step_bytes / bandwidth;
            println!(
                "{:>6} {:>7} | {:>9.2} {:>12.2} {:>9.1} {:>8.1} | {:>9.3} {:>8.1} {:>6.0}% | {:>9.2} {:>9.2} {:>6.0}%",
                format.name(),
                t,
                rss.unwrap_or(0) as f64 / 1e9,
                load_peak.unwrap_or(0) as f64 / 1e9,
                step_bytes / 1e6,
                bandwidth / 1e9,
                best_prefill,
                prefill_rate / 1e9,
                100.0 * prefill_rate / gemm,
                best_step * 1e3,
                bound * 1e3,
                100.0 * bound / best_step
            );
            rows.push(json!({
                "weights": format.name(),
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
                "bytes_per_decode_step": step_bytes,
            }));
        }
        if !args.rows.is_empty() {
            let curves = rows_curves(model, &ids, &positions, &args, &thread_counts, format)?;
            rows_json.extend(curves);
        }
        formats.push(json!({
            "weights": format.name(),
            "load_s": load_s,
            "resident_bytes_before_load": rss_before,
            "resident_bytes_after_load": rss,
            "peak_resident_bytes_during_load": load_peak,
            "resident_bytes_after_decode": rss_after_decode,
            "linear_weight_bytes": model.linear_weight_bytes(),
            "bytes_per_decode_step": step_bytes,
        }));
        drop(loaded);
    }
    let report = json!({
        "bench": "decode",
        "model": label,
        "parameters": c.num_parameters(),
        "parameters_with_vision": params,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "bytes_per_decode_step": first_step_bytes,
        "prefill_flops": flops,
        "formats": formats,
        "rows": rows,
        "row_costs": rows_json,
    });
    super::write_json(&args.json, &report)?;
    println!("\nwrote {}", args.json.display());
    Ok(())
}

/// Most rows of one pass `--rows` measures (the decode kernels' range).
const MAX_ROWS: usize = glance_nn::matvec::MAX_SMALL_ROWS;

/// Best time over `reps` of one pass of `k` new rows (forward and logits, as a speculative
/// verification pass runs them) after the prompt in `cache`, which is rolled back after each.
fn time_pass(
    model: &TextModel,
    cache: &mut KvCache,
    start: usize,
    k: usize,
    reps: usize,
) -> Result<f64> {
    let c = model.config();
    let ids: Vec<u32> = (0..k)
        .map(|i| ((i * 31 + 7) % c.vocab_size) as u32)
        .collect();
    let positions: Vec<u32> = (start..start + k).map(|p| p as u32).collect();
    let xs = model.embed_tokens(&ids)?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let mark = cache.mark();
        let t = std::time::Instant::now();
        let hidden = model.forward(&xs, &positions, &AttnMask::causal(), cache)?;
        std::hint::black_box(model.logits(&hidden)?);
        best = best.min(t.elapsed().as_secs_f64());
        cache.rollback(&mark)?;
    }
    Ok(best)
}

/// The c(k) curve of one format at every thread count: a table and its JSON rows.
fn rows_curves(
    model: &TextModel,
    ids: &[u32],
    positions: &[u32],
    args: &DecodeArgs,
    thread_counts: &[usize],
    format: WeightFormat,
) -> Result<Vec<serde_json::Value>> {
    let c = model.config();
    // Multiply-adds of one row through the linear layers (LM head included); attention over the
    // short prompt is a small addition left out of the floor.
    let emb = c.vocab_size * c.hidden_size;
    let macs_row = (c.num_parameters() - if c.tie_word_embeddings { 0 } else { emb }) as f64;
    let mut out = Vec::new();
    for &t in thread_counts {
        let pool = glance_engine::thread_pool(t)?;
        // This CPU's peak for the instruction the format's kernels use, on `t` threads.
        let peak = pool
            .broadcast(|_| glance_nn::peak::macs_per_second(format))
            .into_iter()
            .sum::<Option<f64>>();
        let times = pool.install(|| -> Result<Vec<f64>> {
            let mut cache = model.new_cache();
            let x = model.embed_tokens(ids)?;
            model.forward(&x, positions, &AttnMask::causal(), &mut cache)?;
            let mut t1 = time_pass(model, &mut cache, ids.len(), 1, args.reps)?;
            let mut times = Vec::new();
            for &k in &args.rows {
                let tk = time_pass(model, &mut cache, ids.len(), k, args.reps)?;
                if k == 1 {
                    t1 = t1.min(tk);
                }
                times.push(tk);
            }
            times.insert(0, t1);
            Ok(times)
        })?;
        let t1 = times[0];
        println!(
            "\n{} on {t} thread(s): one row {:.2} ms; peak {}",
            format.name(),
            t1 * 1e3,
            peak.map_or("n/a".into(), |p| format!("{:.0} GMAC/s", p / 1e9))
        );
        println!(
            "{:>5} {:>9} {:>7} {:>8} {:>8} {:>7}",
            "rows", "ms", "c(k)", "GOP/s", "% peak", "floor"
        );
        for (&k, &tk) in args.rows.iter().zip(&times[1..]) {
            let macs = k as f64 * macs_row;
            let floor = peak.map(|p| (macs / p / t1).max(1.0));
            let pct = peak.map(|p| 100.0 * macs / tk / p);
            println!(
                "{k:>5} {:>9.2} {:>7.2} {:>8.1} {:>7} {:>7}",
                tk * 1e3,
                tk / t1,
                2.0 * macs / tk / 1e9,
                pct.map_or("n/a".into(), |p| format!("{p:.0}%")),
                floor.map_or("n/a".into(), |f| format!("{f:.2}")),
            );
            out.push(json!({
                "weights": format.name(),
                "threads": t,
                "rows": k,
                "ms": tk * 1e3,
                "one_row_ms": t1 * 1e3,
                "cost": tk / t1,
                "gop_s": 2.0 * macs / tk / 1e9,
                "peak_gmac_s": peak.map(|p| p / 1e9),
                "fraction_of_peak": pct.map(|p| p / 100.0),
                "floor_cost": floor,
            }));
        }
    }
    Ok(out)
}
