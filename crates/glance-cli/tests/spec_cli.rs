//! `glance bench spec` through the real binary on the committed random-weight fixture, with
//! untrained draft heads written to a scratch directory: the report's structure (every strategy
//! and group, the rates derived from the counters), the lossless contract under greedy decoding
//! (no answer differs from autoregressive decoding's), the plots, and a clean error without
//! heads. The memory-bound projection (a 1B model) is skipped here.

mod common;

use common::{assert_fails_with, fixture, fixture_str, glance, s, scratch, stderr, stdout};
use glance_models::draft::{DraftConfig, DraftHead};
use serde_json::Value;
use std::path::Path;

/// Writes an untrained head for the fixture with the given ViSpec parts.
fn head(dir: &Path, adaptor: Option<usize>, injection: bool, seed: u64) {
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("models/llama-gqa/config.json")).unwrap(),
    )
    .unwrap();
    let c = DraftConfig::for_target(&config["text_config"], adaptor, injection).unwrap();
    DraftHead::write_random(dir, c, seed).unwrap();
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn bench_spec_reports_every_strategy_and_group_and_greedy_equals_ar() {
    let dir = scratch("spec");
    let (vispec, eagle, ablation) = (dir.join("vispec"), dir.join("eagle"), dir.join("noadapt"));
    head(&vispec, Some(4), true, 1);
    head(&eagle, None, false, 2);
    head(&ablation, None, true, 3);
    let (json, depth, position) = (
        dir.join("out/spec.json"),
        dir.join("depth.svg"),
        dir.join("position.svg"),
    );
    let plots = format!("{},{}", s(&depth), s(&position));
    let model = fixture_str("models/llama-gqa");
    let o = glance(&[
        "bench",
        "spec",
        "--model",
        &model,
        "--n",
        "1",
        "--no-random",
        "--temperature",
        "0,1",
        "--max-new-tokens",
        "16",
        "--draft-depth",
        "3",
        "--draft",
        s(&vispec),
        "--draft",
        s(&eagle),
        "--ablation",
        s(&ablation),
        "--json",
        s(&json),
        "--plot",
        &plots,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "T=0 · short answers",
        "T=1 · descriptions",
        "tok/fwd",
        "mismatch",
    ] {
        assert!(out.contains(needle), "`{needle}` missing from:\n{out}");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["bench"], "spec");
    assert_eq!(v["images"], 1);
    assert_eq!(v["tree"]["depth"], 3);
    assert!(v.get("projection").is_none());
    let names: Vec<&str> = v["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ar", "vispec", "eagle", "vispec-noadaptor", "auto"]);
    // `auto` measured the cost model, and the report shows it.
    assert!(v["cost_model"]["c"].as_array().unwrap().len() >= 4, "{v}");
    let groups = v["groups"].as_array().unwrap();
    let keys: Vec<(f64, &str)> = groups
        .iter()
        .map(|g| (f(&g["temperature"]), g["answers"].as_str().unwrap()))
        .collect();
    assert_eq!(
        keys,
        [
            (0.0, "short"),
            (0.0, "description"),
            (1.0, "short"),
            (1.0, "description")
        ]
    );
    let questions = v["questions"].as_u64().unwrap();
    assert!(questions >= 5, "one question per family: {questions}");
    for g in groups {
        let greedy = f(&g["temperature"]) == 0.0;
        let rows = g["strategies"].as_array().unwrap();
        let ar = &rows[0];
        assert_eq!(ar["strategy"], "ar");
        assert_eq!(f(&ar["tokens_per_forward"]), 1.0, "{ar}");
        assert_eq!(f(&ar["speedup"]), 1.0);
        assert_eq!(ar["rounds"], 0);
        assert!(ar["greedy_mismatches"].is_null());
        for r in rows {
            assert_eq!(r["questions"], g["questions"], "{r}");
            let acc = f(&r["accuracy"]);
            assert!((0.0..=1.0).contains(&acc), "{r}");
            assert!(f(&r["decode_tokens_per_s"]) > 0.0, "{r}");
        }
        for r in &rows[1..] {
            // The lossless contract: greedy speculative answers are autoregressive decoding's.
            if greedy {
                assert_eq!(r["greedy_mismatches"], 0, "{r}");
                assert_eq!(r["completion_tokens"], ar["completion_tokens"], "{r}");
                assert_eq!(r["accuracy"], ar["accuracy"], "{r}");
            } else {
                assert!(r["greedy_mismatches"].is_null(), "{r}");
            }
            assert!(f(&r["tokens_per_forward"]) >= 1.0, "{r}");
            if r["strategy"] == "auto" {
                // Plain rounds or drafted ones, as the machine's costs say: checked above.
                continue;
            }
            let rounds = r["rounds"].as_u64().unwrap();
            let phases: f64 = ["start", "draft", "verify", "accept"]
                .iter()
                .map(|p| f(&r["phase_s"][p]))
                .sum();
            assert!(f(&r["phase_s"]["verify"]) > 0.0, "{r}");
            assert!(phases <= f(&r["decode_s"]) + 1e-3, "{r}");
            assert_eq!(r["forward_passes"].as_u64().unwrap(), rounds, "{r}");
            let decoded =
                r["completion_tokens"].as_u64().unwrap() - r["questions"].as_u64().unwrap();
            let tpf = f(&r["tokens_per_forward"]);
            assert!((tpf - decoded as f64 / rounds as f64).abs() < 1e-9, "{r}");
            assert!(tpf >= 1.0, "{r}");
            let offered = r["offered_by_depth"].as_array().unwrap();
            let rates = r["acceptance_by_depth"].as_array().unwrap();
            assert!(!offered.is_empty() && offered.len() <= 3, "{r}");
            assert_eq!(offered.len(), rates.len());
            // Every round drafts, unless one token is left to the answer's cap.
            let first = offered[0].as_u64().unwrap();
            assert!(first > 0 && first <= rounds, "{r}");
            for x in rates.iter().filter(|x| !x.is_null()) {
                assert!((0.0..=1.0).contains(&f(x)), "{r}");
            }
            let emitted: u64 = r["emitted_by_position"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .sum();
            let by_pos: u64 = r["rounds_by_position"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .sum();
            assert_eq!(by_pos, rounds, "{r}");
            // A round emits its accepted tokens and one more (the last may be cut by the cap).
            assert!(emitted >= decoded && emitted >= rounds, "{r}");
        }
    }
    for p in [&depth, &position] {
        let svg = std::fs::read_to_string(p).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("vispec-noadaptor"),
            "{}",
            p.display()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_spec_without_heads_or_with_bad_flags_fails_cleanly() {
    let model = fixture_str("models/llama-gqa");
    let dir = scratch("spec-bad");
    let json = dir.join("spec.json");
    let base = [
        "bench",
        "spec",
        "--model",
        &model,
        "--n",
        "1",
        "--no-random",
        "--json",
        s(&json),
    ];
    assert_fails_with(&glance(&base), "no draft head");
    let missing = dir.join("nowhere");
    let o = glance(&[&base[..], &["--draft", s(&missing)]].concat());
    assert_fails_with(&o, "config.json");
    let o = glance(&[&base[..], &["--temperature", "-1"]].concat());
    assert_fails_with(&o, "temperature");
    let o = glance(&[&base[..], &["--plot", "one.svg"]].concat());
    assert_fails_with(&o, "--plot takes two files");
    let o = glance(
        &[
            &base[..6],
            &["--random-shape", "llama-9t", "--json", s(&json)],
        ]
        .concat(),
    );
    assert_fails_with(&o, "tinyllama-1.1b");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A copy of glance-tiny's shipped EAGLE head in `dir/eagle`.
fn shipped_eagle_in(dir: &Path) -> std::path::PathBuf {
    let head = dir.join("eagle");
    std::fs::create_dir_all(&head).unwrap();
    let shipped =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny/draft-eagle");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(shipped.join(f), head.join(f)).unwrap();
    }
    head
}

/// `glance train draft-vocab` keeps the tokens the target emits with a head; the head then
/// decodes exactly as autoregressive decoding does, and `--clear` takes the vocabulary away.
#[test]
fn train_draft_vocab_keeps_the_emitted_tokens_with_the_head() {
    let dir = scratch("draft-vocab");
    let head = shipped_eagle_in(&dir);
    let vocab_cmd = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "draft-vocab",
            "--head",
            s(&head),
            "--target",
            "glance-tiny",
        ];
        args.extend(extra);
        glance(&args)
    };
    let o = vocab_cmd(&["--samples", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("tokens kept"), "{}", stdout(&o));
    let config = DraftConfig::load(&head).unwrap();
    let vocab = config.draft_vocab.clone().expect("a vocabulary");
    let target_vocab = config.layer_config().unwrap().vocab_size;
    assert!(!vocab.is_empty() && vocab.len() < target_vocab, "{vocab:?}");
    let image = common::world_sample(&dir, 0);
    let answer = |decode: &[&str]| {
        let mut args = vec![
            "run",
            "--image",
            s(&image),
            "--prompt",
            "Describe the image.",
            "--max-new-tokens",
            "48",
            "--decode",
        ];
        args.extend(decode);
        let o = glance(&args);
        assert!(o.status.success(), "{decode:?}: {}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(answer(&["eagle", "--draft", s(&head)]), answer(&["ar"]));
    // Bad settings are refused before anything is counted.
    assert_fails_with(&vocab_cmd(&["--size", "0"]), "--size");
    let o = vocab_cmd(&["--clear"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(DraftConfig::load(&head).unwrap().draft_vocab.is_none());
}

/// `glance train draft --eval-head DIR --record` measures a head's acceptance by depth on the
/// held-out answers and keeps it in the head's config, where `--decode auto` reads it.
#[test]
fn eval_head_records_the_acceptance_by_depth_with_the_head() {
    let dir = scratch("eval-head-record");
    let head = shipped_eagle_in(&dir);
    let mut config = DraftConfig::load(&head).unwrap();
    config.acceptance = None;
    config.save(&head).unwrap();
    let eval = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "draft",
            "--target",
            "glance-tiny",
            "--kind",
            "eagle",
            "--eval-head",
            s(&head),
        ];
        args.extend(extra);
        glance(&args)
    };
    // Without --record the head is left as it is.
    let o = eval(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("top-1 acceptance by depth"),
        "{}",
        stdout(&o)
    );
    assert!(DraftConfig::load(&head).unwrap().acceptance.is_none());
    let o = eval(&["--record"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let recorded = DraftConfig::load(&head)
        .unwrap()
        .acceptance
        .expect("recorded");
    assert_eq!(recorded.len(), 3, "{recorded:?}");
    // The shipped EAGLE head is well trained: most of its drafts are accepted at every depth.
    assert!(
        recorded.iter().all(|&a| a > 0.5 && a <= 1.0),
        "{recorded:?}"
    );
    // --record needs a head to evaluate (a usage error, as clap reports them).
    let o = glance(&["train", "draft", "--target", "glance-tiny", "--record"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--eval-head"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
