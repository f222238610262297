//! The OpenAI chat-completions request (parsed strictly: an unknown field is a 400) and its
//! translation into the engine's [`Request`]; the response and stream-chunk bodies.
//!
//! Fields OpenAI clients send that glance has no use for are accepted at their neutral values
//! (`logprobs: false`, `frequency_penalty: 0`, `n: 1`, …) and refused with a clear message
//! otherwise. glance's own per-request options travel under `"glance"`:
//! `{"prune": {"policy": "adaptive", "keep": 0.125}, "decode": "vispec"}`.

use crate::error::ApiError;
use glance_core::SamplingParams;
use glance_engine::messages::{parse_messages, ImageSources};
use glance_engine::{
    Budget, DecodeSpec, DiffusionOptions, DiffusionSettings, FinishReason, OptionNames, Policy,
    Prompt, PruneSpec, Request, Response, Usage,
};
use serde::Deserialize;
use serde_json::{json, Value};

/// The most tokens one request may ask for.
pub const MAX_TOKENS_LIMIT: u64 = 1 << 20;

/// `POST /v1/chat/completions` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Value,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI's, but vLLM's and llama.cpp's.
    pub top_k: Option<usize>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    // Accepted at their neutral values only.
    pub user: Option<String>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub store: Option<bool>,
    pub metadata: Option<serde_json::Map<String, Value>>,
    pub service_tier: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub glance: Option<GlanceOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// A stop string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// glance's per-request options.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlanceOptions {
    pub prune: Option<PruneOptions>,
    /// `ar`, `vispec`, `eagle`, or on a converted model `diffusion-threshold`,
    /// `diffusion-linear`, `diffusion-quadratic`.
    pub decode: Option<String>,
    /// Block diffusion: tokens per block (1 to 64).
    pub block: Option<usize>,
    /// diffusion-threshold: the confidence τ that unmasks a slot.
    pub threshold: Option<f32>,
    /// Block diffusion: grow and shrink the block with acceptance.
    pub dynamic_block: Option<bool>,
}

impl GlanceOptions {
    /// The block-diffusion settings the request gives `decode` (`None`: the server's); an option
    /// that does not apply to `decode` is a 400 naming both.
    fn diffusion(&self, decode: DecodeSpec) -> Result<Option<DiffusionSettings>, ApiError> {
        let options = DiffusionOptions {
            block: self.block,
            threshold: self.threshold,
            dynamic: self.dynamic_block.unwrap_or(false),
        };
        options
            .settings_for(decode, &OptionNames::REQUEST)
            .map_err(|e| {
                let param = if self.threshold.is_some() && self.block.is_none() {
                    "glance.threshold"
                } else {
                    "glance.block"
                };
                ApiError::bad_param(param, e.to_string())
            })
    }
}

/// Visual-token pruning, as `glance run --prune … --keep …`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneOptions {
    /// none, random, pool, saliency, text, mix, adaptive, fastv or hier (default `adaptive`).
    pub policy: Option<String>,
    /// A ratio (0.25), a percentage ("25%") or a count (64); default 25%.
    pub keep: Option<Value>,
    pub tau: Option<f32>,
    /// FastV's pruning layer.
    pub layer: Option<usize>,
}

/// Server-wide defaults for what a request does not say.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub max_tokens: usize,
    pub prune: Option<PruneSpec>,
    pub decode: DecodeSpec,
}

/// What the handler needs besides the engine request.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub stream: bool,
    pub include_usage: bool,
}

