//! `POST /v1/completions`: legacy text completions. `prompt` is a string or a list of strings
//! (each its own choices), used as raw text (no chat template); `echo` puts the prompt before
//! each answer; `logprobs: N` returns the tokens' log-probabilities and `N` alternatives in the
//! legacy form ([`crate::logprobs::completion_logprobs`]); `suffix` (insertion) is refused.
//!
//! Every other field means what it means on chat completions: the body is translated by the same
//! code ([`crate::openai::ChatRequest::translate`]), after the legacy fields are taken out.

use crate::chat::Api;
use crate::error::ApiError;
use crate::openai::{self, ChatRequest, Ids, Shape};
use crate::App;
use glance_engine::{Engine, Prompt, Response};
use serde_json::{json, Value};

/// OpenAI's default `max_tokens` of a legacy completion.
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// Parses and translates a legacy body (on a blocking thread).
pub fn parse(app: &App, body: &[u8]) -> Result<(Vec<glance_engine::Request>, Shape), ApiError> {
    let mut fields = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(f)) => f,
        Ok(_) => {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ))
        }
        Err(e) => return Err(ApiError::bad_request(format!("invalid request body: {e}"))),
    };
    let prompts: Vec<String> = match fields.remove("prompt") {
        Some(Value::String(p)) => vec![p],
        Some(Value::Array(list)) if !list.is_empty() => list
            .into_iter()
            .map(|p| match p {
                Value::String(s) => Ok(s),
                other => Err(ApiError::bad_param(
                    "prompt",
                    format!(
                        "prompt must be a string or a list of strings (token-id prompts are not \
                         supported), got an element {other}"
                    ),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::bad_param(
                "prompt",
                format!("prompt must be a string or a non-empty list of strings, got {other}"),
            ))
        }
        None => return Err(ApiError::bad_param("prompt", "prompt is required")),
    };
    match fields.remove("suffix") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(_) => {
            return Err(ApiError::bad_param(
                "suffix",
                "suffix (text insertion) is not supported by glance: send the text before the \
                 insertion point as the prompt",
            ))
        }
    }
    let echo = match fields.remove("echo") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(ApiError::bad_param(
                "echo",
                format!("echo must be a boolean, got {other}"),
            ))
        }
    };
    match fields.remove("best_of") {
        None | Some(Value::Null) => {}
        Some(b) if b == json!(1) || Some(&b) == fields.get("n") => {}
        Some(_) => {
            return Err(ApiError::bad_param(
                "best_of",
                "best_of other than 1 (or n) is not supported by glance",
            ))
        }
    }
    // The legacy `logprobs` is the number of alternatives.
    match fields.remove("logprobs") {
        None | Some(Value::Null) => {}
        Some(Value::Number(k)) => {
            fields.insert("logprobs".into(), json!(true));
            fields.insert("top_logprobs".into(), Value::Number(k));
        }
        Some(other) => {
            return Err(ApiError::bad_param(
                "logprobs",
                format!("logprobs must be a number of alternatives (0 to 20), got {other}"),
            ))
        }
    }
    for chat_only in [
        "messages",
        "continue_final_message",
        "add_generation_prompt",
        "tools",
        "tool_choice",
    ] {
        if fields.contains_key(chat_only) {
            return Err(ApiError::bad_param(
                chat_only,
                format!("`{chat_only}` belongs to /v1/chat/completions"),
            ));
        }
    }
    fields
        .entry("max_tokens")
        .or_insert(json!(DEFAULT_MAX_TOKENS));
    fields.insert("messages".into(), Value::Null);
    let body = serde_json::to_vec(&Value::Object(fields))
        .map_err(|e| ApiError::internal(format!("re-encoding the request: {e}")))?;
    let c = &app.config;
    let texts = prompts.clone();
    let mut request = ChatRequest::parse(&body)?;
    request.check_json_output(&app.engine)?;
    let (requests, mut shape) = request.translate(&c.model_name, &c.defaults, move |_| {
        Ok(texts
            .into_iter()
            .map(|text| {
                let prompt = Prompt::Raw {
                    text,
                    images: Vec::new(),
                };
                (prompt, false)
            })
            .collect())
    })?;
    shape.api = Api::Completion;
    if echo {
        shape.echo = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), shape.n))
            .collect();
    }
    Ok((requests, shape))
}

/// The non-streaming answer.
pub fn body(engine: &Engine, ids: &Ids, all: &[&Response], shape: &Shape) -> Value {
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let echo = shape.echo.get(i).map_or("", String::as_str);
            let logprobs = shape.logprobs.then(|| {
                let list = r.logprobs.as_deref().unwrap_or_default();
                crate::logprobs::completion_logprobs(engine, list, echo.len())
            });
            json!({
                "index": i,
                "text": format!("{echo}{}", r.text),
                "logprobs": logprobs,
                "finish_reason": openai::finish_reason(r.finish_reason),
            })
        })
        .collect();
    json!({
        "id": ids.id,
        "object": "text_completion",
        "created": ids.created,
        "model": ids.model,
        "choices": choices,
        "usage": openai::total_usage(all, shape.n),
    })
}

/// One streamed chunk of choice `index`.
pub fn chunk_json(
    ids: &Ids,
    index: usize,
    text: &str,
    logprobs: Option<Value>,
    finish: Option<&str>,
    include_usage: bool,
) -> Value {
    let choice =
        json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish});
    openai::chunk_envelope(ids, "text_completion", choice, include_usage)
}

pub async fn completions(
    axum::extract::State(app): axum::extract::State<std::sync::Arc<App>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<axum::response::Response, ApiError> {
    crate::chat::serve(app, headers, body, Api::Completion).await
}
