//! `glance logits`, `glance run`, `glance serve` and `glance train draft` on the LLaVA-NeXT
//! fixtures (`fixtures/llava_next/`, made by `scripts/make_llava_next_fixtures.py` with
//! transformers): the real binary gives transformers' logits and greedy tokens.

mod common;
mod serve_common;

use candle_core::{Device, Tensor};
use common::{fixture, glance, s, scratch, stderr, stdout};
use serde_json::{json, Value};
use serve_common::{data_url, Server};

fn case(name: &str) -> Value {
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("llava_next/manifest.json")).unwrap(),
    )
    .unwrap();
    m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
        .clone()
}

fn tensors(c: &Value) -> std::collections::HashMap<String, Tensor> {
    let path = fixture(&format!("llava_next/{}", c["tensors"].as_str().unwrap()));
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

#[test]
fn logits_of_a_llava_next_prompt_match_transformers() {
    let c = case("mistral-astronaut");
    let out = scratch("llava-next-logits").join("l.npy");
    let o = glance(&[
        "logits",
        "--model",
        s(&fixture("llava_next/models/llava-next-mistral")),
        "--image",
        s(&fixture("llava_next/images/astronaut.png")),
        "--prompt",
        "What is shown in this image?",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&out).unwrap();
    let t = tensors(&c);
    assert_eq!(got.dim(0).unwrap(), c["seq_len"].as_u64().unwrap() as usize);
    // The fixture keeps the text rows' logits.
    let rows = Tensor::new(ids(&t["logits_rows"]), &Device::Cpu).unwrap();
    let got = got.index_select(&rows, 0).unwrap();
    let d: f32 = (got - &t["logits"])
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!(d < 1e-4, "max abs diff {d}");
}

fn run_json(model: &str, images: &[&str], prompt: &str, extra: &[&str]) -> Value {
    let model = fixture(&format!("llava_next/models/{model}"));
    let images: Vec<_> = images
        .iter()
        .map(|i| fixture(&format!("llava_next/images/{i}")))
        .collect();
    let mut args = vec!["run", "--model", s(&model)];
    for i in &images {
        args.extend(["--image", s(i)]);
    }
    args.extend([
        "--prompt",
        prompt,
        "--max-new-tokens",
        "10",
        "--ignore-eos",
        "--json",
    ]);
    args.extend(extra);
    let o = glance(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// `glance run` answers two images as transformers does; pruned with a per-tile budget it still
/// answers, with fewer visual tokens.
#[test]
fn run_answers_two_images_as_transformers_and_prunes_per_tile() {
    let c = case("vicuna-two-images");
    let (model, images, prompt) = (
        "llava-next-vicuna",
        ["square.png", "odd.png"],
        "Describe the picture in detail.",
    );
    let v = run_json(model, &images, prompt, &["--decode", "ar"]);
    let want: Vec<u32> = ids(&tensors(&c)["greedy_ids"]);
    let got: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap();
    assert_eq!(got, want, "{v}");
    assert_eq!(v["usage"]["visual_tokens"], c["n_image_tokens"], "{v}");
    let pruned = run_json(
        model,
        &images,
        prompt,
        &[
            "--prune",
            "adaptive",
            "--keep",
            "25%",
            "--prune-tiles",
            "per-tile",
        ],
    );
    let kept = pruned["usage"]["kept_visual_tokens"].as_u64().unwrap();
    assert!(
        kept > 0 && kept < c["n_image_tokens"].as_u64().unwrap(),
        "{pruned}"
    );
    let o = glance(&[
        "run",
        "--model",
        s(&fixture("llava_next/models/llava-next-vicuna")),
        "--prompt",
        "x",
        "--prune",
        "fastv",
        "--prune-tiles",
        "per-tile",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("per-tile"), "{}", stderr(&o));
}

/// The server answers a multi-turn LLaVA-NeXT chat as transformers does (batching on), and with
/// `--weights q4`.
#[test]
fn serve_answers_a_llava_next_chat_as_transformers() {
    let c = case("mistral-chat");
    let url = |name: &str| {
        let bytes = std::fs::read(fixture(&format!("llava_next/images/{name}"))).unwrap();
        data_url(&bytes, "image/png")
    };
    let messages: Vec<Value> = c["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let content: Vec<Value> = m["content"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| match p["type"].as_str().unwrap() {
                    "image" => json!({"type": "image_url",
                        "image_url": {"url": url(p["image"].as_str().unwrap())}}),
                    _ => p.clone(),
                })
                .collect();
            json!({"role": m["role"], "content": content})
        })
        .collect();
    let body = json!({"model": "llava-next-mistral", "temperature": 0, "max_tokens": 10,
        "ignore_eos": true, "messages": messages});
    let model = fixture("llava_next/models/llava-next-mistral");
    let server = Server::start(&["--model", s(&model)]);
    let (status, v) = server.chat(&body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], c["seq_len"], "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 10, "{v}");
    // transformers' text keeps special tokens (the answer holds a `<pad>`); the server's does not.
    assert_eq!(
        v["choices"][0]["message"]["content"],
        c["greedy_text"].as_str().unwrap().replace("<pad>", ""),
        "{v}"
    );
    drop(server);
    let server = Server::start(&["--model", s(&model), "--weights", "q4"]);
    let (status, v) = server.chat(&body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], c["seq_len"], "{v}");
}

/// `glance train draft --target` trains a ViSpec head on a LLaVA-NeXT target's own answers (a
/// few steps), and speculative decoding with it gives exactly the autoregressive answer.
#[test]
fn a_draft_head_trained_on_llava_next_decodes_losslessly() {
    let model = fixture("llava_next/models/llava-next-mistral");
    let out = scratch("llava-next-draft");
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
    let answer = |decode: &str| -> Value {
        let mut extra = vec!["--decode", decode];
        if decode != "ar" {
            extra.extend(["--draft", s(&head)]);
        }
        run_json(
            "llava-next-mistral",
            &["wide.png", "tall.png"],
            "Compare the two pictures.",
            &extra,
        )
    };
    let ar = answer("ar");
    let spec = answer("vispec");
    assert_eq!(spec["token_ids"], ar["token_ids"]);
    assert!(spec["decode"]["counters"]["drafts"].as_u64().unwrap() >= 1);
}
