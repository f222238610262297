//! Every command of the README and of the docs pages a user copies from (auto, models, weights,
//! serve, speculative, diffusion) runs: their `sh` blocks, in order, in one scratch directory, with the built `glance`
//! first on `PATH` and a fresh glance home; `python` blocks too where the `openai` package is
//! installed (the run says when it is not; in CI, where `.ci/python-deps` installs it, a missing
//! package fails). Lines starting with `cargo` are CI's own commands (`.ci/run` runs
//! `cargo test --release --workspace` and `cargo install --path crates/glance-cli`). Flag
//! synopses (with `[…]`) are `text` blocks, not commands; training examples run a few steps.
#![cfg(unix)]

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// The pages whose examples run, in order (later pages use files earlier ones wrote).
const PAGES: [&str; 7] = [
    "README.md",
    "docs/auto.md",
    "docs/models.md",
    "docs/weights.md",
    "docs/serve.md",
    "docs/speculative.md",
    "docs/diffusion.md",
];

/// The fenced blocks of `text` with their info string.
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(info)) => current = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.push(current.take().expect("open block")),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// A bash script running the page's examples.
fn script(page: &str, text: &str) -> String {
    let mut s = format!("echo '## {page}'\n");
    for (info, body) in blocks(text) {
        match info.as_str() {
            "sh" => {
                for line in body.lines() {
                    if !line.trim_start().starts_with("cargo ") {
                        s.push_str(line);
                        s.push('\n');
                    }
                }
            }
            "python" => {
                s.push_str("if python3 -c 'import openai' 2>/dev/null; then\npython3 - <<'PY'\n");
                s.push_str(&body);
                // In CI (`.ci/python-deps` installs the client) a missing client fails.
                s.push_str(
                    "PY\nelif [ -n \"${CI:-}\" ]; then echo 'no openai package in CI \
                     (.ci/python-deps installs it)' >&2; exit 1\n\
                     else echo 'skipped a python example: no openai package'; fi\n",
                );
            }
            _ => {}
        }
    }
    s
}

#[test]
fn every_documented_command_runs() {
    let root = scratch("readme");
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_glance"), bin.join("glance")).unwrap();
    let work = root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut all = String::from("set -euo pipefail\n");
    for page in PAGES {
        let text = std::fs::read_to_string(repo.join(page)).unwrap();
        let page_script = script(page, &text);
        assert!(page_script.lines().count() > 1, "{page}: no sh block");
        // Each page's server is stopped when the page ends (or fails), before the next page
        // starts its own.
        all.push_str(&format!(
            "(\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{page_script})\n"
        ));
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = Command::new("bash")
        .arg("-c")
        .arg(&all)
        .current_dir(&work)
        .env("PATH", path)
        .env("GLANCE_HOME", root.join("home"))
        .env("HF_HUB_CACHE", root.join("hf"))
        .output()
        .unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        o.status.success(),
        "script:\n{all}\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(!err.contains("error:"), "{err}");
    // The demo, a run, the server (curl and, where installed, the openai client) and eval all
    // answered.
    for needle in ["truth:", "\"chat.completion\"", "mean"] {
        assert!(out.contains(needle), "`{needle}` missing:\n{out}");
    }
    eprintln!("{out}");
    let _ = std::fs::remove_dir_all(&root);
}
