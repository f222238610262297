//! Integration tests of `glance eval` and `glance demo` through the real binary on the committed
//! random-weight fixture (its accuracy is about 0: these tests check structure, not scores), and
//! bad input as clean errors (exit code 1, a message naming the problem, no panic).

mod common;

use common::{fixture_str, glance, scratch, stderr, stdout};

fn model() -> String {
    fixture_str("models/llama-gqa")
}

const FAMILIES: [&str; 6] = [
    "attribute",
    "counting",
    "spatial",
    "existence",
    "sign",
    "description",
];

/// Runs `glance eval` on the fixture with `extra` and returns (stdout, JSON report).
fn eval_json(name: &str, extra: &[&str]) -> (String, serde_json::Value) {
    let dir = scratch(name);
    let json = dir.join("eval.json");
    let m = model();
    let args = [
        &[
            "eval",
            "--model",
            &m,
            "--split",
            "test",
            "--n",
            "3",
            "--max-new-tokens",
            "8",
            "--json",
            json.to_str().unwrap(),
        ][..],
        extra,
    ]
    .concat();
    let o = glance(&args);
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (stdout(&o), v)
}

#[test]
fn eval_reports_every_family_with_counts_and_writes_json() {
    let (out, v) = eval_json("plain", &[]);
    for f in FAMILIES {
        assert!(out.contains(f), "`{f}` missing from:\n{out}");
    }
    assert!(out.contains("mean (short answers)"), "{out}");
    assert!(out.contains("precision") && out.contains("recall") && out.contains("F1"));
    assert_eq!(v["split"], "test");
    assert_eq!(v["images"], 3);
    let fams = v["families"].as_array().unwrap();
    let names: Vec<&str> = fams.iter().map(|f| f["family"].as_str().unwrap()).collect();
    assert_eq!(names, FAMILIES);
    let mut total = 0;
    for f in fams {
        let n = f["questions"].as_u64().unwrap();
        total += n;
        if f["family"] != "sign" {
            // Every image has objects, so one question of each of these families.
            assert_eq!(n, 3, "{f}");
        }
        let s = f["score"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&s), "{f}");
    }
    assert_eq!(v["questions"].as_u64().unwrap(), total);
    let mean = v["mean"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&mean));
    let d = &v["description"];
    assert_eq!(d["questions"], 3);
    for k in ["precision", "recall", "f1"] {
        let x = d[k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&x), "{k} = {x}");
    }
    assert_eq!(v["prune"]["policy"], "none");
    assert!(v["timing"]["mean_ttft_s"].as_f64().unwrap() > 0.0);
    assert!(v["model"].as_str().unwrap().ends_with("llama-gqa"));
}

#[test]
fn eval_accepts_pruning() {
    let (out, v) = eval_json("prune", &["--prune", "adaptive", "--keep", "0.25"]);
    assert!(out.contains("adaptive"), "{out}");
    assert_eq!(v["prune"]["policy"], "adaptive");
    assert_eq!(v["prune"]["visual_tokens"], 16);
    assert_eq!(v["prune"]["mean_kept_visual_tokens"], 4.0);
    assert_eq!(v["families"].as_array().unwrap().len(), 6);
    let (_, v) = eval_json("fastv", &["--prune", "fastv", "--keep", "8"]);
    assert_eq!(v["prune"]["policy"], "fastv");
}

#[test]
fn demo_writes_the_image_and_answers_every_family() {
    let dir = scratch("demo");
    let m = model();
    let o = glance(&[
        "demo",
        "--model",
        &m,
        "--seed",
        "3",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let png = dir.join("world-test-3.png");
    let img = image::open(&png).unwrap();
    assert_eq!((img.width(), img.height()), (224, 224));
    let out = stdout(&o);
    // Test image 3 has a sign, so every family is asked.
    for f in FAMILIES {
        assert!(out.contains(&format!("[{f}]")), "`{f}` missing:\n{out}");
    }
    assert_eq!(out.matches("truth:").count(), 6, "{out}");
    assert!(out.contains("time to first token") && out.contains("tokens/s"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_a_clean_error() {
    let m = model();
    let out = scratch("bad-input");
    let o = out.to_str().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["eval", "--model", &m, "--split", "bogus"], "--split"),
        (&["eval", "--model", &m, "--n", "0"], "--n"),
        (
            &["eval", "--model", "/no/such/model", "--n", "1"],
            "/no/such/model",
        ),
        (
            &["eval", "--model", &m, "--n", "1", "--prune", "bogus"],
            "unknown pruning policy",
        ),
        (
            &["eval", "--model", &m, "--max-new-tokens", "0"],
            "--max-new-tokens",
        ),
        (
            &["demo", "--model", "/no/such/model", "--out", o],
            "/no/such/model",
        ),
        (
            &[
                "demo",
                "--model",
                &m,
                "--seed",
                "4611686018427387904",
                "--out",
                o,
            ],
            "--seed",
        ),
    ];
    for (args, needle) in cases {
        let o = glance(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected `{needle}` in {err}"
        );
    }
    // A failed demo writes nothing.
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&out);
}

/// The conversation rows: each image's dialogue turn by turn (follow-ups apart, every other turn
/// also asked alone), its relation question, and the questions by object count — consistent
/// counts in the table and the JSON; `--no-dialogue` leaves the dialogues out.
#[test]
fn eval_reports_dialogues_relations_and_object_counts() {
    let (out, v) = eval_json("dialogue", &[]);
    for row in [
        "relation (is A above B)",
        "objects in the scene",
        "turns in context",
        "same asked alone",
        "follow-up",
        "by turn",
    ] {
        assert!(out.contains(row), "`{row}` missing from:\n{out}");
    }
    let d = &v["dialogue"];
    assert_eq!(d["dialogues"], 3);
    let n = |r: &serde_json::Value| r["questions"].as_u64().unwrap();
    assert_eq!(n(&d["in_context"]), n(&d["alone"]));
    assert_eq!(n(&d["turns"]), n(&d["in_context"]) + n(&d["follow_up"]));
    let by_turn: u64 = d["by_turn"].as_array().unwrap().iter().map(n).sum();
    assert_eq!(by_turn, n(&d["turns"]));
    assert!(
        n(&d["turns"]) >= 3,
        "every dialogue has a short-answer turn: {d}"
    );
    let fams = d["families"].as_array().unwrap();
    assert_eq!(fams.len(), 6);
    let short: u64 = fams
        .iter()
        .filter(|f| f["family"] != "description")
        .map(|f| f["questions"].as_u64().unwrap())
        .sum();
    assert_eq!(short, n(&d["in_context"]));
    assert!(n(&v["relation"]) <= 3);
    let objects = v["by_objects"].as_array().unwrap();
    assert_eq!(objects.len(), 7);
    let short_total: u64 = objects.iter().map(|o| n(&o["short"])).sum();
    let desc_total: u64 = objects.iter().map(|o| n(&o["description_f1"])).sum();
    assert_eq!(short_total + desc_total, v["questions"].as_u64().unwrap());

    let (out, v) = eval_json("no-dialogue", &["--no-dialogue"]);
    assert!(!out.contains("turns in context"), "{out}");
    assert!(v.get("dialogue").is_none(), "{v}");
    assert!(v.get("relation").is_some());
}
