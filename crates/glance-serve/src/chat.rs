//! `POST /v1/chat/completions`: take a place in the queue, read the body (size limit, read
//! timeout), translate it off the async runtime, then generate — in the continuous batch (prepared on
//! a blocking thread, decoded by the [`crate::batcher`] worker) or alone on a blocking thread —
//! and answer with one JSON object or an SSE stream of `chat.completion.chunk`s ending in
//! `data: [DONE]`.
//!
//! The generation streams [`Msg`]s over a channel; when the client goes away the receiver is
//! dropped, the next send fails and the engine's callback answers [`Flow::Cancel`], which ends
//! the generation and frees its slot.

use crate::batcher::Job;
use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};
use crate::openai::{self, ChatRequest, Ids, Shape};
use crate::App;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_core::Stream;
use glance_engine::{Engine, Event, FinishReason, Flow, Request};
use serde_json::json;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// What a running generation reports to its handler.
pub enum Msg {
    Text(String),
    /// One token's log-probabilities in the chat form ([`crate::logprobs::chat_entry`]).
    Logprob(serde_json::Value),
    Done(Box<glance_engine::Response>),
    Failed(ApiError),
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

pub async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let result = handle(&app, arrived, &headers, body).await;
    if let Err(e) = &result {
        app.metrics.outcome(match e.status {
            StatusCode::SERVICE_UNAVAILABLE => Outcome::Overloaded,
            s if s.is_server_error() => Outcome::Failed,
            _ => Outcome::Rejected,
        });
    }
    result
}

