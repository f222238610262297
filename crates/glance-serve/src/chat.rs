//! `POST /v1/chat/completions` (and, through the same flow, `POST /v1/completions`:
//! [`crate::legacy`]): take a place in the queue, read the body (size limit, read timeout),
//! translate it off the async runtime into one engine request per choice, then generate — in the
//! continuous batch (prepared on blocking threads, decoded by the [`crate::batcher`] worker) or
//! one choice after the other on a blocking thread — and answer with one JSON object or an SSE
//! stream (`stream.rs`) ending in `data: [DONE]`.
//!
//! The generations stream [`Msg`]s over a channel; when the client goes away the receiver is
//! dropped, the next send fails and the engine's callback answers [`Flow::Cancel`], which ends
//! the generation and frees its slot (shared by a request's choices, freed with the last).

use crate::batcher::Job;
use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};
use crate::openai::{self, Ids};
use crate::slots::Slot;
use crate::stream::SseStream;
use crate::App;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_core::Stream;
use glance_engine::{Event, FinishReason, Flow, Prepared, Request, SharedPrefill, TokenLogprob};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What a running generation reports to its handler; the number is the choice's index.
pub enum Msg {
    Text(usize, String),
    Logprob(usize, TokenLogprob),
    Done(usize, Box<glance_engine::Response>),
    Failed(ApiError),
}

/// Which API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/completions` (legacy text completions: [`crate::legacy`]).
    Completion,
}

pub async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    serve(app, headers, body, Api::Chat).await
}

/// The flow of both completion APIs; counts and logs a refused or failed request.
pub(crate) async fn serve(
    app: Arc<App>,
    headers: HeaderMap,
    body: Body,
    api: Api,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let ids = Ids::new(api, &app.config.model_name);
    let result = handle(&app, &ids, arrived, &headers, body, api).await;
    if let Err(e) = &result {
        app.metrics.outcome(match e.status {
            StatusCode::SERVICE_UNAVAILABLE => Outcome::Overloaded,
            s if s.is_server_error() => Outcome::Failed,
            _ => Outcome::Rejected,
        });
        crate::log::failed(&ids.id, e, arrived);
    }
    result
}

async fn handle(
    app: &Arc<App>,
    ids: &Ids,
    arrived: Instant,
    headers: &HeaderMap,
    body: Body,
    api: Api,
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
    let (requests, shape) = tokio::task::spawn_blocking(move || match api {
        Api::Chat => openai::parse_chat(&parse_app, &bytes),
        Api::Completion => crate::legacy::parse(&parse_app, &bytes),
    })
    .await
    .map_err(|e| ApiError::internal(format!("request parsing failed: {e}")))??;
    crate::log::ignored(&ids.id, &shape.ignored);
    let slot = ticket.slot().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    dispatch(app, requests, slot, tx, arrived);
    if shape.stream {
        // Wait for the first message so that a request that fails before its first token (a
        // corrupt image, a prompt over the context) still gets its 4xx status.
        let first = rx.recv().await;
        if let Some(Msg::Failed(e)) = first {
            return Err(e);
        }
        let ignored = shape.ignored.clone();
        let stream = SseStream::new(app.clone(), ids.clone(), shape, first, rx, arrived);
        return Ok(with_ignored(stream.into_response(), &ignored));
    }
    // The answers' text comes whole in `Done`; the pieces only show the client is still there.
    let mut done: Vec<Option<Box<glance_engine::Response>>> = vec![None; shape.choices];
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Text(..) | Msg::Logprob(..) => {}
            Msg::Done(i, r) => {
                done[i] = Some(r);
                if done.iter().all(Option::is_some) {
                    let all: Vec<&glance_engine::Response> =
                        done.iter().flatten().map(|r| r.as_ref()).collect();
                    crate::log::finished(&ids.id, &all, arrived);
                    let body = match api {
                        Api::Chat => openai::completion_json(&app.engine, ids, &all, &shape),
                        Api::Completion => crate::legacy::body(&app.engine, ids, &all, &shape),
                    };
                    return Ok(with_ignored(Json(body).into_response(), &shape.ignored));
                }
            }
            Msg::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the generation ended without an answer"))
}

