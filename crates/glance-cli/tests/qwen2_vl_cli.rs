//! `glance logits` and `glance run` on the Qwen2-VL / Qwen2.5-VL fixtures
//! (`fixtures/qwen2_vl/`, made by `scripts/make_qwen_fixtures.py` with transformers): the real
//! binary gives transformers' logits and greedy answer.

mod common;

use candle_core::{Device, Tensor};
use common::{fixture, glance, s, scratch, stderr, stdout};
use serde_json::Value;

fn case(name: &str) -> Value {
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen2_vl/manifest.json")).unwrap())
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
fn logits_of_a_qwen2_vl_chat_match_transformers() {
    let out = scratch("qwen-logits").join("l.npy");
    let o = glance(&[
        "logits",
        "--model",
        s(&fixture("qwen2_vl/models/qwen2-vl")),
        "--image",
        s(&fixture("qwen2_vl/images/astronaut.png")),
        "--prompt",
        "What is shown in this image?",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&out).unwrap();
    let want = candle_core::safetensors::load(
        fixture("qwen2_vl/cases/qwen2-vl-astronaut.safetensors"),
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
fn run_answers_a_qwen2_5_vl_question_as_transformers() {
    let c = case("qwen2_5-vl-astronaut");
    let o = glance(&[
        "run",
        "--model",
        s(&fixture("qwen2_vl/models/qwen2_5-vl")),
        "--image",
        s(&fixture("qwen2_vl/images/astronaut.png")),
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
