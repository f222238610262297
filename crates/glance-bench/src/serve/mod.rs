//! `glance serve` under load (`glance bench serve`): a real server (in this process, on a
//! loopback port) under 1, 2, 4, 8 and 16 concurrent streaming clients, with continuous batching
//! and without it (each request decoding alone), on the model and on a random-weight ~134M text
//! shape. Reports aggregate generated tokens/s (and its ratio to one client), time to first
//! token and time per output token (p50 / p99) as the clients see them.
//!
//! The random shape keeps the model's vision tower, projector input and tokenizer and puts the
//! `llama-134m` decoder (12 layers, d768, its 32000-token LM head cut to the tokenizer's
//! vocabulary) behind them, so prompts and answers go through the same request path.
//!
//! With request kinds ([`mix`]): the one scheduler under a mixed workload.

pub mod client;
pub mod mix;

use crate::{bail_options, Context, Result};
use client::{pct, wave, Sample};
use glance_engine::messages::ImageSources;
use glance_engine::{DecodeSpec, Engine, EngineOptions, TwinShape, WeightFormat};
use glance_models::llava::{Llava, LlavaConfig, LlavaProcessor, WeightLayout};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_nn::Mode;
use glance_serve::openai::Defaults;
use glance_serve::ServerConfig;
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What `glance bench serve` measures.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The real model measured.
    pub model: PathBuf,
    /// The random-weight text shape measured beside it (`none` to skip).
    pub shape: String,
    /// Concurrent clients of each wave.
    pub clients: Vec<usize>,
    /// Requests each client sends, one after the other.
    pub requests: usize,
    /// `max_tokens` of every request.
    pub max_tokens: usize,
    /// Text-only prompts.
    pub no_image: bool,
    /// Every answer runs to `max_tokens`.
    pub ignore_eos: bool,
    /// With batching: most prompt rows prefilled between two decode steps.
    pub prefill_chunk: usize,
    /// Threads of the engine (`None`: one per core).
    pub threads: Option<usize>,
    /// The real model as its real-shape twin.
    pub twin: Option<TwinShape>,
    /// How the real model's text decoder weights are held.
    pub weights: WeightFormat,
    /// Request kinds of a mixed workload ([`mix::MixKind`] names; empty: the plain waves).
    pub mix: Vec<String>,
}

/// Most concurrent clients of one wave.
pub const MAX_CLIENTS: usize = 64;
/// Most requests each client sends.
pub const MAX_REQUESTS: usize = 1000;

impl ServeOptions {
    /// Checks every count (and the servers' settings) before anything loads or runs.
    pub fn validate(&self) -> Result<()> {
        if self.clients.is_empty()
            || self
                .clients
                .iter()
                .any(|&c| !(1..=MAX_CLIENTS).contains(&c))
        {
            bail_options!(
                "--clients takes counts in 1..={MAX_CLIENTS}, got {:?}",
                self.clients
            );
        }
        if !(1..=MAX_REQUESTS).contains(&self.requests) {
            bail_options!(
                "--requests (per client) must be in 1..={MAX_REQUESTS}, got {}",
                self.requests
            );
        }
        let most_tokens = glance_serve::openai::MAX_TOKENS_LIMIT;
        if !(2..=most_tokens as usize).contains(&self.max_tokens) {
            bail_options!(
                "--max-tokens must be in 2..={most_tokens} (the server's max_tokens limit), got {}",
                self.max_tokens
            );
        }
        // The servers' settings (the prefill chunk among them), as `glance serve` checks its own.
        server_config(self, true).validate()?;
        Ok(())
    }

    /// The real model's name in the report.
    fn model_name(&self) -> String {
        let mut name = self
            .model
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned());
        if let Some(shape) = &self.twin {
            name += &format!(" (twin {shape})");
        }
        if self.weights != WeightFormat::F32 {
            name += &format!(" {}", self.weights.name());
        }
        name
    }

    /// The images of the prompts: one per client of the largest wave, or none.
    fn images(&self) -> Result<Vec<String>> {
        if self.no_image {
            Ok(vec![String::new()])
        } else {
            world_images(self.clients.iter().copied().max().unwrap_or(1))
        }
    }
}

/// What the clients of one wave (or of one kind in it) saw: throughput and latency.
#[derive(Debug, Clone, Serialize)]
pub struct WaveFigures {
    pub requests: usize,
    pub tokens: usize,
    pub wall_s: f64,
    pub tokens_per_s: f64,
    /// Against one client alone (see the row for which).
    pub speedup_vs_one_client: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub tpot_p50_s: f64,
    pub tpot_p99_s: f64,
}

impl WaveFigures {
    /// The figures of `samples` answered in `wall_s` seconds; `one_client` is the rate to
    /// compare with (`None`: this rate, the first row of its series).
    pub fn new(samples: &[&Sample], wall_s: f64, one_client: Option<f64>) -> Self {
        let tokens: usize = samples.iter().map(|s| s.tokens).sum();
        let rate = tokens as f64 / wall_s;
        let ttft: Vec<f64> = samples.iter().map(|s| s.ttft).collect();
        let tpot: Vec<f64> = samples.iter().filter_map(|s| s.tpot).collect();
        Self {
            requests: samples.len(),
            tokens,
            wall_s,
            tokens_per_s: rate,
            speedup_vs_one_client: rate / one_client.unwrap_or(rate),
            ttft_p50_s: pct(&ttft, 50.0),
            ttft_p99_s: pct(&ttft, 99.0),
            tpot_p50_s: pct(&tpot, 50.0),
            tpot_p99_s: pct(&tpot, 99.0),
        }
    }
}

