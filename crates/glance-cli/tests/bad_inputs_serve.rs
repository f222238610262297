//! The server's part of the bad-input corpus, on the real binary: start-up flags out of range
//! (each refused naming the flag and its range before the server listens), and clients trying to
//! crash or exhaust a server they can reach — deep JSON, huge counts, floods, image bombs, slow
//! bodies, a model whose logits are not finite. Every refusal is a 4xx (or 503 for overload)
//! naming what is wrong, within seconds, and the server keeps serving. (`serve.rs` holds the
//! ordinary 4xx cases: wrong types, corrupt images, the prompt over the context, …)

mod common;
mod serve_common;

use common::bounded::*;
use common::*;
use glance_models::processing::image::png_header_only;
use serde_json::{json, Value};
use serve_common::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const MODEL: &str = "models/llama-gqa";

/// Longest a refused request may take.
const REFUSAL_TIME: Duration = Duration::from_secs(10);

/// Every start-up flag out of range is refused before the server listens (a flag that slipped
/// through would leave it listening, and the case would fail as a hang).
#[test]
fn start_up_flags_are_refused_before_listening() {
    let m = fixture(MODEL);
    let tiny = fixture("../models/glance-tiny");
    let eagle = tiny.join("draft-eagle");
    let max = "18446744073709551615";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--max-batch", max], "--max-batch must be in 1..=256"),
        (
            vec!["--max-batch", "0"],
            "--max-batch must be in 1..=256, got 0",
        ),
        (vec!["--max-queue", max], "--max-queue must be in 0..=65536"),
        (vec!["--max-body-bytes", "0"], "--max-body-bytes must be in"),
        (vec!["--max-body-bytes", max], "--max-body-bytes must be in"),
        (
            vec!["--body-timeout-ms", "0"],
            "--body-timeout-ms must be in",
        ),
        (
            vec!["--body-timeout-ms", max],
            "--body-timeout-ms must be in",
        ),
        (
            vec!["--header-timeout-ms", max],
            "--header-timeout-ms must be in",
        ),
        (vec!["--prefill-chunk", "0"], "--prefill-chunk must be in"),
        (
            vec!["--default-max-tokens", "1000000000"],
            "--default-max-tokens must be in 1..=1048576",
        ),
        (
            vec!["--max-images-per-request", "0"],
            "--max-images-per-request) must be in 1..=256",
        ),
        (
            vec!["--max-images-per-request", max],
            "--max-images-per-request",
        ),
        (vec!["--max-image-pixels", "0"], "--max-image-pixels"),
        (vec!["--max-image-pixels", max], "--max-image-pixels"),
        (vec!["--threads", "100000"], "at most"),
        (vec!["--served-model-name", " "], "--served-model-name"),
        (
            vec!["--allow-local-files", "/no/such/dir"],
            "--allow-local-files",
        ),
        (vec!["--host", "not a host"], "cannot listen"),
        // Strategies the model cannot run, and flags that do not apply to the default one.
        (
            vec!["--decode", "diffusion-linear"],
            "not converted for block diffusion",
        ),
        (vec!["--decode", "vispec"], "draft"),
        (
            vec!["--threshold", "0.5"],
            "--threshold only applies to the block-diffusion strategies",
        ),
        (
            vec!["--decode", "diffusion-linear", "--threshold", "0.5"],
            "--threshold only applies to diffusion-threshold",
        ),
        // (Draft trees and heads are allowed with any default: requests may ask for vispec.)
        (vec!["--draft-depth", "0"], "depth must be in 1..=256"),
        (vec!["--prune-layer", "1"], "fastv"),
    ];
    for (flags, keyword) in &cases {
        let mut args = vec!["serve", "--model", s(&m), "--port", "0"];
        args.extend_from_slice(flags);
        expect_failure(&flags.join(" "), &args, keyword);
    }
    // A draft head of the other kind is refused at start-up, not replaced by the model's own.
    let args = [
        "serve",
        "--model",
        s(&tiny),
        "--port",
        "0",
        "--decode",
        "vispec",
        "--draft",
        s(&eagle),
    ];
    expect_failure("vispec with an eagle head", &args, "--draft names only");
}

/// One request on a fresh connection, timed: (status, error message or body).
fn refused(server: &Server, label: &str, body: &str) -> (u16, String) {
    let start = Instant::now();
    let (status, text) = server.request("POST", "/v1/chat/completions", Some(body));
    assert!(
        start.elapsed() < REFUSAL_TIME,
        "{label}: took {:?}",
        start.elapsed()
    );
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or(text);
    (status, message)
}

