//! The OpenAI chat-completions request and its translation into the engine's [`Request`]; the
//! response and stream-chunk bodies.
//!
//! The sampling parameters of OpenAI, vLLM and llama-server map onto the engine's sampler
//! (`top_k: -1` and `min_p: 0` are vLLM's "off"); `response_format` and `tools` become the
//! engine's grammar and the template's tools (`crate::structured`, `crate::tools`). Fields OpenAI
//! clients send that glance has no use for are accepted at their neutral values (`store: false`,
//! `modalities: ["text"]`, …) and refused with a clear message otherwise. A top-level field
//! glance does not know is ignored and reported ([`Shape::ignored`]: a log warning and the
//! `glance-ignored-fields` header), as vLLM does, or a 400 with `--strict` ([`Defaults::strict`]).
//! glance's own per-request options travel under `"glance"`, where an unknown key is always a 400:
//! `{"prune": {"policy": "adaptive", "keep": 0.125}, "decode": "vispec"}`.

use crate::chat::Api;
use crate::error::ApiError;
use crate::tools::{Choice, Tools};
use crate::App;
use glance_core::SamplingParams;
use glance_engine::messages::{parse_messages, ImageSources};
use glance_engine::{
    Budget, DecodeSpec, DiffusionOptions, Engine, FinishReason, OptionNames, Policy, Prompt,
    PruneSpec, Request, Response, Role, TreeSettings, Usage,
};
use serde::Deserialize;
use serde_json::{json, Value};

/// The most tokens one request may ask for.
pub const MAX_TOKENS_LIMIT: u64 = 1 << 20;
/// The most choices (`n`, times the prompts of a legacy completion) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Parses a chat body and translates it (on a blocking thread: images are decoded here).
pub fn parse_chat(app: &App, body: &[u8]) -> Result<(Vec<Request>, Shape), ApiError> {
    let c = &app.config;
    let max_images = app.engine.options().max_images;
    let mut request = ChatRequest::parse(body)?;
    request.check_json_output(&app.engine)?;
    request.into_requests(&c.model_name, &c.image_sources, max_images, &c.defaults)
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Value,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI's, but vLLM's and llama.cpp's (as are `min_p`, `repetition_penalty`,
    /// `ignore_eos`, `min_tokens`, `continue_final_message`); -1 and 0 are off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u64>,
    pub continue_final_message: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// Token id (as a string, OpenAI's form) → bias in [-100, 100].
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    // Accepted at their neutral values only.
    pub user: Option<String>,
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub store: Option<bool>,
    pub metadata: Option<serde_json::Map<String, Value>>,
    pub service_tier: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub glance: Option<GlanceOptions>,
    /// The grammar of the answer, from `response_format` ([`Self::check_json_output`]).
    #[serde(skip)]
    pub format: Option<glance_engine::OutputFormat>,
    /// The tools and how the answer is read ([`Self::check_json_output`]).
    #[serde(skip)]
    pub tool_plan: Option<Tools>,
    /// Every other top-level field: ignored (reported), or refused with `--strict`.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, Value>,
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
    /// Speculative strategies and `auto`: the draft tree (`{"depth": 6, "top_k": 2, "budget":
    /// 8, "min_confidence": 0.05}`, any subset; default: the server's).
    pub tree: Option<TreeSettings>,
    /// Block diffusion: tokens per block (1 to 64).
    pub block: Option<usize>,
    /// diffusion-threshold: the confidence τ that unmasks a slot.
    pub threshold: Option<f32>,
    /// Block diffusion: grow and shrink the block with acceptance.
    pub dynamic_block: Option<bool>,
}

impl GlanceOptions {
    /// The strategy the request names (else the server's `default`) with the tree and
    /// block-diffusion settings it gives (`None`: the server's); a setting that does not apply
    /// to the strategy is a 400 naming both.
    fn decode(&self, default: &DecodeSpec) -> Result<DecodeSpec, ApiError> {
        let name = match &self.decode {
            Some(d) => {
                d.parse::<DecodeSpec>()
                    .map_err(|e| ApiError::bad_param("glance.decode", e.to_string()))?;
                d.as_str()
            }
            None => default.name(),
        };
        if let Some(t) = &self.tree {
            t.validate()
                .map_err(|e| ApiError::bad_param("glance.tree", e.to_string()))?;
        }
        let options = DiffusionOptions {
            block: self.block,
            threshold: self.threshold,
            dynamic: self.dynamic_block.unwrap_or(false),
        };
        DecodeSpec::parse_with(name, self.tree.clone(), &options, &OptionNames::REQUEST).map_err(
            |e| {
                let param = if options.any() {
                    if self.threshold.is_some() && self.block.is_none() {
                        "glance.threshold"
                    } else {
                        "glance.block"
                    }
                } else {
                    "glance.tree"
                };
                ApiError::bad_param(param, e.to_string())
            },
        )
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
    /// LLaVA-NeXT: `global` (default) or `per-tile` (HiRED) budget sharing.
    pub tiles: Option<String>,
}

/// Server-wide defaults for what a request does not say.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub max_tokens: usize,
    pub prune: Option<PruneSpec>,
    pub decode: DecodeSpec,
    /// `--strict`: an unknown top-level field is a 400 instead of being ignored.
    pub strict: bool,
}

