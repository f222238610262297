//! `glance serve` against a real server on a loopback port: answers equal `glance run`'s (JSON and
//! SSE), every bad input gets its 4xx and the server keeps serving, overload gets 503s while every
//! accepted request completes correctly, and a dropped stream frees its slot.

mod common;
mod serve_common;

use common::*;
use glance_models::processing::image::png_header_only;
use serde_json::{json, Value};
use serve_common::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const MODEL: &str = "models/llama-gqa";

/// A one-turn chat body: the image first, then the question (as `glance run --image --prompt`).
fn body(url: &str, question: &str, extra: Value) -> Value {
    let mut b = json!({
        "model": "llama-gqa",
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": question}]}],
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// `glance run --json` for the same question: (text, completion tokens).
fn run_answer(image: &str, question: &str, flags: &[&str]) -> (String, u64) {
    let (m, img) = (fixture(MODEL), fixture(&format!("images/{image}")));
    let args = [
        &[
            "run",
            "--model",
            s(&m),
            "--image",
            s(&img),
            "--prompt",
            question,
            "--json",
        ][..],
        flags,
    ]
    .concat();
    let o = glance(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    (
        v["text"].as_str().unwrap().to_string(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn answers_equal_glance_run_streamed_or_not() {
    for mode in ["--prefill-chunk=256", "--no-batching"] {
        answers_equal_glance_run(mode);
    }
}

fn answers_equal_glance_run(mode: &str) {
    let server = Server::start(&["--model", s(&fixture(MODEL)), mode]);
    let (status, models) = server.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
    assert!(models.contains("\"id\":\"llama-gqa\""), "{models}");
    let (status, health) = server.request("GET", "/health", None);
    assert_eq!(status, 200, "{health}");

    let cases: [(&str, &str, Value, &[&str]); 2] = [
        (
            "astronaut.png",
            "What is this?",
            json!({"temperature": 0}),
            &[],
        ),
        (
            "camera_gray.png",
            "Describe it.",
            json!({"temperature": 0.9, "top_p": 0.95, "seed": 7}),
            &["--temperature", "0.9", "--top-p", "0.95", "--seed", "7"],
        ),
    ];
    for (image, question, sampling, flags) in cases {
        let (want, tokens) = run_answer(
            image,
            question,
            &[&["--max-new-tokens", "12"], flags].concat(),
        );
        let mut extra = sampling.clone();
        extra["max_tokens"] = json!(12);
        let (status, v) = server.chat(&body(&image_url(image), question, extra.clone()));
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], want.as_str(), "{v}");
        assert_eq!(v["usage"]["completion_tokens"], tokens);
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
        assert!(finish == "stop" || finish == "length", "{v}");

        extra["stream"] = json!(true);
        extra["stream_options"] = json!({"include_usage": true});
        let (status, events) = server.chat_stream(&body(&image_url(image), question, extra));
        assert_eq!(status, 200, "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        assert_eq!(stream_text(&events), want);
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], tokens);
        let last: Value = serde_json::from_str(&events[events.len() - 3]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], finish);
    }
    let m = server.metrics();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "glance_visual_tokens_total",
        "glance_visual_tokens_kept_total",
    ] {
        assert!(m.contains(name), "{name} missing:\n{m}");
    }
    assert_eq!(
        server.metric("glance_requests_total{model_name=\"llama-gqa\",status=\"finished\"}"),
        4.0
    );
    assert_eq!(
        server.metric("glance_visual_tokens_total{model_name=\"llama-gqa\"}"),
        64.0
    );
    // The server's default is `auto`; a model without draft heads decodes plainly.
    assert_eq!(
        server.metric(
            "glance_decode_strategy_total{model_name=\"llama-gqa\",strategy=\"ar\",\
             chosen_by=\"auto\"}"
        ),
        4.0
    );
}

#[test]
fn bad_inputs_get_their_4xx_and_the_server_keeps_serving() {
    let allowed = scratch("serve-files");
    let server = Server::start(&[
        "--model",
        s(&fixture(MODEL)),
        "--max-body-bytes",
        "1000000",
        "--body-timeout-ms",
        "500",
        "--header-timeout-ms",
        "700",
        "--max-image-pixels",
        "1000000",
        "--max-images-per-request",
        "2",
        "--allow-local-files",
        s(&allowed),
    ]);
    let png = std::fs::read(fixture("images/astronaut.png")).unwrap();
    let good_url = data_url(&png, "image/png");
    let good = body(
        &good_url,
        "What is this?",
        json!({"max_tokens": 4, "temperature": 0}),
    );
    let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
    let img = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    let with = |extra: Value| body(&good_url, "Hi", extra);
    let long_prompt = "word ".repeat(2000);
    let json_cases: Vec<(&str, Value, u16, &str)> = vec![
        ("wrong type", json!({"messages": "hello"}), 400, "list"),
        ("empty messages", json!({"messages": []}), 400, "no message"),
        // (An unknown top-level field is ignored unless --strict: tests/serve_openai.rs.)
        (
            "no choices",
            with(json!({"n": 0})),
            400,
            "n must be at least 1",
        ),
        (
            "wrong field type",
            with(json!({"max_tokens": "many"})),
            400,
            "invalid type",
        ),
        (
            "corrupt image",
            user(json!([img(&data_url(
                b"\x89PNG\r\n\x1a\ngarbage",
                "image/png"
            ))])),
            400,
            "image",
        ),
        (
            "truncated image",
            user(json!([img(&data_url(&png[..png.len() / 2], "image/png"))])),
            400,
            "image",
        ),
        (
            "not an image",
            user(json!([img(&data_url(b"hello world", "image/png"))])),
            400,
            "image",
        ),
        (
            "invalid base64",
            user(json!([img("data:image/png;base64,@@@@")])),
            400,
            "base64",
        ),
        (
            "over the pixel limit",
            user(json!([img(&data_url(
                &png_header_only(5000, 5000),
                "image/png"
            ))])),
            400,
            "pixels",
        ),
        (
            "too many images",
            user(json!([img(&good_url), img(&good_url), img(&good_url)])),
            400,
            "at most 2",
        ),
        (
            "prompt over the context",
            user(json!(long_prompt)),
            400,
            "context",
        ),
        (
            "negative temperature",
            with(json!({"temperature": -1})),
            400,
            "temperature",
        ),
        ("top_p over 1", with(json!({"top_p": 1.5})), 400, "top-p"),
        (
            "zero max_tokens",
            with(json!({"max_tokens": 0})),
            400,
            "max_tokens",
        ),
        ("n = 17", with(json!({"n": 17})), 400, "at most 16"),
        (
            "unknown model",
            with(json!({"model": "gpt-4o"})),
            404,
            "does not exist",
        ),
        (
            "unknown glance option",
            with(json!({"glance": {"turbo": true}})),
            400,
            "unknown field",
        ),
        (
            "unknown strategy",
            with(json!({"glance": {"decode": "magic"}})),
            400,
            "magic",
        ),
        (
            "http image",
            user(json!([img("https://example.com/a.png")])),
            400,
            "offline",
        ),
        (
            "file outside the allowed dir",
            user(json!([img("file:///etc/passwd")])),
            400,
            "outside",
        ),
        (
            "missing draft head",
            with(json!({"glance": {"decode": "vispec"}})),
            400,
            "draft",
        ),
    ];
    let check_good = |label: &str| {
        let (status, v) = server.chat(&good);
        assert_eq!(status, 200, "after {label}: {v}");
    };
    for (label, b, status, needle) in json_cases {
        let start = Instant::now();
        let (got, v) = server.chat(&b);
        assert_eq!(got, status, "{label}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{label}: `{needle}` not in {v}");
        assert!(v["error"]["type"].is_string(), "{label}: {v}");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{label} took too long"
        );
        check_good(label);
    }
    // Streaming requests that fail before their first token still get their status.
    let mut b = user(json!([img(&data_url(b"hello world", "image/png"))]));
    b["stream"] = json!(true);
    let (status, text) = server.request("POST", "/v1/chat/completions", Some(&b.to_string()));
    assert_eq!(status, 400, "{text}");
    // Invalid JSON, an oversized body, a slow client.
    let (status, text) = server.request("POST", "/v1/chat/completions", Some("{\"messages\": ["));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid request body"), "{text}");
    check_good("invalid JSON");
    // An oversized body is refused from its Content-Length, before it is sent.
    let head =
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: 1200000\r\n\r\n";
    let (status, text) = parse_response(&server.raw(head));
    assert_eq!(status, 413, "{text}");
    check_good("oversized body");
    let mut slow = server.connect();
    slow.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"messages\"",
    )
    .unwrap();
    let start = Instant::now();
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    let (status, text) = parse_response(&raw);
    assert_eq!(status, 408, "{text}");
    assert!(start.elapsed() < Duration::from_secs(10));
    check_good("slow client");
    // A client that never finishes its headers is disconnected.
    let mut slow = server.connect();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        .unwrap();
    let start = Instant::now();
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "slow headers held the connection"
    );
    check_good("slow headers");
    let (status, _) = server.request("GET", "/v2/nothing", None);
    assert_eq!(status, 404);
    assert_eq!(
        server.metric("glance_requests_total{model_name=\"llama-gqa\",status=\"failed\"}"),
        0.0,
        "no 5xx"
    );
}

