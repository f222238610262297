//! `glance bench serve`: a real `glance serve` (in this process, on a loopback port) under 1, 2,
//! 4, 8 and 16 concurrent streaming clients, with continuous batching and without it (each
//! request decoding alone), on glance-tiny and on a random-weight ~134M text shape. Reports
//! aggregate generated tokens/s (and its ratio to one client), time to first token and time per
//! output token (p50 / p99) as the clients see them; a table, JSON and SVG plots.
//!
//! The random shape keeps glance-tiny's vision tower, projector input and tokenizer and puts the
//! `llama-134m` decoder (12 layers, d768, its 32000-token LM head cut to the tokenizer's
//! vocabulary) behind them, so prompts and answers go through the same request path.

use crate::plot::{write_line_plot, Axes, Series};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_engine::messages::ImageSources;
use glance_engine::{DecodeSpec, Engine, EngineOptions};
use glance_models::llava::{Llava, LlavaConfig, LlavaProcessor, WeightLayout};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_nn::Mode;
use glance_serve::openai::Defaults;
use glance_serve::ServerConfig;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// One request as its client saw it.
pub(super) struct Sample {
    pub ttft: f64,
    /// Time per output token after the first (`None` for a one-token answer).
    pub tpot: Option<f64>,
    pub tokens: usize,
}

/// Most concurrent clients of one wave (`--clients`).
const MAX_CLIENTS: usize = 64;
/// Most requests each client sends (`--requests`).
const MAX_REQUESTS: usize = 1000;

pub fn run(args: ServeBenchArgs) -> Result<()> {
    // Every count is checked before anything loads or runs.
    if args.clients.is_empty()
        || args
            .clients
            .iter()
            .any(|&c| !(1..=MAX_CLIENTS).contains(&c))
    {
        bail!(
            "--clients takes counts in 1..={MAX_CLIENTS}, got {:?}",
            args.clients
        );
    }
    if !(1..=MAX_REQUESTS).contains(&args.requests) {
        bail!(
            "--requests (per client) must be in 1..={MAX_REQUESTS}, got {}",
            args.requests
        );
    }
    let most_tokens = glance_serve::openai::MAX_TOKENS_LIMIT;
    if !(2..=most_tokens as usize).contains(&args.max_tokens) {
        bail!(
            "--max-tokens must be in 2..={most_tokens} (the server's max_tokens limit), got {}",
            args.max_tokens
        );
    }
    // The servers' settings (--prefill-chunk among them), as `glance serve` checks its own.
    server_config(&args, true).validate()?;
    crate::args::check_writable(&args.json)?;
    let tiny = crate::args::model_dir(args.model.as_deref())?;
    let options = EngineOptions {
        // Every request is a new conversation: no prefix reuse, so both modes prefill alike.
        prefix_cache_bytes: 0,
        ..EngineOptions::default().with_threads(args.threads)
    };
    let mut models: Vec<(String, Arc<Engine>)> = Vec::new();
    let twin = options
        .clone()
        .with_weights(args.weights)
        .with_twin(args.twin.twin.clone());
    let engine =
        Engine::load(&tiny, twin).with_context(|| format!("loading {}", tiny.display()))?;
    let mut name = tiny
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    if let Some(shape) = &args.twin.twin {
        name += &format!(" (twin {shape})");
    }
    if args.weights != glance_engine::WeightFormat::F32 {
        name += &format!(" {}", args.weights.name());
    }
    if !args.mix.is_empty() {
        let images = if args.no_image {
            vec![String::new()]
        } else {
            world_images(*args.clients.iter().max().expect("non-empty"))?
        };
        return super::serve_mix::run(&args, &name, Arc::new(engine), &images);
    }
    models.push((name, Arc::new(engine)));
    if args.shape != "none" {
        eprintln!(
            "building a random-weight `{}` decoder behind {}…",
            args.shape,
            tiny.display()
        );
        models.push((
            format!("random {}", args.shape),
            Arc::new(random_shape(&tiny, &args.shape, options)?),
        ));
    }
    let images = if args.no_image {
        vec![String::new()]
    } else {
        world_images(*args.clients.iter().max().expect("non-empty"))?
    };
    let mut report = Vec::new();
    println!(
        "{:<22} {:>7} {:>8} {:>6} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "model",
        "clients",
        "batching",
        "tokens",
        "tok/s",
        "× 1 cli",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99"
    );
    for (name, engine) in &models {
        for batching in [true, false] {
            let server = glance_serve::spawn(
                engine.clone(),
                server_config(&args, batching),
                "127.0.0.1:0",
            )?;
            // One warm-up request (thread pools, allocator).
            let ask = (args.max_tokens, args.ignore_eos);
            let plain = [Value::Null];
            wave(server.addr, &images, &plain, 1, 1, ask)?;
            let mut single = None;
            for &c in &args.clients {
                let start = Instant::now();
                let samples: Vec<Sample> =
                    wave(server.addr, &images, &plain, c, args.requests, ask)?
                        .into_iter()
                        .map(|(_, s)| s)
                        .collect();
                let wall = start.elapsed().as_secs_f64();
                let tokens: usize = samples.iter().map(|s| s.tokens).sum();
                let rate = tokens as f64 / wall;
                let base = *single.get_or_insert(rate);
                let ttft: Vec<f64> = samples.iter().map(|s| s.ttft).collect();
                let tpot: Vec<f64> = samples.iter().filter_map(|s| s.tpot).collect();
                let (t50, t99, p50, p99) = (
                    pct(&ttft, 50.0),
                    pct(&ttft, 99.0),
                    pct(&tpot, 50.0),
                    pct(&tpot, 99.0),
                );
                println!(
                    "{:<22} {:>7} {:>8} {:>6} {:>9.1} {:>8.2} {:>8.0}ms {:>7.0}ms {:>7.1}ms {:>7.1}ms",
                    name,
                    c,
                    if batching { "on" } else { "off" },
                    tokens,
                    rate,
                    rate / base,
                    t50 * 1e3,
                    t99 * 1e3,
                    p50 * 1e3,
                    p99 * 1e3
                );
                let _ = std::io::stdout().flush();
                report.push(json!({
                    "model": name, "clients": c, "batching": batching,
                    "requests": samples.len(), "tokens": tokens, "wall_s": wall,
                    "tokens_per_s": rate, "speedup_vs_one_client": rate / base,
                    "ttft_p50_s": t50, "ttft_p99_s": t99, "tpot_p50_s": p50, "tpot_p99_s": p99,
                }));
            }
            server.shutdown()?;
        }
    }
    let out = json!({
        "bench": "serve", "threads": models[0].1.threads(), "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "requests_per_client": args.requests, "rows": report,
    });
    super::write_json(&args.json, &out)?;
    let plots = write_plots(&args.json, &report)?;
    println!("wrote {} and {}", args.json.display(), plots.join(", "));
    Ok(())
}

