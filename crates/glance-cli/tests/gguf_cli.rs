//! `glance run --model X.gguf [--mmproj Y.gguf]`: the GGUF copies of the fixtures
//! (fixtures/gguf, scripts/make_gguf_fixtures.py) answer with the tokens their safetensors
//! directories give in the matching weight format; a pair alone in its folder needs no
//! `--mmproj`; bad input is refused with a message, never a panic.

mod common;

use common::*;
use std::path::Path;

fn run_json(model: &Path, extra: &[&str]) -> serde_json::Value {
    let img = fixture("images/astronaut.png");
    let mut args = vec![
        "run",
        "--model",
        s(model),
        "--image",
        s(&img),
        "--prompt",
        "What is in the picture?",
        "--max-new-tokens",
        "10",
        "--decode",
        "ar",
        "--threads",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = glance(&args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn gguf_pairs_answer_as_their_directories() {
    for (model, text, mmproj, weights) in [
        ("llama-gqa", "text-f16.gguf", "mmproj-f16.gguf", "f16"),
        ("mistral", "text-q8_0.gguf", "mmproj-f32.gguf", "q8"),
        ("mistral", "text-q4_0.gguf", "mmproj-f32.gguf", "q4"),
        ("qwen2", "text-f16.gguf", "mmproj-f16.gguf", "f16"),
    ] {
        let dir = fixture(&format!("models/{model}"));
        let want = run_json(&dir, &["--weights", weights]);
        let gguf = fixture(&format!("gguf/{model}"));
        let mm = gguf.join(mmproj);
        // No --weights: the file's own format.
        let got = run_json(&gguf.join(text), &["--mmproj", s(&mm)]);
        assert_eq!(got["weights"], weights, "{model} {text}");
        assert!(!want["token_ids"].as_array().unwrap().is_empty());
        assert_eq!(got["token_ids"], want["token_ids"], "{model} {text}");
        assert_eq!(got["text"], want["text"], "{model} {text}");
    }
}

#[test]
fn a_pair_alone_in_its_folder_needs_no_mmproj_flag() {
    let d = scratch("gguf-pair");
    let gguf = fixture("gguf/qwen2");
    std::fs::copy(gguf.join("text-f16.gguf"), d.join("qwen2-f16.gguf")).unwrap();
    std::fs::copy(
        gguf.join("mmproj-f16.gguf"),
        d.join("mmproj-qwen2-f16.gguf"),
    )
    .unwrap();
    let want = run_json(&fixture("models/qwen2"), &["--weights", "f16"]);
    let img = fixture("images/astronaut.png");
    let o = glance(&[
        "run",
        "--model",
        s(&d.join("qwen2-f16.gguf")),
        "--image",
        s(&img),
        "--prompt",
        "What is in the picture?",
        "--max-new-tokens",
        "10",
        "--decode",
        "ar",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("mmproj-qwen2-f16.gguf"),
        "{}",
        stderr(&o)
    );
    let got: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(got["token_ids"], want["token_ids"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_gguf_input_is_refused_with_a_message() {
    let d = scratch("gguf-bad");
    let gguf = fixture("gguf/mistral");
    let mm = gguf.join("mmproj-f16.gguf");
    let bytes = std::fs::read(gguf.join("text-f16.gguf")).unwrap();
    let cut = d.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let run = |model: &Path, extra: &[&str]| {
        let mut args = vec!["run", "--model", s(model), "--prompt", "hi"];
        args.extend_from_slice(extra);
        glance(&args)
    };
    let o = run(&cut, &["--mmproj", s(&mm)]);
    assert_fails_with(&o, "truncated");
    // The text model alone, next to two mmproj files: which one?
    let o = run(&gguf.join("text-f16.gguf"), &[]);
    assert_fails_with(&o, "--mmproj");
    // Alone in a folder: the mmproj is missing.
    let alone = d.join("alone.gguf");
    std::fs::copy(gguf.join("text-f16.gguf"), &alone).unwrap();
    assert_fails_with(&run(&alone, &[]), "mmproj");
    // The files swapped.
    let o = run(&mm, &["--mmproj", s(&gguf.join("text-f16.gguf"))]);
    assert_fails_with(&o, "unknown architecture `clip`");
    // --mmproj with a directory model.
    let o = run(&fixture("models/mistral"), &["--mmproj", s(&mm)]);
    assert_fails_with(&o, "--mmproj goes with a GGUF --model");
    // A file that does not exist.
    let o = run(&d.join("absent.gguf"), &["--mmproj", s(&mm)]);
    assert_fails_with(&o, "absent.gguf");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A GGUF pair under the glance home's `models/` is listed by `glance models` (the text model,
/// not its mmproj) and answers by its file name.
#[test]
fn gguf_models_in_the_glance_home_are_listed_and_found_by_name() {
    let home = scratch("gguf-home");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let gguf = fixture("gguf/qwen2");
    std::fs::copy(gguf.join("text-f16.gguf"), models.join("qwen2-f16.gguf")).unwrap();
    std::fs::copy(
        gguf.join("mmproj-f16.gguf"),
        models.join("mmproj-qwen2-f16.gguf"),
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_glance"))
            .env("GLANCE_HOME", &home)
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["models", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&str> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"qwen2-f16.gguf"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("mmproj")), "{names:?}");
    let want = run_json(&fixture("models/qwen2"), &["--weights", "f16"]);
    let img = fixture("images/astronaut.png");
    let o = run(&[
        "run",
        "--model",
        "qwen2-f16.gguf",
        "--image",
        s(&img),
        "--prompt",
        "What is in the picture?",
        "--max-new-tokens",
        "10",
        "--decode",
        "ar",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(got["token_ids"], want["token_ids"]);
    std::fs::remove_dir_all(&home).unwrap();
}
