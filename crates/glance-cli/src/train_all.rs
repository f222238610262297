//! `glance train all --out DIR`: the whole glance-tiny family by one command, staged and
//! resumable — the base (vision pretraining, then the LLaVA stage with dialogues, relation
//! questions and token drop), both draft heads, the block-diffusion conversion, then the eval —
//! and a table of every artifact's numbers with each stage's wall time.
//!
//! Each stage is one of glance's own training or eval commands, run as a child process of this
//! binary in its own directory under DIR (so each keeps its checkpoints, metrics and `--resume`).
//! `DIR/family.json` records which stages are done and the wall time each took over all
//! invocations; `--resume` continues from the first stage not done, resuming its checkpoint.
//! Ctrl-C (or SIGTERM) reaches the running stage, which checkpoints and stops; this command then
//! records the time spent and says how to continue.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Args)]
pub struct AllArgs {
    /// Output directory: one directory per stage, the assembled `glance-tiny/` (with its draft
    /// heads) and `glance-tiny-dvlm/`, `eval/` and `family.json`.
    #[arg(long, default_value = "runs/family")]
    pub out: PathBuf,
    /// Continue the run in OUT from its first stage not done.
    #[arg(long)]
    pub resume: bool,
    /// The model the base starts from (its weights; heads it lacks start random).
    #[arg(long, default_value = "glance-tiny")]
    pub init: PathBuf,
    /// Fine-tune the base from INIT (a whole glance-tiny) instead of training it from scratch:
    /// no vision stage, and the LLaVA stage continues INIT's weights for 1,200 steps at a lower
    /// learning rate with relation questions on 80% of the images and spatial ×4 (the heads
    /// and the conversion are retrained on it as usual): 1,200 base steps instead of 6,800.
    #[arg(long)]
    pub finetune: bool,
    /// Multiply every stage's optimiser steps (e.g. 0.01 for a smoke run of the whole
    /// pipeline; at least one step each).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// World test images of the final evaluation (dialogues included).
    #[arg(long, default_value_t = 200)]
    pub eval_images: usize,
    /// Threads in all, passed to every stage (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print the stages and their commands, run nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// One stage: a glance command whose output directory is `dir` and whose product (relative to
/// it) shows it finished.
struct Stage {
    name: &'static str,
    /// Optimiser steps (after `--scale`).
    steps: u64,
    args: Vec<String>,
    dir: PathBuf,
    product: &'static str,
}

/// What `family.json` keeps per stage.
#[derive(Default, Serialize, Deserialize)]
struct Record {
    done: bool,
    seconds: f64,
}

#[derive(Default, Serialize, Deserialize)]
struct Family {
    stages: BTreeMap<String, Record>,
}

fn s(x: impl AsRef<std::ffi::OsStr>) -> String {
    x.as_ref().to_string_lossy().into_owned()
}

/// The recipe (docs/glance-tiny.md, "v2"): each stage's command and its steps before `--scale`.
/// Steps, not minutes, so that a machine busy with other work stretches a stage's wall time
/// instead of cutting its training.
fn stages(a: &AllArgs, init: &Path) -> Vec<Stage> {
    let out = &a.out;
    let base = s(out.join("glance-tiny"));
    let strs = |x: &[&str]| -> Vec<String> { x.iter().map(|v| v.to_string()).collect() };
    let vision_init = s(init);
    // From scratch: the vision stage, then 5,500 LLaVA steps on its tower; fine-tuning: 1,200
    // steps from INIT at a lower rate, with more relation and spatial questions.
    let (llava_init, llava_steps, lr, relations, spatial) = if a.finetune {
        (s(init), 1200, "3e-4", "0.8", "4")
    } else {
        (s(out.join("vision/model")), 5500, "5e-4", "0.3", "2")
    };
    let recipe: [(&'static str, u64, Vec<String>, &'static str); 5] = [
        (
            "vision",
            1300,
            [
                strs(&["train", "world", "--stage", "vision", "--lr", "3e-4"]),
                strs(&["--no-curriculum", "--init", &vision_init]),
            ]
            .concat(),
            "model/config.json",
        ),
        (
            "llava",
            llava_steps,
            [
                strs(&["train", "world", "--stage", "llava", "--lr", lr]),
                strs(&["--no-curriculum", "--init", &llava_init]),
                strs(&["--dialogue", "0.5", "--relations", relations]),
                strs(&["--spatial-weight", spatial]),
                strs(&["--token-drop", "0.5", "--align", "2"]),
            ]
            .concat(),
            "model/config.json",
        ),
        // The ViSpec head sees a quarter of its prompts pruned, the EAGLE head half: at a half
        // the ViSpec head's depth-1 acceptance fell to 0.866 from v1's 0.878; at a quarter it
        // is 0.883 and still keeps 96% of its tokens per forward under 12.5% pruning
        // (docs/glance-tiny.md).
        (
            "draft-vispec",
            3000,
            strs(&[
                "train",
                "draft",
                "--kind",
                "vispec",
                "--token-drop",
                "0.25",
                "--target",
                &base,
            ]),
            "head/config.json",
        ),
        (
            "draft-eagle",
            2500,
            strs(&[
                "train",
                "draft",
                "--kind",
                "eagle",
                "--token-drop",
                "0.5",
                "--target",
                &base,
            ]),
            "head/config.json",
        ),
        (
            "diffusion",
            4000,
            strs(&[
                "train",
                "diffusion",
                "--lr",
                "1e-4",
                "--token-drop",
                "0.5",
                "--from",
                &base,
            ]),
            "model/config.json",
        ),
    ];
    recipe
        .into_iter()
        .filter(|(name, ..)| !(a.finetune && *name == "vision"))
        .map(|(name, steps, mut args, product)| {
            let steps = ((steps as f64 * a.scale).round() as u64).max(1);
            let dir = out.join(name);
            args.extend(["--steps".into(), steps.to_string(), "--out".into(), s(&dir)]);
            Stage {
                name,
                steps,
                args,
                dir,
                product,
            }
        })
        .collect()
}

/// The evaluations of the assembled family: (file stem, arguments).
fn evals(a: &AllArgs) -> Vec<(&'static str, Vec<String>)> {
    let out = &a.out;
    let n = a.eval_images.to_string();
    let few = a.eval_images.min(60).to_string();
    let eval = |model: &Path, images: &str, extra: &[&str], stem: &str| -> Vec<String> {
        let mut v: Vec<String> = vec![
            "eval".into(),
            "--model".into(),
            s(model),
            "--n".into(),
            images.into(),
            "--json".into(),
            s(out.join("eval").join(format!("{stem}.json"))),
        ];
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let base = out.join("glance-tiny");
    let dvlm = out.join("glance-tiny-dvlm");
    vec![
        ("base", eval(&base, &n, &[], "base")),
        (
            "pruned",
            eval(
                &base,
                &n,
                &["--no-dialogue", "--prune", "adaptive", "--keep", "12.5%"],
                "pruned",
            ),
        ),
        (
            "vispec",
            eval(
                &base,
                &few,
                &["--no-dialogue", "--decode", "vispec"],
                "vispec",
            ),
        ),
        (
            "eagle",
            eval(
                &base,
                &few,
                &["--no-dialogue", "--decode", "eagle"],
                "eagle",
            ),
        ),
        (
            "diffusion",
            eval(
                &dvlm,
                &few,
                &["--no-dialogue", "--decode", "diffusion-linear"],
                "diffusion",
            ),
        ),
    ]
}

pub fn run(a: AllArgs) -> Result<()> {
    if !(a.scale > 0.0 && a.scale.is_finite()) {
        bail!("--scale must be > 0, got {}", a.scale);
    }
    if a.eval_images == 0 {
        bail!("--eval-images must be at least 1");
    }
    let init = crate::args::model_dir(Some(&a.init))?;
    let state_path = a.out.join("family.json");
    let mut family: Family = match (state_path.is_file(), a.resume) {
        (true, true) => serde_json::from_str(
            &std::fs::read_to_string(&state_path)
                .with_context(|| format!("reading {}", state_path.display()))?,
        )
        .with_context(|| format!("{} is not a train-all record", state_path.display()))?,
        (true, false) => bail!(
            "{} already holds a family run: pass --resume to continue it",
            a.out.display()
        ),
        (false, true) => bail!("--resume: no family run in {}", a.out.display()),
        (false, false) => Family::default(),
    };
    let plan = stages(&a, &init);
    let evals = evals(&a);
    if a.dry_run {
        for st in &plan {
            let steps = format!("{} steps", st.steps);
            println!("{:<13} {steps:>11}  glance {}", st.name, st.args.join(" "));
        }
        println!(
            "{:<13} {:>11}  llava/model → glance-tiny/; the heads and diffusion/model at the end",
            "assemble", ""
        );
        for args in head_args(&a.out) {
            println!("{:<13} {:>11}  glance {}", "", "", args.join(" "));
        }
        for (name, args) in &evals {
            println!("eval {name:<8} {:>11}  glance {}", "", args.join(" "));
        }
        return Ok(());
    }
    std::fs::create_dir_all(a.out.join("eval"))
        .with_context(|| format!("creating {}", a.out.display()))?;
    // The stages get the signal themselves and checkpoint; this process outlives them to record
    // the time and say how to continue.
    crate::signals::checkpoint_on_signals();
    let exe = std::env::current_exe().context("finding the glance binary")?;
    for st in &plan {
        let record = family.stages.entry(st.name.to_string()).or_default();
        if record.done {
            eprintln!(
                "train all: {} done ({:.1} min)",
                st.name,
                record.seconds / 60.0
            );
            continue;
        }
        let mut args = st.args.clone();
        let resuming = st.dir.join("checkpoint.safetensors").is_file();
        if resuming {
            args = resume_args(&args);
        } else if st.dir.exists() {
            args.push("--force".into());
        }
        if let Some(t) = a.threads {
            args.extend(["--threads".into(), t.to_string()]);
        }
        eprintln!("train all: {} — glance {}", st.name, args.join(" "));
        let before = record.seconds;
        // The record is written as the stage runs, so a run killed outright (a session's end)
        // still leaves what `--resume` needs and the wall time it spent.
        let status = run_stage(&exe, &args, |elapsed| {
            family
                .stages
                .entry(st.name.to_string())
                .or_default()
                .seconds = before + elapsed;
            save_or_warn(&state_path, &family);
        });
        let record = family.stages.entry(st.name.to_string()).or_default();
        let ok = matches!(&status, Ok(s) if s.success())
            && st.dir.join(st.product).is_file()
            && glance_train::interrupt::requested().is_none();
        // The base goes where the later stages read it before the stage counts as done.
        if ok && st.name == "llava" {
            copy_dir(&st.dir.join("model"), &a.out.join("glance-tiny"))?;
        }
        record.done = ok;
        save(&state_path, &family)?;
        if !ok {
            bail!(
                "stage {} stopped ({}); continue with `glance train all --out {} --resume`",
                st.name,
                match status {
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                },
                a.out.display()
            );
        }
    }
    assemble(&a.out, &exe)?;
    if !family.stages.get("eval").is_some_and(|r| r.done) {
        let mut spent = family.stages.get("eval").map_or(0.0, |r| r.seconds);
        for (name, args) in &evals {
            eprintln!("train all: eval {name} — glance {}", args.join(" "));
            let status = run_stage(&exe, args, |elapsed| {
                family.stages.entry("eval".into()).or_default().seconds = spent + elapsed;
                save_or_warn(&state_path, &family);
            });
            spent = family.stages.get("eval").map_or(0.0, |r| r.seconds);
            if !matches!(&status, Ok(s) if s.success()) {
                bail!(
                    "eval {name} failed; continue with `glance train all --out {} --resume`",
                    a.out.display()
                );
            }
        }
        family.stages.entry("eval".into()).or_default().done = true;
        save(&state_path, &family)?;
    }
    let order: Vec<&str> = plan.iter().map(|st| st.name).chain(["eval"]).collect();
    print_table(&a.out, &family, &order, &evals)
}

/// Runs `glance ARGS` and waits for it. A stop asked of this process (Ctrl-C, SIGTERM) is
/// passed on to the stage as SIGINT, so it checkpoints, and the stage's failure ends the run.
/// `progress(seconds so far)` runs at the start, every minute and at the end.
fn run_stage(
    exe: &Path,
    args: &[String],
    mut progress: impl FnMut(f64),
) -> Result<std::process::ExitStatus> {
    let start = Instant::now();
    progress(0.0);
    let mut child = Command::new(exe)
        .args(args)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let mut forwarded = false;
    let mut last = start;
    loop {
        if let Some(status) = child.try_wait()? {
            progress(start.elapsed().as_secs_f64());
            return Ok(status);
        }
        if last.elapsed().as_secs() >= 60 {
            last = Instant::now();
            progress(start.elapsed().as_secs_f64());
        }
        if !forwarded && glance_train::interrupt::requested().is_some() {
            forwarded = true;
            #[cfg(unix)]
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
                unsafe {
                    libc::kill(pid, libc::SIGINT);
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `args` for a resumed stage: `--resume` added, `--init` (which only starts a run) taken out;
/// the checkpoint's saved settings win over the rest.
fn resume_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut it = args.iter();
    while let Some(x) = it.next() {
        if x == "--init" {
            it.next();
        } else {
            out.push(x.clone());
        }
    }
    out.push("--resume".into());
    out
}

/// [`save`] while a stage runs: a record that cannot be written is reported, and the stage goes
/// on (its own checkpoints are what `--resume` needs most).
fn save_or_warn(path: &Path, family: &Family) {
    if let Err(e) = save(path, family) {
        eprintln!("train all: warning: {e:#}");
    }
}

fn save(path: &Path, family: &Family) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(family)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Copies the files of `from` into `to` (created; one level, as model directories are).
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let dest = to.join(path.file_name().context("a file name")?);
            std::fs::copy(&path, &dest)
                .with_context(|| format!("copying {} to {}", path.display(), dest.display()))?;
        }
    }
    Ok(())
}

/// `glance-tiny/` with its heads, and `glance-tiny-dvlm/`.
/// Copies the heads into the base and the converted model beside it, and gives each head its
/// reduced vocabulary and its measured acceptance ([`head_args`]).
fn assemble(out: &Path, exe: &Path) -> Result<()> {
    let base = out.join("glance-tiny");
    for kind in ["vispec", "eagle"] {
        copy_dir(
            &out.join(format!("draft-{kind}/head")),
            &base.join(format!("draft-{kind}")),
        )?;
    }
    copy_dir(&out.join("diffusion/model"), &out.join("glance-tiny-dvlm"))?;
    for args in head_args(out) {
        let status = run_stage(exe, &args, |_| {})?;
        if !status.success() {
            bail!(
                "glance {} failed ({status}); continue with `glance train all --out {} --resume`",
                args.join(" "),
                out.display()
            );
        }
    }
    Ok(())
}

/// For each assembled head, `glance train draft-vocab` (the tokens the base emits on the heads'
/// training samples, FR-Spec, so its draft steps read those rows of the LM head only), then
/// `glance train draft --eval-head --record` (its acceptance by depth on held-out answers, which
/// `--decode auto` chooses among heads by).
fn head_args(out: &Path) -> Vec<Vec<String>> {
    let base = out.join("glance-tiny");
    let mut all = Vec::new();
    for kind in ["vispec", "eagle"] {
        let head = s(base.join(format!("draft-{kind}")));
        all.push(vec![
            "train".into(),
            "draft-vocab".into(),
            "--head".into(),
            head.clone(),
            "--target".into(),
            s(&base),
        ]);
        all.push(vec![
            "train".into(),
            "draft".into(),
            "--target".into(),
            s(&base),
            "--kind".into(),
            kind.into(),
            "--eval-head".into(),
            head,
            "--record".into(),
        ]);
    }
    all
}

/// The family's numbers, one row per evaluation, and each stage's wall time.
fn print_table(
    out: &Path,
    family: &Family,
    order: &[&str],
    evals: &[(&str, Vec<String>)],
) -> Result<()> {
    println!("stage          wall (min)");
    let mut total = 0.0;
    for name in order {
        let Some(r) = family.stages.get(*name) else {
            continue;
        };
        total += r.seconds;
        println!("{name:<14} {:>10.1}", r.seconds / 60.0);
    }
    println!("{:<14} {:>10.1}", "total", total / 60.0);
    println!();
    println!(
        "{:<10} {:>6} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>6}",
        "eval",
        "mean",
        "spatial",
        "relation",
        "dialogue",
        "alone",
        "follow",
        "desc F1",
        "tok/fw",
        "kept"
    );
    for (name, _) in evals {
        let path = out.join("eval").join(format!("{name}.json"));
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?,
        )?;
        let f = |x: &serde_json::Value| x.as_f64().map_or("-".into(), |x| format!("{x:.3}"));
        let spatial = v["families"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["family"] == "spatial"))
            .map_or(serde_json::Value::Null, |x| x["score"].clone());
        let d = &v["dialogue"];
        println!(
            "{:<10} {:>6} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>6.1}",
            name,
            f(&v["mean"]),
            f(&spatial),
            f(&v["relation"]["score"]),
            f(&d["in_context"]["score"]),
            f(&d["alone"]["score"]),
            f(&d["follow_up"]["score"]),
            f(&v["description"]["f1"]),
            f(&v["timing"]["tokens_per_forward"]),
            v["prune"]["mean_kept_visual_tokens"]
                .as_f64()
                .unwrap_or(0.0),
        );
    }
    Ok(())
}