/// One wave as its clients saw it.
#[derive(Debug, Clone, Serialize)]
pub struct ServeRow {
    pub model: String,
    pub clients: usize,
    pub batching: bool,
    #[serde(flatten)]
    pub figures: WaveFigures,
}

/// What `glance bench serve` reports (the JSON it writes).
#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    pub bench: &'static str,
    pub threads: usize,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub requests_per_client: usize,
    pub rows: Vec<ServeRow>,
}

/// The report of either workload.
pub enum Outcome {
    Plain(ServeReport),
    Mix(mix::MixReport),
}

/// Checks the options, loads the model and runs the waves (or the mixed workload).
pub fn run(o: &ServeOptions, progress: &mut dyn crate::Progress) -> Result<Outcome> {
    o.validate()?;
    let options = EngineOptions {
        // Every request is a new conversation: no prefix reuse, so both modes prefill alike.
        prefix_cache_bytes: 0,
        ..EngineOptions::default().with_threads(o.threads)
    };
    let twin = options
        .clone()
        .with_weights(o.weights)
        .with_twin(o.twin.clone());
    let engine =
        Engine::load(&o.model, twin).with_context(|| format!("loading {}", o.model.display()))?;
    let name = o.model_name();
    if !o.mix.is_empty() {
        let images = o.images()?;
        return Ok(Outcome::Mix(mix::run(o, &name, Arc::new(engine), &images)?));
    }
    let mut models: Vec<(String, Arc<Engine>)> = vec![(name, Arc::new(engine))];
    if o.shape != "none" {
        progress.note(&format!(
            "building a random-weight `{}` decoder behind {}…",
            o.shape,
            o.model.display()
        ));
        models.push((
            format!("random {}", o.shape),
            Arc::new(random_shape(&o.model, &o.shape, options)?),
        ));
    }
    let images = o.images()?;
    let mut rows = Vec::new();
    for (name, engine) in &models {
        for batching in [true, false] {
            let server =
                glance_serve::spawn(engine.clone(), server_config(o, batching), "127.0.0.1:0")?;
            // One warm-up request (thread pools, allocator).
            let ask = (o.max_tokens, o.ignore_eos);
            let plain = [Value::Null];
            wave(server.addr, &images, &plain, 1, 1, ask)?;
            let mut single = None;
            for &c in &o.clients {
                let start = Instant::now();
                let samples: Vec<Sample> = wave(server.addr, &images, &plain, c, o.requests, ask)?
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect();
                let wall = start.elapsed().as_secs_f64();
                let figures = WaveFigures::new(&samples.iter().collect::<Vec<_>>(), wall, single);
                single.get_or_insert(figures.tokens_per_s);
                rows.push(ServeRow {
                    model: name.clone(),
                    clients: c,
                    batching,
                    figures,
                });
            }
            server.shutdown()?;
        }
    }
    Ok(Outcome::Plain(ServeReport {
        bench: "serve",
        threads: models[0].1.threads(),
        max_tokens: o.max_tokens,
        ignore_eos: o.ignore_eos,
        requests_per_client: o.requests,
        rows,
    }))
}

/// The server of a wave: room for the largest wave, images as data URLs only, greedy
/// autoregressive decoding unless a request says otherwise.
pub(crate) fn server_config(o: &ServeOptions, batching: bool) -> ServerConfig {
    let most = o.clients.iter().copied().max().unwrap_or(1);
    ServerConfig {
        model_name: "bench".into(),
        max_batch: most,
        max_queue: most,
        max_body_bytes: 32 << 20,
        body_timeout: Duration::from_secs(30),
        header_timeout: Duration::from_secs(30),
        image_sources: ImageSources::DataOnly,
        defaults: Defaults {
            max_tokens: o.max_tokens,
            prune: None,
            decode: DecodeSpec::Autoregressive,
            strict: false,
        },
        batching,
        prefill_chunk: o.prefill_chunk,
        api_key: None,
    }
}

/// glance-tiny's vision tower and tokenizer in front of a random-weight decoder of `shape`.
fn random_shape(tiny: &Path, shape: &str, options: EngineOptions) -> Result<Engine> {
    let mut config: Value = glance_models::checkpoint::read_json(&tiny.join("config.json"))?;
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
            image::DynamicImage::ImageRgb8(ex.image)
                .write_to(&mut png, image::ImageFormat::Png)
                .map_err(|e| crate::BenchError::Check(format!("encoding a world image: {e}")))?;
            let b64 = base64::engine::general_purpose::STANDARD.encode(png.into_inner());
            Ok(format!("data:image/png;base64,{b64}"))
        })
        .collect()
}
