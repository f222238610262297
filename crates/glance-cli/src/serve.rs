//! `glance serve`: the OpenAI-compatible HTTP server (glance-serve) over one engine.

use crate::args::{DecodeArgs, ModelArgs, PruneArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_engine::messages::ImageSources;
use glance_engine::EngineOptions;
use glance_serve::openai::Defaults;
use glance_serve::ServerConfig;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the bound address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Name clients use in `model` (default: the model directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Generations running at once.
    #[arg(long, default_value_t = 4)]
    pub max_batch: usize,
    /// Requests waiting for a slot; beyond them new requests get 503.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Largest image accepted, in pixels (checked from the header before decoding; the default
    /// is 4096 x 4096).
    #[arg(long, default_value_t = 1 << 24)]
    pub max_image_pixels: u64,
    /// Most images in one request.
    #[arg(long, default_value_t = 8)]
    pub max_images_per_request: usize,
    /// Allow `file://` image URLs (and plain absolute paths) under this directory.
    #[arg(long, value_name = "DIR")]
    pub allow_local_files: Option<PathBuf>,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = 32 << 20)]
    pub max_body_bytes: usize,
    /// Milliseconds a client has to send its whole request body (408 after them).
    #[arg(long, default_value_t = 30_000)]
    pub body_timeout_ms: u64,
    /// Milliseconds a client has to send its request line and headers (the connection is
    /// closed after them; an idle keep-alive connection is closed after as long).
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Decode each request alone instead of batching the decode steps of all running requests.
    #[arg(long)]
    pub no_batching: bool,
    /// With batching: most prompt rows prefilled between two decode steps of the running
    /// requests (a long prompt delays their next token by at most one chunk).
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Default `max_tokens` of a request that gives none.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,
    /// Refuse requests with unknown top-level fields (400) instead of ignoring them with a
    /// warning and a `glance-ignored-fields` response header.
    #[arg(long)]
    pub strict: bool,
    /// Require `Authorization: Bearer KEY` on every route but /health and /metrics (default:
    /// $GLANCE_API_KEY, if set).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Request logs on stderr: `text` or `json` (one object per line). `RUST_LOG` filters them
    /// (e.g. `glance_serve=warn`; default `glance_serve=info`).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub log_format: String,
    /// Server-wide default pruning (a request's `glance.prune` overrides it).
    #[command(flatten)]
    pub prune: PruneArgs,
    /// Server-wide default decoding strategy (a request's `glance.decode` overrides it).
    #[command(flatten)]
    pub decode: DecodeArgs,
}

/// Validates every flag (the server's settings, the engine's options, the default strategy's
/// flags) before the model loads, then loads it, checks that it can run the default strategy
/// (a converted model for diffusion, the draft head for vispec / eagle) and serves.
pub fn run(args: ServeArgs) -> Result<()> {
    let json_logs = match args.log_format.as_str() {
        "text" => false,
        "json" => true,
        other => bail!("--log-format must be text or json, got `{other}`"),
    };
    let api_key = match args
        .api_key
        .clone()
        .or_else(|| std::env::var("GLANCE_API_KEY").ok())
    {
        Some(k) => Some(
            glance_serve::auth::ApiKey::new(&k).map_err(|e| anyhow::anyhow!("--api-key: {e}"))?,
        ),
        None => None,
    };
    let image_sources = match &args.allow_local_files {
        None => ImageSources::DataOnly,
        Some(dir) => {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("--allow-local-files {}", dir.display()))?;
            if !dir.is_dir() {
                bail!("--allow-local-files {} is not a directory", dir.display());
            }
            ImageSources::FilesUnder(dir)
        }
    };
    let defaults = Defaults {
        max_tokens: args.default_max_tokens,
        prune: args.prune.request_spec()?,
        decode: args.decode.server_spec()?,
        strict: args.strict,
    };
    let options = EngineOptions {
        max_image_pixels: args.max_image_pixels,
        max_images: args.max_images_per_request,
        ..args.decode.engine_options(EngineOptions::default())?
    };
    options.validate()?;
    // The model's name: a repo id for a Hugging Face model, else its directory's name.
    let located = args.model.locate()?;
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| located.name.clone());
    let config = ServerConfig {
        model_name: model_name.clone(),
        max_batch: args.max_batch,
        max_queue: args.max_queue,
        max_body_bytes: args.max_body_bytes,
        body_timeout: Duration::from_millis(args.body_timeout_ms),
        header_timeout: Duration::from_millis(args.header_timeout_ms),
        image_sources,
        defaults,
        batching: !args.no_batching,
        prefill_chunk: args.prefill_chunk,
        api_key,
    };
    config.validate()?;
    let (_, engine) = args.model.engine(options)?;
    // The default strategy must run on this model, and every --draft head must fit it: refused
    // now rather than on every request.
    engine.check_decode(&config.defaults.decode)?;
    for dir in &args.decode.draft {
        engine.set_draft(Arc::new(engine.read_draft(dir)?));
    }
    init_logs(json_logs);
    let addr = format!("{}:{}", args.host, args.port);
    glance_serve::serve_blocking(Arc::new(engine), config, &addr, |bound| {
        // Tests and scripts read the bound address from this line.
        println!("glance serve: `{model_name}` listening on http://{bound}");
        let _ = std::io::stdout().flush();
    })?;
    Ok(())
}

/// Request logs on stderr through `tracing` ([`glance_serve::log`]): `RUST_LOG` as a list of
/// `target=level` directives (default `glance_serve=info`), text or JSON lines.
fn init_logs(json: bool) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let default = Targets::new().with_target("glance_serve", LevelFilter::INFO);
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => s.parse::<Targets>().unwrap_or_else(|e| {
            eprintln!("glance serve: ignoring RUST_LOG={s:?} ({e}); logging glance_serve=info");
            default.clone()
        }),
        _ => default,
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    let _ = if json {
        registry.with(fmt.json().flatten_event(true)).try_init()
    } else {
        registry.with(fmt).try_init()
    };
}
