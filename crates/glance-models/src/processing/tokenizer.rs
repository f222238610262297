//! The text side of a Hugging Face checkpoint: `tokenizer.json` (the `tokenizers` pipeline),
//! special tokens, the chat template and the ids that end generation.
//!
//! Mirrors transformers 5's `AutoTokenizer` / `AutoProcessor` loading of a local directory:
//!
//! * `tokenizer.json` is used as saved, except that its truncation and padding settings are
//!   switched off: transformers disables them on every call unless asked (`tokenizer(text)`).
//! * Special tokens (`bos_token`, `eos_token`, `pad_token`, `unk_token`) come from
//!   `tokenizer_config.json`, as strings or `AddedToken` objects (`{"content": …}`);
//!   `special_tokens_map.json` fills those the config lacks.
//! * Chat template precedence: `chat_template.jinja` (newer transformers write this; it clobbers the
//!   config's), then `chat_template.json` (`{"chat_template": …}`, the processor's legacy file), then
//!   `tokenizer_config.json`'s `chat_template` (a string, or a list of `{"name", "template"}` where
//!   `"default"` wins; a list without a default but with a single entry uses that entry).
//!   A template that does not compile makes loading fail ([`Error::Template`], naming the file).
//! * `clean_up_tokenization_spaces` (default `false`, as in transformers ≥ 4.45) is applied by
//!   [`TextProcessor::decode`] and the [`StreamDecoder`], as transformers' `decode` does.
//! * End-of-generation ids: `eos_token` of the tokenizer config plus `generation_config.json`'s
//!   `eos_token_id` (int or list), deduplicated, in that order.
//!
//! BOS doubling: a chat template that writes `{{ bos_token }}` itself must be tokenised with
//! [`TextProcessor::encode_plain`]; [`TextProcessor::encode_prompt`] makes that choice the way
//! transformers' processors do (no special tokens when the rendered prompt starts with the BOS text).

mod stream;

use std::path::{Path, PathBuf};

use glance_core::{Error, Result};
use serde_json::Value as Json;
use tokenizers::Tokenizer;

pub use super::chat::expand_image_tokens;
use super::chat::{ChatMessage, ChatTemplate};
pub use stream::StreamDecoder;

/// Tokeniser, special tokens and chat template of a model directory.
pub struct TextProcessor {
    tokenizer: Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    chat_template: Option<ChatTemplate>,
    chat_template_file: Option<PathBuf>,
    eos_ids: Vec<u32>,
    clean_up_tokenization_spaces: bool,
    /// Whether the decoder has a `ByteFallback` step (then `<0xNN>` tokens are bytes).
    byte_fallback: bool,
    /// Added tokens marked special (what `skip_special_tokens` drops).
    special_ids: std::collections::HashSet<u32>,
}

impl std::fmt::Debug for TextProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextProcessor")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("eos_ids", &self.eos_ids)
            .field("chat_template_file", &self.chat_template_file)
            .finish_non_exhaustive()
    }
}