pub(super) fn server_config(args: &ServeBenchArgs, batching: bool) -> ServerConfig {
    let most = *args.clients.iter().max().expect("non-empty");
    ServerConfig {
        model_name: "bench".into(),
        max_batch: most,
        max_queue: most,
        max_body_bytes: 32 << 20,
        body_timeout: Duration::from_secs(30),
        header_timeout: Duration::from_secs(30),
        image_sources: ImageSources::DataOnly,
        defaults: Defaults {
            max_tokens: args.max_tokens,
            prune: None,
            decode: DecodeSpec::Autoregressive,
            strict: false,
        },
        batching,
        prefill_chunk: args.prefill_chunk,
        api_key: None,
    }
}

/// glance-tiny's vision tower and tokenizer in front of a random-weight decoder of `shape`.
fn random_shape(tiny: &Path, shape: &str, options: EngineOptions) -> Result<Engine> {
    let text = std::fs::read_to_string(tiny.join("config.json"))?;
    let mut config: Value = serde_json::from_str(&text)?;
    let mut decoder = presets::text_config_value(shape)?;
    decoder["vocab_size"] = config["text_config"]["vocab_size"].clone();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id", "rope_theta"] {
        if let Some(v) = config["text_config"].get(key) {
            decoder[key] = v.clone();
        }
    }
    config["text_config"] = decoder;
    let config = LlavaConfig::from_value(&config)?;
    let processor = LlavaProcessor::from_dir(tiny, &config)?;
    let vb = random_var_builder(0, &candle_core::Device::Cpu);
    let model = Llava::from_var_builder(&vb, config, &WeightLayout::hub(), Mode::Infer)?;
    Ok(Engine::from_parts(
        Arc::new(model),
        Arc::new(processor),
        options,
    )?)
}

/// `n` distinct world test images as `data:` URLs.
fn world_images(n: usize) -> Result<Vec<String>> {
    use base64::Engine as _;
    (0..n as u64)
        .map(|i| {
            let ex = glance_world::sample(glance_world::Split::Test, i)?;
            let mut png = std::io::Cursor::new(Vec::new());
            image::DynamicImage::ImageRgb8(ex.image).write_to(&mut png, image::ImageFormat::Png)?;
            let b64 = base64::engine::general_purpose::STANDARD.encode(png.into_inner());
            Ok(format!("data:image/png;base64,{b64}"))
        })
        .collect()
}

