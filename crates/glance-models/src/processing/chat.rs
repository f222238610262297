//! Chat messages and Hugging Face chat templates, rendered as transformers'
//! `apply_chat_template(messages, add_generation_prompt=…, tokenize=False)` renders them.
//!
//! Reference: transformers `utils/chat_template_utils.py` (`_compile_jinja_template`,
//! `render_jinja_template`). What is mirrored, and the quirks:
//!
//! * Jinja2 `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
//!   `loopcontrols` extension; a single trailing newline of the template source is dropped (Jinja2's
//!   `keep_trailing_newline=False`, which minijinja shares).
//! * Globals `raise_exception(msg)` (→ [`Error::Template`]) and `strftime_now(fmt)` (UTC here; transformers
//!   uses local time).
//! * `tojson` is Python's `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`:
//!   `", "` / `": "` separators and no HTML escaping (minijinja's own `tojson` escapes `<>&'`, which
//!   would corrupt tool schemas).
//! * Python string / dict / list methods (`.upper()`, `.strip()`, `.items()`, …) via
//!   `minijinja_contrib::pycompat`.
//! * `{% generation %}…{% endgeneration %}` (transformers' `AssistantTracker` extension, used by the
//!   llava-hf templates to mark assistant spans) renders its body unchanged; minijinja does not know
//!   the tag, so the source is rewritten to `{% if true %}…{% endif %}` with the same whitespace
//!   control markers before compiling.
//! * Messages are handed to the template as ordered maps (`role`, `content`; parts `type`, `text`),
//!   as the Python dicts are, so `tojson` and `.items()` keep the Python key order.
//!   `content` is always a list of parts (the processor format); a template that expects a plain
//!   string (`message['content'] + …`) needs the text-only form, which glance does not produce.
//!
//! A chat template is code from the model directory, so rendering is bounded (transformers relies
//! on Jinja2's sandbox, which bounds neither): minijinja's fuel ([`TEMPLATE_FUEL`]: every
//! instruction and every 64 bytes of data produced cost one unit) stops endless loops and
//! runaway string building, and the rendered prompt may hold at most [`MAX_RENDERED_BYTES`].

mod pyfns;

use std::sync::Arc;

use glance_core::{Error, Result};
use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Deserializer, Serialize};

/// One message of a conversation, in the Hugging Face processor format
/// (`{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "…"}]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// Deserialises from a list of parts or from a plain string (one text part).
    #[serde(deserialize_with = "deserialize_content")]
    pub content: Vec<ContentPart>,
    /// Other keys the template reads, in order: an assistant turn's `tool_calls` (each call's
    /// `function.arguments` an object, as transformers' templates expect), a tool result's
    /// `tool_call_id` and `name`.
    #[serde(default, skip)]
    pub extra: Vec<(String, serde_json::Value)>,
}

/// One part of a message's content. Extra keys of an image part (`url`, `path`, `image`) are
/// accepted and ignored: the pixels travel separately.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    Image {},
}

fn deserialize_content<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<ContentPart>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<ContentPart>),
    }
    Ok(match Content::deserialize(d)? {
        Content::Text(text) => vec![ContentPart::Text { text }],
        Content::Parts(parts) => parts,
    })
}

impl ChatMessage {
    /// A message with the given role and parts.
    pub fn new(role: &str, content: Vec<ContentPart>) -> Self {
        Self {
            role: role.to_string(),
            content,
            extra: Vec::new(),
        }
    }

    /// A user turn: `images` image parts first, then the text (as in the LLaVA examples). An empty
    /// text adds no text part.
    pub fn user(text: &str, images: usize) -> Self {
        let mut content: Vec<ContentPart> = (0..images).map(|_| ContentPart::Image {}).collect();
        if !text.is_empty() {
            content.push(ContentPart::Text {
                text: text.to_string(),
            });
        }
        Self::new("user", content)
    }

    /// An assistant turn holding `text`.
    pub fn assistant(text: &str) -> Self {
        Self::new(
            "assistant",
            vec![ContentPart::Text {
                text: text.to_string(),
            }],
        )
    }

    /// A system turn holding `text`.
    pub fn system(text: &str) -> Self {
        Self::new(
            "system",
            vec![ContentPart::Text {
                text: text.to_string(),
            }],
        )
    }

    /// Number of image parts.
    pub fn num_images(&self) -> usize {
        self.content
            .iter()
            .filter(|p| matches!(p, ContentPart::Image {}))
            .count()
    }

