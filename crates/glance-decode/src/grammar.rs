//! Constrained decoding: a grammar (a JSON schema, or any JSON value) turned into a mask over the
//! vocabulary at every step, so the answer is valid by construction. The masks come from
//! llguidance (the Earley parser and derivative-based lexer behind vLLM's and SGLang's
//! `guidance` backends): it walks a trie of the tokens' bytes against the parser's state, lazily,
//! instead of precomputing an index over every state and token.
//!
//! A [`GrammarVocab`] holds the tokens' bytes (one per model, built from its tokenizer) and
//! compiles an [`OutputFormat`] into a [`Grammar`]: the state of one generation. The sampler
//! applies it as its last processor (`crate::sampler`): the row of a node given the history and a
//! path masks every token the grammar forbids after them, so a draft token that violates the
//! grammar is never the target's choice and never accepted.

use glance_core::{Error, Result, TokenId};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;

/// What the answer must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
}

impl OutputFormat {
    /// The schema the grammar is compiled from, with llguidance's layout options: `", "` between
    /// items, `": "` after keys and no other whitespace (flexible whitespace lets a model emit
    /// blanks forever).
    fn schema(&self) -> Value {
        let mut schema = match self {
            OutputFormat::JsonObject => json!({"type": "object"}),
            OutputFormat::JsonSchema(s) => s.clone(),
        };
        if let Value::Object(m) = &mut schema {
            m.entry("x-guidance").or_insert_with(|| {
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
            });
        }
        schema
    }
}

/// A model's tokens as bytes, and the grammar compiler over them.
pub struct GrammarVocab {
    factory: ParserFactory,
    eos: Arc<[TokenId]>,
    vocab: usize,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrammarVocab({} tokens, eos {:?})", self.vocab, self.eos)
    }
}

impl GrammarVocab {
    /// From a Hugging Face `tokenizer.json` (its byte-level or byte-fallback vocabulary), the
    /// model's vocabulary size (rows of logits) and its end-of-sequence tokens. A tokenizer that
    /// cannot spell arbitrary bytes (word-level, as glance-tiny's) is an [`Error::Input`].
    pub fn from_tokenizer_json(tokenizer: &Value, vocab: usize, eos: &[TokenId]) -> Result<Self> {
        let mut words = llguidance::token_bytes_from_tokenizer_json(tokenizer).map_err(|e| {
            Error::Input(format!(
                "the tokenizer cannot spell arbitrary text (no byte-level or byte-fallback \
                 vocabulary): {e}"
            ))
        })?;
        let first = *eos.first().ok_or_else(|| {
            Error::Input("the model has no end-of-sequence token to end a grammar".into())
        })?;
        let size = vocab.max(words.len());
        words.resize(size, Vec::new());
        let info = TokRxInfo::new(size as u32, first);
        let env = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&(env as _)).map_err(grammar_error)?;
        factory.quiet();
        Ok(Self {
            factory,
            eos: eos.into(),
            vocab,
        })
    }

    /// The state of one generation under `format`; an invalid or unsupported schema is an
    /// [`Error::InvalidParam`] with llguidance's reason.
    pub fn compile(&self, format: &OutputFormat) -> Result<Grammar> {
        let grammar = TopLevelGrammar::from_json_schema(format.schema());
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::InvalidParam(format!("the JSON schema is not usable: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::InvalidParam(format!(
                "the JSON schema is not usable: {e}"
            )));
        }
        Ok(Grammar {
            matcher,
            eos: self.eos.clone(),
            trie_eos: self.eos[0],
        })
    }
}

fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::Input(format!("grammar: {e}"))
}

/// One generation's position in its grammar: the tokens emitted so far have been consumed.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    eos: Arc<[TokenId]>,
    /// The end-of-sequence token llguidance's mask names.
    trie_eos: TokenId,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grammar(stopped: {})", self.matcher.is_stopped())
    }
}

