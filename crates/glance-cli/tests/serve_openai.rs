//! The OpenAI parameters vLLM and llama-server accept, against a real `glance serve` (glance-tiny):
//! log-probabilities equal `glance logits` (streamed or not, whichever strategy), penalties move
//! greedy output the expected way, `logit_bias` / `min_tokens` / `ignore_eos` do what they say,
//! a final assistant message is continued, `cached_tokens` counts the prefix cache, and unknown
//! fields are ignored with a header (refused with `--strict`).

mod common;
mod serve_common;

use candle_core::Tensor;
use common::*;
use serde_json::{json, Value};
use serve_common::*;

const QUESTION: &str = "Describe the image in detail.";

fn image_url(name: &str) -> String {
    let bytes = std::fs::read(fixture(&format!("images/{name}"))).unwrap();
    data_url(&bytes, "image/png")
}

/// A greedy one-turn chat about `image` with `extra` fields.
fn body(image: &str, question: &str, extra: Value) -> Value {
    let mut b = json!({
        "model": "glance-tiny",
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_url(image)}},
            {"type": "text", "text": question}]}],
        "temperature": 0,
        "max_tokens": 24,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn ok(server: &Server, b: &Value) -> Value {
    let (status, v) = server.chat(b);
    assert_eq!(status, 200, "{b}: {v}");
    v
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `(token, logprob, [(token, logprob)…])` of a chat `logprobs.content` list.
type Lp = (String, f64, Vec<(String, f64)>);

fn entries(content: &Value) -> Vec<Lp> {
    content
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let top = e["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t["token"].as_str().unwrap().to_string(),
                        t["logprob"].as_f64().unwrap(),
                    )
                })
                .collect();
            let token = e["token"].as_str().unwrap().to_string();
            assert_eq!(e["bytes"], json!(token.as_bytes()));
            (token, e["logprob"].as_f64().unwrap(), top)
        })
        .collect()
}

fn assert_close(a: &[Lp], b: &[Lp], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.0, y.0, "{what}");
        assert!((x.1 - y.1).abs() < 1e-3, "{what}: {x:?} {y:?}");
        assert_eq!(x.2.len(), y.2.len(), "{what}");
    }
}

