//! The SSE body of a streamed completion (chat or legacy): for every choice, one `data:` event per
//! text piece (with its tokens' log-probabilities when asked for), a final chunk with its finish
//! reason; once every choice has ended, the usage chunk when asked for, then `data: [DONE]`.
//! Dropping it (the client went away) drops the receiver, which cancels the generations.
//!
//! With tools (`tool_choice` other than `none`) a chat answer is held back where it may be a
//! call: with `auto`, its text streams up to a `<tool_call>` (or what may start one); a forced
//! call's whole answer is held. At the end, the rest of the content and the `tool_calls` (each
//! call whole, with its `index`) come as two deltas before the finish chunk.

use crate::chat::{Api, Msg};
use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::openai::{self, Ids, Shape};
use crate::tools::Choice;
use crate::App;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use glance_engine::TokenLogprob;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc;

pub(crate) struct SseStream {
    app: Arc<App>,
    ids: Ids,
    shape: Shape,
    pending: VecDeque<Bytes>,
    /// Per choice: log-probabilities of tokens whose text has not been sent yet.
    logprobs: Vec<Vec<TokenLogprob>>,
    /// Per choice: bytes of text sent so far (legacy `text_offset`).
    offsets: Vec<usize>,
    /// Per choice, with tools: the answer so far, and how many of its bytes were sent.
    held: Vec<String>,
    sent: Vec<usize>,
    finished: Vec<Option<Box<glance_engine::Response>>>,
    first: Option<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    done: bool,
    arrived: Instant,
}

impl SseStream {
    pub(crate) fn new(
        app: Arc<App>,
        ids: Ids,
        shape: Shape,
        first: Option<Msg>,
        rx: mpsc::UnboundedReceiver<Msg>,
        arrived: Instant,
    ) -> Self {
        let n = shape.choices;
        let mut s = Self {
            app,
            ids,
            pending: VecDeque::new(),
            logprobs: vec![Vec::new(); n],
            offsets: vec![0; n],
            held: vec![String::new(); n],
            sent: vec![0; n],
            finished: vec![None; n],
            first,
            rx,
            done: false,
            arrived,
            shape,
        };
        for i in 0..n {
            match s.shape.api {
                Api::Chat => s.event(i, json!({"role": "assistant", "content": ""}), None),
                // The echoed prompt comes first.
                Api::Completion => {
                    let echo = s.shape.echo.get(i).cloned().unwrap_or_default();
                    if !echo.is_empty() {
                        s.text(i, &echo, None);
                    }
                }
            }
        }
        s
    }

    /// The response: `text/event-stream`, not cached.
    pub(crate) fn into_response(self) -> Response {
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(self),
        )
            .into_response()
    }

    /// A chat chunk of choice `i` carrying the log-probabilities held for it.
    fn event(&mut self, i: usize, delta: Value, finish: Option<&str>) {
        let list = std::mem::take(&mut self.logprobs[i]);
        let logprobs = (self.shape.logprobs && !list.is_empty())
            .then(|| crate::logprobs::chat_logprobs(&self.app.engine, &list));
        let chunk = openai::chunk_json(
            &self.ids,
            i,
            delta,
            logprobs,
            finish,
            self.shape.include_usage,
        );
        self.data(&chunk.to_string());
    }

    /// A legacy chunk of choice `i`: `text`, with the log-probabilities held for it.
    fn text(&mut self, i: usize, text: &str, finish: Option<&str>) {
        let list = std::mem::take(&mut self.logprobs[i]);
        let logprobs = (self.shape.logprobs && !list.is_empty()).then(|| {
            crate::logprobs::completion_logprobs(&self.app.engine, &list, self.offsets[i])
        });
        self.offsets[i] += text.len();
        let chunk = crate::legacy::chunk_json(
            &self.ids,
            i,
            text,
            logprobs,
            finish,
            self.shape.include_usage,
        );
        self.data(&chunk.to_string());
    }

    fn piece(&mut self, i: usize, text: &str, finish: Option<&str>) {
        match self.shape.api {
            Api::Chat => {
                let delta = if finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                self.event(i, delta, finish)
            }
            Api::Completion => self.text(i, text, finish),
        }
    }

    /// Takes a piece of a held answer: with `tool_choice: "auto"`, sends what cannot be part of
    /// a call (everything before a `<tool_call>` or the start of one).
    fn hold(&mut self, i: usize, text: &str) {
        self.held[i].push_str(text);
        if self.shape.calls().is_some_and(|t| t.choice == Choice::Auto) {
            let upto = crate::tools::sendable(&self.held[i]);
            if upto > self.sent[i] {
                let piece = self.held[i][self.sent[i]..upto].to_string();
                self.sent[i] = upto;
                self.event(i, json!({"content": piece}), None);
            }
        }
    }

    /// Whether chat answers are held to their end (tools).
    fn holds(&self) -> bool {
        self.shape.api == Api::Chat && self.shape.calls().is_some()
    }

    fn data(&mut self, payload: &str) {
        self.pending
            .push_back(Bytes::from(format!("data: {payload}\n\n")));
    }

    fn on(&mut self, msg: Option<Msg>) {
        match msg {
            Some(Msg::Text(i, t)) if self.holds() => self.hold(i, &t),
            Some(Msg::Text(i, t)) => self.piece(i, &t, None),
            Some(Msg::Logprob(i, l)) => self.logprobs[i].push(l),
            Some(Msg::Done(i, r)) => {
                let mut finish = openai::finish_reason(r.finish_reason).unwrap_or("stop");
                if self.holds() {
                    let rest = r.text.get(self.sent[i]..).unwrap_or_default();
                    let (content, calls) =
                        crate::tools::answer_parts(&self.shape, rest, r.finish_reason);
                    if let Some(c) = content.filter(|c| !c.is_empty()) {
                        self.event(i, json!({"content": c}), None);
                    }
                    if !calls.is_empty() {
                        let mut calls = crate::tools::calls_json(&calls, &self.ids.id, i);
                        for (k, c) in calls.as_array_mut().into_iter().flatten().enumerate() {
                            c["index"] = json!(k);
                        }
                        self.event(i, json!({"tool_calls": calls}), None);
                        finish = "tool_calls";
                    }
                }
                self.piece(i, "", Some(finish));
                self.finished[i] = Some(r);
                if self.finished.iter().all(Option::is_some) {
                    let all: Vec<&glance_engine::Response> =
                        self.finished.iter().flatten().map(|r| r.as_ref()).collect();
                    crate::log::finished(&self.ids.id, &all, self.arrived);
                    if self.shape.include_usage {
                        let u = openai::usage_chunk_json(&self.ids, &all, &self.shape);
                        self.data(&u.to_string());
                    }
                    self.data("[DONE]");
                    self.done = true;
                }
            }
            Some(Msg::Failed(e)) => {
                self.app.metrics.outcome(if e.status.is_server_error() {
                    Outcome::Failed
                } else {
                    Outcome::Rejected
                });
                crate::log::failed(&self.ids.id, &e, self.arrived);
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
