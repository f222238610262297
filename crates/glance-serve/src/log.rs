//! One structured log line per request through `tracing` (target `glance_serve::request`): id,
//! status, prompt / completion / cached tokens, strategy, time to first token and total time; a
//! warning for ignored unknown fields. `glance serve` installs the subscriber (`RUST_LOG`,
//! `--log-format json`).

use crate::error::ApiError;
use glance_engine::Response;
use std::time::Instant;

/// A request answered (streamed or not), with its choices' responses: tokens summed over them,
/// the first one's strategy and finish reason, the earliest first token.
pub fn finished(id: &str, all: &[&Response], arrived: Instant) {
    let Some(first) = all.first() else {
        return;
    };
    let sum = |f: fn(&Response) -> usize| all.iter().map(|r| f(r)).sum::<usize>();
    let ttft = all
        .iter()
        .map(|r| r.timings.time_to_first_token_s)
        .fold(f64::INFINITY, f64::min);
    tracing::info!(
        target: "glance_serve::request",
        id,
        status = 200u16,
        choices = all.len(),
        prompt_tokens = first.usage.prompt_tokens,
        completion_tokens = sum(|r| r.usage.completion_tokens),
        cached_tokens = first.cache.cached_tokens(),
        strategy = first.decode.strategy.as_str(),
        finish = crate::openai::finish_reason(first.finish_reason).unwrap_or("cancelled"),
        ttft_s = ttft,
        total_s = arrived.elapsed().as_secs_f64(),
        "request finished"
    );
}

/// A request refused (4xx, and 503 for overload: a warning) or failed (an error).
pub fn failed(id: &str, e: &ApiError, arrived: Instant) {
    let status = e.status.as_u16();
    let total_s = arrived.elapsed().as_secs_f64();
    let message = e.message.as_str();
    if e.status.is_server_error() && e.status.as_u16() != 503 {
        tracing::error!(target: "glance_serve::request", id, status, total_s, message, "request failed");
    } else if status == 503 {
        tracing::warn!(target: "glance_serve::request", id, status, total_s, message, "request refused");
    } else {
        tracing::info!(target: "glance_serve::request", id, status, total_s, message, "request refused");
    }
}

/// Unknown top-level fields a request carried, ignored.
pub fn ignored(id: &str, fields: &[String]) {
    if !fields.is_empty() {
        tracing::warn!(
            target: "glance_serve::request",
            id,
            fields = fields.join(", ").as_str(),
            "ignored unknown request fields"
        );
    }
}
