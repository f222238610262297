//! Block diffusion through the real binary: `glance run --decode diffusion-…` on the shipped
//! converted model, `glance bench diffusion` (the report's structure, the lossless contract, the
//! plot), and clean errors for an unconverted model, misplaced or invalid flags and a conversion
//! that cannot start.

mod common;

use common::{assert_fails_with, fixture, glance, s, scratch, stderr, stdout};
use serde_json::Value;
use std::path::PathBuf;

fn models(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    p.to_string_lossy().into_owned()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn run(model: &str, extra: &[&str]) -> std::process::Output {
    let image = fixture("images/astronaut.png");
    let mut args = vec![
        "run",
        "--model",
        model,
        "--image",
        s(&image),
        "--prompt",
        "Describe the image in detail.",
        "--max-new-tokens",
        "40",
    ];
    args.extend_from_slice(extra);
    glance(&args)
}

#[test]
fn run_decodes_the_converted_model_like_autoregressive_decoding() {
    let dvlm = models("glance-tiny-dvlm");
    let json = |o: std::process::Output| -> Value {
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let ar = json(run(&dvlm, &["--json"]));
    for extra in [
        &["--decode", "diffusion-linear", "--block", "8"][..],
        &["--decode", "diffusion-quadratic", "--dynamic-block"][..],
    ] {
        let mut args = extra.to_vec();
        args.push("--json");
        let r = json(run(&dvlm, &args));
        assert_eq!(r["token_ids"], ar["token_ids"], "{extra:?}");
        assert_eq!(r["decode"]["strategy"], extra[1]);
        let passes = r["decode"]["forward_passes"].as_u64().unwrap();
        assert!(passes >= 1, "{r}");
        assert!(
            r["decode"]["histograms"]["accepted_length"].is_array(),
            "{r}"
        );
    }
    let t = json(run(
        &dvlm,
        &[
            "--decode",
            "diffusion-threshold",
            "--threshold",
            "0.7",
            "--json",
        ],
    ));
    assert!(!t["token_ids"].as_array().unwrap().is_empty());
}

#[test]
fn misplaced_and_invalid_diffusion_flags_are_refused() {
    let tiny = models("glance-tiny");
    assert_fails_with(
        &run(&tiny, &["--decode", "diffusion-linear"]),
        "glance train diffusion",
    );
    assert_fails_with(
        &run(&tiny, &["--block", "4"]),
        "--block only applies to the block-diffusion strategies",
    );
    let dvlm = models("glance-tiny-dvlm");
    assert_fails_with(
        &run(&dvlm, &["--decode", "diffusion-linear", "--block", "0"]),
        "--block must be in 1..=64",
    );
    assert_fails_with(
        &run(
            &dvlm,
            &["--decode", "diffusion-threshold", "--threshold", "1.5"],
        ),
        "threshold",
    );
    let dir = scratch("diffusion-train");
    let out = dir.join("out");
    assert_fails_with(
        &glance(&[
            "train",
            "diffusion",
            "--from",
            s(&dir.join("missing")),
            "--out",
            s(&out),
        ]),
        "missing",
    );
    assert_fails_with(
        &glance(&[
            "train",
            "diffusion",
            "--from",
            &tiny,
            "--out",
            s(&out),
            "--resume",
        ]),
        "no checkpoint",
    );
    assert_fails_with(
        &glance(&[
            "train",
            "diffusion",
            "--from",
            &tiny,
            "--out",
            s(&out),
            "--export",
        ]),
        "no checkpoint",
    );
}

#[test]
fn bench_diffusion_reports_every_column_and_the_lossless_modes_equal_ar() {
    let dir = scratch("diffusion-bench");
    let (json, plot) = (dir.join("d.json"), dir.join("d.svg"));
    let o = glance(&[
        "bench",
        "diffusion",
        "--n",
        "1",
        "--blocks",
        "2,4",
        "--thresholds",
        "0.9",
        "--prune-block",
        "4",
        "--max-new-tokens",
        "24",
        "--json",
        s(&json),
        "--plot",
        s(&plot),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in ["short answers", "description answers", "tok/NFE", "keeps"] {
        assert!(out.contains(needle), "`{needle}` missing from:\n{out}");
    }
    assert!(std::fs::read_to_string(&plot).unwrap().contains("<svg"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let groups = v["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    for g in groups {
        let cols = g["columns"].as_array().unwrap();
        let names: Vec<&str> = cols
            .iter()
            .map(|c| c["strategy"].as_str().unwrap())
            .collect();
        // ar ×2, linear and quadratic at 2 sizes + dynamic, auto, threshold at 2 sizes, 4
        // pruned.
        assert_eq!(names.len(), 2 + 2 * 3 + 1 + 2 + 4, "{names:?}");
        assert!(names.contains(&"auto"), "{names:?}");
        assert_eq!(names[..2], ["ar (original)", "ar"]);
        let ar = &cols[1];
        assert_eq!(f(&ar["tokens_per_forward"]), 1.0);
        for c in cols {
            assert!((0.0..=1.0).contains(&f(&c["accuracy"])), "{c}");
            let lossless = ["diffusion-linear", "diffusion-quadratic", "auto"];
            if lossless.contains(&c["decode"].as_str().unwrap()) {
                assert_eq!(c["greedy_mismatches"], 0, "{c}");
                if c["pruned"] == false {
                    assert_eq!(c["completion_tokens"], ar["completion_tokens"], "{c}");
                }
            }
        }
    }
}

/// Fast-dVLM's own base: `train diffusion --from` a Qwen2.5-VL checkpoint (the committed
/// random-weight fixture, whose tokenizer has no mask token and no spare vocabulary row)
/// converts it — the mask token added as a new special token, the vocabulary grown by one row —
/// and the converted model decodes by linear and quadratic block diffusion exactly as it
/// decodes autoregressively.
#[test]
fn a_qwen2_5_vl_checkpoint_converts_and_decodes_losslessly() {
    let dir = scratch("qwen-diffusion");
    let out = dir.join("run");
    let from = fixture("qwen2_vl/models/qwen2_5-vl");
    let o = glance(&[
        "train",
        "diffusion",
        "--from",
        s(&from),
        "--out",
        s(&out),
        "--steps",
        "3",
        "--batch",
        "2",
        "--eval-every",
        "0",
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let model = out.join("model");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let mask = config["block_diffusion"]["mask_token_id"].as_u64().unwrap();
    assert_eq!(mask, 427, "the first id past the fixture tokenizer's");
    assert_eq!(config["text_config"]["vocab_size"], 428);
    let tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("tokenizer.json")).unwrap())
            .unwrap();
    let added = tokenizer["added_tokens"].as_array().unwrap();
    assert!(added
        .iter()
        .any(|t| t["id"] == mask && t["content"] == "[MASK]" && t["special"] == true));
    let m = model.to_string_lossy().into_owned();
    let json = |o: std::process::Output| -> Value {
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let ar = json(run(&m, &["--json", "--decode", "ar"]));
    assert!(!ar["token_ids"].as_array().unwrap().is_empty());
    for extra in [
        &["--decode", "diffusion-linear", "--block", "4"][..],
        &["--decode", "diffusion-quadratic", "--block", "4"][..],
    ] {
        let mut args = extra.to_vec();
        args.push("--json");
        let r = json(run(&m, &args));
        assert_eq!(r["token_ids"], ar["token_ids"], "{extra:?}");
        assert_eq!(r["decode"]["strategy"], extra[1]);
    }
}
