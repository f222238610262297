//! `glance train all`: the plan it prints (every stage, each a glance command writing under
//! OUT, the base's LLaVA stage with the dialogue mix), and its refusals. A real run at
//! `--scale 0.01` takes minutes of training, so CI does not run one (docs/glance-tiny.md, "v2").

mod common;

use common::*;

#[test]
fn dry_run_prints_every_stage_under_out() {
    let dir = scratch("train-all-plan");
    let out = dir.join("family");
    let o = glance(&[
        "train",
        "all",
        "--out",
        s(&out),
        "--dry-run",
        "--scale",
        "0.5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for stage in [
        "vision",
        "llava",
        "draft-vispec",
        "draft-eagle",
        "diffusion",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(stage))
            .unwrap_or_else(|| panic!("no stage {stage} in:\n{text}"));
        assert!(line.contains(&s(&out.join(stage)).to_string()), "{line}");
    }
    let llava = text.lines().find(|l| l.starts_with("llava")).unwrap();
    assert!(
        llava.contains("2750 steps"),
        "--scale halves the steps: {llava}"
    );
    for flag in ["--dialogue 0.5", "--relations", "--token-drop", "--init"] {
        assert!(llava.contains(flag), "{flag} missing: {llava}");
    }
    assert_eq!(text.lines().filter(|l| l.starts_with("eval ")).count(), 5);
    // Each assembled head gets its reduced vocabulary and its measured acceptance.
    for kind in ["vispec", "eagle"] {
        let head = s(&out.join("glance-tiny").join(format!("draft-{kind}"))).to_string();
        for wanted in [
            format!("draft-vocab --head {head} "),
            format!("--eval-head {head} --record"),
        ] {
            assert!(text.contains(&wanted), "{wanted}:\n{text}");
        }
    }
    assert!(!out.exists(), "a dry run writes nothing");
}

#[test]
fn a_fine_tune_continues_the_given_model_without_a_vision_stage() {
    let dir = scratch("train-all-finetune");
    let out = dir.join("family");
    let o = glance(&["train", "all", "--out", s(&out), "--finetune", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        !text.lines().any(|l| l.starts_with("vision")),
        "no vision stage:\n{text}"
    );
    let llava = text.lines().find(|l| l.starts_with("llava")).unwrap();
    assert!(llava.contains("1200 steps"), "{llava}");
    // It starts from the shipped model, not from a vision stage's output.
    assert!(!llava.contains("vision"), "{llava}");
    assert!(llava.contains("--relations 0.8"), "{llava}");
    for stage in ["draft-vispec", "draft-eagle", "diffusion"] {
        assert!(text.lines().any(|l| l.starts_with(stage)), "{stage}");
    }
}

#[test]
fn refuses_bad_settings_and_unclear_restarts() {
    let dir = scratch("train-all-refusals");
    let out = dir.join("family");
    let o = glance(&["train", "all", "--out", s(&out), "--scale", "0"]);
    assert_fails_with(&o, "--scale");
    let o = glance(&["train", "all", "--out", s(&out), "--resume"]);
    assert_fails_with(&o, "no family run");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("family.json"), "{\"stages\": {}}").unwrap();
    let o = glance(&["train", "all", "--out", s(&out)]);
    assert_fails_with(&o, "--resume");
    std::fs::write(out.join("family.json"), "not json").unwrap();
    let o = glance(&["train", "all", "--out", s(&out), "--resume"]);
    assert_fails_with(&o, "not a train-all record");
}
