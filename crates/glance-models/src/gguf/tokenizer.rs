//! The tokenizer of a GGUF text model, rebuilt from its `tokenizer.ggml.*` metadata as a
//! `tokenizers` pipeline, the way llama.cpp tokenizes (`llama-vocab.cpp`) and transformers'
//! GGUF loader converts (`integrations/ggml.py`):
//!
//! * `tokenizer.ggml.model = "llama"` (SentencePiece): tokens, `scores` and `token_type`.
//!   llama.cpp merges, at each step, the adjacent pair whose concatenation is a token with the
//!   highest score, and falls back to `<0xNN>` byte tokens for characters outside the vocabulary.
//!   That is BPE with one merge per split of each normal token into two tokens, ranked by the
//!   merged token's score (transformers' `SentencePieceExtractor` builds the same list), byte
//!   fallback on, spaces written as `▁` with one prepended to the text (`add_space_prefix`).
//! * `tokenizer.ggml.model = "gpt2"` (byte-level BPE): tokens and `merges` as stored, GPT-2's
//!   byte-to-unicode mapping, and the pre-tokenizer regex `tokenizer.ggml.pre` names (the regexes
//!   of llama.cpp's `llama-vocab.cpp` for `qwen2` and `llama-bpe`; GPT-2's otherwise).
//!
//! Control, unknown and user-defined tokens (`token_type` 3, 2, 4) become added tokens, matched
//! whole (control and unknown ones special); BOS / EOS are added as `add_bos_token` /
//! `add_eos_token` say (defaults: BOS for `llama`, none for `gpt2`).

use super::file::GgufFile;
use crate::processing::tokenizer::{TextParts, TextProcessor};
use glance_core::{Error, Result};
use serde_json::{json, Value as Json};
use std::collections::HashMap;

