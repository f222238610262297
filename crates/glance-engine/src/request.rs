//! What a caller asks ([`Request`]) and what it gets back ([`Response`], streamed [`Event`]s).
//!
//! The shapes follow OpenAI's chat completions, which every serving engine speaks: a list of
//! messages with text and image parts, sampling settings, a token cap and stop strings — plus
//! glance's own per-request options: visual-token pruning and the decoding strategy.

use glance_core::{Error, Result, SamplingParams, TokenId};
use glance_decode::{DecodeSpec, DecodeStats, OutputFormat, TokenLogprob};
use glance_prune::PruneSpec;
use serde::Serialize;
use std::sync::Arc;

/// The most stop strings one request may carry (OpenAI allows 4; glance is generous).
pub const MAX_STOP_STRINGS: usize = 16;
/// The longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;

/// An image as a caller hands it over.
#[derive(Clone)]
pub enum ImageInput {
    /// Encoded PNG, JPEG or WebP bytes (decoded by the engine, with its pixel limit checked from the
    /// header first).
    Bytes(Arc<[u8]>),
    /// An image already decoded.
    Decoded(Arc<image::DynamicImage>),
}

impl ImageInput {
    pub fn bytes(bytes: impl Into<Arc<[u8]>>) -> Self {
        ImageInput::Bytes(bytes.into())
    }

    pub fn decoded(image: image::DynamicImage) -> Self {
        ImageInput::Decoded(Arc::new(image))
    }
}

impl std::fmt::Debug for ImageInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageInput::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            ImageInput::Decoded(i) => write!(f, "Decoded({}x{})", i.width(), i.height()),
        }
    }
}

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result (OpenAI's `role: "tool"`).
    Tool,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "system" | "developer" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(Error::Input(format!(
                "unknown message role `{other}` (system, user, assistant or tool)"
            ))),
        }
    }
}

/// One part of a message.
#[derive(Debug, Clone)]
pub enum Part {
    Text(String),
    Image(ImageInput),
}

/// One message of a conversation.
#[derive(Debug, Clone)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
    /// An assistant turn's `tool_calls` (arguments as objects), a tool result's `tool_call_id`
    /// and `name`: passed to the chat template as they are.
    pub extra: Vec<(String, serde_json::Value)>,
}

impl Message {
    /// A user turn: the images first, then the text (as the LLaVA examples do).
    pub fn user(text: &str, images: Vec<ImageInput>) -> Self {
        let mut content: Vec<Part> = images.into_iter().map(Part::Image).collect();
        if !text.is_empty() {
            content.push(Part::Text(text.to_string()));
        }
        Self {
            role: Role::User,
            content,
            extra: Vec::new(),
        }
    }

    pub fn assistant(text: &str) -> Self {
        Self {
            role: Role::Assistant,
            content: vec![Part::Text(text.to_string())],
            extra: Vec::new(),
        }
    }

    pub fn system(text: &str) -> Self {
        Self {
            role: Role::System,
            content: vec![Part::Text(text.to_string())],
            extra: Vec::new(),
        }
    }

    /// The images of this message, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageInput> {
        self.content.iter().filter_map(|p| match p {
            Part::Image(i) => Some(i),
            Part::Text(_) => None,
        })
    }
}

/// The prompt of a request.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template (with the generation prompt).
    Chat(Vec<Message>),
    /// Text used exactly as given: no template, BOS only if the tokenizer adds it, and one image
    /// placeholder (`<image>`) per image, in order.
    Raw {
        text: String,
        images: Vec<ImageInput>,
    },
}

