//! What the chat page of `glance serve` reads, against a real server (the page itself in a
//! browser: tests/browser.rs): the built-in page and its assets, `GET /glance/info`,
//! `GET /glance/world/sample` (the same example `glance world sample` writes) and the `glance`
//! usage block of answers (kept patches, tokens per step, token ends), streamed or not.

mod common;
mod serve_common;

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};
use serve_common::*;

/// A chat about a world image with `glance` options, greedy.
fn ask(server: &Server, image_url: &str, glance: Value, stream: bool) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": "Describe the image."}]}],
        "max_tokens": 40, "temperature": 0, "glance": glance,
    });
    if !stream {
        let (status, v) = server.chat(&body);
        assert_eq!(status, 200, "{v}");
        return v;
    }
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, events) = server.chat_stream(&body);
    assert_eq!(status, 200, "{events:?}");
    let usage = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk");
    json!({
        "choices": [{"message": {"content": stream_text(&events)}}],
        "usage": usage["usage"],
    })
}

/// Checks the `glance` usage block of an answer; returns it.
fn glance_block(v: &Value) -> &Value {
    let usage = &v["usage"];
    let g = &usage["glance"];
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let completion = usage["completion_tokens"].as_u64().unwrap();
    let steps: Vec<u64> = g["tokens_per_step"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(steps.iter().sum::<u64>(), completion, "{g}");
    assert!(steps.iter().all(|&n| n >= 1));
    let ends = g["token_ends"].as_array().unwrap();
    assert_eq!(ends.len() as u64, completion);
    assert_eq!(
        ends.last().and_then(Value::as_u64),
        Some(text.chars().count() as u64)
    );
    g
}

#[test]
fn the_page_its_routes_and_the_glance_usage_block() {
    let server = Server::start(&[]);
    let (status, html) = server.request("GET", "/", None);
    assert_eq!(status, 200);
    assert!(html.contains("<script src=\"page.js\"") && html.contains("id=\"composer\""));
    assert!(html.contains("<style>"), "the style sheet is inline");
    let (status, script) = server.request("GET", "/page.js", None);
    assert_eq!(status, 200);
    assert!(script.contains("/v1/chat/completions"));
    let (status, text) = server.request("GET", "/nowhere", None);
    assert_eq!(status, 404);
    assert!(text.contains("GET /glance/world/sample"), "{text}");

    // glance-tiny runs its shipped draft heads, and is not converted for block diffusion.
    let (status, info) = server.request("GET", "/glance/info", None);
    assert_eq!(status, 200);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["model"], "glance-tiny");
    assert_eq!(info["strategies"], json!(["ar", "vispec", "eagle", "auto"]));

    // The sample is the example `glance world sample` writes.
    let dir = scratch("page-api");
    let written = world_sample(&dir, 5);
    let (status, sample) = server.request("GET", "/glance/world/sample?split=test&index=5", None);
    assert_eq!(status, 200, "{sample}");
    let sample: Value = serde_json::from_str(&sample).unwrap();
    let url = sample["image"].as_str().unwrap();
    let png = base64::engine::general_purpose::STANDARD
        .decode(url.strip_prefix("data:image/png;base64,").unwrap())
        .unwrap();
    let served = image::load_from_memory(&png).unwrap().to_rgb8();
    let written = image::open(written).unwrap().to_rgb8();
    assert!(
        served == written,
        "the served image differs from the written one"
    );
    let lines = std::fs::read_to_string(dir.join("questions.jsonl")).unwrap();
    let first: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(sample["questions"][0]["question"], first["question"]);
    assert_eq!(sample["questions"][0]["answer"], first["answer"]);
    for bad in ["index=-1", "index=x", "split=nope", "colour=red"] {
        let (status, text) = server.request("GET", &format!("/glance/world/sample?{bad}"), None);
        assert_eq!(status, 400, "{bad}: {text}");
    }

    // Pruned to 12.5%, speculative: the patches kept per image and the tokens of each round.
    for stream in [false, true] {
        let v = ask(
            &server,
            url,
            json!({"prune": {"policy": "adaptive", "keep": 0.125}, "decode": "vispec"}),
            stream,
        );
        let g = glance_block(&v);
        assert_eq!(g["strategy"], "vispec");
        let kept = &g["kept_patches"][0];
        let (rows, cols) = (
            kept["rows"].as_u64().unwrap(),
            kept["cols"].as_u64().unwrap(),
        );
        assert_eq!(rows * cols, v["usage"]["visual_tokens"].as_u64().unwrap());
        let indices = kept["kept"].as_array().unwrap();
        let budget = glance_prune::Budget::Ratio(0.125).resolve((rows * cols) as usize);
        assert_eq!(indices.len(), budget, "{kept}");
        assert_eq!(
            indices.len() as u64,
            v["usage"]["kept_visual_tokens"].as_u64().unwrap()
        );
        assert!(indices.iter().all(|i| i.as_u64().unwrap() < rows * cols));
        // Drafts were accepted: fewer steps than tokens.
        let steps = g["tokens_per_step"].as_array().unwrap().len() as u64;
        assert!(
            steps < v["usage"]["completion_tokens"].as_u64().unwrap(),
            "{g}"
        );
    }
    // Plain: every patch kept (none listed), one token per step.
    let v = ask(
        &server,
        url,
        json!({"prune": {"policy": "none"}, "decode": "ar"}),
        false,
    );
    let g = glance_block(&v);
    assert_eq!(g["kept_patches"], json!([]));
    assert!(g["tokens_per_step"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n == 1));
}