/// What the handler needs besides the engine requests.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    pub api: Api,
    /// Choices in the answer: `n` per prompt.
    pub choices: usize,
    pub n: usize,
    /// Legacy completions with `echo`: each choice's prompt text, sent before its answer.
    pub echo: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// The answer carries log-probabilities.
    pub logprobs: bool,
    /// Unknown top-level fields that were ignored, sorted.
    pub ignored: Vec<String>,
    /// The request's tools: answers are read into `tool_calls`.
    pub tools: Option<Tools>,
}

impl Shape {
    /// The tools whose calls answers are read for (not with `tool_choice: "none"`).
    pub fn calls(&self) -> Option<&Tools> {
        self.tools.as_ref().filter(|t| t.choice != Choice::None)
    }
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

    /// The engine requests (one per choice), with at most `max_images` images (counted before any
    /// is read) resolved under `sources`.
    pub fn into_requests(
        self,
        served: &str,
        sources: &ImageSources,
        max_images: usize,
        defaults: &Defaults,
    ) -> Result<(Vec<Request>, Shape), ApiError> {
        self.translate(served, defaults, |me| {
            let messages = parse_messages(&me.messages, sources, max_images)
                .map_err(|e| ApiError::from(e).with_param("messages"))?;
            let continue_final = match (me.continue_final_message, me.add_generation_prompt) {
                (Some(true), Some(true)) => {
                    return Err(ApiError::bad_param(
                        "continue_final_message",
                        "continue_final_message and add_generation_prompt cannot both be true",
                    ))
                }
                (Some(c), _) => c,
                // vLLM: no generation prompt means the last message is continued.
                (None, Some(g)) => !g,
                // A conversation that ends with an assistant message is a prefill to continue.
                (None, None) => messages.last().is_some_and(|m| m.role == Role::Assistant),
            };
            Ok(vec![(Prompt::Chat(messages), continue_final)])
        })
    }