/// What [`TextProcessor::from_parts`] takes beside the tokenizer.
#[derive(Debug, Clone, Default)]
pub struct TextParts {
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token`, in that order.
    pub specials: [Option<String>; 4],
    /// The chat template's source and where it came from (named in errors).
    pub chat_template: Option<(String, PathBuf)>,
    /// Ids that end generation beside `eos_token`'s (`generation_config.json`'s `eos_token_id`).
    pub extra_eos_ids: Vec<u32>,
    pub clean_up_tokenization_spaces: bool,
}

const SPECIAL_KEYS: [&str; 4] = ["bos_token", "eos_token", "pad_token", "unk_token"];

impl TextProcessor {
    /// Loads the text side of the model directory `dir` (see the module documentation for which
    /// files are read and which wins).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(Error::MissingFile {
                dir: dir.to_path_buf(),
                what: "tokenizer.json".to_string(),
            });
        }
        let bytes = glance_core::io::read_capped(
            &tokenizer_path,
            glance_core::io::MAX_TOKENIZER_FILE_BYTES,
            "a tokenizer.json",
        )?;
        let tokenizer = Self::tokenizer_from_bytes(&bytes)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tokenizer_path.display())))?;

        let config = read_json_opt(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let special_map =
            read_json_opt(&dir.join("special_tokens_map.json"))?.unwrap_or(Json::Null);
        let mut specials: [Option<String>; 4] = Default::default();
        for (slot, key) in specials.iter_mut().zip(SPECIAL_KEYS) {
            *slot = token_content(config.get(key)).or_else(|| token_content(special_map.get(key)));
        }
        let clean_up_tokenization_spaces = config
            .get("clean_up_tokenization_spaces")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        let chat_template = find_chat_template(dir, &config)?;

        let mut extra_eos_ids = Vec::new();
        let gen_path = dir.join("generation_config.json");
        if let Some(gen) = read_json_opt(&gen_path)? {
            let ids = match gen.get("eos_token_id") {
                None | Some(Json::Null) => Vec::new(),
                Some(Json::Array(items)) => items
                    .iter()
                    .map(json_id)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                    Error::Tokenizer(format!("{}: eos_token_id must be ids", gen_path.display()))
                })?,
                Some(one) => vec![json_id(one).ok_or_else(|| {
                    Error::Tokenizer(format!(
                        "{}: eos_token_id must be an id",
                        gen_path.display()
                    ))
                })?],
            };
            extra_eos_ids.extend(ids);
        }
        Self::from_parts(
            tokenizer,
            TextParts {
                specials,
                chat_template,
                extra_eos_ids,
                clean_up_tokenization_spaces,
            },
        )
    }

    /// A text processor from a tokenizer and the settings a model directory's other files (or
    /// a GGUF file's metadata) give. The chat template is compiled here; a template that does
    /// not compile is an [`Error::Template`] naming its source.
    pub fn from_parts(tokenizer: Tokenizer, parts: TextParts) -> Result<Self> {
        let TextParts {
            specials,
            chat_template,
            extra_eos_ids,
            clean_up_tokenization_spaces,
        } = parts;
        let [bos_token, eos_token, pad_token, unk_token] = specials;
        let (chat_template, chat_template_file) = match chat_template {
            Some((source, file)) => {
                let template = ChatTemplate::new(source).map_err(|e| {
                    Error::Template(format!("{}: {}", file.display(), strip_prefix(e)))
                })?;
                (Some(template), Some(file))
            }
            None => (None, None),
        };

        let mut eos_ids = Vec::new();
        if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            eos_ids.push(id);
        }
        eos_ids.extend(extra_eos_ids);
        let mut seen = std::collections::HashSet::new();
        eos_ids.retain(|id| seen.insert(*id));
        let byte_fallback = tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|json| json.contains("\"ByteFallback\""));
        let special_ids = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();

        Ok(Self {
            tokenizer,
            bos_token,
            eos_token,
            pad_token,
            unk_token,
            chat_template,
            chat_template_file,
            eos_ids,
            clean_up_tokenization_spaces,
            byte_fallback,
            special_ids,
        })
    }

    /// Parses a `tokenizer.json`, turning its truncation and padding off. Guards against a panic
    /// inside `tokenizers` on odd input: a model directory is user input.
    pub(crate) fn tokenizer_from_bytes(bytes: &[u8]) -> std::result::Result<Tokenizer, String> {
        let parsed = std::panic::catch_unwind(|| Tokenizer::from_bytes(bytes))
            .map_err(|_| "the tokenizers library panicked while parsing the file".to_string())?;
        let mut tokenizer = parsed.map_err(|e| e.to_string())?;
        tokenizer.with_truncation(None).map_err(|e| e.to_string())?;
        tokenizer.with_padding(None);
        Ok(tokenizer)
    }

    /// Vocabulary size including added tokens (`len(tokenizer)` in transformers).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// One past the largest id the tokenizer can decode (added tokens included): the logits of
    /// ids at or above it are never sampled (`TextModel::limit_vocab`). Robust to ids with gaps,
    /// unlike [`TextProcessor::vocab_size`].
    pub fn id_limit(&self) -> usize {
        self.tokenizer
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1)
    }

    /// The id of `token` (a vocabulary entry or an added token), if it has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The token text of `id`, if the vocabulary has it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Tokenises exactly as `tokenizer(text)` in transformers: special tokens added by the
    /// `tokenizer.json` post-processor (BOS for Llama-style tokenizers).
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text, true)
    }

    /// Tokenises with `add_special_tokens=False` (after a chat template that already wrote BOS).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text, false)
    }

    /// Tokenises a rendered chat prompt as transformers' processors do: without special tokens
    /// when the prompt already starts with the BOS text, with them otherwise.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        match self.bos_token.as_deref() {
            Some(bos) if !bos.is_empty() && prompt.starts_with(bos) => self.encode_plain(prompt),
            _ => self.encode_raw(prompt),
        }
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Detokenises like transformers' `decode(ids, skip_special_tokens=…)`, including the
    /// `clean_up_tokenization_spaces` pass when the tokenizer config asks for it. Ids outside the
    /// vocabulary are skipped (as `tokenizers` does).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let text = self.decode_pipeline(ids, skip_special_tokens)?;
        Ok(if self.clean_up_tokenization_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// True when `id` is a `<0xNN>` token that a `ByteFallback` decoder turns into a raw byte.
    fn is_fallback_byte(&self, id: u32) -> bool {
        self.byte_fallback
            && self
                .tokenizer
                .id_to_token(id)
                .is_some_and(|t| t.len() == 6 && t.starts_with("<0x") && t.ends_with('>'))
    }

    /// True when `id` is an added token marked special.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The `tokenizers` decode pipeline only (no clean-up pass).
    fn decode_pipeline(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }

    /// All ids that end generation: `eos_token` plus `generation_config.json`'s `eos_token_id`(s).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// True when `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    pub fn unk_token(&self) -> Option<&str> {
        self.unk_token.as_deref()
    }

