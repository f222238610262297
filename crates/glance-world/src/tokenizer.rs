//! Hugging Face tokenizer files for the world vocabulary, and the chat format.
//!
//! `tokenizer.json`: a WordPiece model over the closed word list (whole words; digits after the
//! first of a number are `##d` continuations, so "42" → `4 ##2` and decodes back to "42"), a
//! `Lowercase` normaliser, a pre-tokenizer splitting on whitespace and punctuation, a Llama-style
//! `TemplateProcessing` post-processor adding `<s>`, and a WordPiece decoder that re-joins words
//! with single spaces (and glues `##` pieces and punctuation). Unknown words map to `<unk>`.
//!
//! `tokenizer_config.json`: special tokens and a LLaVA-1.5 chat template:
//! `USER: <image>\n{question} ASSISTANT: {answer}</s>USER: {question} ASSISTANT:` — the image
//! goes in the first user turn, every answer ends with `</s>`. [`chat_text`] and [`chat_prompt`]
//! produce exactly what the template renders, for training code that does not run Jinja.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::qa::Qa;
use crate::vocab::{self, BOS, EOS, IMAGE, MASK, PAD, UNK};
use crate::WorldError;

/// The chat template (Jinja; renders in both Python jinja2 and minijinja). Message `content` may
/// be a string or a list of `{"type": "image"}` / `{"type": "text", "text": …}` parts; system
/// messages are ignored (the vocabulary has no words for them).
pub const CHAT_TEMPLATE: &str = concat!(
    "{% for message in messages %}",
    "{% if message['role'] == 'user' %}USER: ",
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}",
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>\\n' }}{% endif %}{% endfor %}",
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}",
    "{% endif %} ",
    "{% elif message['role'] == 'assistant' %}ASSISTANT: ",
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}",
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}",
    "{% endif %}</s>",
    "{% endif %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
);

fn added_token(id: usize, content: &str) -> Value {
    json!({
        "id": id, "content": content, "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true
    })
}

/// The `tokenizer.json` document.
pub fn tokenizer_json() -> String {
    let tokens = vocab::tokens();
    let mut vocab_map = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab_map.insert(t.clone(), json!(i));
    }
    let added: Vec<Value> = vocab::SPECIAL
        .iter()
        .enumerate()
        .map(|(i, t)| added_token(i, t))
        .collect();
    let bos_id = vocab::SPECIAL.iter().position(|t| *t == BOS).unwrap_or(2);
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": { "type": "Lowercase" },
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                { "type": "WhitespaceSplit" },
                { "type": "Punctuation", "behavior": "Isolated" }
            ]
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                { "SpecialToken": { "id": BOS, "type_id": 0 } },
                { "Sequence": { "id": "A", "type_id": 0 } }
            ],
            "pair": [
                { "SpecialToken": { "id": BOS, "type_id": 0 } },
                { "Sequence": { "id": "A", "type_id": 0 } },
                { "SpecialToken": { "id": BOS, "type_id": 1 } },
                { "Sequence": { "id": "B", "type_id": 1 } }
            ],
            "special_tokens": { BOS: { "id": BOS, "ids": [bos_id], "tokens": [BOS] } }
        },
        "decoder": { "type": "WordPiece", "prefix": vocab::CONTINUATION, "cleanup": true },
        "model": {
            "type": "WordPiece",
            "unk_token": UNK,
            "continuing_subword_prefix": vocab::CONTINUATION,
            "max_input_chars_per_word": 100,
            "vocab": Value::Object(vocab_map)
        }
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// The `tokenizer_config.json` document (special tokens, chat template).
pub fn tokenizer_config_json() -> String {
    let mut decoder = Map::new();
    for (i, t) in vocab::SPECIAL.iter().enumerate() {
        decoder.insert(
            i.to_string(),
            json!({ "content": t, "lstrip": false, "normalized": false, "rstrip": false,
                    "single_word": false, "special": true }),
        );
    }
    let doc = json!({
        "add_bos_token": true,
        "add_eos_token": false,
        "added_tokens_decoder": Value::Object(decoder),
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "mask_token": MASK,
        "image_token": IMAGE,
        "extra_special_tokens": { "image_token": IMAGE },
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 2048,
        "padding_side": "right",
        "tokenizer_class": "PreTrainedTokenizerFast"
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// Write `tokenizer.json` and `tokenizer_config.json` into `dir` (created if missing).
pub fn write_tokenizer_files(dir: &Path) -> Result<(), WorldError> {
    std::fs::create_dir_all(dir).map_err(|cause| WorldError::Io {
        path: dir.to_path_buf(),
        cause,
    })?;
    for (name, text) in [
        ("tokenizer.json", tokenizer_json()),
        ("tokenizer_config.json", tokenizer_config_json()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|cause| WorldError::Io { path, cause })?;
    }
    Ok(())
}

/// A whole conversation as the chat template renders it (image in the first user turn,
/// every answer followed by `</s>`). The tokenizer adds `<s>` in front.
pub fn chat_text(turns: &[Qa]) -> String {
    let mut s = String::new();
    for (k, t) in turns.iter().enumerate() {
        s.push_str("USER: ");
        if k == 0 {
            s.push_str(IMAGE);
            s.push('\n');
        }
        s.push_str(&t.question);
        s.push_str(" ASSISTANT: ");
        s.push_str(&t.answer);
        s.push_str(EOS);
    }
    s
}

/// The prompt for `question` after the answered turns `history`, ending in `ASSISTANT:` (the
/// template with `add_generation_prompt`); the model continues with the answer and `</s>`.
pub fn chat_prompt(history: &[Qa], question: &str) -> String {
    let mut s = chat_text(history);
    s.push_str("USER: ");
    if history.is_empty() {
        s.push_str(IMAGE);
        s.push('\n');
    }
    s.push_str(question);
    s.push_str(" ASSISTANT:");
    s
}