/// `clients` threads, each sending `requests` streaming requests one after the other; client
/// `c` sends the `glance` options `options[c mod len]` (null: none). Each sample comes with the
/// index of its options.
pub(super) fn wave(
    addr: SocketAddr,
    images: &[String],
    options: &[Value],
    clients: usize,
    requests: usize,
    ask: (usize, bool),
) -> Result<Vec<(usize, Sample)>> {
    let results: Vec<Result<Vec<(usize, Sample)>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let image = &images[c % images.len()];
                let o = c % options.len();
                let glance = &options[o];
                scope.spawn(move || {
                    (0..requests)
                        .map(|r| stream_once(addr, image, c * requests + r, ask, glance))
                        .map(|s| s.map(|s| (o, s)))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("a client panicked")))
            .collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}

/// One streaming chat request over a fresh connection, timed at each SSE event; `glance` holds
/// the request's glance options (or is null).
pub(super) fn stream_once(
    addr: SocketAddr,
    image: &str,
    n: usize,
    (max_tokens, ignore_eos): (usize, bool),
    glance: &Value,
) -> Result<Sample> {
    let questions = [
        "Describe the image.",
        "What is in the image?",
        "What do you see?",
    ];
    let mut content = vec![json!({"type": "text", "text": questions[n % questions.len()]})];
    if !image.is_empty() {
        content.insert(0, json!({"type": "image_url", "image_url": {"url": image}}));
    }
    let mut body = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "ignore_eos": ignore_eos, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !glance.is_null() {
        body["glance"] = glance.clone();
    }
    let body = body.to_string();
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(600)))?;
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("HTTP/1.1 200") {
        // The error body (OpenAI's shape) says which field and why: show its message.
        let mut rest = String::new();
        let _ = reader.take(64 << 10).read_to_string(&mut rest);
        let body = rest.split("\r\n\r\n").nth(1).unwrap_or("");
        let message = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| body.trim().to_string());
        bail!("the server answered {}: {message}", line.trim());
    }
    let (mut first, mut last, mut tokens) = (None, None, 0);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data)?;
        if let Some(u) = v.get("usage").and_then(|u| u["completion_tokens"].as_u64()) {
            tokens = u as usize;
        }
        let content = v["choices"][0]["delta"]["content"].as_str();
        if content.is_some_and(|c| !c.is_empty()) {
            let now = start.elapsed().as_secs_f64();
            first.get_or_insert(now);
            last = Some(now);
        }
    }
    let end = start.elapsed().as_secs_f64();
    let ttft = first.unwrap_or(end);
    let tpot = (tokens > 1).then(|| (last.unwrap_or(end) - ttft) / (tokens - 1) as f64);
    Ok(Sample { ttft, tpot, tokens })
}

/// The `p`-th percentile (nearest rank); 0 for no samples.
pub(super) fn pct(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Throughput and TPOT p99 against clients, one line per (model, batching).
fn write_plots(json_path: &Path, rows: &[Value]) -> Result<Vec<String>> {
    let mut keys: Vec<(String, bool)> = Vec::new();
    for r in rows {
        let k = (
            r["model"].as_str().unwrap_or("").to_string(),
            r["batching"] == true,
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let series = |metric: &str, scale: f64| -> Vec<Series> {
        keys.iter()
            .map(|(m, b)| Series {
                name: format!("{m}, batching {}", if *b { "on" } else { "off" }),
                points: rows
                    .iter()
                    .filter(|r| r["model"] == m.as_str() && r["batching"] == *b)
                    .map(|r| {
                        let x = r["clients"].as_f64().unwrap_or(0.0);
                        (x, r[metric].as_f64().unwrap_or(f64::NAN) * scale)
                    })
                    .collect(),
            })
            .collect()
    };
    let ticks: Vec<(f64, String)> = [1, 2, 4, 8, 16, 32, 64]
        .iter()
        .filter(|&&c| rows.iter().any(|r| r["clients"] == c))
        .map(|&c| (c as f64, c.to_string()))
        .collect();
    let stem = json_path.with_extension("");
    let mut written = Vec::new();
    for (suffix, metric, scale, title, y) in [
        (
            "throughput",
            "tokens_per_s",
            1.0,
            "glance serve: aggregate throughput",
            "tokens/s",
        ),
        (
            "tpot",
            "tpot_p99_s",
            1e3,
            "glance serve: time per output token (p99)",
            "ms",
        ),
    ] {
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