#[test]
fn logprobs_equal_glance_logits_streamed_or_not_whichever_strategy() {
    let server = Server::start(&[]);
    let b = body(
        "coffee_palette.png",
        QUESTION,
        json!({"logprobs": true, "top_logprobs": 3}),
    );
    let v = ok(&server, &b);
    let got = entries(&v["choices"][0]["logprobs"]["content"]);
    assert_eq!(got.len() as u64, v["usage"]["completion_tokens"]);
    assert!(got.iter().all(|g| g.2.len() == 3));
    // Streamed: the same entries, spread over the chunks.
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let (status, events) = server.chat_stream(&sb);
    assert_eq!(status, 200);
    let streamed: Vec<Lp> = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|c| !c["choices"][0]["logprobs"].is_null())
        .flat_map(|c| entries(&c["choices"][0]["logprobs"]["content"]))
        .collect();
    assert_eq!(streamed, got);
    assert_eq!(stream_text(&events), content(&v));
    // The speculative strategy's tokens carry the target's values.
    let mut vb = b.clone();
    vb["glance"] = json!({"decode": "vispec"});
    let spec = entries(&ok(&server, &vb)["choices"][0]["logprobs"]["content"]);
    assert_close(&spec, &got, "vispec");

    // `glance logits` over the prompt the chat template renders, followed by the answer.
    let answer = content(&v);
    let out = scratch("serve-logprobs").join("l.npy");
    let o = glance(&[
        "logits",
        "--image",
        s(&fixture("images/coffee_palette.png")),
        "--prompt",
        &format!("USER: <image>\n{QUESTION} ASSISTANT: {answer}"),
        "--raw",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // (prompt + answer, vocab)
    let logits: Vec<Vec<f32>> = Tensor::read_npy(&out).unwrap().to_vec2().unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    // Every token but a final end-of-sequence one is in the answer's text.
    let spelled = got.iter().take_while(|g| g.0 != "</s>").count();
    assert!(spelled >= 10, "{got:?}");
    assert_eq!(logits.len(), prompt + spelled);
    for (i, (token, lp, top)) in got.iter().take(spelled).enumerate() {
        let row = &logits[prompt - 1 + i];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z = max + row.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        // The most likely token is the greedy pick; the top list follows the logits.
        assert_eq!(top[0].0, *token, "position {i}");
        for (k, (_, want)) in top.iter().enumerate() {
            let l = (row[order[k]] - z) as f64;
            assert!(
                (l - want).abs() < 1e-4,
                "position {i} top {k}: {l} vs {want}"
            );
        }
        assert!(((row[order[0]] - z) as f64 - lp).abs() < 1e-4);
    }
}

/// Distinct words of an answer (punctuation aside).
fn distinct(text: &str) -> usize {
    let text = text.replace([',', '.'], " ");
    let words: std::collections::HashSet<&str> = text.split_whitespace().collect();
    words.len()
}

#[test]
fn penalties_bias_and_token_limits_change_greedy_output_as_they_say() {
    let server = Server::start(&[]);
    let ask = |extra: Value| {
        let mut b = body("coffee_palette.png", QUESTION, json!({"max_tokens": 64}));
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        ok(&server, &b)
    };
    let plain = ask(json!({}));
    assert_eq!(plain["usage"]["completion_tokens"], 64);
    let plain = content(&plain);
    let base = distinct(&plain);
    // vLLM's "off" values change nothing.
    let off = json!({"top_k": -1, "min_p": 0, "repetition_penalty": 1,
                     "presence_penalty": 0, "frequency_penalty": 0});
    assert_eq!(content(&ask(off)), plain);
    for extra in [
        json!({"presence_penalty": 1.5}),
        json!({"frequency_penalty": 1.0}),
        json!({"repetition_penalty": 2.0}),
    ] {
        let v = ask(extra.clone());
        assert_eq!(v["usage"]["completion_tokens"], 64);
        let t = content(&v);
        assert!(distinct(&t) > base, "{extra}: {t} vs {plain}");
    }
    // A negative presence penalty favours words already said.
    let t = content(&ask(json!({"presence_penalty": -2.0})));
    assert!(distinct(&t) < base, "{t} vs {plain}");
    // A +100 bias on one word's id: every token is that word.
    let vocab: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("../models/glance-tiny/tokenizer.json")).unwrap(),
    )
    .unwrap();
    let id = &vocab["model"]["vocab"]["circle"];
    let v = ask(json!({"logit_bias": {id.to_string(): 100}, "max_tokens": 5}));
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    assert_eq!(content(&v), "circle circle circle circle circle");
    // min_tokens holds the end of sequence back; ignore_eos runs to max_tokens.
    let short = |extra: Value| {
        let mut b = body(
            "coffee_palette.png",
            "How many objects are there?",
            json!({"max_tokens": 12}),
        );
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        ok(&server, &b)["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
    };
    let n = short(json!({}));
    assert!(n < 6, "{n}");
    assert!(short(json!({"min_tokens": 6})) >= 6);
    assert_eq!(short(json!({"ignore_eos": true})), 12);
}

#[test]
fn a_final_assistant_message_is_continued_and_repeated_images_count_cached_tokens() {
    let server = Server::start(&[]);
    let full = ok(&server, &body("coffee_palette.png", QUESTION, json!({})));
    assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let full = content(&full);
    let words: Vec<&str> = full.split_whitespace().collect();
    let head = words[..3].join(" ");
    let mut b = body("coffee_palette.png", QUESTION, json!({"max_tokens": 21}));
    b["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": head}));
    let v = ok(&server, &b);
    let rest = content(&v);
    // The continuation picks up where the prefilled words stop.
    assert!(
        full.starts_with(&format!("{head} {}", rest.trim()))
            || full.starts_with(&format!("{head}{rest}")),
        "{head:?} + {rest:?} vs {full:?}"
    );
    // The same image again (a new question): its prefix came from the cache.
    let cached = ok(
        &server,
        &body("coffee_palette.png", "What is this?", json!({})),
    );
    let n = cached["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(n > 0 && n < cached["usage"]["prompt_tokens"].as_u64().unwrap());
}

/// The head of a raw response, lower-cased.
fn head(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw).to_ascii_lowercase();
    text.split("\r\n\r\n").next().unwrap().to_string()
}

#[test]
fn unknown_fields_are_ignored_with_a_header_unless_strict() {
    let b = body(
        "coffee_palette.png",
        QUESTION,
        json!({"max_tokens": 4, "vendor_option": {"x": 1}, "best_of": 1}),
    );
    let req = request_bytes("POST", "/v1/chat/completions", Some(&b.to_string()));
    let lenient = Server::start(&[]);
    let raw = lenient.raw(&req);
    let (status, _) = parse_response(&raw);
    assert_eq!(status, 200);
    assert!(
        head(&raw).contains("glance-ignored-fields: best_of, vendor_option"),
        "{}",
        head(&raw)
    );
    // Unknown keys inside "glance" stay errors.
    let mut g = b.clone();
    g["glance"] = json!({"speed": 2});
    assert_eq!(lenient.chat(&g).0, 400);
    let strict = Server::start(&["--strict"]);
    let (status, v) = strict.chat(&b);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "best_of");
}