/// Starts the generations of a request's choices: in the continuous batch (each prepared on a
/// blocking thread, then decoded by the scheduling worker beside every other request), or with
/// batching off one after the other on one blocking thread. The slot is freed when the last one
/// ends.
fn dispatch(
    app: &Arc<App>,
    requests: Vec<Request>,
    slot: Slot,
    tx: mpsc::UnboundedSender<Msg>,
    arrived: Instant,
) {
    if app.batcher.is_some() {
        let slot = Arc::new(slot);
        // The choices share one prefill: the first computes it, the others fork it.
        let share = (requests.len() > 1).then(SharedPrefill::new);
        for (index, request) in requests.into_iter().enumerate() {
            let (app, tx, slot, share) = (app.clone(), tx.clone(), slot.clone(), share.clone());
            // Prepared here (images encoded off the batching thread), then decoded in the batch.
            tokio::task::spawn_blocking(move || {
                let prepared = app.engine.prepare(&request).map(|p| match &share {
                    Some(share) => p.share(share, index == 0),
                    None => p,
                });
                if let (Some(share), Err(e), 0) = (&share, &prepared, index) {
                    share.fail(&e.to_string());
                }
                dispatch_prepared(&app, prepared, index, tx, arrived, slot)
            });
        }
        return;
    }
    let app = app.clone();
    tokio::task::spawn_blocking(move || {
        let last = requests.len().saturating_sub(1);
        for (index, request) in requests.iter().enumerate() {
            let Some(end) = generate(&app, request, index, arrived, &tx) else {
                return;
            };
            let failed = matches!(end, Msg::Failed(_));
            if index == last || failed {
                // Free the slot before the answer goes out: a client that sends its next
                // request as soon as it has this one's answer finds the slot free.
                drop(slot);
                let _ = tx.send(end);
                return;
            }
            let _ = tx.send(end);
        }
    });
}

/// Hands a prepared choice to the scheduling worker, or answers its preparation's error.
fn dispatch_prepared(
    app: &App,
    prepared: glance_core::Result<Prepared>,
    index: usize,
    tx: mpsc::UnboundedSender<Msg>,
    arrived: Instant,
    slot: Arc<Slot>,
) {
    match prepared {
        // The client left while its images were encoded: nothing to decode.
        Ok(_) if tx.is_closed() => app.metrics.outcome(Outcome::Cancelled),
        Ok(prepared) => {
            let batcher = app.batcher.as_ref().expect("batching is on");
            batcher.submit(Job {
                prepared,
                index,
                tx,
                arrived,
                slot,
            });
        }
        Err(e) => {
            drop(slot);
            let _ = tx.send(Msg::Failed(e.into()));
        }
    }
}

/// Runs choice `index`'s generation on the current (blocking) thread, streaming its text through
/// `tx`; returns the final message (`None` when the client went away).
fn generate(
    app: &App,
    request: &Request,
    index: usize,
    arrived: Instant,
    tx: &mpsc::UnboundedSender<Msg>,
) -> Option<Msg> {
    let mut first: Option<Instant> = None;
    let result = app.engine.generate(request, &mut |event| {
        first.get_or_insert_with(Instant::now);
        match tx.send(message(index, event)) {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Cancel,
        }
    });
    conclude(&app.metrics, result, index, arrived, first)
}

/// An engine event of choice `index` as a message.
pub(crate) fn message(index: usize, event: Event) -> Msg {
    match event {
        Event::Text(t) => Msg::Text(index, t.to_string()),
        Event::Logprob(l) => Msg::Logprob(index, l.clone()),
    }
}

/// Records a generation's metrics and turns its result into the final message (`None` for a
/// cancelled one: nobody is listening). Errors are counted where they are answered.
pub(crate) fn conclude(
    metrics: &Metrics,
    result: glance_core::Result<glance_engine::Response>,
    index: usize,
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
            Some(Msg::Done(index, Box::new(r)))
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