impl ChatRequest {
    /// Parses a body: invalid JSON, a wrong type and an unknown field are 400s, naming the
    /// top-level field at fault when there is one.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        serde_json::from_slice(body).map_err(|e| match Self::field_at_fault(body) {
            Some(field) => {
                ApiError::bad_param(&field, format!("invalid request body: `{field}`: {e}"))
            }
            None => ApiError::bad_request(format!("invalid request body: {e}")),
        })
    }

    /// The first top-level field of a body that parses as a JSON object whose value alone does
    /// not deserialize (serde's message gives the line and column, not the field). Only run on a
    /// body already refused.
    fn field_at_fault(body: &[u8]) -> Option<String> {
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        fields.into_iter().find_map(|(name, value)| {
            let mut probe = serde_json::Map::new();
            probe.insert("messages".into(), Value::Array(Vec::new()));
            probe.insert(name.clone(), value);
            serde_json::from_value::<ChatRequest>(Value::Object(probe))
                .is_err()
                .then_some(name)
        })
    }

    /// The engine request, with at most `max_images` images (counted before any is read)
    /// resolved under `sources`.
    pub fn into_request(
        self,
        served: &str,
        sources: &ImageSources,
        max_images: usize,
        defaults: &Defaults,
    ) -> Result<(Request, Shape), ApiError> {
        if let Some(m) = self.model.as_deref() {
            if m != served {
                return Err(ApiError::not_found(
                    format!("the model `{m}` does not exist; this server serves `{served}`"),
                    "model_not_found",
                ));
            }
        }
        self.check_neutral()?;
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::bad_param(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => defaults.max_tokens as u64,
        };
        if max_tokens == 0 || max_tokens > MAX_TOKENS_LIMIT {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!("max_tokens must be between 1 and {MAX_TOKENS_LIMIT}, got {max_tokens}"),
            ));
        }
        let seed = match self.seed {
            Some(s) if s < 0 => {
                return Err(ApiError::bad_param("seed", "seed must be >= 0"));
            }
            Some(s) => s as u64,
            // No seed: every sampled request draws differently, as OpenAI's do.
            None => fresh_seed(),
        };
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            seed,
        };
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        let (prune, decode) = match &self.glance {
            None => (defaults.prune.clone(), defaults.decode),
            Some(g) => (
                match &g.prune {
                    None => defaults.prune.clone(),
                    Some(p) => p.spec()?,
                },
                match &g.decode {
                    None => defaults.decode,
                    Some(d) => d
                        .parse::<DecodeSpec>()
                        .map_err(|e| ApiError::bad_param("glance.decode", e.to_string()))?,
                },
            ),
        };
        let diffusion = match &self.glance {
            Some(g) => g.diffusion(decode)?,
            None => None,
        };
        let messages = parse_messages(&self.messages, sources, max_images)
            .map_err(|e| ApiError::from(e).with_param("messages"))?;
        let request = Request {
            diffusion,
            sampling,
            max_new_tokens: max_tokens as usize,
            stop,
            prune,
            decode,
            ..Request::new(Prompt::Chat(messages))
        };
        request.validate().map_err(ApiError::from)?;
        Ok((
            request,
            Shape {
                stream,
                include_usage,
            },
        ))
    }

    /// Refuses any non-neutral value of a field glance does not implement.
    fn check_neutral(&self) -> Result<(), ApiError> {
        let refuse = |param: &str, what: &str| {
            Err(ApiError::bad_param(
                param,
                format!("{param}: {what} is not supported by glance"),
            ))
        };
        if self.n.is_some_and(|n| n != 1) {
            return refuse("n", "a number of choices other than 1");
        }
        if self.logprobs == Some(true) || self.top_logprobs.is_some_and(|n| n > 0) {
            return refuse("logprobs", "returning log-probabilities");
        }
        if self.frequency_penalty.is_some_and(|p| p != 0.0) {
            return refuse("frequency_penalty", "a non-zero penalty");
        }
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            return refuse("presence_penalty", "a non-zero penalty");
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return refuse("logit_bias", "a logit bias");
        }
        if let Some(f) = &self.response_format {
            if f.get("type").and_then(Value::as_str) != Some("text") {
                return refuse(
                    "response_format",
                    "a format other than {\"type\": \"text\"}",
                );
            }
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return refuse("tools", "tool calling");
        }
        if let Some(c) = &self.tool_choice {
            if !(c.is_null() || c.as_str() == Some("none") || c.as_str() == Some("auto")) {
                return refuse("tool_choice", "forcing a tool");
            }
        }
        if self.store == Some(true) {
            return refuse("store", "storing completions");
        }
        if let Some(m) = &self.modalities {
            if m.iter().any(|m| m != "text") {
                return refuse("modalities", "output other than text");
            }
        }
        Ok(())
    }
}

