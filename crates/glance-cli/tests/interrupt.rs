//! Ctrl-C during training: the run writes a checkpoint before it exits, and `--resume` continues
//! from it. The three trainers share the mechanism (`glance_train::interrupt`, checked before each
//! step by both step loops); this drives `train diffusion` (its source model given by name) with a
//! real SIGINT.
#![cfg(unix)]

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn sigint_checkpoints_and_resume_continues() {
    let dir = scratch("interrupt");
    let out = dir.join("run");
    let train = |extra: &[&str]| {
        let mut c = glance_command();
        c.args([
            "train",
            "diffusion",
            "--from",
            "glance-tiny",
            "--out",
            s(&out),
        ])
        .args(["--threads", "1", "--batch", "2", "--eval-every", "0"])
        .args(extra);
        c
    };
    let mut child = train(&["--steps", "100000", "--checkpoint-every", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The start-up line comes once the handler is installed.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("glance train diffusion:") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no start-up line");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("still running 120 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest = reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(rest.contains("interrupted (signal 2)"), "{rest}");
    assert!(out.join("checkpoint.safetensors").is_file(), "{rest}");

    // --resume picks it up (one more step, then stop).
    let o = train(&["--resume", "--stop-after", "1"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let at: u64 = e
        .split("at step ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no step in: {e}"));
    assert!(at >= 1, "{e}");
    assert!(e.contains("stopped; continue with --resume"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