    /// The text parts joined with `\n`.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|p| match p {
                ContentPart::Text { text } => Some(text.as_str()),
                ContentPart::Image {} => None,
            })
            .collect();
        texts.join("\n")
    }

    fn to_value(&self) -> Value {
        let parts: Vec<Value> = self.content.iter().map(ContentPart::to_value).collect();
        let mut entries = vec![
            ("role", Value::from(self.role.as_str())),
            ("content", Value::from(parts)),
        ];
        entries.extend(
            self.extra
                .iter()
                .map(|(k, v)| (k.as_str(), OrderedMap::json(v))),
        );
        OrderedMap::value(entries)
    }
}

impl ContentPart {
    fn to_value(&self) -> Value {
        match self {
            ContentPart::Text { text } => OrderedMap::value(vec![
                ("type", Value::from("text")),
                ("text", Value::from(text.as_str())),
            ]),
            ContentPart::Image {} => OrderedMap::value(vec![("type", Value::from("image"))]),
        }
    }
}

/// A map that iterates in insertion order (minijinja's own maps sort their keys without its
/// `preserve_order` feature; Python dicts keep insertion order).
#[derive(Debug)]
struct OrderedMap(Vec<(String, Value)>);

impl OrderedMap {
    fn value(entries: Vec<(&str, Value)>) -> Value {
        let entries = entries.into_iter().map(|(k, v)| (k.to_string(), v));
        Value::from_object(OrderedMap(entries.collect()))
    }

    /// A JSON value as a template value, objects keeping their key order (as Python's `json`
    /// gives them to transformers' templates).
    fn json(v: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        match v {
            J::Null => Value::from(()),
            J::Bool(b) => Value::from(*b),
            J::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Value::from(i),
                (None, Some(f)) => Value::from(f),
                (None, None) => Value::from(n.to_string()),
            },
            J::String(s) => Value::from(s.as_str()),
            J::Array(a) => Value::from(a.iter().map(Self::json).collect::<Vec<_>>()),
            J::Object(m) => Value::from_object(OrderedMap(
                m.iter().map(|(k, v)| (k.clone(), Self::json(v))).collect(),
            )),
        }
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.0
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

const TEMPLATE_NAME: &str = "chat_template";

/// Fuel of one render (minijinja's unit: one per instruction, plus one per 64 bytes of strings and
/// output produced). Real chat templates use a few thousand for a short conversation; this bound
/// stops a hostile template after well under a second and a few hundred megabytes.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// Longest rendered prompt accepted (bytes): far more text than any model's context holds.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// The render target: stops with an error once more than `limit` bytes were written.
struct CappedOutput {
    buf: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source` (Jinja2 as in Hugging Face `chat_template`). Syntax errors (and tags
    /// minijinja does not know) are [`Error::Template`].
    pub fn new(source: String) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", pyfns::strftime_now);
        env.add_filter("tojson", pyfns::tojson);
        let rewritten = rewrite_generation_tags(&source);
        env.add_template_owned(TEMPLATE_NAME, rewritten)
            .map_err(template_error)?;
        Ok(Self { env, source })
    }

    /// The template source as it was given (before the `{% generation %}` rewrite).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders like transformers' `apply_chat_template(messages, add_generation_prompt,
    /// tokenize=False)`: variables `messages`, `add_generation_prompt`, and `bos_token` /
    /// `eos_token` where the tokenizer defines them (undefined otherwise, as in transformers).
    /// Runtime errors, including `raise_exception(...)` from the template, are [`Error::Template`].
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        self.render_with(messages, add_generation_prompt, bos_token, eos_token, None)
    }

    /// [`Self::render`] with the `tools` variable defined (transformers'
    /// `apply_chat_template(…, tools=…)`: a list of `{"type": "function", "function": {…}}`).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        let mut ctx = std::collections::BTreeMap::new();
        ctx.insert("messages", Value::from(messages));
        if let Some(tools) = tools {
            ctx.insert("tools", OrderedMap::json(tools));
        }
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        if let Some(bos) = bos_token {
            ctx.insert("bos_token", Value::from(bos));
        }
        if let Some(eos) = eos_token {
            ctx.insert("eos_token", Value::from(eos));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let mut out = CappedOutput {
            buf: Vec::new(),
            limit: MAX_RENDERED_BYTES,
            over: false,
        };
        let rendered = template.render_captured_to(Value::from(ctx), &mut out);
        if out.over {
            return Err(Error::Template(format!(
                "the rendered prompt is longer than the limit of {} MiB",
                MAX_RENDERED_BYTES >> 20
            )));
        }
        match rendered {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(Error::Template(format!(
                    "rendering stopped: the template used up its fuel of {TEMPLATE_FUEL} \
                     (instructions and data produced); an endless or huge loop?"
                )))
            }
            Err(e) => return Err(template_error(e)),
        }
        String::from_utf8(out.buf)
            .map_err(|_| Error::Template("the rendered prompt is not UTF-8".into()))
    }
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// A minijinja error as [`Error::Template`], with the chain of causes (minijinja puts the
/// interesting part, e.g. the `raise_exception` message, in the detail).
fn template_error(e: minijinja::Error) -> Error {
    let mut msg = match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        if !msg.contains("line") {
            msg.push_str(&format!(" (line {line})"));
        }
    }
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        msg.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    Error::Template(msg)
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags to `{% if true %}` /
/// `{% endif %}`, keeping the `-` / `+` whitespace-control markers so that trimming is unchanged.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 16);
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match parse_generation_tag(tag) {
            Some((len, left, right, end)) => {
                let body = if end { "endif" } else { "if true" };
                out.push_str(&format!("{{%{left} {body} {right}%}}"));
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Parses `{%[-+]? (end)?generation [-+]?%}` at the start of `s`: (length, left marker, right
/// marker, is end tag).
fn parse_generation_tag(s: &str) -> Option<(usize, &str, &str, bool)> {
    let bytes = s.as_bytes();
    let mut i = 2;
    let left = match bytes.get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &s[2..3]
        }
        _ => "",
    };
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    let word_start = i;
    while bytes
        .get(i)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    {
        i += 1;
    }
    let end = match &s[word_start..i] {
        "generation" => false,
        "endgeneration" => true,
        _ => return None,
    };
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    let right = match bytes.get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &s[i - 1..i]
        }
        _ => "",
    };
    if s[i..].starts_with("%}") {
        Some((i + 2, left, right, end))
    } else {
        None
    }
}

