//! Running the real binary on hostile input with a deadline: a case that runs past
//! [`CASE_TIMEOUT`] is killed and fails as a hang; a clean failure is exit code 1, an `error:` line
//! naming the problem, and no panic. Shared by the bad-input corpora (`bad_inputs.rs`,
//! `bad_inputs_serve.rs`).

use super::fixture;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Longest a single bad-input run may take before it counts as a hang.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `glance args…` with [`CASE_TIMEOUT`]; kills the process and fails on expiry. Returns
/// (exit code, stderr).
pub fn run_bounded(label: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut child = super::glance_command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    // Drain stderr on a thread so a chatty process cannot block on a full pipe.
    let mut pipe = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > CASE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{label}: still running after {CASE_TIMEOUT:?} (killed)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().expect("reader"))
}

/// Asserts the clean failure of one case: exit code 1, `error:` with `keyword`, no panic.
pub fn expect_failure(label: &str, args: &[&str], keyword: &str) -> String {
    let (code, err) = run_bounded(label, args);
    assert!(!err.contains("panicked"), "{label}: panic: {err}");
    assert_eq!(code, Some(1), "{label}: exit code {code:?}, stderr: {err}");
    assert!(err.contains("error:"), "{label}: no `error:` line: {err}");
    assert!(
        err.contains(keyword),
        "{label}: expected `{keyword}` in: {err}"
    );
    err
}

/// A fresh copy of fixture model `name` under `root`.
pub fn model_copy(root: &Path, label: &str, name: &str) -> PathBuf {
    let dst = root.join(label);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

/// A file of `len` bytes starting with `head`, sparse (no disk or time spent on the rest).
pub fn sparse_file(path: &Path, head: &[u8], len: u64) {
    std::fs::write(path, head).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
}
