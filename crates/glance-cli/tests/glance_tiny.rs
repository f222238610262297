//! The shipped default model, `models/glance-tiny`, through the real binary with no `--model`
//! (so the default resolution is tested too): it is a standard checkpoint within the size budget,
//! and it answers from the image — accuracy on a small fixed test sample stays above a floor set
//! well under its measured accuracy. The floor catches a broken or swapped checkpoint; it does not
//! measure the model (`glance eval --n 1000` does).

mod common;

use common::{glance, glance_command, scratch, stderr, stdout};
use std::path::PathBuf;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny")
}

/// Test images scored by the floor test (one question per family each).
const FLOOR_IMAGES: &str = "40";
/// Floors well under what the shipped model measured on these 40 images: mean 0.860, weakest
/// family (spatial) 0.625, description F1 0.887.
const MEAN_FLOOR: f64 = 0.70;
const FAMILY_FLOOR: f64 = 0.45;
const DESCRIPTION_F1_FLOOR: f64 = 0.70;
/// Floor of the mean with `--prune adaptive --keep 0.125` on the same images (measured: 0.860).
const PRUNED_MEAN_FLOOR: f64 = 0.70;

#[test]
fn shipped_model_is_a_complete_hf_checkpoint_under_40_mb() {
    let dir = model_dir();
    let mut total = 0;
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    ] {
        let meta = std::fs::metadata(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        total += meta.len();
    }
    assert!(total <= 40 << 20, "glance-tiny is {total} bytes");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "LlavaForConditionalGeneration");
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert!(
        tok["chat_template"].is_string() || dir.join("chat_template.jinja").is_file(),
        "no chat template"
    );
}

/// `glance eval --split test --n FLOOR_IMAGES EXTRA… --json` run from a directory without
/// `models/` (the default must resolve to the source tree's copy): the report and stdout.
fn eval_default_model(name: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let dir = scratch(name);
    let json = dir.join("eval.json");
    let mut args = vec!["eval", "--split", "test", "--n", FLOOR_IMAGES];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let o = glance_command()
        .env_remove("RAYON_NUM_THREADS")
        .args(&args)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["model"].as_str().unwrap().ends_with("glance-tiny"));
    let _ = std::fs::remove_dir_all(&dir);
    (v, stdout(&o))
}

#[test]
fn shipped_model_answers_from_the_image() {
    let (v, out) = eval_default_model("tiny-floor", &[]);
    let mean = v["mean"].as_f64().unwrap();
    assert!(mean >= MEAN_FLOOR, "mean {mean}:\n{out}");
    for f in v["families"].as_array().unwrap() {
        if f["family"] != "description" {
            let s = f["score"].as_f64().unwrap();
            assert!(s >= FAMILY_FLOOR, "{f}:\n{out}");
        }
    }
    let f1 = v["description"]["f1"].as_f64().unwrap();
    assert!(f1 >= DESCRIPTION_F1_FLOOR, "description F1 {f1}");
}

/// glance-tiny is trained to answer from pruned token sets: with `adaptive` keeping 12.5% of the
/// visual tokens it stays above a floor set well under what it measured, and the report says
/// how many tokens were kept.
#[test]
fn shipped_model_answers_from_an_eighth_of_its_visual_tokens() {
    let (v, out) = eval_default_model("tiny-pruned", &["--prune", "adaptive", "--keep", "0.125"]);
    assert_eq!(
        v["prune"]["mean_kept_visual_tokens"].as_f64(),
        Some(32.0),
        "{v}"
    );
    let mean = v["mean"].as_f64().unwrap();
    assert!(mean >= PRUNED_MEAN_FLOOR, "mean {mean}:\n{out}");
}

#[test]
fn demo_and_run_use_the_shipped_model_by_default() {
    let dir = scratch("tiny-demo");
    let o = glance(&["demo", "--seed", "3", "--out", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("glance-tiny"), "{out}");
    assert_eq!(out.matches("truth:").count(), 6, "{out}");
    let png = dir.join("world-test-3.png");
    let o = glance(&[
        "run",
        "--image",
        png.to_str().unwrap(),
        "--prompt",
        "How many objects are there?",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let text = v["text"].as_str().unwrap().trim().to_string();
    assert!(!text.is_empty() && text.len() < 40, "`{text}`");
    let _ = std::fs::remove_dir_all(&dir);
}
