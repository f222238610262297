//! A corpus of hostile or broken inputs for `glance run`: images, model configs, weights, chat
//! templates, safetensors indexes and flags. Every case must end within a bounded time with exit
//! code 1, an `error:` line naming the problem (a keyword is asserted) and no panic; the binary
//! must neither hang nor read without bound (`/dev/zero`, multi-gigabyte sparse files).
//!
//! Each case builds its input in a scratch directory from the committed fixtures.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use glance_models::processing::image::png_header_only;
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a single bad-input run may take before it counts as a hang.
const CASE_TIMEOUT: Duration = Duration::from_secs(30);

const MODEL: &str = "models/llama-gqa";

/// Runs `glance args…` with [`CASE_TIMEOUT`]; kills the process and fails on expiry. Returns
/// (exit code, stderr).
fn run_bounded(label: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_glance"))
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    // Drain stderr on a thread so a chatty process cannot block on a full pipe.
    let mut pipe = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > CASE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{label}: still running after {CASE_TIMEOUT:?} (killed)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().expect("reader"))
}

/// Asserts the clean failure of one case: exit code 1, `error:` with `keyword`, no panic.
fn expect_failure(label: &str, args: &[&str], keyword: &str) -> String {
    let (code, err) = run_bounded(label, args);
    assert!(!err.contains("panicked"), "{label}: panic: {err}");
    assert_eq!(code, Some(1), "{label}: exit code {code:?}, stderr: {err}");
    assert!(err.contains("error:"), "{label}: no `error:` line: {err}");
    assert!(
        err.contains(keyword),
        "{label}: expected `{keyword}` in: {err}"
    );
    err
}

/// `glance run` of `model` on `image` with a short prompt and `extra` flags.
fn run_args<'a>(model: &'a str, image: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "run",
        "--model",
        model,
        "--image",
        image,
        "--prompt",
        "What is this?",
        "--max-new-tokens",
        "2",
    ];
    v.extend_from_slice(extra);
    v
}

/// A fresh copy of fixture model `name` under `root`.
fn model_copy(root: &Path, label: &str, name: &str) -> PathBuf {
    let dst = root.join(label);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

/// A copy of the fixture model whose `config.json` went through `edit`.
fn config_case(
    root: &Path,
    label: &str,
    fixture_model: &str,
    edit: impl FnOnce(&mut Value),
) -> PathBuf {
    let m = model_copy(root, label, fixture_model);
    let p = m.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    m
}

/// A file of `len` bytes starting with `head`, sparse (no disk or time spent on the rest).
fn sparse_file(path: &Path, head: &[u8], len: u64) {
    std::fs::write(path, head).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
}

#[test]
fn bad_images() {
    let d = scratch("bad-images");
    let model = fixture(MODEL);
    let png = std::fs::read(fixture("images/astronaut.png")).unwrap();
    let jpg = std::fs::read(fixture("images/chelsea.jpg")).unwrap();
    let mut random = Vec::with_capacity(4096);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        random.push(x as u8);
    }
    let files: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.png", vec![], "0 bytes"),
        ("truncated.png", png[..png.len() / 2].to_vec(), "image"),
        ("truncated.jpg", jpg[..jpg.len() / 2].to_vec(), "truncated"),
        ("random.png", random, "not a PNG or JPEG"),
        (
            "text.png",
            b"hello, I am a text file\n".to_vec(),
            "not a PNG or JPEG",
        ),
        (
            "huge-dims.png",
            png_header_only(200_000, 200_000),
            "over the limit",
        ),
    ];
    for (name, bytes, keyword) in &files {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        expect_failure(name, &run_args(s(&model), s(&p), &[]), keyword);
    }
    // A 3 GB file named .png (sparse): refused from its size, never read.
    let big = d.join("big.png");
    sparse_file(&big, &png_header_only(64, 64), 3 << 30);
    let err = expect_failure("3 GB png", &run_args(s(&model), s(&big), &[]), "limit");
    assert!(err.contains("big.png") && err.contains("MiB"), "{err}");
    // Endless and odd files.
    #[cfg(unix)]
    expect_failure(
        "/dev/zero",
        &run_args(s(&model), "/dev/zero", &[]),
        "not a PNG or JPEG",
    );
    expect_failure("a directory", &run_args(s(&model), s(&d), &[]), "directory");
    expect_failure(
        "missing image",
        &run_args(s(&model), s(&d.join("nope.png")), &[]),
        "nope.png",
    );
}

