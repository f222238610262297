//! Integration tests that run the real `glance` binary on the committed fixtures: the happy paths
//! a user types, and bad input that must give a clear error (exit code 1, a message naming the
//! problem) instead of a panic.

mod common;

use candle_core::{Device, Tensor};
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Copies a fixture model into a scratch dir so a test can damage it.
fn model_copy(name: &str) -> PathBuf {
    let dst = scratch(name);
    for e in std::fs::read_dir(fixture("models/llama-gqa")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

const MODEL: &str = "models/llama-gqa";

#[test]
fn run_streams_text_and_json_reports_counts_and_timings() {
    let (m, img) = (fixture(MODEL), fixture("images/astronaut.png"));
    let args = [
        "run",
        "--model",
        s(&m),
        "--image",
        s(&img),
        "--prompt",
        "What is this?",
        "--max-new-tokens",
        "6",
    ];
    let o = glance(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let streamed = stdout(&o);

    let o = glance(&[&args[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 6);
    assert_eq!(v["usage"]["visual_tokens"], 16);
    assert_eq!(v["usage"]["kept_visual_tokens"], 16);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["decode"]["strategy"], "ar");
    assert_eq!(v["decode"]["forward_passes"], 5);
    let t = |k: &str| v["timings"][k].as_f64().unwrap();
    // Every stage took time, and time to first token is made of the stages before it.
    for k in [
        "load_s",
        "vision_s",
        "prefill_s",
        "decode_s",
        "decode_tokens_per_s",
    ] {
        assert!(t(k) > 0.0, "{k}: {v}");
    }
    let stages = t("preprocess_s") + t("vision_s") + t("prune_select_s") + t("prefill_s");
    assert!((t("time_to_first_token_s") - stages).abs() < 1e-6, "{v}");
    assert!(
        (t("decode_tokens_per_s") - 5.0 / t("decode_s")).abs() < 1e-6 * t("decode_tokens_per_s")
    );
    // The streamed text is the JSON text plus the final newline.
    assert_eq!(streamed, format!("{}\n", v["text"].as_str().unwrap()));
}

#[test]
fn sampling_is_deterministic_per_seed() {
    let (m, img) = (fixture(MODEL), fixture("images/camera_gray.png"));
    let run = |seed: &str| {
        let o = glance(&[
            "run",
            "--model",
            s(&m),
            "--image",
            s(&img),
            "--prompt",
            "Describe it.",
            "--max-new-tokens",
            "16",
            "--temperature",
            "1.0",
            "--top-k",
            "50",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["token_ids"].clone()
    };
    assert_eq!(run("3"), run("3"));
    assert_ne!(run("3"), run("4"));
}

#[test]
fn logits_raw_match_the_transformers_fixture() {
    let out = scratch("logits").join("l.npy");
    let o = glance(&[
        "logits",
        "--model",
        s(&fixture(MODEL)),
        "--image",
        s(&fixture("images/astronaut.png")),
        "--prompt",
        "USER: <image>\nWhat is the astronaut holding? ASSISTANT:",
        "--raw",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&out).unwrap();
    let want = candle_core::safetensors::load(
        fixture("cases/llama-gqa-astronaut.safetensors"),
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
fn help_explains_every_command() {
    let o = glance(&["--help"]);
    let h = stdout(&o);
    for cmd in [
        "run", "eval", "demo", "models", "logits", "bench", "world", "train",
    ] {
        assert!(h.contains(cmd), "{h}");
    }
    let o = glance(&["run", "--help"]);
    assert!(stdout(&o).contains("--max-new-tokens"));
}

/// `glance run` on `model` with the astronaut image and a one-word prompt: the probe of the
/// bad-model tests, which must fail before answering.
fn run_on(model: &str) -> std::process::Output {
    glance(&[
        "run",
        "--model",
        model,
        "--image",
        s(&fixture("images/astronaut.png")),
        "--prompt",
        "x",
    ])
}

#[test]
fn missing_model_dir_is_named() {
    let o = run_on("/no/such/model");
    assert_fails_with(&o, "/no/such/model");
}

#[test]
fn corrupt_and_truncated_images_are_rejected() {
    let d = scratch("images");
    let garbage = d.join("garbage.png");
    std::fs::write(&garbage, b"this is not an image at all").unwrap();
    let truncated = d.join("truncated.png");
    let bytes = std::fs::read(fixture("images/astronaut.png")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    for img in [&garbage, &truncated, &d.join("missing.png")] {
        let o = glance(&[
            "run",
            "--model",
            s(&fixture(MODEL)),
            "--image",
            s(img),
            "--prompt",
            "x",
        ]);
        assert_fails_with(&o, "image");
    }
}

#[test]
fn truncated_safetensors_names_the_file() {
    let m = model_copy("truncated");
    let f = m.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 3]).unwrap();
    let o = run_on(s(&m));
    assert_fails_with(&o, "model.safetensors");
}

/// Rewrites the copy's weights through `edit`.
fn edit_weights(m: &Path, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let f = m.join("model.safetensors");
    let mut ts = candle_core::safetensors::load(&f, &Device::Cpu).unwrap();
    edit(&mut ts);
    candle_core::safetensors::save(&ts, &f).unwrap();
}

#[test]
fn missing_tensor_is_named() {
    let m = model_copy("missing-tensor");
    let name = "language_model.model.layers.1.mlp.up_proj.weight";
    edit_weights(&m, |ts| {
        assert!(ts.remove(name).is_some());
    });
    let o = run_on(s(&m));
    assert_fails_with(&o, name);
}

#[test]
fn wrong_shape_names_tensor_and_both_shapes() {
    let m = model_copy("wrong-shape");
    let name = "multi_modal_projector.linear_1.weight";
    edit_weights(&m, |ts| {
        let t = ts.remove(name).unwrap();
        let (o, i) = t.dims2().unwrap();
        ts.insert(
            name.into(),
            Tensor::zeros((o, i + 1), t.dtype(), &Device::Cpu).unwrap(),
        );
    });
    let o = run_on(s(&m));
    assert_fails_with(&o, name);
    let err = stderr(&o);
    assert!(
        err.contains("[72, 49]") && err.contains("[72, 48]"),
        "{err}"
    );
}

#[test]
fn prompt_over_context_length_is_rejected() {
    let long = "word ".repeat(2000);
    let o = glance(&[
        "run",
        "--model",
        s(&fixture(MODEL)),
        "--image",
        s(&fixture("images/astronaut.png")),
        "--prompt",
        &long,
    ]);
    assert_fails_with(&o, "context");
}

#[test]
fn invalid_parameters_are_rejected() {
    let (m, img) = (fixture(MODEL), fixture("images/astronaut.png"));
    for (flag, value, needle) in [
        ("--temperature", "-1", "temperature"),
        ("--top-p", "1.5", "top-p"),
        ("--max-new-tokens", "0", "max-new-tokens"),
        ("--threads", "0", "threads"),
        ("--threads", "10000", "at most"),
        ("--decode", "bogus", "unknown decoding strategy"),
    ] {
        let o = glance(&[
            "run",
            "--model",
            s(&m),
            "--image",
            s(&img),
            "--prompt",
            "x",
            flag,
            value,
        ]);
        assert_fails_with(&o, needle);
    }
    // A raw prompt without the image placeholder cannot take the image.
    let o = glance(&[
        "run",
        "--model",
        s(&m),
        "--image",
        s(&img),
        "--prompt",
        "no placeholder",
        "--raw",
    ]);
    assert_fails_with(&o, "placeholder");
}

/// `--image` repeats, and `--messages` takes a conversation of OpenAI chat messages whose images
/// are file paths or data: URLs; both answer as one request would.
#[test]
fn several_images_and_conversations() {
    use base64::Engine as _;
    let (m, a, b) = (
        fixture(MODEL),
        fixture("images/astronaut.png"),
        fixture("images/chelsea.jpg"),
    );
    let json = |o: &std::process::Output| -> serde_json::Value {
        assert!(o.status.success(), "{}", stderr(o));
        serde_json::from_str(&stdout(o)).unwrap()
    };
    let two = json(&glance(&[
        "run",
        "--model",
        s(&m),
        "--image",
        s(&a),
        "--image",
        s(&b),
        "--prompt",
        "Compare.",
        "--max-new-tokens",
        "5",
        "--json",
    ]));
    assert_eq!(two["usage"]["visual_tokens"], 32);
    // The same turn as a messages file: one image as a path, one as a data: URL.
    let data = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&b).unwrap());
    let file = scratch("messages").join("m.json");
    let messages = serde_json::json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": s(&a)}},
        {"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{data}")}},
        {"type": "text", "text": "Compare."}]}]);
    std::fs::write(&file, messages.to_string()).unwrap();
    let same = json(&glance(&[
        "run",
        "--model",
        s(&m),
        "--messages",
        s(&file),
        "--max-new-tokens",
        "5",
        "--json",
    ]));
    assert_eq!(same["token_ids"], two["token_ids"]);
    assert_eq!(
        same["usage"]["prompt_tokens"],
        two["usage"]["prompt_tokens"]
    );
    // A second turn changes the prompt.
    let turns = serde_json::json!({"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": s(&a)}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A thing."},
        {"role": "user", "content": "And now?"}]});
    std::fs::write(&file, turns.to_string()).unwrap();
    let v = json(&glance(&[
        "run",
        "--model",
        s(&m),
        "--messages",
        s(&file),
        "--max-new-tokens",
        "3",
        "--json",
    ]));
    assert_eq!(v["usage"]["visual_tokens"], 16);
    // Bad messages: a clear error naming the message and part.
    std::fs::write(&file, r#"[{"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64,@@"}]}]"#).unwrap();
    assert_fails_with(
        &glance(&["run", "--model", s(&m), "--messages", s(&file)]),
        "message 0: part 0: invalid base64",
    );
    // --messages replaces --prompt and --image (a usage error, exit code 2).
    let o = glance(&[
        "run",
        "--model",
        s(&m),
        "--messages",
        s(&file),
        "--prompt",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

#[test]
fn world_sample_writes_images_and_questions() {
    let d = scratch("world");
    let o = glance(&[
        "world",
        "sample",
        "--split",
        "test",
        "--n",
        "3",
        "--out",
        s(&d),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for i in 0..3 {
        assert!(d.join(format!("{i:04}.png")).is_file());
    }
    let qs = std::fs::read_to_string(d.join("questions.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(qs.lines().next().unwrap()).unwrap();
    assert_eq!(first["split"], "test");
    assert!(first["question"].as_str().is_some() && first["answer"].as_str().is_some());
    let o = glance(&[
        "world",
        "sample",
        "--split",
        "nope",
        "--n",
        "1",
        "--out",
        s(&d),
    ]);
    assert_eq!(o.status.code(), Some(2), "clap rejects an unknown split");
}

#[test]
fn bench_decode_writes_a_report() {
    let out = scratch("bench").join("decode.json");
    let o = glance(&[
        "bench",
        "decode",
        "--model",
        s(&fixture(MODEL)),
        "--prompt-len",
        "16",
        "--new-tokens",
        "4",
        "--reps",
        "1",
        "--threads",
        "1",
        "--json",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("% bound"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let row = &v["rows"][0];
    assert_eq!(row["threads"], 1);
    for k in [
        "read_bandwidth_gb_s",
        "gemm_gflop_s",
        "prefill_s",
        "decode_ms_per_token",
        "decode_bound_ms_per_token",
    ] {
        assert!(row[k].as_f64().unwrap() > 0.0, "{k}");
    }
}
