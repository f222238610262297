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
    // Each penalty reaches the sampler: it changes the greedy answer. (Whether an answer then
    // uses more distinct words depends on the model; the arithmetic of each penalty is tested
    // in crates/glance-decode/src/sampler.rs.)
    for extra in [
        json!({"presence_penalty": 1.5}),
        json!({"frequency_penalty": 1.0}),
        json!({"repetition_penalty": 2.0}),
    ] {
        let t = content(&ask(extra.clone()));
        assert_ne!(t, plain, "{extra} changed nothing");
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
    // A token beyond the vocabulary is a 400 naming the field's problem.
    let mut b = body(
        "coffee_palette.png",
        QUESTION,
        json!({"logit_bias": {"141": 1}}),
    );
    b["stream"] = json!(true);
    let (status, v) = server.chat(&b);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("beyond the model's vocabulary"));
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

/// `n` seeded choices differ from each other and are the same on every call; chat and legacy
/// completions choose alike.
#[test]
fn n_seeded_choices_differ_and_repeat() {
    let server = Server::start(&[]);
    let b = body(
        "coffee_palette.png",
        QUESTION,
        json!({"n": 3, "seed": 42, "temperature": 1.0, "max_tokens": 20}),
    );
    let answers = |v: &Value| -> Vec<String> {
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{v}");
        choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                assert_eq!(c["index"], i);
                c["message"]["content"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let first = ok(&server, &b);
    let a = answers(&first);
    assert!(a[0] != a[1] && a[1] != a[2] && a[0] != a[2], "{a:?}");
    assert_eq!(answers(&ok(&server, &b)), a);
    // Usage: the prompt once, every choice's tokens.
    let one = ok(
        &server,
        &body(
            "coffee_palette.png",
            QUESTION,
            json!({"seed": 42, "temperature": 1.0, "max_tokens": 20}),
        ),
    );
    assert_eq!(content(&one), a[0]);
    assert_eq!(
        first["usage"]["prompt_tokens"],
        one["usage"]["prompt_tokens"]
    );
    // Streamed: the same three answers, told apart by index.
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let (status, events) = server.chat_stream(&sb);
    assert_eq!(status, 200);
    let mut streamed = vec![String::new(); 3];
    let mut finished = 0;
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if let Some(t) = choice["delta"]["content"].as_str() {
            streamed[i].push_str(t);
        }
        finished += usize::from(!choice["finish_reason"].is_null());
    }
    assert_eq!(streamed, a);
    assert_eq!(finished, 3);
    // Choices that cannot join the batch (speculative) decode one after the other: distinct and
    // reproducible too (speculative sampling draws differently from `ar`, same distribution).
    let mut vb = b.clone();
    vb["glance"] = json!({"decode": "vispec"});
    let v = answers(&ok(&server, &vb));
    assert!(v[0] != v[1] && v[1] != v[2] && v[0] != v[2], "{v:?}");
    assert_eq!(answers(&ok(&server, &vb)), v);
}

fn legacy(server: &Server, b: &Value) -> (u16, Value) {
    let (status, text) = server.request("POST", "/v1/completions", Some(&b.to_string()));
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status}: {e}: {text}"));
    (status, v)
}