#[test]
fn invalid_configs() {
    let d = scratch("bad-configs");
    let img = fixture("images/astronaut.png");
    type Edit = fn(&mut Value);
    let cases: Vec<(&str, &str, Edit, &str)> = vec![
        (
            "theta-0",
            MODEL,
            |v| v["text_config"]["rope_parameters"]["rope_theta"] = json!(0.0),
            "rope_theta",
        ),
        (
            "theta-neg",
            MODEL,
            |v| v["text_config"]["rope_parameters"]["rope_theta"] = json!(-1.0),
            "rope_theta",
        ),
        (
            "rms-eps-neg",
            MODEL,
            |v| v["text_config"]["rms_norm_eps"] = json!(-1e-5),
            "rms_norm_eps",
        ),
        (
            "ln-eps-neg",
            MODEL,
            |v| v["vision_config"]["layer_norm_eps"] = json!(-1e-5),
            "layer_norm_eps",
        ),
        (
            "llama3-factor-0",
            MODEL,
            |v| v["text_config"]["rope_parameters"]["factor"] = json!(0.0),
            "factor",
        ),
        (
            "linear-factor-0",
            MODEL,
            |v| {
                v["text_config"]["rope_parameters"] =
                    json!({"rope_type": "linear", "factor": 0.0, "rope_theta": 10000.0})
            },
            "factor",
        ),
        (
            "layers-0",
            MODEL,
            |v| v["text_config"]["num_hidden_layers"] = json!(0),
            "num_hidden_layers",
        ),
        (
            "layers-absurd",
            MODEL,
            |v| v["text_config"]["num_hidden_layers"] = json!(1u64 << 40),
            "num_hidden_layers",
        ),
        (
            "layers-fewer-than-the-checkpoint",
            MODEL,
            |v| v["text_config"]["num_hidden_layers"] = json!(1),
            "more decoder layers",
        ),
        (
            "hidden-0",
            MODEL,
            |v| v["text_config"]["hidden_size"] = json!(0),
            "hidden_size",
        ),
        (
            "vocab-0",
            MODEL,
            |v| v["text_config"]["vocab_size"] = json!(0),
            "vocab_size",
        ),
        (
            "vision-layers-0",
            MODEL,
            |v| v["vision_config"]["num_hidden_layers"] = json!(0),
            "num_hidden_layers",
        ),
        (
            "image-token-outside",
            MODEL,
            |v| v["image_token_index"] = json!(100_000),
            "image_token_index",
        ),
        (
            "window-0",
            "models/mistral",
            |v| v["text_config"]["sliding_window"] = json!(0),
            "sliding_window",
        ),
    ];
    for (label, base, edit, keyword) in cases {
        let m = config_case(&d, label, base, edit);
        let err = expect_failure(label, &run_args(s(&m), s(&img), &[]), keyword);
        assert!(
            err.contains("config.json"),
            "{label}: file not named: {err}"
        );
    }

    // Broken JSON: the file and the parser's cause, printed once.
    let m = model_copy(&d, "truncated-json", MODEL);
    let p = m.join("config.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    let err = expect_failure(
        "truncated json",
        &run_args(s(&m), s(&img), &[]),
        "invalid JSON",
    );
    assert_eq!(
        err.matches("EOF while parsing").count(),
        1,
        "cause not printed once: {err}"
    );

    // A config.json of 3 GB (sparse) is refused from its size.
    let m = model_copy(&d, "huge-json", MODEL);
    sparse_file(&m.join("config.json"), b"{", 3 << 30);
    expect_failure("3 GB config", &run_args(s(&m), s(&img), &[]), "limit");
    // So is a huge tokenizer_config.json and a huge tokenizer.json.
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    ] {
        let m = model_copy(&d, &format!("huge-{file}"), MODEL);
        sparse_file(&m.join(file), b"{", 3 << 30);
        expect_failure(file, &run_args(s(&m), s(&img), &[]), "limit");
    }

    // Another model's tokenizer: the tokenizer and the config disagree.
    let m = model_copy(&d, "foreign-tokenizer", MODEL);
    std::fs::copy(
        fixture("../models/glance-tiny/tokenizer.json"),
        m.join("tokenizer.json"),
    )
    .unwrap();
    expect_failure(
        "foreign tokenizer",
        &run_args(s(&m), s(&img), &[]),
        "disagree",
    );
    // A tokenizer whose token at the image id is not the placeholder processor_config names.
    let m = model_copy(&d, "renamed-placeholder", MODEL);
    let p = m.join("tokenizer.json");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("<image>", "<picture>");
    std::fs::write(&p, text).unwrap();
    expect_failure(
        "renamed placeholder",
        &run_args(s(&m), s(&img), &[]),
        "disagree",
    );
}

