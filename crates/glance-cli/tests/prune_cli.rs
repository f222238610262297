//! Integration tests of visual-token pruning through the real `glance` binary on the committed
//! fixtures: `run --prune/--keep/--tau/--prune-layer`, bad values as clean errors, and
//! `bench prune` (TTFT and the accuracy loop on a fixture model, JSON and SVG plots).

mod common;

use common::{fixture_str as fixture, glance, stderr};

fn run_json(extra: &[&str]) -> serde_json::Value {
    let (m, img) = (fixture("models/llama-gqa"), fixture("images/astronaut.png"));
    let args = [
        &[
            "run",
            "--model",
            &m,
            "--image",
            &img,
            "--prompt",
            "What is the astronaut holding?",
        ][..],
        extra,
        &["--json"],
    ]
    .concat();
    let o = glance(&args);
    assert!(o.status.success(), "{:?}: {}", extra, stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn run_prunes_visual_tokens_and_reports_them() {
    let full = run_json(&["--max-new-tokens", "6"]);
    assert_eq!(full["pruning"]["policy"], "none");
    assert_eq!(full["usage"]["kept_visual_tokens"], 16);
    let t = full["usage"]["prompt_tokens"].as_u64().unwrap();
    for (policy, keep, kept) in [
        ("adaptive", "0.25", 4),
        ("hier", "50%", 8),
        ("fastv", "3", 3),
        ("pool", "0.125", 2),
    ] {
        let v = run_json(&["--max-new-tokens", "6", "--prune", policy, "--keep", keep]);
        assert_eq!(v["pruning"]["policy"], policy);
        assert_eq!(v["usage"]["kept_visual_tokens"], kept, "{policy}");
        assert_eq!(
            v["usage"]["prompt_rows"].as_u64().unwrap(),
            t - 16 + kept,
            "{policy}"
        );
        assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap(), t, "{policy}");
        assert_eq!(v["usage"]["completion_tokens"], 6, "{policy}");
        // Pre-LLM policies spend time selecting; FastV selects inside the prefill.
        let select = v["timings"]["prune_select_s"].as_f64().unwrap();
        assert_eq!(select > 0.0, policy != "fastv", "{policy}: {select}");
        let t = |k: &str| v["timings"][k].as_f64().unwrap();
        assert!(
            t("time_to_first_token_s") >= t("prune_select_s") + t("prefill_s") - 1e-9,
            "{policy}: TTFT covers selection and prefill"
        );
    }
    // A bare budget means adaptive; keeping everything is exactly the unpruned answer.
    let v = run_json(&["--max-new-tokens", "6", "--prune", "0.5"]);
    assert_eq!(v["pruning"]["policy"], "adaptive");
    let all = run_json(&[
        "--max-new-tokens",
        "6",
        "--prune",
        "saliency",
        "--keep",
        "1.0",
    ]);
    assert_eq!(all["token_ids"], full["token_ids"]);
    assert_eq!(all["text"], full["text"]);
}

#[test]
fn bad_pruning_options_are_clean_errors() {
    let (m, img) = (fixture("models/llama-gqa"), fixture("images/astronaut.png"));
    for (extra, needle) in [
        (vec!["--keep", "0"], "--keep"),
        (vec!["--keep", "1.5"], "--keep"),
        (vec!["--prune", "bogus"], "unknown pruning policy"),
        (vec!["--prune", "text", "--tau", "-1"], "--tau"),
        (
            vec!["--prune", "adaptive", "--prune-layer", "1"],
            "--prune-layer",
        ),
        (
            vec!["--prune", "fastv", "--prune-layer", "2"],
            "FastV layer",
        ),
        (vec!["--prune", "0.5", "--keep", "0.25"], "budget once"),
    ] {
        let o = glance(
            &[
                &["run", "--model", &m, "--image", &img, "--prompt", "x"][..],
                &extra,
            ]
            .concat(),
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains(needle),
            "{extra:?}: expected `{needle}` in {err}"
        );
    }
}

#[test]
fn bench_prune_writes_ttft_accuracy_json_and_plots() {
    let out = std::env::temp_dir().join(format!("glance-bench-prune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = glance(&[
        "bench",
        "prune",
        "--shape",
        "none",
        "--model",
        &fixture("models/mistral"),
        "--examples",
        "1",
        "--reps",
        "1",
        "--budgets",
        "1,0.5,0.25",
        "--policies",
        "adaptive,saliency,fastv,hier",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("prune.json")).unwrap()).unwrap();
    // 100% once, then 4 policies × 2 budgets.
    assert_eq!(v["model_ttft"]["rows"].as_array().unwrap().len(), 9);
    let acc = v["accuracy"]["rows"].as_array().unwrap();
    assert_eq!(acc.len(), 9);
    for r in acc {
        let m = r["mean_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&m), "{r}");
        assert!(r["families"]["counting"]["questions"].as_u64().unwrap() == 1);
    }
    let svg = std::fs::read_to_string(out.join("prune-accuracy.svg")).unwrap();
    // One 2-px line per policy (axes, ticks and legend keys are drawn thinner), each named.
    assert_eq!(
        svg.matches(r#"stroke-width="2" points"#).count(),
        4,
        "one line per policy"
    );
    for name in [
        "adaptive",
        "saliency",
        "fastv",
        "hier",
        "visual tokens kept",
    ] {
        assert!(svg.contains(&format!(">\n{name}\n</text>")), "{name}");
    }
    let o = glance(&[
        "bench",
        "prune",
        "--shape",
        "none",
        "--budgets",
        "0,0.5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&out);
}
