//! `glance logits`, `glance run`, `glance serve` and `glance train draft` on the InternVL
//! fixtures (`fixtures/internvl/`, made by `scripts/make_internvl_fixtures.py` with
//! transformers): the real binary gives transformers' logits and greedy answers, and a draft head
//! trained on an InternVL target decodes losslessly.

mod common;
mod serve_common;

use candle_core::{Device, Tensor};
use common::{fixture, glance, s, scratch, stderr, stdout};
use serde_json::{json, Value};
use serve_common::{data_url, Server};

fn case(name: &str) -> Value {
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("internvl/manifest.json")).unwrap())
            .unwrap();
    m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
        .clone()
}

#[test]
fn logits_of_an_internvl_chat_match_transformers() {
    let out = scratch("internvl-logits").join("l.npy");
    let o = glance(&[
        "logits",
        "--model",
        s(&fixture("internvl/models/internvl-qwen2")),
        "--image",
        s(&fixture("internvl/images/astronaut.png")),
        "--prompt",
        "What is shown in this image?",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&out).unwrap();
    let want = candle_core::safetensors::load(
        fixture("internvl/cases/internvl-qwen2-astronaut.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let want = &want["logits"];
    assert_eq!(got.dims(), want.dims());
    let d: f32 = (got - want)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!(d < 1e-4, "max abs diff {d}");
}

#[test]
fn run_answers_an_internvl_llama_question_as_transformers() {
    let c = case("internvl-llama-square");
    let o = glance(&[
        "run",
        "--model",
        s(&fixture("internvl/models/internvl-llama")),
        "--image",
        s(&fixture("internvl/images/square_big.png")),
        "--prompt",
        "Describe the picture in detail.",
        "--max-new-tokens",
        "10",
        "--decode",
        "ar",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim_end_matches('\n'),
        c["greedy_text"].as_str().unwrap()
    );
}

/// The server answers a two-image InternVL conversation as transformers does, streamed or not,
/// and with `--weights q4` and pruning.
#[test]
fn serve_answers_a_two_image_internvl_chat_as_transformers() {
    let c = case("internvl-qwen2-two-images");
    let url = |name: &str| {
        let bytes = std::fs::read(fixture(&format!("internvl/images/{name}"))).unwrap();
        data_url(&bytes, "image/png")
    };
    let content: Vec<Value> = c["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| match p["type"].as_str().unwrap() {
            "image" => json!({"type": "image_url",
                "image_url": {"url": url(p["image"].as_str().unwrap())}}),
            _ => p.clone(),
        })
        .collect();
    let body = json!({"model": "internvl-qwen2", "temperature": 0, "max_tokens": 10,
        "messages": [{"role": "user", "content": content}]});
    // The server skips special tokens (this answer holds a `<video>`); the fixture keeps them.
    let want = c["greedy_text"].as_str().unwrap().replace("<video>", "");
    assert_ne!(want, c["greedy_text"].as_str().unwrap());
    let model = fixture("internvl/models/internvl-qwen2");
    let server = Server::start(&["--model", s(&model)]);
    let (status, v) = server.chat(&body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], c["seq_len"]);
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let (status, events) = server.chat_stream(&stream);
    assert_eq!(status, 200, "{events:?}");
    assert_eq!(serve_common::stream_text(&events), want);
    drop(server);
    let server = Server::start(&["--model", s(&model), "--weights", "q4"]);
    let (status, v) = server.chat(&body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 10);
}

/// `glance train draft --target` trains a ViSpec head on an InternVL target's own answers (a few
/// steps), and speculative decoding with it gives exactly the autoregressive answer.
#[test]
fn a_draft_head_trained_on_internvl_decodes_losslessly() {
    let model = fixture("internvl/models/internvl-llama");
    let out = scratch("internvl-draft");
    let o = glance(&[
        "train",
        "draft",
        "--target",
        s(&model),
        "--out",
        s(&out),
        "--steps",
        "20",
        "--batch",
        "2",
        "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let head = out.join("head");
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(head.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "glance_draft");
    let (tall, cup) = (
        fixture("internvl/images/tall.png"),
        fixture("internvl/images/cup_rgba.png"),
    );
    let answer = |decode: &str| -> Value {
        let mut args = vec![
            "run",
            "--model",
            s(&model),
            "--image",
            s(&tall),
            "--image",
            s(&cup),
            "--prompt",
            "What colour is the strip?",
            "--max-new-tokens",
            "24",
            "--decode",
            decode,
            "--json",
        ];
        if decode != "ar" {
            args.extend(["--draft", s(&head)]);
        }
        let o = glance(&args);
        assert!(o.status.success(), "{decode}: {}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let ar = answer("ar");
    for decode in ["vispec", "auto"] {
        let got = answer(decode);
        assert_eq!(got["token_ids"], ar["token_ids"], "{decode}");
    }
    let spec = answer("vispec");
    assert!(spec["decode"]["counters"]["drafts"].as_u64().unwrap() >= 1);
}