#[test]
fn hostile_clients_neither_crash_nor_exhaust_the_server() {
    let server = Server::start(&[
        "--model",
        s(&fixture(MODEL)),
        "--max-body-bytes",
        "2000000",
        "--body-timeout-ms",
        "1000",
        "--header-timeout-ms",
        "1000",
        "--max-images-per-request",
        "2",
        "--max-batch",
        "1",
        "--max-queue",
        "2",
    ]);
    let good = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                      "temperature": 0});
    let check_good = |label: &str| {
        let (status, v) = server.chat(&good);
        assert_eq!(status, 200, "after {label}: {v}");
    };
    let with = |extra: Value| {
        let mut b = good.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
    let img = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let small_png = data_url(&png_header_only(8, 8), "image/png");
    // A real JPEG whose frame header now declares 65000 x 65000 pixels: small bytes, a huge
    // declared image.
    let mut jpeg_bomb = std::fs::read(fixture("images/chelsea.jpg")).unwrap();
    let sof = jpeg_bomb
        .windows(2)
        .position(|w| w[0] == 0xff && matches!(w[1], 0xc0 | 0xc2))
        .expect("a frame header");
    jpeg_bomb[sof + 5..sof + 9].copy_from_slice(&[0xfd, 0xe8, 0xfd, 0xe8]);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "JSON nested 100000 deep",
            format!("{{\"messages\": {}}}", deep(100_000)),
            400,
            "recursion limit",
        ),
        (
            "content nested 100000 deep",
            format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": {}}}]}}",
                deep(100_000)
            ),
            400,
            "recursion limit",
        ),
        ("not an object", "12".into(), 400, "invalid request body"),
        ("null", "null".into(), 400, "invalid request body"),
        (
            "max_tokens 10^12",
            with(json!({"max_tokens": 1_000_000_000_000u64})),
            400,
            "max_tokens must be between 1 and 1048576",
        ),
        (
            "max_tokens 2^64",
            with(json!({"max_tokens": 18446744073709551616.0})),
            400,
            "`max_tokens`: invalid type",
        ),
        (
            "negative max_tokens",
            with(json!({"max_tokens": -1})),
            400,
            "`max_tokens`: invalid value",
        ),
        (
            "max_completion_tokens 10^9",
            with(json!({"max_completion_tokens": 1_000_000_000})),
            400,
            "max_tokens",
        ),
        (
            "n 10^9",
            with(json!({"n": 1_000_000_000})),
            400,
            "at most 16",
        ),
        (
            "negative n",
            with(json!({"n": -1})),
            400,
            "`n`: invalid value",
        ),
        ("negative seed", with(json!({"seed": -5})), 400, "seed"),
        (
            "temperature 10^39 (infinite as f32)",
            with(json!({"temperature": 1e39})),
            400,
            "temperature must be a finite number",
        ),
        ("top_p -0", with(json!({"top_p": -0.0})), 400, "top-p"),
        (
            "top_logprobs",
            with(json!({"top_logprobs": 1_000_000})),
            400,
            "logprobs",
        ),
        (
            "1000 stop strings",
            with(json!({"stop": vec!["x"; 1000]})),
            400,
            "at most 16 stop strings",
        ),
        (
            "a 100 kB stop string",
            with(json!({"stop": "x".repeat(100_000)})),
            400,
            "1 to 256 bytes",
        ),
        (
            "500 image parts",
            user(json!(vec![img(&small_png); 500])).to_string(),
            400,
            "500 images in one request; at most 2",
        ),
        (
            "500 file parts (files not allowed)",
            user(json!(vec![img("/etc/passwd"); 500])).to_string(),
            400,
            "500 images",
        ),
        (
            "PNG bomb (200000 x 200000)",
            user(json!([img(&data_url(
                &png_header_only(200_000, 200_000),
                "image/png"
            ))]))
            .to_string(),
            400,
            "over the limit",
        ),
        (
            "JPEG bomb (65000 x 65000)",
            user(json!([img(&data_url(&jpeg_bomb, "image/jpeg"))])).to_string(),
            400,
            "over the limit",
        ),
        (
            "data:text/plain",
            user(json!([img("data:text/plain;base64,aGVsbG8=")])).to_string(),
            400,
            "must declare an image type",
        ),
        (
            "a 1 MB data: URL without a comma",
            user(json!([img(&format!(
                "data:image/png;{}",
                "a".repeat(1 << 20)
            ))]))
            .to_string(),
            400,
            "`,`",
        ),
        (
            "50000 messages",
            json!({"messages": vec![json!({"role": "user", "content": "a"}); 50_000]}).to_string(),
            400,
            "",
        ),
        (
            "a 1.9 MB message",
            user(json!("word ".repeat(380_000))).to_string(),
            400,
            "context",
        ),
        (
            "threshold with diffusion-linear",
            with(json!({"glance": {"decode": "diffusion-linear", "threshold": 0.5}})),
            400,
            "glance.threshold only applies to diffusion-threshold",
        ),
        (
            "diffusion on an unconverted model",
            with(json!({"glance": {"decode": "diffusion-linear"}})),
            400,
            "not converted",
        ),
    ];
    for (label, body, status, needle) in &cases {
        let (got, message) = refused(&server, label, body);
        assert_eq!(got, *status, "{label}: {message}");
        assert!(
            message.contains(needle),
            "{label}: `{needle}` not in {message}"
        );
        check_good(label);
    }

    // A body that is not UTF-8.
    let raw = request_bytes(
        "POST",
        "/v1/chat/completions",
        Some("{\"messages\": \"??\"}"),
    );
    let at = raw.len() - 4;
    let mut raw = raw;
    raw[at] = 0xff;
    raw[at + 1] = 0xfe;
    let (status, text) = parse_response(&server.raw(&raw));
    assert_eq!(status, 400, "invalid UTF-8: {text}");
    check_good("invalid UTF-8");

    // Bodies over the limit: declared (refused before they are sent), absurdly declared, or
    // streamed in chunks without a length.
    for length in ["2000001", "18446744073709551615"] {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\n\r\n"
        );
        let (status, text) = parse_response(&server.raw(head.as_bytes()));
        // hyper itself refuses a length past its own bound (431) before glance sees it.
        assert!(
            status == 413 || status == 431,
            "Content-Length {length}: {status} {text}"
        );
    }
    // Chunks whose data ends one byte past the limit (no trailing CRLF after the last one), so
    // that the server has read everything sent when it answers.
    let mut chunked = server.connect();
    let mut sent = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                     Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    let mut left = 2_000_001usize;
    while left > 0 {
        let n = left.min(1 << 16);
        sent.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        sent.extend(std::iter::repeat_n(b' ', n));
        left -= n;
        if left > 0 {
            sent.extend_from_slice(b"\r\n");
        }
    }
    chunked.write_all(&sent).unwrap();
    let mut raw = Vec::new();
    let _ = chunked.read_to_end(&mut raw);
    let (status, text) = parse_response(&raw);
    assert_eq!(status, 413, "chunked body over the limit: {text}");
    check_good("oversized bodies");

    // A flood of clients that declare a body and never send it: the one slot and two queue
    // places are taken (their bodies time out, 408), every other is refused at once (503) without
    // its body being read.
    let mut held = Vec::new();
    for _ in 0..10 {
        let mut c = server.connect();
        c.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000000\r\n\r\n{",
        )
        .unwrap();
        held.push(c);
        std::thread::sleep(Duration::from_millis(30));
    }
    let start = Instant::now();
    let statuses: Vec<u16> = held
        .into_iter()
        .map(|mut c| {
            let mut raw = Vec::new();
            let _ = c.read_to_end(&mut raw);
            parse_response(&raw).0
        })
        .collect();
    assert!(start.elapsed() < REFUSAL_TIME, "the flood held the server");
    let busy = statuses.iter().filter(|&&s| s == 503).count();
    let timed_out = statuses.iter().filter(|&&s| s == 408).count();
    assert_eq!((busy, timed_out), (7, 3), "{statuses:?}");
    check_good("a flood of slow bodies");

    let (status, _) = server.request("GET", "/health", None);
    assert_eq!(status, 200);
    assert_eq!(
        server.metric("glance_requests_total{model_name=\"llama-gqa\",status=\"failed\"}"),
        0.0,
        "no 5xx"
    );
}

