//! Log-probabilities in OpenAI's shapes: the chat form (`{"content": [{"token", "logprob",
//! "bytes", "top_logprobs": [...]}]}`) and the legacy completions form (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`). The values are the engine's
//! ([`glance_engine::Request::logprobs`]): the log-softmax of the target's logits after the
//! sampling processors, whichever strategy produced the token.

use glance_core::TokenId;
use glance_engine::{Engine, TokenLogprob};
use serde_json::{json, Map, Value};

/// A token's text as the tokenizer decodes it alone (special tokens included).
pub fn token_text(engine: &Engine, id: TokenId) -> String {
    engine
        .processor()
        .text
        .decode(&[id], false)
        .unwrap_or_default()
}

/// One token's entry of the chat form.
pub fn chat_entry(engine: &Engine, l: &TokenLogprob) -> Value {
    let one = |id: TokenId, lp: f32| {
        let text = token_text(engine, id);
        json!({"token": text, "logprob": lp, "bytes": text.as_bytes()})
    };
    let mut entry = one(l.token, l.logprob);
    let top: Vec<Value> = l.top.iter().map(|&(id, lp)| one(id, lp)).collect();
    entry["top_logprobs"] = Value::Array(top);
    entry
}

/// The chat form of a whole answer.
pub fn chat_logprobs(engine: &Engine, list: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = list.iter().map(|l| chat_entry(engine, l)).collect();
    json!({"content": content})
}

/// The legacy completions form of tokens whose text starts at byte `offset` of the returned text
/// (after an echoed prompt, or the text streamed before them). A token's `text_offset` is where
/// its piece of the detokenised answer starts (the piece may begin with the space a tokenizer
/// puts between words; `tokens` holds each token decoded alone).
pub fn completion_logprobs(engine: &Engine, list: &[TokenLogprob], offset: usize) -> Value {
    let mut tokens = Vec::with_capacity(list.len());
    let mut values = Vec::with_capacity(list.len());
    let mut tops = Vec::with_capacity(list.len());
    let mut offsets = Vec::with_capacity(list.len());
    let mut pieces = engine.processor().text.stream_decoder();
    let mut at = offset;
    for l in list {
        let text = token_text(engine, l.token);
        offsets.push(at);
        at += pieces.push(l.token).map_or(0, |p| p.len());
        tokens.push(text);
        values.push(l.logprob);
        let top: Map<String, Value> = l
            .top
            .iter()
            .map(|&(id, lp)| (token_text(engine, id), json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}