#[test]
fn legacy_completions_take_prompt_lists_echo_and_logprobs() {
    let server = Server::start(&[]);
    // glance-tiny's chat prompt, written out: the same answer as the chat API's.
    let chat = ok(
        &server,
        &json!({"messages": [{"role": "user", "content": QUESTION}],
                                    "temperature": 0, "max_tokens": 12}),
    );
    let raw = format!("USER: {QUESTION} ASSISTANT:");
    let (status, v) = legacy(
        &server,
        &json!({"model": "glance-tiny", "prompt": raw,
                                               "temperature": 0, "max_tokens": 12}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(
        v["choices"][0]["text"],
        chat["choices"][0]["message"]["content"]
    );
    // The counts agree (glance's block holds timings, which do not).
    let counts = |u: &Value| {
        let mut u = u.clone();
        u.as_object_mut().unwrap().remove("glance");
        u
    };
    assert_eq!(counts(&v["usage"]), counts(&chat["usage"]));
    assert_eq!(
        v["usage"]["glance"]["token_ends"],
        chat["usage"]["glance"]["token_ends"]
    );
    // A list of prompts, echoed, with log-probabilities in the legacy form.
    let (status, v) = legacy(
        &server,
        &json!({"prompt": [raw, "USER: How many objects are there? ASSISTANT:"],
                "temperature": 0, "max_tokens": 6, "echo": true, "logprobs": 2}),
    );
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (c, p) in choices
        .iter()
        .zip([raw.as_str(), "USER: How many objects are there? ASSISTANT:"])
    {
        let text = c["text"].as_str().unwrap();
        assert!(text.starts_with(p), "{text}");
        let lp = &c["logprobs"];
        let tokens = lp["tokens"].as_array().unwrap();
        assert!(!tokens.is_empty());
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
        assert_eq!(lp["text_offset"][0], p.len());
        // Each token's piece of the text starts at its offset (after a word-separating space).
        for (t, at) in tokens.iter().zip(lp["text_offset"].as_array().unwrap()) {
            let (t, at) = (t.as_str().unwrap(), at.as_u64().unwrap() as usize);
            if t != "</s>" {
                assert!(
                    text[at..].trim_start().starts_with(t),
                    "{t:?} at {at} in {text:?}"
                );
            }
        }
        let top = lp["top_logprobs"][0].as_object().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely.
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((best - lp["token_logprobs"][0].as_f64().unwrap()).abs() < 1e-6);
    }
    // Streamed: the echo, then the text.
    let (status, text) = server.request(
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": raw, "temperature": 0, "max_tokens": 12, "stream": true, "echo": true}).to_string()),
    );
    assert_eq!(status, 200);
    let events = sse_data(&text);
    let joined: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(
        joined,
        format!(
            "{raw}{}",
            chat["choices"][0]["message"]["content"].as_str().unwrap()
        )
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    for (b, param) in [
        (json!({"prompt": "a", "suffix": "b"}), "suffix"),
        (json!({"prompt": [1, 2]}), "prompt"),
        (json!({}), "prompt"),
        (json!({"prompt": "a", "best_of": 3}), "best_of"),
    ] {
        let (status, v) = legacy(&server, &b);
        assert_eq!(status, 400, "{b}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

#[test]
fn an_api_key_guards_every_api_route_and_requests_are_logged_as_json() {
    let log = scratch("serve-log").join("stderr.log");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_glance"));
    cmd.env("GLANCE_HOME", common::TEST_HOME)
        .env("GLANCE_API_KEY", "k3y")
        .env("RUST_LOG", "glance_serve=info");
    let file = std::fs::File::create(&log).unwrap();
    let server = Server::start_with_stderr(cmd, &["--log-format", "json"], file.into());
    let b = body("coffee_palette.png", QUESTION, json!({"max_tokens": 3}));
    let send = |path: &str, auth: Option<&str>, body: Option<&str>| {
        let method = if body.is_some() { "POST" } else { "GET" };
        let mut req = String::from_utf8(request_bytes(method, path, body)).unwrap();
        if let Some(a) = auth {
            req = req.replacen("\r\n", &format!("\r\nAuthorization: {a}\r\n"), 1);
        }
        parse_response(&server.raw(req.as_bytes())).0
    };
    let chat = b.to_string();
    assert_eq!(send("/v1/chat/completions", None, Some(&chat)), 401);
    assert_eq!(
        send("/v1/chat/completions", Some("Bearer nope"), Some(&chat)),
        401
    );
    assert_eq!(
        send("/v1/completions", None, Some("{\"prompt\": \"a\"}")),
        401
    );
    assert_eq!(send("/v1/models", None, None), 401);
    assert_eq!(send("/v1/models", Some("Bearer k3y"), None), 200);
    assert_eq!(send("/health", None, None), 200);
    assert_eq!(send("/metrics", None, None), 200);
    assert_eq!(
        send("/v1/chat/completions", Some("Bearer k3y"), Some(&chat)),
        200
    );
    drop(server);
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let done: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "request finished")
        .collect();
    assert_eq!(done.len(), 1, "{lines:?}");
    let l = done[0];
    assert!(l["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(l["status"], 200);
    assert_eq!(l["completion_tokens"], 3);
    // The server's default is `auto`: whichever it chose, the line names it.
    assert!(
        ["ar", "vispec", "eagle"].contains(&l["strategy"].as_str().unwrap()),
        "{l}"
    );
    assert!(l["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(l["ttft_s"].as_f64().unwrap() <= l["total_s"].as_f64().unwrap());
}

/// `--draft DIR` with the default `ar`: requests may ask for the head's strategy.
#[test]
fn a_draft_head_serves_requests_that_ask_for_it() {
    let head = fixture("../models/glance-tiny/draft-vispec");
    let server = Server::start(&["--draft", s(&head)]);
    let b = body("coffee_palette.png", QUESTION, json!({}));
    let ar = content(&ok(&server, &b));
    let mut v = b.clone();
    v["glance"] = json!({"decode": "vispec"});
    assert_eq!(content(&ok(&server, &v)), ar);
}

/// A WebP image (lossless) answers as its PNG does.
#[test]
fn webp_images_are_accepted() {
    let server = Server::start(&[]);
    let png = std::fs::read(fixture("images/coffee_palette.png")).unwrap();
    let img = image::load_from_memory(&png).unwrap().to_rgb8();
    let mut webp = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut webp)
        .encode(
            img.as_raw(),
            img.width(),
            img.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    let mut b = body("coffee_palette.png", QUESTION, json!({}));
    let want = content(&ok(&server, &b));
    b["messages"][0]["content"][0]["image_url"]["url"] = json!(data_url(&webp, "image/webp"));
    assert_eq!(content(&ok(&server, &b)), want);
}

/// `glance run` takes the same processors as flags and gives the server's answer and
/// log-probabilities; a malformed `--logit-bias` is refused before the model loads.
#[test]
fn glance_run_flags_match_the_server() {
    let server = Server::start(&[]);
    let v = ok(
        &server,
        &body(
            "coffee_palette.png",
            QUESTION,
            json!({"presence_penalty": 1.5, "repetition_penalty": 1.2, "logit_bias": {"6": -5},
                   "min_tokens": 30, "logprobs": true, "top_logprobs": 2}),
        ),
    );
    let o = glance(&[
        "run",
        "--image",
        s(&fixture("images/coffee_palette.png")),
        "--prompt",
        QUESTION,
        "--max-new-tokens",
        "24",
        "--presence-penalty",
        "1.5",
        "--repetition-penalty",
        "1.2",
        "--logit-bias",
        "6=-5",
        "--min-tokens",
        "30",
        "--logprobs",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(run["text"], v["choices"][0]["message"]["content"]);
    let served = &v["choices"][0]["logprobs"]["content"];
    let local = run["logprobs"].as_array().unwrap();
    assert_eq!(local.len(), served.as_array().unwrap().len());
    for (a, b) in local.iter().zip(served.as_array().unwrap()) {
        assert!((a["logprob"].as_f64().unwrap() - b["logprob"].as_f64().unwrap()).abs() < 1e-4);
    }
    let o = glance(&["run", "--prompt", "hi", "--logit-bias", "7"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("ID=BIAS"), "{}", stderr(&o));
}