/// A seed that differs from call to call (clock and a counter, mixed).
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos
        ^ CALLS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl PruneOptions {
    /// The pruning spec; `None` when it changes nothing.
    fn spec(&self) -> Result<Option<PruneSpec>, ApiError> {
        let bad = |e: glance_core::Error| ApiError::bad_param("glance.prune", e.to_string());
        let policy = match &self.policy {
            Some(p) => p.parse::<Policy>().map_err(bad)?,
            None => Policy::Adaptive,
        };
        let budget = match &self.keep {
            None => Budget::Ratio(0.25),
            Some(Value::Number(n)) => n.to_string().parse::<Budget>().map_err(bad)?,
            Some(Value::String(s)) => s.parse::<Budget>().map_err(bad)?,
            Some(other) => {
                return Err(ApiError::bad_param(
                    "glance.prune.keep",
                    format!("keep must be a number or a string such as \"25%\", got {other}"),
                ))
            }
        };
        let mut spec = PruneSpec::new(policy, budget);
        if let Some(t) = self.tau {
            spec.tau = t;
        }
        if let Some(l) = self.layer {
            if policy != Policy::FastV {
                return Err(ApiError::bad_param(
                    "glance.prune.layer",
                    "layer only applies to the fastv policy",
                ));
            }
            spec.fastv_layer = Some(l);
        }
        spec.validate().map_err(bad)?;
        Ok((!spec.is_noop()).then_some(spec))
    }
}

/// OpenAI's finish reason (`None` for a cancelled generation, which no client sees).
pub fn finish_reason(f: FinishReason) -> Option<&'static str> {
    match f {
        FinishReason::Eos | FinishReason::Stop => Some("stop"),
        FinishReason::Length => Some("length"),
        FinishReason::Cancelled => None,
    }
}

/// The `usage` object, with glance's visual-token counts beside OpenAI's.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "visual_tokens": u.visual_tokens,
        "kept_visual_tokens": u.kept_visual_tokens,
    })
}

/// glance's own usage block, `usage.glance`: what the accelerators did — the strategy, its
/// target passes and the tokens each step emitted (`tokens_per_step`, with `token_ends` placing
/// each token in the answer's text, in characters), the patches each image kept after pruning
/// (`kept_patches`, per image: its grid and the kept indices; empty when nothing was pruned),
/// and the time to first token and decode speed.
pub fn glance_usage_json(r: &Response) -> Value {
    json!({
        "strategy": r.decode.strategy,
        "forward_passes": r.decode.forward_passes,
        "tokens_per_step": r.decode.tokens_per_step,
        "token_ends": r.token_ends,
        "kept_patches": r.kept_patches,
        "time_to_first_token_s": r.timings.time_to_first_token_s,
        "decode_tokens_per_s": r.timings.decode_tokens_per_s,
    })
}

/// Identity of one completion: id, creation time, model name.
#[derive(Debug, Clone)]
pub struct Ids {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// The non-streaming answer.
pub fn completion_json(ids: &Ids, r: &Response) -> Value {
    let mut c = json!({
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": r.text},
            "logprobs": null,
            "finish_reason": finish_reason(r.finish_reason),
        }],
        "usage": usage_json(&r.usage),
    });
    c["usage"]["glance"] = glance_usage_json(r);
    c
}

/// One `chat.completion.chunk`; `usage` is `null` on every chunk but the last when usage was
/// asked for, and absent otherwise.
pub fn chunk_json(ids: &Ids, delta: Value, finish: Option<&str>, include_usage: bool) -> Value {
    let mut c = json!({
        "id": ids.id,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    });
    if include_usage {
        c["usage"] = Value::Null;
    }
    c
}