async fn handle(
    app: &Arc<App>,
    arrived: Instant,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // A place in the queue before the body is read: at most max_batch + max_queue bodies are in
    // memory at once, and a flood beyond them is refused (503) without reading theirs.
    let ticket = app.slots.admit()?;
    let bytes = read_body(
        body,
        headers,
        app.config.max_body_bytes,
        app.config.body_timeout,
    )
    .await?;
    let parse_app = app.clone();
    let (request, shape) = tokio::task::spawn_blocking(move || {
        let c = &parse_app.config;
        let max_images = parse_app.engine.options().max_images;
        ChatRequest::parse(&bytes)?.into_request(
            &c.model_name,
            &c.image_sources,
            max_images,
            &c.defaults,
        )
    })
    .await
    .map_err(|e| ApiError::internal(format!("request parsing failed: {e}")))??;
    let slot = ticket.slot().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let job_app = app.clone();
    match &app.batcher {
        Some(_) if Engine::batchable(&request) => {
            // Prepared here (images encoded off the batching thread), then decoded in the batch.
            tokio::task::spawn_blocking(move || match job_app.engine.prepare(&request) {
                // The client left while its images were encoded: nothing to decode.
                Ok(_) if tx.is_closed() => {
                    drop(slot);
                    job_app.metrics.outcome(Outcome::Cancelled);
                }
                Ok(prepared) => {
                    let batcher = job_app.batcher.as_ref().expect("checked");
                    batcher.submit(Job {
                        prepared,
                        tx,
                        arrived,
                        slot,
                    });
                }
                Err(e) => {
                    drop(slot);
                    let _ = tx.send(Msg::Failed(e.into()));
                }
            });
        }
        _ => {
            tokio::task::spawn_blocking(move || {
                let end = generate(&job_app, &request, arrived, &tx);
                // Free the slot before the answer goes out: a client that sends its next
                // request as soon as it has this one's answer finds the slot free.
                drop(slot);
                if let Some(end) = end {
                    let _ = tx.send(end);
                }
            });
        }
    }
    let ids = Ids {
        id: format!(
            "chatcmpl-{:x}{:08x}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: app.config.model_name.clone(),
    };
    if shape.stream {
        // Wait for the first message so that a request that fails before its first token (a
        // corrupt image, a prompt over the context) still gets its 4xx status.
        let first = rx.recv().await;
        if let Some(Msg::Failed(e)) = first {
            return Err(e);
        }
        let ignored = shape.ignored.clone();
        let stream = SseStream::new(ids, shape, first, rx, app.metrics.clone());
        return Ok(with_ignored(sse_response(stream), &ignored));
    }
    // The answer's text comes whole in `Done`; the pieces only show the client is still there.
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Text(_) | Msg::Logprob(_) => {}
            Msg::Done(r) => {
                let logprobs = shape.logprobs.then(|| {
                    let list = r.logprobs.as_deref().unwrap_or_default();
                    crate::logprobs::chat_logprobs(&app.engine, list)
                });
                let body = Json(openai::completion_json(&ids, &r, logprobs));
                return Ok(with_ignored(body.into_response(), &shape.ignored));
            }
            Msg::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the generation ended without an answer"))
}

/// Runs one generation on the current (blocking) thread, streaming its text through `tx`;
/// returns the final message (`None` when the client went away).
fn generate(
    app: &App,
    request: &Request,
    arrived: Instant,
    tx: &mpsc::UnboundedSender<Msg>,
) -> Option<Msg> {
    let mut first: Option<Instant> = None;
    let result = app.engine.generate(request, &mut |event| {
        let msg = match event {
            Event::Text(t) => {
                first.get_or_insert_with(Instant::now);
                Msg::Text(t.to_string())
            }
            Event::Logprob(l) => Msg::Logprob(crate::logprobs::chat_entry(&app.engine, l)),
        };
        match tx.send(msg) {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Cancel,
        }
    });
    conclude(&app.metrics, result, arrived, first)
}

/// Records a generation's metrics and turns its result into the final message (`None` for a
/// cancelled one: nobody is listening). Errors are counted where they are answered.
pub(crate) fn conclude(
    metrics: &Metrics,
    result: glance_core::Result<glance_engine::Response>,
    arrived: Instant,
    first: Option<Instant>,
) -> Option<Msg> {
    match result {
        Ok(r) => {
            if r.finish_reason == FinishReason::Cancelled {
                metrics.outcome(Outcome::Cancelled);
                return None;
            }
            let e2e = arrived.elapsed().as_secs_f64();
            let ttft = first.map_or(e2e, |f| (f - arrived).as_secs_f64());
            metrics.generation(&r, ttft, e2e);
            let reason = openai::finish_reason(r.finish_reason).unwrap_or("stop");
            metrics.outcome(Outcome::Finished(reason));
            Some(Msg::Done(Box::new(r)))
        }
        Err(e) => Some(Msg::Failed(ApiError::from(e))),
    }
}

/// Reads the whole body: over `limit` bytes is a 413 (from `Content-Length` before reading, or
/// while reading), not complete within `timeout` a 408.
async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<u8>, ApiError> {
    let too_large = || ApiError::too_large(format!("the request body is over {limit} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let read = async {
        // Grown as bytes arrive: a declared length alone reserves at most 1 MiB.
        let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(1 << 20) as usize);
        while let Some(chunk) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await
        {
            let chunk = chunk
                .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
            if buf.len() + chunk.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| {
        ApiError::timeout(format!(
            "the request body did not arrive within {:.1} s",
            timeout.as_secs_f64()
        ))
    })?
}

/// Names the ignored unknown fields of the request in the `glance-ignored-fields` header.
pub(crate) fn with_ignored(mut response: Response, ignored: &[String]) -> Response {
    if let Some(v) = (!ignored.is_empty())
        .then(|| header::HeaderValue::from_str(&ignored.join(", ")).ok())
        .flatten()
    {
        response.headers_mut().insert("glance-ignored-fields", v);
    }
    response
}

fn sse_response(stream: SseStream) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The SSE body: one `data:` event per text piece, the final chunk with the finish reason, the
/// usage chunk when asked for, then `data: [DONE]`. Dropping it (the client went away) drops the
/// receiver, which cancels the generation.
struct SseStream {
    ids: Ids,
    shape: Shape,
    pending: std::collections::VecDeque<Bytes>,
    /// Log-probabilities of tokens whose text has not been sent yet.
    logprobs: Vec<serde_json::Value>,
    first: Option<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    done: bool,
    metrics: Arc<Metrics>,
}

impl SseStream {
    fn new(
        ids: Ids,
        shape: Shape,
        first: Option<Msg>,
        rx: mpsc::UnboundedReceiver<Msg>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut s = Self {
            ids,
            shape,
            pending: Default::default(),
            logprobs: Vec::new(),
            first,
            rx,
            done: false,
            metrics,
        };
        s.event(json!({"role": "assistant", "content": ""}), None);
        s
    }

    fn event(&mut self, delta: serde_json::Value, finish: Option<&str>) {
        let logprobs = (self.shape.logprobs && !self.logprobs.is_empty())
            .then(|| json!({"content": std::mem::take(&mut self.logprobs)}));
        let chunk =
            openai::chunk_json(&self.ids, delta, logprobs, finish, self.shape.include_usage);
        self.data(&chunk.to_string());
    }

    fn data(&mut self, payload: &str) {
        self.pending
            .push_back(Bytes::from(format!("data: {payload}\n\n")));
    }

    fn on(&mut self, msg: Option<Msg>) {
        match msg {
            Some(Msg::Text(t)) => self.event(json!({"content": t}), None),
            Some(Msg::Logprob(l)) => self.logprobs.push(l),
            Some(Msg::Done(r)) => {
                let finish = openai::finish_reason(r.finish_reason).unwrap_or("stop");
                self.event(json!({}), Some(finish));
                if self.shape.include_usage {
                    let u = openai::usage_chunk_json(&self.ids, &r.usage, r.cache.cached_tokens());
                    self.data(&u.to_string());
                }
                self.data("[DONE]");
                self.done = true;
            }
            Some(Msg::Failed(e)) => {
                self.metrics.outcome(if e.status.is_server_error() {
                    Outcome::Failed
                } else {
                    Outcome::Rejected
                });
                self.data(&e.body().to_string());
                self.data("[DONE]");
                self.done = true;
            }
            None => {
                let e = ApiError::internal("the generation ended without an answer");
                self.data(&e.body().to_string());
                self.done = true;
            }
        }
    }
}

impl Stream for SseStream {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(first) = self.first.take() {
                self.on(Some(first));
                continue;
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(msg) => self.on(msg),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