impl Grammar {
    /// Sets to `-inf` every entry of `row` the grammar forbids after the tokens consumed and then
    /// `path`. End-of-sequence tokens are allowed where the grammar may end (and only they once it
    /// has ended); a path the grammar refuses, or a failure inside the parser, leaves only them.
    pub fn mask(&mut self, row: &mut [f32], path: &[TokenId]) {
        let allowed = self.allowed(path);
        let eos_ok = allowed.as_ref().is_none_or(|a| a.is_allowed(self.trie_eos));
        for (t, l) in row.iter_mut().enumerate() {
            let t = t as TokenId;
            let ok = if self.eos.contains(&t) {
                eos_ok
            } else {
                allowed.as_ref().is_some_and(|a| a.is_allowed(t))
            };
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// The tokens allowed after `path`; `None`: only end-of-sequence.
    fn allowed(&mut self, path: &[TokenId]) -> Option<llguidance::toktrie::SimpleVob> {
        if self.matcher.is_stopped() {
            return None;
        }
        if path.is_empty() {
            return self.matcher.compute_mask().ok();
        }
        if self.matcher.validate_tokens(path).ok()? < path.len() {
            return None;
        }
        self.matcher.consume_tokens(path).ok()?;
        let mask = if self.matcher.is_stopped() {
            None
        } else {
            self.matcher.compute_mask().ok()
        };
        self.matcher.rollback(path.len()).ok()?;
        mask
    }

    /// `token` was emitted. Tokens after the grammar ended (end-of-sequence ignored by the
    /// caller) change nothing.
    pub fn advance(&mut self, token: TokenId) {
        if !self.matcher.is_stopped() {
            // A refused token puts the matcher in its error state: only end-of-sequence after.
            let _ = self.matcher.consume_token(token);
        }
    }

    /// Whether the tokens so far form a complete answer.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-fallback vocabulary: `</s>` (0), the 256 byte tokens, and a few merged pieces.
    fn vocab() -> GrammarVocab {
        let mut v = serde_json::Map::new();
        v.insert("</s>".into(), json!(0));
        for b in 0..=255u32 {
            v.insert(format!("<0x{b:02X}>"), json!(1 + b));
        }
        for (i, w) in ["{\"", "\":", "true", "▁{", "}"].iter().enumerate() {
            v.insert(w.to_string(), json!(257 + i));
        }
        let tok = json!({
            "added_tokens": [{"id": 0, "content": "</s>", "special": true}],
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}]},
            "model": {"type": "BPE", "vocab": v},
        });
        GrammarVocab::from_tokenizer_json(&tok, 262, &[0]).unwrap()
    }

    fn byte(b: u8) -> TokenId {
        1 + b as TokenId
    }

    fn allowed(g: &mut Grammar, path: &[TokenId]) -> Vec<TokenId> {
        let mut row = vec![0.0f32; 262];
        g.mask(&mut row, path);
        (0..262).filter(|&t| row[t as usize] == 0.0).collect()
    }

    #[test]
    fn masks_follow_the_schema_and_end_with_eos() {
        let v = vocab();
        let schema = json!({"type": "object", "properties": {"a": {"type": "boolean"}},
                            "required": ["a"], "additionalProperties": false});
        let mut g = v.compile(&OutputFormat::JsonSchema(schema)).unwrap();
        // First: `{` alone, or `{"`; never a blank, `}` or end-of-sequence.
        let first = allowed(&mut g, &[]);
        assert_eq!(first, vec![byte(b'{'), 257], "{first:?}");
        // After `{"`, only `a`; a path is consumed and rolled back.
        assert_eq!(allowed(&mut g, &[257]), vec![byte(b'a')]);
        assert_eq!(allowed(&mut g, &[]), first);
        // A path the grammar refuses leaves end-of-sequence only.
        assert_eq!(allowed(&mut g, &[byte(b'x')]), vec![0]);
        for t in [257, byte(b'a'), 258, byte(b' '), 259] {
            assert!(allowed(&mut g, &[]).contains(&t), "{t}");
            g.advance(t);
        }
        assert!(!g.is_complete());
        assert_eq!(allowed(&mut g, &[]), vec![byte(b'}'), 261]);
        g.advance(261);
        assert!(g.is_complete());
        assert_eq!(allowed(&mut g, &[]), vec![0]);
    }

    #[test]
    fn bad_schemas_and_vocabularies_are_errors() {
        let v = vocab();
        let e = v
            .compile(&OutputFormat::JsonSchema(json!({"type": "frobnicate"})))
            .unwrap_err();
        assert!(matches!(e, Error::InvalidParam(_)), "{e}");
        let word_level = json!({"decoder": null, "model": {"type": "WordLevel", "vocab": {}}});
        let e = GrammarVocab::from_tokenizer_json(&word_level, 4, &[0]).unwrap_err();
        assert!(e.to_string().contains("cannot spell"), "{e}");
        assert!(v.compile(&OutputFormat::JsonObject).is_ok());
    }
}