/// The final usage chunk of a stream with `include_usage` (no choices).
pub fn usage_chunk_json(ids: &Ids, u: &Usage) -> Value {
    json!({
        "id": ids.id,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": ids.model,
        "choices": [],
        "usage": usage_json(u),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            max_tokens: 16,
            prune: None,
            decode: DecodeSpec::Ar,
        }
    }

    fn convert(body: Value) -> Result<(Request, Shape), ApiError> {
        ChatRequest::parse(body.to_string().as_bytes())?.into_request(
            "m",
            &ImageSources::DataOnly,
            4,
            &defaults(),
        )
    }

    #[test]
    fn requests_translate_with_defaults_and_options() {
        let (r, s) = convert(json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0, "max_tokens": 5, "stop": "x", "seed": 3, "n": 1,
            "user": "u", "logprobs": false, "frequency_penalty": 0,
            "stream": true, "stream_options": {"include_usage": true},
            "glance": {"prune": {"policy": "pool", "keep": "50%"}, "decode": "ar"}
        }))
        .unwrap();
        assert!(s.stream && s.include_usage);
        assert_eq!(r.max_new_tokens, 5);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert_eq!(r.sampling.seed, 3);
        let p = r.prune.unwrap();
        assert_eq!((p.policy, p.budget), (Policy::Pool, Budget::Ratio(0.5)));
        let (r, _) = convert(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "glance": {"decode": "diffusion-quadratic", "block": 16, "dynamic_block": true}
        }))
        .unwrap();
        assert_eq!(r.decode, DecodeSpec::DiffusionQuadratic);
        let d = r.diffusion.unwrap();
        assert_eq!((d.block, d.dynamic), (16, true));
        let (r, s) = convert(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert!(r.diffusion.is_none());
        assert!(!s.stream);
        assert_eq!(r.max_new_tokens, 16);
        assert_eq!(r.sampling.temperature, 1.0);
    }

    #[test]
    fn bad_requests_are_400_with_the_reason() {
        let m = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"messages": m, "bogus": 1}), 400, "unknown field"),
            (
                json!({"messages": m, "temperature": "hot"}),
                400,
                "invalid type",
            ),
            (
                json!({"messages": m, "max_tokens": -1}),
                400,
                "`max_tokens`: invalid value",
            ),
            (json!({"messages": []}), 400, "no message"),
            (json!({"messages": m, "n": 2}), 400, "choices other than 1"),
            (
                json!({"messages": m, "logprobs": true}),
                400,
                "log-probabilities",
            ),
            (
                json!({"messages": m, "temperature": -1}),
                400,
                "temperature",
            ),
            (json!({"messages": m, "top_p": 0}), 400, "top-p"),
            (json!({"messages": m, "max_tokens": 0}), 400, "max_tokens"),
            (
                json!({"messages": m, "model": "gpt-4"}),
                404,
                "does not exist",
            ),
            (
                json!({"messages": m, "glance": {"speed": 1}}),
                400,
                "unknown field",
            ),
            (
                json!({"messages": m, "glance": {"prune": {"policy": "x"}}}),
                400,
                "policy",
            ),
            (
                json!({"messages": m, "glance": {"decode": "magic"}}),
                400,
                "magic",
            ),
            (
                json!({"messages": m, "glance": {"decode": "ar", "block": 8}}),
                400,
                "block-diffusion strategies",
            ),
            (
                json!({"messages": m, "glance": {"decode": "diffusion-linear", "block": 0}}),
                400,
                "glance.block must be in 1..=64",
            ),
            (
                json!({"messages": m, "glance": {"decode": "diffusion-linear", "threshold": 0.5}}),
                400,
                "glance.threshold only applies to diffusion-threshold",
            ),
            (
                json!({"messages": m, "stream_options": {"include_usage": true}}),
                400,
                "stream",
            ),
        ];
        for (body, status, want) in cases {
            let e = convert(body.clone()).unwrap_err();
            assert_eq!(e.status.as_u16(), status, "{body}: {e}");
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
    }
}