/// Rewrites the copy's weights through `edit`.
fn edit_weights(m: &Path, edit: impl FnOnce(&mut std::collections::HashMap<String, Tensor>)) {
    let f = m.join("model.safetensors");
    let mut ts = candle_core::safetensors::load(&f, &Device::Cpu).unwrap();
    edit(&mut ts);
    candle_core::safetensors::save(&ts, &f).unwrap();
}

#[test]
fn bad_weights() {
    let d = scratch("bad-weights");
    let img = fixture("images/astronaut.png");
    let img = s(&img);

    let m = model_copy(&d, "missing", MODEL);
    let name = "language_model.model.layers.0.self_attn.k_proj.weight";
    edit_weights(&m, |ts| assert!(ts.remove(name).is_some()));
    expect_failure("missing tensor", &run_args(s(&m), img, &[]), name);

    let m = model_copy(&d, "truncated", MODEL);
    let f = m.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    expect_failure(
        "truncated safetensors",
        &run_args(s(&m), img, &[]),
        "model.safetensors",
    );

    for (dtype, shown) in [(DType::I64, "I64"), (DType::U8, "U8"), (DType::U32, "U32")] {
        let m = model_copy(&d, &format!("int-lm-head-{shown}"), MODEL);
        edit_weights(&m, |ts| {
            let w = ts.get_mut("language_model.lm_head.weight").unwrap();
            *w = w.to_dtype(dtype).unwrap();
        });
        let err = expect_failure(
            "integer lm_head",
            &run_args(s(&m), img, &[]),
            "lm_head.weight",
        );
        assert!(err.contains(shown), "{shown}: {err}");
    }

    // NaN weights: decoding refuses the non-finite logits instead of emitting garbage.
    let m = model_copy(&d, "nan-lm-head", MODEL);
    edit_weights(&m, |ts| {
        let w = ts.get_mut("language_model.lm_head.weight").unwrap();
        *w = (w.ones_like().unwrap() * f64::NAN).unwrap();
    });
    expect_failure("NaN lm_head", &run_args(s(&m), img, &[]), "finite");

    // Sharded checkpoints whose index points outside the model directory.
    for (label, shard) in [
        (
            "index-dotdot",
            "../model-00001-of-00001.safetensors".to_string(),
        ),
        (
            "index-absolute",
            s(&d.join("stolen.safetensors")).to_string(),
        ),
    ] {
        let m = model_copy(&d, label, MODEL);
        std::fs::copy(
            m.join("model.safetensors"),
            d.join("model-00001-of-00001.safetensors"),
        )
        .unwrap();
        std::fs::copy(m.join("model.safetensors"), d.join("stolen.safetensors")).unwrap();
        std::fs::remove_file(m.join("model.safetensors")).unwrap();
        let ts =
            candle_core::safetensors::load(d.join("stolen.safetensors"), &Device::Cpu).unwrap();
        let map: serde_json::Map<String, Value> =
            ts.keys().map(|k| (k.clone(), json!(shard))).collect();
        std::fs::write(
            m.join("model.safetensors.index.json"),
            json!({"metadata": {}, "weight_map": map}).to_string(),
        )
        .unwrap();
        expect_failure(label, &run_args(s(&m), img, &[]), "shard name");
    }
}

