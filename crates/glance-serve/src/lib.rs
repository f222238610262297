//! glance's OpenAI-compatible HTTP server (`glance serve`), on axum and tokio.
//!
//! Routes: `POST /v1/chat/completions` and `POST /v1/completions` (JSON or SSE streaming),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), and the chat page at
//! `GET /` with its own routes ([`page`]); with an API key ([`auth`]) every route but `/health`,
//! `/metrics` and the page's static files requires it. One log line per request ([`log`]). Every generation runs on a
//! blocking thread, never on the async runtime; at most `max_batch` run at once and at most
//! `max_queue` wait ([`slots`]); a client that disconnects cancels its generation. Plain
//! autoregressive requests are decoded together by one continuous-batching worker
//! ([`batcher`]); speculative and pruned ones alone. Bad input is a 4xx with an OpenAI-style
//! error body ([`error`]); the server keeps serving.

pub mod auth;
pub mod batcher;
pub mod chat;
pub mod error;
pub mod legacy;
pub mod log;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod page;
pub mod slots;
mod stream;
pub mod structured;
pub mod tools;

use crate::batcher::Batcher;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::Defaults;
use crate::slots::Slots;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use glance_engine::messages::ImageSources;
use glance_engine::Engine;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients put in `model` (the model directory's name by default).
    pub model_name: String,
    /// Generations running at once.
    pub max_batch: usize,
    /// Requests waiting for a slot before new ones get 503.
    pub max_queue: usize,
    /// Largest request body, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Time a client has to send its whole body (408 after it).
    pub body_timeout: Duration,
    /// Where image parts may come from (`data:` URLs, files under `--allow-local-files`).
    pub image_sources: ImageSources,
    /// What a request does not say.
    pub defaults: Defaults,
    /// One scheduler steps every running request in shared target passes (off: each request
    /// decodes alone, one after the other in its slot).
    pub batching: bool,
    /// With batching: most prompt rows prefilled between two decode steps of the batch.
    pub prefill_chunk: usize,
    /// Time a client has to send its request line and headers (the connection is closed after).
    pub header_timeout: Duration,
    /// Required as `Authorization: Bearer KEY` on every route but `/health` and `/metrics`.
    pub api_key: Option<auth::ApiKey>,
}

/// The most generations a server runs at once (`--max-batch`): each holds a blocking thread and
/// a KV cache.
pub const MAX_BATCH_LIMIT: usize = 256;
/// The most requests that may wait for a slot (`--max-queue`).
pub const MAX_QUEUE_LIMIT: usize = 65_536;
/// The largest request body a server may accept (`--max-body-bytes`): 1 GiB.
pub const MAX_BODY_LIMIT: usize = 1 << 30;
/// The longest header or body timeout (`--header-timeout-ms`, `--body-timeout-ms`): one hour.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The largest prefill chunk (`--prefill-chunk`), in prompt rows.
pub const MAX_PREFILL_CHUNK: usize = 1 << 16;

impl ServerConfig {
    /// Checks every setting against its range; each refusal names the `glance serve` flag, the
    /// range and the value. [`App::new`] runs it, and `glance serve` before it loads the model.
    pub fn validate(&self) -> Result<(), ServeError> {
        let range = |flag: &str, v: u128, lo: u128, hi: u128| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(ServeError::Config(format!(
                    "{flag} must be in {lo}..={hi}, got {v}"
                )))
            }
        };
        if self.model_name.trim().is_empty() {
            return Err(ServeError::Config(
                "--served-model-name must not be empty".into(),
            ));
        }
        range(
            "--max-batch",
            self.max_batch as u128,
            1,
            MAX_BATCH_LIMIT as u128,
        )?;
        range(
            "--max-queue",
            self.max_queue as u128,
            0,
            MAX_QUEUE_LIMIT as u128,
        )?;
        range(
            "--max-body-bytes",
            self.max_body_bytes as u128,
            1,
            MAX_BODY_LIMIT as u128,
        )?;
        let most = MAX_TIMEOUT.as_millis();
        range("--body-timeout-ms", self.body_timeout.as_millis(), 1, most)?;
        range(
            "--header-timeout-ms",
            self.header_timeout.as_millis(),
            1,
            most,
        )?;
        range(
            "--prefill-chunk",
            self.prefill_chunk as u128,
            1,
            MAX_PREFILL_CHUNK as u128,
        )?;
        range(
            "--default-max-tokens",
            self.defaults.max_tokens as u128,
            1,
            openai::MAX_TOKENS_LIMIT as u128,
        )?;
        Ok(())
    }
}

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {cause}")]
    Bind { addr: String, cause: std::io::Error },
    #[error("invalid server setting: {0}")]
    Config(String),
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What every handler shares.
pub struct App {
    pub engine: Arc<Engine>,
    pub config: ServerConfig,
    pub metrics: Arc<Metrics>,
    pub slots: Arc<Slots>,
    /// The continuous-batching worker (`None` with batching off).
    pub batcher: Option<Batcher>,
}

