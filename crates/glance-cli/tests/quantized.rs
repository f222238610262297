//! Quantized directories: `glance quantize` records the format, carries the draft heads and the
//! block-diffusion settings and writes files readable by all; loading the output needs no
//! `--weights`, and a conflicting one is refused.

mod common;

use common::*;
use std::path::Path;

fn run_json(model: &Path, extra: &[&str]) -> std::process::Output {
    let img = fixture("images/astronaut.png");
    let mut args = vec![
        "run",
        "--model",
        s(model),
        "--image",
        s(&img),
        "--prompt",
        "What is this?",
        "--max-new-tokens",
        "8",
        "--json",
    ];
    args.extend_from_slice(extra);
    glance(&args)
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap()
}

#[cfg(unix)]
fn assert_modes_0644(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            assert_modes_0644(&p);
        } else {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "{}: {mode:o}", p.display());
        }
    }
}

#[test]
fn quantized_directories_load_in_their_format_with_their_heads() {
    let d = scratch("quantized");
    // The shipped model, by name, in q8.
    let q8 = d.join("tiny-q8");
    let o = glance(&["quantize", "--weights", "q8", "glance-tiny", s(&q8)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(q8.join("draft-vispec/model.safetensors").is_file());
    assert!(q8.join("draft-eagle/config.json").is_file());
    #[cfg(unix)]
    assert_modes_0644(&q8);

    // No --weights: the recorded format.
    let v = json(&run_json(&q8, &[]));
    assert_eq!(v["weights"], "q8");
    // The same flag is fine; another is refused, naming both.
    assert_eq!(
        json(&run_json(&q8, &["--weights", "q8"]))["text"],
        v["text"]
    );
    for other in ["q4", "f32", "bf16"] {
        let o = run_json(&q8, &["--weights", other]);
        assert_fails_with(&o, "holds q8 weights");
        assert!(
            stderr(&o).contains(&format!("instead of {other}")),
            "{}",
            stderr(&o)
        );
    }
    // The heads came along: speculative decoding gives the greedy answer.
    for strategy in ["vispec", "eagle"] {
        let w = json(&run_json(&q8, &["--decode", strategy]));
        assert_eq!(w["text"], v["text"], "{strategy}");
    }

    // The block-diffusion model in q4 keeps its settings.
    let q4 = d.join("dvlm-q4");
    let o = glance(&["quantize", "--weights", "q4", "glance-tiny-dvlm", s(&q4)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let w = json(&run_json(&q4, &["--decode", "diffusion-linear"]));
    assert_eq!(w["weights"], "q4");
    assert_eq!(w["decode"]["strategy"], "diffusion-linear");
    let _ = std::fs::remove_dir_all(&d);
}