/// Replaces every occurrence of `image_token` in `prompt` by `n` copies of it, as `LlavaProcessor`
/// does (`sample.replace(image_token, image_token * num_image_tokens)`). An empty `image_token`
/// leaves the prompt unchanged.
/// The rendering `full` of a conversation (without a generation prompt) cut right after its
/// last message's text (trailing whitespace trimmed), as Hugging Face's `continue_final_message`
/// does: the prompt that continues that message rather than answering it.
pub fn cut_after_final(full: &str, messages: &[ChatMessage]) -> Result<String> {
    let last = messages.last().map(ChatMessage::text).unwrap_or_default();
    let last = last.trim_end();
    if last.is_empty() {
        return Err(Error::Input(
            "the final message to continue has no text".to_string(),
        ));
    }
    let end = full.rfind(last).map(|i| i + last.len()).ok_or_else(|| {
        Error::Template(
            "the chat template does not render the final message's text as given, so it \
             cannot be continued"
                .to_string(),
        )
    })?;
    Ok(full[..end].to_string())
}

/// How a family with size-dependent image token counts (Qwen2-VL, InternVL) writes images into a
/// prompt: each `placeholder` becomes `open`, that image's count of `placeholder`s, `close`.
/// Text holding `video` is refused (`family` names the model in the error).
pub struct SizedImages<'a> {
    pub placeholder: &'a str,
    pub open: &'a str,
    pub close: &'a str,
    pub video: &'a str,
    pub family: &'a str,
}

impl SizedImages<'_> {
    /// `text` with its `i`-th placeholder expanded to `tokens[i]` image tokens.
    pub fn expand(&self, text: &str, tokens: &[usize]) -> Result<String> {
        if text.contains(self.video) {
            return Err(Error::Input(format!(
                "video input is not supported: glance runs {} on images only",
                self.family
            )));
        }
        let pieces: Vec<&str> = text.split(self.placeholder).collect();
        if pieces.len() - 1 != tokens.len() {
            return Err(Error::Input(format!(
                "the prompt has {} `{}` placeholder(s) for {} image(s)",
                pieces.len() - 1,
                self.placeholder,
                tokens.len()
            )));
        }
        let total: usize = tokens.iter().sum();
        let mut expanded = String::with_capacity(text.len() + total * self.placeholder.len());
        for (i, piece) in pieces.iter().enumerate() {
            expanded.push_str(piece);
            if let Some(&n) = tokens.get(i) {
                expanded.push_str(self.open);
                expanded.push_str(&self.placeholder.repeat(n));
                expanded.push_str(self.close);
            }
        }
        Ok(expanded)
    }
}

/// Checks that tokenising a prompt gave exactly `expected` image tokens (`image_token_id`).
pub fn check_image_tokens(ids: &[u32], image_token_id: u32, expected: usize) -> Result<usize> {
    let image_tokens = ids.iter().filter(|&&i| i == image_token_id).count();
    if image_tokens != expected {
        return Err(Error::Input(format!(
            "tokenising the prompt gave {image_tokens} image tokens, expected {expected}"
        )));
    }
    Ok(image_tokens)
}

pub fn expand_image_tokens(prompt: &str, image_token: &str, n: usize) -> String {
    if image_token.is_empty() {
        return prompt.to_string();
    }
    prompt.replace(image_token, &image_token.repeat(n))
}

#[cfg(test)]
mod tests;
