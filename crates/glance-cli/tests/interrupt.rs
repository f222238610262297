//! Ctrl-C (or SIGTERM) during training: the run writes a checkpoint before it exits, and
//! `--resume` continues from it. The three trainers share the mechanism
//! (`glance_train::interrupt`, checked before each step by both step loops, and the handler of
//! crates/glance-cli/src/signals.rs, installed by each command before its start-up line); this
//! sends a real signal to each of `train world`, `train draft` and `train diffusion`.
#![cfg(unix)]

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The arguments of `glance train <kind>` writing to `out`, at tiny settings.
fn train_args(kind: &str, out: &Path) -> Vec<String> {
    let mut a: Vec<String> = vec!["train".into(), kind.into()];
    let rest: &[&str] = match kind {
        "world" => &["--quick", "--workers", "1", "--eval-per-family", "0"],
        "draft" => &[
            "--target",
            "glance-tiny",
            "--batch",
            "2",
            "--eval-every",
            "0",
        ],
        "diffusion" => &["--from", "glance-tiny", "--batch", "2", "--eval-every", "0"],
        other => panic!("no trainer {other}"),
    };
    a.extend(rest.iter().map(|s| s.to_string()));
    a.extend([
        "--threads".into(),
        "1".into(),
        "--out".into(),
        s(out).into(),
    ]);
    a
}

/// Starts `train <kind>`, sends `signal` once its start-up line is out and a step or so has run,
/// and checks the exit (128 + the signal), the message and the checkpoint; then `--resume`
/// continues from it for one step.
fn interrupted_run_resumes(kind: &str, signal: (&str, i32)) {
    let dir = scratch(&format!("interrupt-{kind}"));
    let out = dir.join("run");
    let train = |extra: &[&str]| {
        let mut c = glance_command();
        c.args(train_args(kind, &out)).args(extra);
        c
    };
    let mut child = train(&["--checkpoint-every", "100000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The start-up line comes once the handler is installed.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let startup = format!("glance train {kind}");
    while !line.contains(&startup) {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "{kind}: no start-up line"
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    let kill = std::process::Command::new("kill")
        .args([&format!("-{}", signal.0), &child.id().to_string()])
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
            panic!("{kind}: still running 120 s after SIG{}", signal.0);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest = reader.join().unwrap();
    assert_eq!(status.code(), Some(128 + signal.1), "{kind}: {rest}");
    assert!(
        rest.contains(&format!("interrupted (signal {})", signal.1)),
        "{kind}: {rest}"
    );
    assert!(
        out.join("checkpoint.safetensors").is_file(),
        "{kind}: {rest}"
    );

    // --resume picks it up (one more step, then stop).
    let o = train(&["--resume", "--stop-after", "1"]).output().unwrap();
    assert!(o.status.success(), "{kind}: {}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&format!("resuming {}", out.display())),
        "{kind}: {e}"
    );
    assert!(e.contains("stopped; continue with --resume"), "{kind}: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_checkpoints_diffusion_training_and_resume_continues() {
    interrupted_run_resumes("diffusion", ("INT", 2));
}

#[test]
fn sigterm_checkpoints_draft_training_and_resume_continues() {
    interrupted_run_resumes("draft", ("TERM", 15));
}

#[test]
fn sigint_checkpoints_world_training_and_resume_continues() {
    interrupted_run_resumes("world", ("INT", 2));
}