#[test]
fn hostile_templates() {
    let d = scratch("bad-templates");
    let img = fixture("images/astronaut.png");
    for (label, template, keyword) in [
        (
            "fuel",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}<image>",
            "fuel",
        ),
        (
            "output",
            "{% set mb = 'x' * 1000000 %}{% for i in range(100000) %}{{ mb }}{% endfor %}<image>",
            "limit",
        ),
    ] {
        let m = model_copy(&d, label, MODEL);
        std::fs::write(m.join("chat_template.jinja"), template).unwrap();
        expect_failure(label, &run_args(s(&m), s(&img), &[]), keyword);
    }
}

#[test]
fn bad_flags() {
    let (m, img) = (fixture(MODEL), fixture("images/astronaut.png"));
    for (flags, keyword) in [
        (&["--temperature", "1e-45"][..], "temperature"),
        (&["--temperature", "nan"][..], "temperature"),
        (&["--temperature", "inf"][..], "temperature"),
        (&["--top-p", "2"][..], "top-p"),
        (&["--top-p", "nan"][..], "top-p"),
        (&["--max-new-tokens", "0"][..], "max-new-tokens"),
    ] {
        let mut args = run_args(s(&m), s(&img), &[]);
        args.truncate(7); // without the default --max-new-tokens
        args.extend_from_slice(flags);
        expect_failure(&flags.join(" "), &args, keyword);
    }
}

/// Speculative-decoding flags: a missing or foreign draft head, bad tree settings, tree flags
/// without a speculative strategy.
#[test]
fn bad_draft_heads_and_tree_flags() {
    let (m, img) = (fixture(MODEL), fixture("images/astronaut.png"));
    let root = scratch("bad-draft");
    // A "head" that is a target model, and a directory with no config at all.
    let not_a_head = model_copy(&root, "not-a-head", MODEL);
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for (flags, keyword) in [
        (&["--decode", "vispec"][..], "draft-vispec"),
        (&["--decode", "eagle"][..], "draft-eagle"),
        (
            &["--decode", "vispec", "--draft", s(&empty)][..],
            "config.json",
        ),
        (
            &["--decode", "vispec", "--draft", s(&not_a_head)][..],
            "model_type",
        ),
        (&["--decode", "vispec", "--draft-depth", "0"][..], "depth"),
        (
            &["--decode", "vispec", "--draft-budget", "100000"][..],
            "budget",
        ),
        (
            &["--decode", "vispec", "--chain", "--draft-top-k", "3"][..],
            "--chain",
        ),
        (&["--draft-depth", "3"][..], "vispec or eagle"),
        (&["--decode", "medusa"][..], "vispec"),
    ] {
        expect_failure(&flags.join(" "), &run_args(s(&m), s(&img), flags), keyword);
    }
}

/// `--weights`: an unknown format is refused by the parser naming the formats; a checkpoint
/// written by `glance quantize` runs in its own format and is refused in any other with an
/// error naming the one it holds.
#[test]
fn weight_formats_and_quantized_checkpoints() {
    let (m, img) = (fixture("models/mistral"), fixture("images/astronaut.png"));
    let mut args = run_args(s(&m), s(&img), &["--weights", "q3"]);
    let (code, err) = run_bounded("--weights q3", &args);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("unknown weight format") && err.contains("q4"),
        "{err}"
    );
    for f in ["bf16", "f16", "q8", "q4"] {
        args = run_args(s(&m), s(&img), &["--weights", f]);
        let (code, err) = run_bounded(f, &args);
        assert_eq!(code, Some(0), "{f}: {err}");
    }
    let root = std::env::temp_dir().join(format!("glance-cli-quantize-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let out = root.join("mistral-q4");
    let (code, err) = run_bounded("quantize", &["quantize", "--weights", "q4", s(&m), s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run_bounded("q4 run", &run_args(s(&out), s(&img), &["--weights", "q4"]));
    assert_eq!(code, Some(0), "{err}");
    expect_failure(
        "q8 of q4",
        &run_args(s(&out), s(&img), &["--weights", "q8"]),
        "--weights q4",
    );
    expect_failure(
        "f32 of q4",
        &run_args(s(&out), s(&img), &[]),
        "--weights q4",
    );
    // The output directory exists now: refused.
    expect_failure(
        "quantize twice",
        &["quantize", "--weights", "q4", s(&m), s(&out)],
        "exists",
    );
    std::fs::remove_dir_all(&root).unwrap();
}