/// `token_type` values of the GGUF spec.
const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Qwen2's pre-tokenizer regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's pre-tokenizer regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The text processor of a GGUF text model: tokenizer, special tokens, chat template
/// (`tokenizer.chat_template`), end-of-generation ids (`eos_token_id`, `eot_token_id`).
/// `placeholder`: a special token to add after the vocabulary (id = the number of tokens), for
/// a model whose vocabulary has no image placeholder.
pub fn text_processor(file: &GgufFile, placeholder: Option<&str>) -> Result<TextProcessor> {
    let bad = |what: String| Error::Tokenizer(format!("{}: {what}", file.path.display()));
    let model = file.str_opt("tokenizer.ggml.model")?.ok_or_else(|| {
        bad("no tokenizer (metadata `tokenizer.ggml.model` is missing)".to_string())
    })?;
    let tokens = file
        .strings_opt("tokenizer.ggml.tokens")?
        .ok_or_else(|| bad("metadata `tokenizer.ggml.tokens` is missing".to_string()))?;
    let types = file
        .ints_opt("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![NORMAL; tokens.len()]);
    if types.len() != tokens.len() {
        return Err(bad(format!(
            "{} token types for {} tokens",
            types.len(),
            tokens.len()
        )));
    }
    let id = |key: &str| -> Result<Option<u32>> {
        match file.uint_opt(key)? {
            None => Ok(None),
            Some(i) if (i as usize) < tokens.len() => Ok(Some(i as u32)),
            Some(i) => Err(bad(format!(
                "`{key}` {i} is outside the {}-token vocabulary",
                tokens.len()
            ))),
        }
    };
    let bos = id("tokenizer.ggml.bos_token_id")?;
    let eos = id("tokenizer.ggml.eos_token_id")?;
    let unk = id("tokenizer.ggml.unknown_token_id")?;
    let pad = id("tokenizer.ggml.padding_token_id")?;
    let eot = id("tokenizer.ggml.eot_token_id")?;
    let text = |i: Option<u32>| i.map(|i| tokens[i as usize].to_string());
    let (add_bos_default, spm) = match model {
        "llama" => (true, true),
        "gpt2" => (false, false),
        other => {
            return Err(bad(format!(
                "tokenizer model `{other}` is not supported (llama: SentencePiece, gpt2: \
                 byte-level BPE)"
            )))
        }
    };
    let add_bos = file
        .bool_opt("tokenizer.ggml.add_bos_token")?
        .unwrap_or(add_bos_default);
    let add_eos = file
        .bool_opt("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);

    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(t.to_string(), json!(i));
        if matches!(*ty, UNKNOWN | CONTROL | USER_DEFINED) {
            added.push(
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty != USER_DEFINED}),
            );
        }
    }
    if let Some(p) = placeholder {
        added.push(
            json!({"id": tokens.len(), "content": p, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        );
    }
    let post = post_processor(
        text(bos).filter(|_| add_bos),
        bos,
        text(eos).filter(|_| add_eos),
        eos,
    );
    let doc = if spm {
        let scores = file
            .floats_opt("tokenizer.ggml.scores")?
            .ok_or_else(|| bad("metadata `tokenizer.ggml.scores` is missing".to_string()))?;
        if scores.len() != tokens.len() {
            return Err(bad(format!(
                "{} scores for {} tokens",
                scores.len(),
                tokens.len()
            )));
        }
        let prefix = file
            .bool_opt("tokenizer.ggml.add_space_prefix")?
            .unwrap_or(true);
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if prefix {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                "prepend_scheme": if prefix { "first" } else { "never" }, "split": false},
            "post_processor": post,
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {"type": "BPE", "dropout": null, "unk_token": text(unk),
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
                "byte_fallback": true, "ignore_merges": false, "vocab": vocab,
                "merges": merges_from_scores(&tokens, &types, &scores)},
        })
    } else {
        let merges: Vec<Json> = file
            .strings_opt("tokenizer.ggml.merges")?
            .ok_or_else(|| bad("metadata `tokenizer.ggml.merges` is missing".to_string()))?
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| json!([a, b]))
                    .ok_or_else(|| bad(format!("merge `{m}` is not two tokens")))
            })
            .collect::<Result<_>>()?;
        let regex = match file.str_opt("tokenizer.ggml.pre")? {
            Some("qwen2") => Some(QWEN2_REGEX),
            Some("llama-bpe" | "llama3") => Some(LLAMA3_REGEX),
            _ => None,
        };
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": regex.is_none()});
        let pre = match regex {
            Some(r) => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false},
                byte_level]}),
            None => byte_level,
        };
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": pre, "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
        })
    };
    let bytes = serde_json::to_vec(&doc).map_err(|e| bad(e.to_string()))?;
    let tokenizer = TextProcessor::tokenizer_from_bytes(&bytes).map_err(bad)?;
    let template = file
        .str_opt("tokenizer.chat_template")?
        .map(|t| (t.to_string(), file.path.join("tokenizer.chat_template")));
    TextProcessor::from_parts(
        tokenizer,
        TextParts {
            specials: [text(bos), text(eos), text(pad), text(unk)],
            chat_template: template,
            extra_eos_ids: eot.into_iter().collect(),
            clean_up_tokenization_spaces: false,
        },
    )
}

/// A `TemplateProcessing` post-processor adding `bos` before and `eos` after the text (either
/// may be absent).
fn post_processor(
    bos: Option<String>,
    bos_id: Option<u32>,
    eos: Option<String>,
    eos_id: Option<u32>,
) -> Json {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = serde_json::Map::new();
    if let (Some(b), Some(id)) = (&bos, bos_id) {
        single.push(json!({"SpecialToken": {"id": b, "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": b, "type_id": 0}}));
        specials.insert(b.clone(), json!({"id": b, "ids": [id], "tokens": [b]}));
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let (Some(e), Some(id)) = (&eos, eos_id) {
        single.push(json!({"SpecialToken": {"id": e, "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": e, "type_id": 0}}));
        specials.insert(e.clone(), json!({"id": e, "ids": [id], "tokens": [e]}));
    }
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair,
        "special_tokens": specials})
}

/// The merges a SentencePiece vocabulary implies: every split of a normal token into two
/// tokens, ranked by the merged token's score (highest first; ties by the two ids), as
/// transformers' `SentencePieceExtractor` lists them.
pub(crate) fn merges_from_scores(tokens: &[&str], types: &[i64], scores: &[f64]) -> Vec<Json> {
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    // (score, left id, right id, left, right)
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if types[i] != NORMAL || t.chars().nth(1).is_none() {
            continue;
        }
        let mut local: Vec<(f64, usize, usize, &str, &str)> = t
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = t.split_at(at);
                Some((scores[i], *ids.get(l)?, *ids.get(r)?, l, r))
            })
            .collect();
        local.sort_by_key(|m| (m.1, m.2));
        merges.extend(local);
    }
    // Stable: equal scores keep the order above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, _, _, l, r)| json!([l, r]))
        .collect()
}