impl App {
    pub fn new(engine: Arc<Engine>, config: ServerConfig) -> Result<Arc<Self>, ServeError> {
        config.validate()?;
        let metrics = Arc::new(Metrics::new(&config.model_name));
        let slots = Arc::new(Slots::new(
            config.max_batch,
            config.max_queue,
            metrics.clone(),
        ));
        let batcher = if config.batching {
            Some(Batcher::start(
                engine.clone(),
                metrics.clone(),
                config.prefill_chunk,
            )?)
        } else {
            None
        };
        Ok(Arc::new(Self {
            engine,
            config,
            metrics,
            slots,
            batcher,
        }))
    }
}

/// The routes: the API behind the key check ([`auth`]), health and metrics open.
pub fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/completions", post(legacy::completions))
        .route("/v1/models", get(models))
        .route("/glance/info", get(page::info))
        .route("/glance/world/sample", get(page::world_sample))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::require_key,
        ));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/", get(page::index))
        .route("/page.js", get(page::script))
        .fallback(not_found)
        .with_state(app)
}

async fn models(State(app): State<Arc<App>>) -> impl IntoResponse {
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "glance",
        }],
    }))
}

async fn health(State(app): State<Arc<App>>) -> impl IntoResponse {
    use std::sync::atomic::Ordering;
    Json(json!({
        "status": "ok",
        "model": app.config.model_name,
        "running": app.metrics.running.load(Ordering::Relaxed),
        "waiting": app.metrics.waiting.load(Ordering::Relaxed),
        "max_batch": app.config.max_batch,
        "max_queue": app.config.max_queue,
    }))
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
}

async fn not_found() -> ApiError {
    ApiError::not_found(
        "no such route: the API has POST /v1/chat/completions, POST /v1/completions, \
         GET /v1/models, GET /health, GET /metrics, and the page at GET / (with GET /glance/info \
         and GET /glance/world/sample)",
        "not_found",
    )
}

/// Binds `addr` (port 0 picks a free port), calls `on_bound` with the bound address, and serves
/// until the process ends. Builds its own tokio runtime; the calling thread blocks.
pub fn serve_blocking(
    engine: Arc<Engine>,
    config: ServerConfig,
    addr: &str,
    on_bound: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let (_keep, stop) = tokio::sync::oneshot::channel::<()>();
    run(engine, config, addr, on_bound, stop)
}

/// A server running on its own thread (benchmarks, embedding); [`ServerHandle::shutdown`] stops
/// it (open connections end with its runtime).
pub struct ServerHandle {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), ServeError>>,
}

impl ServerHandle {
    /// Stops accepting connections and joins the server thread; connections still open are
    /// dropped with its runtime.
    pub fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .unwrap_or_else(|_| Err(ServeError::Config("the server thread panicked".into())))
    }
}

/// Starts a server on a thread of its own and returns once it listens.
pub fn spawn(
    engine: Arc<Engine>,
    config: ServerConfig,
    addr: &str,
) -> Result<ServerHandle, ServeError> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let addr = addr.to_string();
    let thread = std::thread::Builder::new()
        .name("glance-serve".into())
        .spawn(move || {
            run(
                engine,
                config,
                &addr,
                |a| {
                    let _ = bound_tx.send(a);
                },
                stopped,
            )
        })?;
    match bound_rx.recv() {
        Ok(addr) => Ok(ServerHandle { addr, stop, thread }),
        // The thread ended before binding: its error says why.
        Err(_) => Err(thread
            .join()
            .unwrap_or_else(|_| Err(ServeError::Config("the server thread panicked".into())))
            .err()
            .unwrap_or_else(|| ServeError::Config("the server stopped before listening".into()))),
    }
}

fn run(
    engine: Arc<Engine>,
    config: ServerConfig,
    addr: &str,
    on_bound: impl FnOnce(SocketAddr),
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), ServeError> {
    let app = App::new(engine, config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("glance-http")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|cause| ServeError::Bind {
                    addr: addr.to_string(),
                    cause,
                })?;
        on_bound(listener.local_addr()?);
        let header_timeout = app.config.header_timeout;
        let routes = router(app);
        let mut stop = std::pin::pin!(stop);
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    // A refused or reset connection (or too many open files) ends only itself.
                    Err(_) => continue,
                },
                _ = &mut stop => break,
            };
            let service = hyper_util::service::TowerToHyperService::new(routes.clone());
            tokio::spawn(async move {
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(header_timeout);
                let io = hyper_util::rt::TokioIo::new(stream);
                // A connection error (the client went away, a header timeout) ends only it.
                let _ = http.serve_connection(io, service).await;
            });
        }
        Ok(())
    })
}