/// A model whose logits are not finite: every request is a 500 naming the first layer whose
/// output is not finite, batched or alone, streamed or not; the server keeps serving.
#[test]
fn non_finite_logits_are_a_server_error_naming_the_layer() {
    let d = scratch("serve-nan");
    let m = model_copy(&d, "nan-norm", MODEL);
    let f = m.join("model.safetensors");
    let mut ts = candle_core::safetensors::load(&f, &candle_core::Device::Cpu).unwrap();
    let w = ts.get_mut("language_model.model.norm.weight").unwrap();
    *w = (w.ones_like().unwrap() * f64::NAN).unwrap();
    candle_core::safetensors::save(&ts, &f).unwrap();
    for flags in [&[][..], &["--no-batching"][..]] {
        let mut args = vec!["--model", s(&m)];
        args.extend_from_slice(flags);
        let server = Server::start(&args);
        for stream in [false, true] {
            let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                              "temperature": 0, "stream": stream});
            let (status, message) = refused(&server, "NaN norm", &body.to_string());
            assert_eq!(status, 500, "{flags:?} stream {stream}: {message}");
            assert!(
                message.contains("non-finite") && message.contains("the decoder's final norm"),
                "{flags:?} stream {stream}: {message}"
            );
        }
        let (status, _) = server.request("GET", "/health", None);
        assert_eq!(status, 200);
    }
}
