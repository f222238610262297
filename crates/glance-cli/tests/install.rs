//! Install anywhere: a copy of the binary, run from `/` with no source tree in reach, answers
//! with the model it carries (installed to the glance home on first use: `$GLANCE_HOME`, else the
//! platform data directory), serves it, and lists it in `glance models`.

mod common;
mod serve_common;

use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The built binary copied alone into a scratch directory.
fn copied_binary(root: &Path) -> PathBuf {
    let bin = root.join("bin").join("glance");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_glance"), &bin).unwrap();
    bin
}

/// The copy, run from `/` with a clean environment: only `PATH`, `HOME` and `extra`.
fn command(bin: &Path, home: &Path, extra: &[(&str, &Path)]) -> Command {
    let mut c = Command::new(bin);
    c.current_dir("/")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("RAYON_NUM_THREADS", "1");
    for (k, v) in extra {
        c.env(k, v);
    }
    c
}

#[test]
fn a_copied_binary_runs_demo_run_and_serve_from_anywhere() {
    let root = scratch("install");
    let bin = copied_binary(&root);
    let home = root.join("home");
    let data = root.join("data");
    let xdg: &[(&str, &Path)] = &[("XDG_DATA_HOME", &data)];

    // demo: no --model, no GLANCE_HOME: the platform data directory.
    let out = root.join("demo");
    let o = command(&bin, &home, xdg)
        .args(["demo", "--seed", "3", "--out", s(&out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let installed = data.join("glance/models/glance-tiny");
    assert!(
        stderr(&o).contains("installed glance-tiny"),
        "{}",
        stderr(&o)
    );
    assert!(installed.join("model.safetensors").is_file());
    assert!(installed.join("draft-vispec/model.safetensors").is_file());
    assert_eq!(stdout(&o).matches("truth:").count(), 6, "{}", stdout(&o));

    // run, twice: the second use installs nothing.
    let png = out.join("world-test-3.png");
    let ask = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--image",
            s(&png),
            "--prompt",
            "How many objects are there?",
            "--json",
        ];
        args.extend_from_slice(extra);
        command(&bin, &home, xdg).args(&args).output().unwrap()
    };
    let o = ask(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("installed"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let text = v["text"].as_str().unwrap().trim().to_string();
    assert!(!text.is_empty() && text.len() < 40, "`{text}`");
    // The draft heads travel too: vispec gives the same answer.
    let o = ask(&["--decode", "vispec"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let w: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(w["text"], v["text"]);
    // So does glance-tiny-dvlm, by name.
    let o = ask(&[
        "--model",
        "glance-tiny-dvlm",
        "--decode",
        "diffusion-linear",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    // $GLANCE_HOME wins over the data directory.
    let gh = root.join("glance-home");
    let env: &[(&str, &Path)] = &[("XDG_DATA_HOME", &data), ("GLANCE_HOME", &gh)];
    let o = command(&bin, &home, env)
        .args(["models", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["home"], json!(gh));
    let models = v["models"].as_array().unwrap();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names[..2], ["glance-tiny", "glance-tiny-dvlm"]);
    assert!(models[0]["note"].as_str().unwrap().contains("first use"));

    // serve, from the copy, under that home.
    let mut cmd = command(&bin, &home, env);
    cmd.env_remove("RAYON_NUM_THREADS");
    let server = serve_common::Server::start_command(cmd, &[]);
    let (status, body) = server.chat(&json!({
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 3,
    }));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "glance-tiny");
    drop(server);
    let o = command(&bin, &home, env).args(["models"]).output().unwrap();
    let table = stdout(&o);
    assert!(
        table.contains(&format!(
            "{}  (installed)",
            gh.join("models/glance-tiny").display()
        )),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn unknown_model_names_say_where_glance_looked() {
    let o = glance(&["run", "--model", "no-such-model", "--prompt", "hi"]);
    assert_fails_with(&o, "not a shipped model");
    let o = glance(&["run", "--model", "nobody/nothing", "--prompt", "hi"]);
    assert_fails_with(&o, "models--nobody--nothing");
    let o = glance(&[
        "run",
        "--model",
        "glance-tiny",
        "--revision",
        "main",
        "--prompt",
        "hi",
    ]);
    assert_fails_with(&o, "--revision applies to a Hugging Face repo id");
}