    /// Whether `decode` applies transformers' `clean_up_tokenization` pass.
    pub fn clean_up_tokenization_spaces(&self) -> bool {
        self.clean_up_tokenization_spaces
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The file the chat template came from, if any.
    pub fn chat_template_file(&self) -> Option<&Path> {
        self.chat_template_file.as_deref()
    }

    /// Renders `messages` with the model's chat template and this tokenizer's BOS / EOS texts.
    /// A model without a chat template is an [`Error::Template`].
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(messages, add_generation_prompt, None)
    }

    /// [`Self::apply_chat_template`] with the template's `tools` variable.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            Error::Template("the model directory has no chat template".to_string())
        })?;
        template.render_with(
            messages,
            add_generation_prompt,
            self.bos_token(),
            self.eos_token(),
            tools,
        )
    }

    /// An incremental detokeniser (`skip_special_tokens = true`) for streaming generated ids.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// transformers' `clean_up_tokenization`: removes the space before punctuation and English
/// contractions, replacement by replacement, in this order.
pub(crate) const CLEAN_UP_RULES: [(&str, &str); 10] = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
];

pub(crate) fn clean_up_tokenization(text: &str) -> String {
    let mut out = text.to_string();
    for (from, to) in CLEAN_UP_RULES {
        if out.contains(from) {
            out = out.replace(from, to);
        }
    }
    out
}

/// Reads and parses an optional JSON file: `Ok(None)` when it does not exist.
fn read_json_opt(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    crate::checkpoint::read_json(path).map(Some)
}

/// A special token given as a string or as an `AddedToken` object (`{"content": …}`).
fn token_content(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(obj) => obj
            .get("content")
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn json_id(value: &Json) -> Option<u32> {
    value.as_u64().and_then(|v| u32::try_from(v).ok())
}

/// A chat template as stored in `tokenizer_config.json` or `chat_template.json`: a string, or a
/// list of named templates (`"default"` wins; a lone entry is used as is).
fn template_from_json(value: &Json, path: &Path) -> Result<Option<String>> {
    match value {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some(s.clone())),
        Json::Array(items) => {
            let mut named = Vec::new();
            for item in items {
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => named.push((n, t)),
                    _ => {
                        return Err(Error::Template(format!(
                            "{}: chat_template list entries need \"name\" and \"template\" strings",
                            path.display()
                        )))
                    }
                }
            }
            let chosen = named
                .iter()
                .find(|(n, _)| *n == "default")
                .or(if named.len() == 1 {
                    named.first()
                } else {
                    None
                });
            Ok(chosen.map(|(_, t)| t.to_string()))
        }
        _ => Err(Error::Template(format!(
            "{}: chat_template must be a string or a list",
            path.display()
        ))),
    }
}

/// The chat template source and the file it came from, by transformers' precedence.
fn find_chat_template(dir: &Path, config: &Json) -> Result<Option<(String, PathBuf)>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let source = crate::checkpoint::read_text(&jinja)?;
        return Ok(Some((source, jinja)));
    }
    let json_path = dir.join("chat_template.json");
    if let Some(json) = read_json_opt(&json_path)? {
        if let Some(source) =
            template_from_json(json.get("chat_template").unwrap_or(&Json::Null), &json_path)?
        {
            return Ok(Some((source, json_path)));
        }
    }
    if let Some(value) = config.get("chat_template") {
        let config_path = dir.join("tokenizer_config.json");
        if let Some(source) = template_from_json(value, &config_path)? {
            return Ok(Some((source, config_path)));
        }
    }
    Ok(None)
}

/// The message of an [`Error::Template`] without its "chat template: " prefix.
fn strip_prefix(e: Error) -> String {
    match e {
        Error::Template(msg) => msg,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