impl Prompt {
    /// Every image of the prompt, in prompt order.
    pub fn images(&self) -> Vec<&ImageInput> {
        match self {
            Prompt::Chat(messages) => messages.iter().flat_map(Message::images).collect(),
            Prompt::Raw { images, .. } => images.iter().collect(),
        }
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    /// How tokens are picked (greedy by default).
    pub sampling: SamplingParams,
    /// At most this many new tokens.
    pub max_new_tokens: usize,
    /// Generation stops when the answer contains one of these; the text itself is not returned.
    pub stop: Vec<String>,
    /// Visual-token pruning (`None`: every visual token).
    pub prune: Option<PruneSpec>,
    /// The decoding strategy and its settings.
    pub decode: DecodeSpec,
    /// Keep generating after end-of-sequence tokens (until the token cap or a stop string).
    pub ignore_eos: bool,
    /// Report each new token's log-probability and this many most likely alternatives (at most
    /// [`glance_core::MAX_TOP_LOGPROBS`]); `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// Continue the conversation's last message (an assistant message) instead of starting a
    /// new turn.
    pub continue_final_message: bool,
    /// The answer follows this format (constrained decoding; `None`: free text).
    pub format: Option<OutputFormat>,
    /// The chat template's `tools` variable (a list of `{"type": "function", "function": …}`);
    /// `None`: undefined.
    pub tools: Option<serde_json::Value>,
}

impl Request {
    /// A greedy request with default limits.
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::greedy(),
            max_new_tokens: 128,
            stop: Vec::new(),
            prune: None,
            decode: DecodeSpec::default(),
            ignore_eos: false,
            logprobs: None,
            continue_final_message: false,
            format: None,
            tools: None,
        }
    }

    /// One user turn with `images` and `text` in the chat template.
    pub fn chat(text: &str, images: Vec<ImageInput>) -> Self {
        Self::new(Prompt::Chat(vec![Message::user(text, images)]))
    }

    /// Checks every setting that does not need the model.
    pub fn validate(&self) -> Result<()> {
        self.sampling.validate()?;
        if self.max_new_tokens == 0 {
            return Err(Error::InvalidParam(
                "max new tokens must be at least 1".into(),
            ));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(Error::InvalidParam(format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                self.stop.len()
            )));
        }
        if let Some(s) = self
            .stop
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(Error::InvalidParam(format!(
                "a stop string must be 1 to {MAX_STOP_BYTES} bytes long, got {} bytes",
                s.len()
            )));
        }
        if let Some(p) = &self.prune {
            p.validate()?;
        }
        if let Some(n) = self.logprobs {
            if n > glance_core::MAX_TOP_LOGPROBS {
                return Err(Error::InvalidParam(format!(
                    "top_logprobs must be in 0..={}, got {n}",
                    glance_core::MAX_TOP_LOGPROBS
                )));
            }
            if !self.decode.lossless() {
                return Err(Error::InvalidParam(format!(
                    "logprobs are not available with {}, whose tokens come from parallel \
                     drafts; use ar or a lossless strategy",
                    self.decode
                )));
            }
        }
        self.decode.validate()?;
        if let Prompt::Chat(messages) = &self.prompt {
            if messages.is_empty() {
                return Err(Error::Input("the conversation has no message".into()));
            }
            if self.continue_final_message
                && messages.last().is_some_and(|m| m.role != Role::Assistant)
            {
                return Err(Error::InvalidParam(
                    "continue_final_message needs a conversation that ends with an assistant \
                     message"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}

/// What the engine reports while generating.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// New answer text (stop strings already held back and removed).
    Text(&'a str),
    /// A new token's log-probabilities (with [`Request::logprobs`]), before its text (which the
    /// detokeniser or a stop string may hold back).
    Logprob(&'a TokenLogprob),
}

/// The callback's answer to an [`Event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop generating now (the caller went away); the response ends with
    /// [`FinishReason::Cancelled`].
    Cancel,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// The token cap or the model's context was reached.
    Length,
    /// A stop string matched.
    Stop,
    /// The caller cancelled.
    Cancelled,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens, every visual token counted.
    pub prompt_tokens: usize,
    /// Visual tokens in the prompt before pruning.
    pub visual_tokens: usize,
    /// Visual tokens the decoder ran (for FastV: in the layers after its pruning layer).
    pub kept_visual_tokens: usize,
    /// Prompt rows the decoder ran (for FastV: in the layers after its pruning layer).
    pub prompt_rows: usize,
    /// Generated tokens (a final EOS token included).
    pub completion_tokens: usize,
}

/// Where the time went, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    /// Everything before the first token that is not one of the three below: prompt rendering
    /// and tokenisation, image decoding and pre-processing, setting up the request, and under
    /// load the scheduler's steps of other requests before this one's prefill.
    pub preprocess_s: f64,
    /// Vision tower and projector (0 when every image came from the encoding cache).
    pub vision_s: f64,
    /// Visual-token scoring and selection.
    pub prune_select_s: f64,
    /// The prefill pass, including picking the first token.
    pub prefill_s: f64,
    /// From the request to the first token: the four above.
    pub time_to_first_token_s: f64,
    /// All passes after the first token.
    pub decode_s: f64,
    /// Tokens after the first per second of decoding.
    pub decode_tokens_per_s: f64,
    /// Work the caches saved: the first computation's time of every cached image encoding and
    /// prompt prefix this request reused. `time_to_first_token_s + cache_saved_s` is what the
    /// request would have taken alone.
    pub cache_saved_s: f64,
}

/// Cache use of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheUse {
    /// Images whose encoding came from the cache.
    pub image_hits: usize,
    /// Prompt rows whose keys and values came from the prefix cache.
    pub prefix_rows: usize,
}

/// The visual tokens one image kept after pruning, for drawing them over the image: its patch
/// grid (row-major: patch `i` is at row `i / cols`, column `i % cols`) and the kept patches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptPatches {
    pub rows: usize,
    pub cols: usize,
    /// Indices `< rows * cols` of the kept patches, increasing. A merged row (`pool`, `hier`)
    /// counts at the patch whose position it takes.
    pub kept: Vec<u32>,
}

/// Byte offsets into `text` (increasing, on character boundaries) → character offsets.
pub(crate) fn char_offsets(text: &str, byte_ends: &[usize]) -> Vec<u32> {
    let mut chars = text.char_indices().map(|(b, _)| b).peekable();
    let mut count = 0u32;
    byte_ends
        .iter()
        .map(|&end| {
            while chars.next_if(|&b| b < end).is_some() {
                count += 1;
            }
            count
        })
        .collect()
}

impl CacheUse {
    /// Prompt tokens served from the prefix cache (OpenAI's `cached_tokens`).
    pub fn cached_tokens(&self) -> usize {
        self.prefix_rows
    }
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Serialize)]
pub struct Response {
    pub text: String,
    pub token_ids: Vec<TokenId>,
    /// Where each token's text ends in `text`, in characters (one entry per token id). Text a
    /// token released later (held back by the detokeniser or a stop string) counts at the token
    /// that released it; what was released after the last token counts at the last one.
    pub token_ends: Vec<u32>,
    /// The patches each image kept, in prompt order; empty when nothing was pruned.
    pub kept_patches: Vec<KeptPatches>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    pub cache: CacheUse,
    /// The strategy's own statistics.
    pub decode: DecodeStats,
    /// Each token's log-probabilities, with [`Request::logprobs`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_offsets_become_character_offsets() {
        // "é" is 2 bytes, "→" 3.
        let text = "aé → b";
        let ends = [1, 3, 4, 7, text.len()];
        assert_eq!(char_offsets(text, &ends), vec![1, 2, 3, 4, 6]);
        assert_eq!(char_offsets("", &[0, 0]), vec![0, 0]);
    }
}
