//! Helpers shared by the CLI integration tests: run the real binary, read its output, find the
//! committed fixtures, make scratch directories.
#![allow(dead_code)] // each test binary uses its own subset

pub mod bounded;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `fixtures/<p>` at the repository root.
pub fn fixture(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(p)
}

/// [`fixture`] as a string argument.
pub fn fixture_str(p: &str) -> String {
    fixture(p).to_string_lossy().into_owned()
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// The glance home of the tests (the shipped models are installed there, once).
pub const TEST_HOME: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/glance-home");

/// The built `glance`, on one kernel thread, with the tests' glance home.
pub fn glance_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_glance"));
    c.env("RAYON_NUM_THREADS", "1")
        .env("GLANCE_HOME", TEST_HOME);
    c
}

/// Runs `glance` with `args` on one kernel thread.
pub fn glance(args: &[&str]) -> Output {
    glance_command().args(args).output().expect("binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a clean failure: exit code 1, no panic, and `needle` in the message.
pub fn assert_fails_with(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
}

/// `glance world sample --split test --start INDEX --n 1 --out OUT`: the image's path.
pub fn world_sample(out: &Path, index: u64) -> PathBuf {
    let index_arg = index.to_string();
    let o = glance(&[
        "world",
        "sample",
        "--split",
        "test",
        "--start",
        &index_arg,
        "--n",
        "1",
        "--out",
        s(out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out.join(format!("{index:04}.png"))
}

/// A fresh scratch directory under the system temp dir, unique to this test process.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("glance-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
