//! A corpus of hostile or broken inputs for `glance run`: images, model configs, weights, chat
//! templates, safetensors indexes and flags. Every case must end within a bounded time with exit
//! code 1, an `error:` line naming the problem (a keyword is asserted) and no panic; the binary
//! must neither hang nor read without bound (`/dev/zero`, multi-gigabyte sparse files).
//!
//! Each case builds its input in a scratch directory from the committed fixtures.

mod common;

use candle_core::{DType, Device, Tensor};
use common::bounded::*;
use common::*;
use glance_models::processing::image::png_header_only;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MODEL: &str = "models/llama-gqa";

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
        ("random.png", random, "not a PNG, JPEG or WebP"),
        (
            "text.png",
            b"hello, I am a text file\n".to_vec(),
            "not a PNG, JPEG or WebP",
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
        "not a PNG, JPEG or WebP",
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
        (
            &["--decode", "ar", "--draft-depth", "3"][..],
            "speculative strategies (vispec, eagle, auto), not `ar`",
        ),
        // `auto` (the default) with a broken head given: refused, never silently plain.
        (&["--draft", s(&empty)][..], "config.json"),
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
        &run_args(s(&out), s(&img), &["--weights", "f32"]),
        "--weights q4",
    );
    // No --weights: the format the directory records.
    let (code, err) = run_bounded("q4 by default", &run_args(s(&out), s(&img), &[]));
    assert_eq!(code, Some(0), "{err}");
    // The output directory exists now: refused.
    expect_failure(
        "quantize twice",
        &["quantize", "--weights", "q4", s(&m), s(&out)],
        "exists",
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// Counts are checked before the work they bound: 300 `--image`s of a 100 MiB file, or a
/// conversation naming it 500 times, are refused by their count before any image is read
/// (reading them would take 30 to 50 GB); a benchmark's request, client and token counts are
/// refused before anything loads.
#[test]
fn counts_are_checked_before_the_work_they_bound() {
    let d = scratch("bad-counts");
    let model = fixture(MODEL);
    let big = d.join("big.png");
    sparse_file(&big, &png_header_only(64, 64), 100 << 20);
    let mut args = vec!["run", "--model", s(&model), "--prompt", "hi"];
    for _ in 0..300 {
        args.extend(["--image", s(&big)]);
    }
    let start = Instant::now();
    let err = expect_failure("300 --image", &args, "300 images");
    assert!(
        err.contains("--image") && err.contains("at most 16"),
        "{err}"
    );
    let part = json!({"type": "image_url", "image_url": s(&big)});
    let messages = d.join("messages.json");
    let body = json!([{"role": "user", "content": vec![part; 500]}]);
    std::fs::write(&messages, body.to_string()).unwrap();
    let err = expect_failure(
        "500 images in --messages",
        &["run", "--model", s(&model), "--messages", s(&messages)],
        "500 images",
    );
    assert!(
        err.contains("--messages") && err.contains("at most 16"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "images were read"
    );

    let json_out = d.join("serve.json");
    for (flags, keyword) in [
        (
            &["--requests", "1000000000"][..],
            "--requests (per client) must be in 1..=1000",
        ),
        (&["--requests", "0"][..], "--requests"),
        (
            &["--max-tokens", "1000000000"][..],
            "--max-tokens must be in 2..=1048576",
        ),
        (
            &["--clients", "1,100"][..],
            "--clients takes counts in 1..=64",
        ),
        (&["--prefill-chunk", "0"][..], "--prefill-chunk must be in"),
    ] {
        let mut args = vec![
            "bench",
            "serve",
            "--model",
            s(&model),
            "--shape",
            "none",
            "--json",
            s(&json_out),
        ];
        args.extend_from_slice(flags);
        expect_failure(&flags.join(" "), &args, keyword);
    }
}

/// A flag that does not apply to the chosen strategy is refused naming both, a draft head of the
/// wrong kind is never silently replaced by the model's own, and a data URL must declare an image
/// type.
#[test]
fn flags_that_do_not_apply_are_refused_naming_both() {
    let (m, img) = (fixture(MODEL), fixture("images/astronaut.png"));
    for (flags, keyword) in [
        (
            &["--decode", "diffusion-linear", "--threshold", "0.5"][..],
            "--threshold only applies to diffusion-threshold, not `diffusion-linear`",
        ),
        (
            &["--decode", "diffusion-quadratic", "--threshold", "0.5"][..],
            "not `diffusion-quadratic`",
        ),
        (
            &["--dynamic-block"][..],
            "--dynamic-block only applies to the block-diffusion strategies",
        ),
        (&["--decode", "vispec", "--block", "4"][..], "not `vispec`"),
        (
            &["--decode", "diffusion-threshold", "--threshold", "nan"][..],
            "--threshold must be in (0, 1], got NaN",
        ),
    ] {
        expect_failure(&flags.join(" "), &run_args(s(&m), s(&img), flags), keyword);
    }
    // glance-tiny ships both heads: `--draft` names the one to use, and a head of the other kind
    // is refused rather than replaced by the model directory's.
    let tiny = fixture("../models/glance-tiny");
    let eagle = tiny.join("draft-eagle");
    let err = expect_failure(
        "vispec with an eagle head",
        &run_args(
            s(&tiny),
            s(&img),
            &["--decode", "vispec", "--draft", s(&eagle)],
        ),
        "--draft names only",
    );
    assert!(
        err.contains("eagle head") && err.contains("vispec"),
        "{err}"
    );
    expect_failure(
        "two eagle heads",
        &run_args(
            s(&tiny),
            s(&img),
            &[
                "--decode",
                "eagle",
                "--draft",
                s(&eagle),
                "--draft",
                s(&eagle),
            ],
        ),
        "give one head per kind",
    );
    // Data URLs: an image type is required.
    let d = scratch("bad-data-urls");
    let png = std::fs::read(&img).unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    for (label, url, keyword) in [
        (
            "text/plain",
            format!("data:text/plain;base64,{b64}"),
            "must declare an image type",
        ),
        ("no type", format!("data:;base64,{b64}"), "image/png"),
        (
            "svg",
            format!("data:image/svg+xml;base64,{b64}"),
            "`image/svg+xml`",
        ),
        ("no comma", format!("data:image/png;base64{b64}"), "`,`"),
    ] {
        let p = d.join(format!("{}.json", label.replace('/', "-")));
        let body = json!([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is this?"}]}]);
        std::fs::write(&p, body.to_string()).unwrap();
        expect_failure(
            label,
            &["run", "--model", s(&m), "--messages", s(&p)],
            keyword,
        );
    }
}

/// Training hyper-parameters are checked before any training: a negative, zero, NaN or infinite
/// learning rate, and every other out-of-range setting, name their flag and range.
#[test]
fn training_settings_are_checked_before_training() {
    let d = scratch("bad-train");
    let tiny = fixture("../models/glance-tiny");
    let out = d.join("out");
    let (tiny, out) = (s(&tiny), s(&out));
    let draft = |flags: &[&'static str]| {
        let mut a = vec!["train", "draft", "--target", tiny, "--out", out];
        a.extend_from_slice(flags);
        a
    };
    let diffusion = |flags: &[&'static str]| {
        let mut a = vec!["train", "diffusion", "--from", tiny, "--out", out];
        a.extend_from_slice(flags);
        a
    };
    let world = |flags: &[&'static str]| {
        let mut a = vec!["train", "world", "--quick", "--out", out];
        a.extend_from_slice(flags);
        a
    };
    for (args, keyword) in [
        (
            draft(&["--lr=-0.001"]),
            "--lr (the peak learning rate) must be in (0, 1]",
        ),
        (draft(&["--lr", "nan"]), "got NaN"),
        (draft(&["--lr", "0"]), "--lr"),
        (draft(&["--lr", "inf"]), "--lr"),
        (draft(&["--minutes", "nan"]), "--minutes"),
        (draft(&["--steps", "0"]), "--steps must be at least 1"),
        (
            draft(&["--passes", "9"]),
            "--passes must be in 1..=8, got 9",
        ),
        (draft(&["--batch", "0"]), "--batch"),
        (
            draft(&["--adaptor-queries", "1000000000"]),
            "--adaptor-queries must be in 1..=1024",
        ),
        (diffusion(&["--lr", "nan"]), "--lr"),
        (diffusion(&["--alpha", "2"]), "--alpha"),
        (diffusion(&["--alpha", "nan"]), "--alpha"),
        (
            diffusion(&["--blocks", "8,4"]),
            "--blocks must be increasing",
        ),
        (world(&["--lr=-1"]), "stage vision: --lr"),
        (world(&["--lr", "nan"]), "--lr"),
        (world(&["--minutes", "nan"]), "--minutes"),
    ] {
        expect_failure(&args[2..].join(" "), &args, keyword);
    }
    assert!(!d.join("out/checkpoint.safetensors").exists());
}

/// Packed (quantized) directories: `quantize` reports what it actually packed, refuses an
/// output inside its input, and a directory of another layout version is refused at load.
#[test]
fn packed_directories_are_checked() {
    let d = scratch("bad-packed");
    let img = fixture("images/astronaut.png");
    // llama-gqa's text matrices have input dimensions that are not multiples of 32: every one
    // falls back to bf16, and the report says so.
    let out = d.join("llama-q4");
    let o = glance(&["quantize", "--weights", "q4", s(&fixture(MODEL)), s(&out)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report = stdout(&o);
    assert!(
        report.contains("29 in bf16") && !report.contains("in q4"),
        "{report}"
    );
    assert!(
        stderr(&o).contains("no matrix was packed in q4"),
        "{}",
        stderr(&o)
    );
    let out = d.join("mistral-q4");
    let o = glance(&[
        "quantize",
        "--weights",
        "q4",
        s(&fixture("models/mistral")),
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("in q4, "), "{}", stdout(&o));
    // An unknown layout version is refused, naming the version found and the one supported.
    let file = out.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let key = b"\"glance_layout_version\":\"1\"";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("layout version in the header");
    bytes[at + key.len() - 2] = b'7';
    std::fs::write(&file, bytes).unwrap();
    let err = expect_failure(
        "layout version 7",
        &run_args(s(&out), s(&img), &["--weights", "q4"]),
        "layout version `7` is not supported",
    );
    assert!(err.contains("version 1"), "{err}");
    // An output inside the input directory, however it is spelled.
    let m = model_copy(&d, "model", MODEL);
    for inside in [m.join("q4"), m.join("a/../b"), m.join(".")] {
        expect_failure(
            s(&inside),
            &["quantize", "--weights", "q4", s(&m), s(&inside)],
            "",
        );
    }
    let err = expect_failure(
        "inside",
        &["quantize", "--weights", "q8", s(&m), s(&m.join("q8"))],
        "inside the model directory",
    );
    assert!(err.contains("q8"), "{err}");
    assert!(!m.join("q8").exists() && !m.join("q4").exists());
}

/// Non-finite output is an error on every path that produces logits, naming the first stage
/// whose output is not finite: `logits` (which wrote a file of NaN before), `run`, `eval`.
#[test]
fn non_finite_output_names_the_first_bad_layer() {
    let d = scratch("bad-nan");
    let img = fixture("images/astronaut.png");
    let npy = d.join("out.npy");
    for (name, place) in [
        (
            "language_model.model.norm.weight",
            "the decoder's final norm",
        ),
        (
            "language_model.model.layers.1.post_attention_layernorm.weight",
            "decoder layer 1",
        ),
        (
            "multi_modal_projector.linear_2.bias",
            "image 0's multimodal projector",
        ),
        (
            "vision_tower.encoder.layers.0.layer_norm1.bias",
            "image 0's vision tower",
        ),
    ] {
        let m = model_copy(&d, name, MODEL);
        edit_weights(&m, |ts| {
            let w = ts.get_mut(name).unwrap();
            *w = (w.ones_like().unwrap() * f64::NAN).unwrap();
        });
        let logits = [
            "logits",
            "--model",
            s(&m),
            "--image",
            s(&img),
            "--prompt",
            "hi",
            "--out",
            s(&npy),
        ];
        let err = expect_failure(&format!("logits, NaN {name}"), &logits, place);
        assert!(err.contains("non-finite"), "{err}");
        expect_failure(
            &format!("run, NaN {name}"),
            &run_args(s(&m), s(&img), &[]),
            place,
        );
        if name.ends_with("norm.weight") {
            let eval = [
                "eval",
                "--model",
                s(&m),
                "--split",
                "test",
                "--n",
                "1",
                "--max-new-tokens",
                "2",
            ];
            expect_failure("eval, NaN final norm", &eval, place);
        }
    }
    assert!(
        std::fs::metadata(&npy).map_or(0, |m| m.len()) == 0,
        "no logits were written"
    );
}
