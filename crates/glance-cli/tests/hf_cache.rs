//! Hugging Face repo ids resolved offline in a hand-made HF cache with the layout
//! `huggingface_hub` writes: `models--org--name/refs/main` holding a commit hash,
//! `snapshots/<commit>/<file>` symbolic links into `blobs/`.
#![cfg(unix)]

mod common;
mod serve_common;

use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};

const REPO: &str = "glance-test/llama-gqa";
const MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const OLD: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// A cache under `root` holding the llama-gqa fixture as `REPO`: `main` at `MAIN`, and a second
/// snapshot `OLD` that no branch names.
fn make_cache(root: &Path) -> PathBuf {
    let cache = root.join("hub");
    let repo = cache.join("models--glance-test--llama-gqa");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::write(repo.join("refs/main"), MAIN).unwrap();
    for (i, e) in std::fs::read_dir(fixture("models/llama-gqa"))
        .unwrap()
        .enumerate()
    {
        let e = e.unwrap();
        let blob = format!("{i:064x}");
        std::fs::copy(e.path(), repo.join("blobs").join(&blob)).unwrap();
        for rev in [MAIN, OLD] {
            let snap = repo.join("snapshots").join(rev);
            std::fs::create_dir_all(&snap).unwrap();
            let target = PathBuf::from("../../blobs").join(&blob);
            std::os::unix::fs::symlink(target, snap.join(e.file_name())).unwrap();
        }
    }
    cache
}

fn tokens(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_str(&stdout(o)).unwrap();
    v["token_ids"].clone()
}

const ASK: [&str; 5] = ["run", "--prompt", "What is this?", "--max-new-tokens", "6"];

#[test]
fn repo_ids_load_from_the_hf_cache() {
    let root = scratch("hf-cache");
    let cache = make_cache(&root);
    let run = |env: &[(&str, &Path)], extra: &[&str]| {
        let mut c = glance_command();
        c.env_remove("HF_HUB_CACHE").env_remove("HF_HOME");
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(ASK).args(["--json"]).args(extra).output().unwrap()
    };
    let expected = tokens(&run(&[], &["--model", s(&fixture("models/llama-gqa"))]));
    // $HF_HUB_CACHE, and $HF_HOME/hub.
    let by_id = run(&[("HF_HUB_CACHE", &cache)], &["--model", REPO]);
    assert_eq!(tokens(&by_id), expected);
    let by_home = run(&[("HF_HOME", &root)], &["--model", REPO]);
    assert_eq!(tokens(&by_home), expected);
    // A commit hash names its snapshot; a branch the cache does not have is refused, listing
    // what it has.
    let env: &[(&str, &Path)] = &[("HF_HUB_CACHE", &cache)];
    let old = run(env, &["--model", REPO, "--revision", OLD]);
    assert_eq!(tokens(&old), expected);
    let o = run(env, &["--model", REPO, "--revision", "v2"]);
    assert_fails_with(&o, "revision `v2`");
    assert!(stderr(&o).contains("branches here: main"), "{}", stderr(&o));
    let o = run(env, &["--model", "glance-test/absent"]);
    assert_fails_with(&o, "models--glance-test--absent");

    // `glance models` lists the repo and its snapshot.
    let o = glance_command()
        .env("HF_HUB_CACHE", &cache)
        .args(["models", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let hf: Vec<&serde_json::Value> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["source"] == "HF cache")
        .collect();
    assert_eq!(hf.len(), 1, "{v}");
    assert_eq!(hf[0]["name"], REPO);
    assert!(hf[0]["dir"].as_str().unwrap().ends_with(MAIN));

    // The server names the model by its repo id, given as an id or as the snapshot's path.
    let snapshot = cache
        .join("models--glance-test--llama-gqa/snapshots")
        .join(MAIN);
    for model in [REPO, s(&snapshot)] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_glance"));
        cmd.env("GLANCE_HOME", TEST_HOME)
            .env("HF_HUB_CACHE", &cache);
        let server = serve_common::Server::start_command(cmd, &["--model", model]);
        let (status, models) = server.request("GET", "/v1/models", None);
        assert_eq!(status, 200, "{models}");
        let v: serde_json::Value = serde_json::from_str(&models).unwrap();
        assert_eq!(v["data"][0]["id"], json!(REPO), "{v}");
    }
    let _ = std::fs::remove_dir_all(&root);
}