    /// The engine requests of the prompts `prompts` gives (each with whether its last message is
    /// continued), after every other field is checked: `n` choices per prompt, choice `j` of a
    /// prompt with the seed [`choice_seed`]`(seed, j)`.
    pub(crate) fn translate(
        self,
        served: &str,
        defaults: &Defaults,
        prompts: impl FnOnce(&Self) -> Result<Vec<(Prompt, bool)>, ApiError>,
    ) -> Result<(Vec<Request>, Shape), ApiError> {
        if let Some(m) = self.model.as_deref() {
            if m != served {
                return Err(ApiError::not_found(
                    format!("the model `{m}` does not exist; this server serves `{served}`"),
                    "model_not_found",
                ));
            }
        }
        let mut ignored: Vec<String> = self.unknown.keys().cloned().collect();
        ignored.sort();
        if let (true, Some(field)) = (defaults.strict, ignored.first()) {
            return Err(ApiError::bad_param(
                field,
                format!(
                    "unknown field `{field}` (the server runs with --strict; without it unknown \
                     fields are ignored)"
                ),
            ));
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
        let sampling = self.sampling(seed)?;
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), top) => Some(top.unwrap_or(0)),
            (_, Some(n)) if n > 0 => {
                return Err(ApiError::bad_param(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ))
            }
            _ => None,
        };
        if let Some(n) = logprobs.filter(|&n| n > glance_core::MAX_TOP_LOGPROBS as u64) {
            return Err(ApiError::bad_param(
                "top_logprobs",
                format!(
                    "top_logprobs must be in 0..={}, got {n}",
                    glance_core::MAX_TOP_LOGPROBS
                ),
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let (prune, decode) = match &self.glance {
            None => (defaults.prune.clone(), defaults.decode.clone()),
            Some(g) => (
                match &g.prune {
                    None => defaults.prune.clone(),
                    Some(p) => p.spec()?,
                },
                g.decode(&defaults.decode)?,
            ),
        };
        let n = self.n.unwrap_or(1) as usize;
        let prompts = prompts(&self)?;
        if n == 0 || n.saturating_mul(prompts.len()) > MAX_CHOICES {
            return Err(ApiError::bad_param(
                "n",
                format!(
                    "n must be at least 1 and n times the prompts at most {MAX_CHOICES}, got n = \
                     {n} for {} prompt(s)",
                    prompts.len()
                ),
            ));
        }
        let mut requests = Vec::with_capacity(n * prompts.len());
        for (prompt, continue_final) in prompts {
            for j in 0..n {
                let request = Request {
                    sampling: SamplingParams {
                        seed: choice_seed(seed, j),
                        ..sampling.clone()
                    },
                    ignore_eos: self.ignore_eos.unwrap_or(false),
                    logprobs: logprobs.map(|n| n as usize),
                    continue_final_message: continue_final,
                    format: self.format.clone(),
                    tools: self
                        .tool_plan
                        .as_ref()
                        .map(|t| Value::Array(t.list.clone())),
                    max_new_tokens: max_tokens as usize,
                    stop: stop.clone(),
                    prune: prune.clone(),
                    decode: decode.clone(),
                    ..Request::new(prompt.clone())
                };
                request.validate().map_err(ApiError::from)?;
                requests.push(request);
            }
        }
        let shape = Shape {
            api: Api::Chat,
            choices: requests.len(),
            n,
            echo: Vec::new(),
            stream,
            include_usage,
            logprobs: logprobs.is_some(),
            ignored,
            tools: self.tool_plan.clone(),
        };
        Ok((requests, shape))
    }

    /// The sampling parameters, each range checked with the field named.
    fn sampling(&self, seed: u64) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::bad_param(
                    "top_k",
                    format!("top_k must be -1 or 0 (off) or a positive count, got {k}"),
                ))
            }
        };
        let mut logit_bias = std::collections::BTreeMap::new();
        for (id, bias) in self.logit_bias.iter().flatten() {
            let id = id.trim().parse::<u32>().map_err(|_| {
                ApiError::bad_param(
                    "logit_bias",
                    format!("logit_bias keys are token ids, got `{id}`"),
                )
            })?;
            let bias = bias.as_f64().ok_or_else(|| {
                ApiError::bad_param(
                    "logit_bias",
                    format!("the logit_bias of token {id} must be a number, got {bias}"),
                )
            })?;
            logit_bias.insert(id, bias as f32);
        }
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            seed,
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            min_tokens: self.min_tokens.unwrap_or(0).min(MAX_TOKENS_LIMIT) as usize,
        };
        // The engine's message names the parameter; point `param` at it too.
        p.validate().map_err(|e| {
            let msg = e.to_string();
            let param = [
                "temperature",
                "min_p",
                "repetition_penalty",
                "presence_penalty",
                "frequency_penalty",
                "logit_bias",
            ]
            .into_iter()
            .find(|f| msg.contains(f))
            .unwrap_or(if msg.contains("top-p") {
                "top_p"
            } else {
                "temperature"
            });
            ApiError::bad_param(param, msg)
        })?;
        Ok(p)
    }

    /// Reads `response_format` (and the tools a request forces) into the grammar the answer
    /// follows, checked against the model: a 400 on a model whose vocabulary cannot spell JSON
    /// (glance-tiny's word-level tokens have no braces or quotes) or for a schema the grammar
    /// compiler refuses.
    pub fn check_json_output(&mut self, engine: &Engine) -> Result<(), ApiError> {
        self.format = crate::structured::output_format(self.response_format.as_ref())?;
        self.tool_plan = Tools::parse(
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        if let Some(t) = &self.tool_plan {
            t.check(engine)?;
            if let Some(f) = t.format() {
                if self.format.is_some() {
                    return Err(ApiError::bad_param(
                        "response_format",
                        "response_format cannot be combined with a tool_choice that forces a \
                         call (the call's arguments are the structured answer)",
                    ));
                }
                self.format = Some(f);
            }
        }
        if let Some(f) = &self.format {
            // Past the end of its JSON, end-of-sequence is the only token a grammar allows.
            let forced_eos = [
                ("ignore_eos", self.ignore_eos == Some(true)),
                ("min_tokens", self.min_tokens.is_some_and(|n| n > 0)),
            ];
            if let Some((field, _)) = forced_eos.iter().find(|f| f.1) {
                return Err(ApiError::bad_param(
                    field,
                    format!(
                        "{field} cannot be combined with structured output (response_format or a \
                         forced tool call): the answer ends where its JSON ends"
                    ),
                ));
            }
            if self.tool_plan.as_ref().is_none_or(|t| t.format().is_none()) {
                crate::structured::check(engine, f, "response_format")?;
            }
        }
        Ok(())
    }

    /// Refuses any non-neutral value of a field glance does not implement.
    fn check_neutral(&self) -> Result<(), ApiError> {
        let refuse = |param: &str, what: &str| {
            Err(ApiError::bad_param(
                param,
                format!("{param}: {what} is not supported by glance"),
            ))
        };
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

/// The seed of choice `j` of a request seeded `seed`: `seed` itself for the first, a distinct
/// seed derived from both for every other (so `n` choices differ, and the same each time).
pub fn choice_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    mix(seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A seed that differs from call to call (clock and a counter, mixed).
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix(nanos
        ^ CALLS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15))
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
        if let Some(t) = &self.tiles {
            spec.tiles = t.parse().map_err(bad)?;
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

/// The `usage` object, with glance's visual-token counts beside OpenAI's; `cached` prompt
/// tokens came from the prefix cache.
pub fn usage_json(u: &Usage, cached: usize) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
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

/// The usage of a request's choices: every choice's completion tokens, each prompt's tokens once
/// (the first of its `n` choices), and glance's own block of the first choice.
pub fn total_usage(all: &[&Response], n: usize) -> Value {
    let mut u = Usage::default();
    let mut cached = 0;
    for (i, r) in all.iter().enumerate() {
        u.completion_tokens += r.usage.completion_tokens;
        if i % n.max(1) == 0 {
            u.prompt_tokens += r.usage.prompt_tokens;
            u.visual_tokens += r.usage.visual_tokens;
            u.kept_visual_tokens += r.usage.kept_visual_tokens;
            cached += r.cache.cached_tokens();
        }
    }
    let mut usage = usage_json(&u, cached);
    if let Some(r) = all.first() {
        usage["glance"] = glance_usage_json(r);
    }
    usage
}

/// Identity of one completion: id, creation time, model name.
#[derive(Debug, Clone)]
pub struct Ids {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Ids {
    /// A fresh id (`chatcmpl-…` or `cmpl-…`) created now.
    pub fn new(api: Api, model: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        };
        Self {
            id: format!(
                "{prefix}-{:x}{:08x}",
                std::process::id(),
                NEXT_ID.fetch_add(1, Ordering::Relaxed)
            ),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_string(),
        }
    }
}

/// The non-streaming chat answer, one choice per response (log-probabilities in the chat form
/// when asked for).
pub fn completion_json(engine: &Engine, ids: &Ids, all: &[&Response], shape: &Shape) -> Value {
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let logprobs = shape.logprobs.then(|| {
                crate::logprobs::chat_logprobs(engine, r.logprobs.as_deref().unwrap_or_default())
            });
            let (message, finish) = crate::tools::message(ids, i, r, shape);
            json!({
                "index": i,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            })
        })
        .collect();
    json!({
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "choices": choices,
        "usage": total_usage(all, shape.n),
    })
}

/// One `chat.completion.chunk` of choice `index`; `usage` is `null` on every chunk but the last
/// when usage was asked for, and absent otherwise; `logprobs` those of the chunk's tokens.
pub fn chunk_json(
    ids: &Ids,
    index: usize,
    delta: Value,
    logprobs: Option<Value>,
    finish: Option<&str>,
    include_usage: bool,
) -> Value {
    let choice =
        json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish});
    chunk_envelope(ids, "chat.completion.chunk", choice, include_usage)
}

/// A streamed chunk of either API around its one `choice`; `usage: null` with `include_usage`.
pub fn chunk_envelope(ids: &Ids, object: &str, choice: Value, include_usage: bool) -> Value {
    let mut c = json!({
        "id": ids.id,
        "object": object,
        "created": ids.created,
        "model": ids.model,
        "choices": [choice],
    });
    if include_usage {
        c["usage"] = Value::Null;
    }
    c
}

/// The final usage chunk of a stream with `include_usage` (no choices).
pub fn usage_chunk_json(ids: &Ids, all: &[&Response], shape: &Shape) -> Value {
    let object = match shape.api {
        Api::Chat => "chat.completion.chunk",
        Api::Completion => "text_completion",
    };
    json!({
        "id": ids.id,
        "object": object,
        "created": ids.created,
        "model": ids.model,
        "choices": [],
        "usage": total_usage(all, shape.n),
    })
}

#[cfg(test)]
mod tests;