#[test]
fn overload_gets_503_and_every_accepted_request_completes() {
    let server = Server::start(&[
        "--model",
        s(&fixture(MODEL)),
        "--max-batch",
        "1",
        "--max-queue",
        "1",
    ]);
    let (want, _) = run_answer(
        "astronaut.png",
        "Tell me a long story.",
        &["--max-new-tokens", "400"],
    );
    let b = body(
        &image_url("astronaut.png"),
        "Tell me a long story.",
        json!({"max_tokens": 400, "temperature": 0}),
    );
    let start = Instant::now();
    let results: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..12).map(|_| scope.spawn(|| server.chat(&b))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < Duration::from_secs(120));
    let mut ok = 0;
    let mut busy = 0;
    for (status, v) in &results {
        match status {
            200 => {
                assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
                ok += 1;
            }
            503 => {
                assert_eq!(v["error"]["code"], "overloaded", "{v}");
                busy += 1;
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert!(ok >= 1 && busy >= 1, "{ok} answered, {busy} refused");
    let (status, v) = server.chat(&b);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        server.metric("glance_requests_total{model_name=\"llama-gqa\",status=\"overloaded\"}"),
        busy as f64
    );
}

#[test]
fn a_dropped_stream_cancels_its_generation_and_frees_its_slot() {
    let server = Server::start(&[
        "--model",
        s(&fixture(MODEL)),
        "--max-batch",
        "1",
        "--max-queue",
        "0",
    ]);
    let mut b = body(
        &image_url("chelsea.jpg"),
        "Tell me a long story.",
        json!({"max_tokens": 450, "temperature": 1.5, "seed": 1, "stream": true}),
    );
    b["messages"][0]["content"][0]["image_url"]["url"] = json!(data_url(
        &std::fs::read(fixture("images/chelsea.jpg")).unwrap(),
        "image/jpeg"
    ));
    let mut conn = server.connect();
    conn.write_all(&request_bytes(
        "POST",
        "/v1/chat/completions",
        Some(&b.to_string()),
    ))
    .unwrap();
    // Read until the first content chunk, then hang up.
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("\"content\":\"") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    drop(conn);
    // The slot comes back: with one slot and no queue, a new request is served.
    let deadline = Instant::now() + Duration::from_secs(20);
    let good = body(&image_url("astronaut.png"), "Hi", json!({"max_tokens": 3}));
    loop {
        let (status, v) = server.chat(&good);
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{v}");
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cancelled =
        server.metric("glance_requests_total{model_name=\"llama-gqa\",status=\"cancelled\"}");
    assert_eq!(cancelled, 1.0, "{}", server.metrics());
    assert_eq!(
        server.metric("vllm:num_requests_running{model_name=\"llama-gqa\"}"),
        0.0
    );
}

#[test]
fn glance_tiny_is_the_default_model_and_answers_like_glance_run() {
    let server = Server::start(&[]);
    let question = "What color is the largest shape?";
    let img = fixture("images/coffee_palette.png");
    let o = glance(&[
        "run",
        "--image",
        s(&img),
        "--prompt",
        question,
        "--max-new-tokens",
        "16",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut b = body(
        &image_url("coffee_palette.png"),
        question,
        json!({"max_tokens": 16, "temperature": 0}),
    );
    b["model"] = json!("glance-tiny");
    let (status, v) = server.chat(&b);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want["text"]);
    assert_eq!(v["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"]);
}

/// Speculative decoding per request on glance-tiny (its shipped draft heads): the same answer as
/// autoregressive decoding, and the speculative counters in `/metrics`.
#[test]
fn speculative_requests_answer_like_autoregressive_ones_and_are_counted() {
    let server = Server::start(&[]);
    let ask = |decode: &str| {
        let mut b = body(
            &image_url("coffee_palette.png"),
            "Describe the image in detail.",
            json!({"max_tokens": 48, "temperature": 0}),
        );
        b["model"] = json!("glance-tiny");
        b["glance"] = json!({"decode": decode});
        let (status, v) = server.chat(&b);
        assert_eq!(status, 200, "{decode}: {v}");
        v["choices"][0]["message"]["content"].clone()
    };
    let ar = ask("ar");
    assert_eq!(ask("vispec"), ar);
    assert_eq!(ask("eagle"), ar);
    let (status, metrics) = server.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let drafted = value("vllm:spec_decode_num_draft_tokens_total");
    let accepted = value("vllm:spec_decode_num_accepted_tokens_total");
    assert!(
        drafted > 0.0 && accepted > 0.0 && accepted <= drafted,
        "{metrics}"
    );
}

#[test]
fn concurrent_requests_are_batched_and_each_gets_its_solo_answer() {
    let server = Server::start(&[
        "--model",
        s(&fixture(MODEL)),
        "--max-batch",
        "8",
        "--prefill-chunk",
        "8",
    ]);
    let cases: Vec<(&str, &str, usize)> = vec![
        ("astronaut.png", "What is this?", 60),
        ("camera_gray.png", "Describe it.", 80),
        ("coffee_palette.png", "Which colours?", 70),
        ("astronaut.png", "Tell me a long story.", 90),
        ("camera_gray.png", "Why?", 50),
        ("coffee_palette.png", "Count them.", 75),
    ];
    let want: Vec<String> = cases
        .iter()
        .map(|(img, q, n)| run_answer(img, q, &["--max-new-tokens", &n.to_string()]).0)
        .collect();
    let got: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(img, q, n)| {
                let b = body(
                    &image_url(img),
                    q,
                    json!({"max_tokens": n, "temperature": 0}),
                );
                let server = &server;
                scope.spawn(move || server.chat(&b))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (status, v)) in got.iter().enumerate() {
        assert_eq!(*status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["message"]["content"],
            want[i].as_str(),
            "request {i}"
        );
    }
    let steps = server.metric("glance_batch_decode_steps_total{model_name=\"llama-gqa\"}");
    let rows = server.metric("glance_batch_decode_rows_total{model_name=\"llama-gqa\"}");
    assert!(
        steps > 0.0 && rows > steps,
        "no step decoded two requests: {rows} rows in {steps} steps"
    );
}

#[test]
fn bench_serve_writes_a_report_and_plots() {
    let out = scratch("bench-serve").join("serve.json");
    let o = glance(&[
        "bench",
        "serve",
        "--model",
        s(&fixture(MODEL)),
        "--shape",
        "none",
        "--clients",
        "1,2",
        "--requests",
        "1",
        "--max-tokens",
        "4",
        "--threads",
        "1",
        "--json",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("TPOT p99"), "{}", stdout(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "2 client counts x batching on/off");
    for r in rows {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ttft_p99_s"].as_f64().unwrap() >= r["ttft_p50_s"].as_f64().unwrap());
    }
    for plot in ["serve-throughput.svg", "serve-tpot.svg"] {
        let svg = std::fs::read_to_string(out.with_file_name(plot)).unwrap();
        assert!(svg.contains("<svg"), "{plot}");
    }
}

#[test]
fn a_speculative_default_without_a_draft_head_fails_at_start() {
    let o = glance(&[
        "serve",
        "--model",
        s(&fixture(MODEL)),
        "--port",
        "0",
        "--decode",
        "vispec",
    ]);
    assert_fails_with(&o, "draft head");
}

/// Requests of every kind — plain, ViSpec, EAGLE, pruned, pruned ViSpec, `auto` — sent at once
/// share the scheduler's steps, and each gets the answer it gets alone.
#[test]
fn mixed_kinds_under_load_answer_as_they_do_alone() {
    let server = Server::start(&["--max-batch", "8", "--prefill-chunk", "32"]);
    let prune = json!({"policy": "adaptive", "keep": 0.125});
    let cases: Vec<(&str, Value, usize)> = vec![
        ("astronaut.png", json!({"decode": "ar"}), 40),
        ("camera_gray.png", json!({"decode": "vispec"}), 48),
        ("coffee_palette.png", json!({"decode": "eagle"}), 44),
        ("astronaut.png", json!({"decode": "ar", "prune": prune}), 36),
        (
            "camera_gray.png",
            json!({"decode": "vispec", "prune": prune}),
            40,
        ),
        ("coffee_palette.png", json!({"decode": "auto"}), 32),
        ("astronaut.png", json!({"decode": "vispec"}), 30),
    ];
    let request = |(img, glance, n): &(&str, Value, usize)| {
        let mut b = body(
            &image_url(img),
            "Describe the image in detail.",
            json!({"max_tokens": n, "temperature": 0}),
        );
        b["model"] = json!("glance-tiny");
        b["glance"] = glance.clone();
        b
    };
    let alone: Vec<Value> = cases
        .iter()
        .map(|c| {
            let (status, v) = server.chat(&request(c));
            assert_eq!(status, 200, "{v}");
            v["choices"][0]["message"]["content"].clone()
        })
        .collect();
    let steps = |server: &Server| {
        server.metric("glance_batch_decode_steps_total{model_name=\"glance-tiny\"}")
    };
    let rows = |server: &Server| {
        server.metric("glance_batch_decode_rows_total{model_name=\"glance-tiny\"}")
    };
    let (steps0, rows0) = (steps(&server), rows(&server));
    let got: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|c| {
                let b = request(c);
                let server = &server;
                scope.spawn(move || server.chat(&b))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (status, v)) in got.iter().enumerate() {
        assert_eq!(*status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["message"]["content"], alone[i],
            "request {i}: {}",
            cases[i].1
        );
    }
    let (steps1, rows1) = (steps(&server), rows(&server));
    assert!(
        rows1 - rows0 > steps1 - steps0,
        "no step decoded two requests: {} rows in {} steps",
        rows1 - rows0,
        steps1 - steps0
    );
    for strategy in ["vispec", "eagle", "ar"] {
        let n = server.metric(&format!(
            "glance_batch_decode_rows_by_strategy_total{{model_name=\"glance-tiny\",strategy=\"{strategy}\"}}"
        ));
        assert!(n > 0.0, "no {strategy} sequence was scheduled");
    }
}

#[test]
fn bench_serve_mix_reports_each_kind_and_the_batch_composition() {
    let out = scratch("bench-serve-mix").join("mix.json");
    let o = glance(&[
        "bench",
        "serve",
        "--mix",
        "ar,vispec,prune",
        "--clients",
        "1,3",
        "--requests",
        "1",
        "--max-tokens",
        "6",
        "--threads",
        "1",
        "--json",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("sequences per step"), "{}", stdout(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    // Each kind alone at 1 and 3 clients, then the mix at 1 client (ar) and 3 (one of each).
    assert_eq!(rows.len(), 3 * 2 + 1 + 3, "{v}");
    for r in rows {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        let per_step = r["sequences_per_step"].as_object().unwrap();
        assert!(!per_step.is_empty(), "{r}");
    }
    let mixed = rows
        .iter()
        .find(|r| r["workload"] == "mixed" && r["clients"] == 3)
        .unwrap();
    let per_step = mixed["sequences_per_step"].as_object().unwrap();
    assert!(
        per_step.contains_key("vispec") && per_step.contains_key("ar"),
        "{mixed}"
    );
    // A kind the model cannot run is refused before anything is measured.
    let o = glance(&["bench", "serve", "--mix", "ar,diffusion", "--json", s(&out)]);
    assert_fails_with(&o, "diffusion");
}
