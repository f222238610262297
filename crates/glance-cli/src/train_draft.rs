//! `glance train draft --target DIR …`: train an EAGLE / ViSpec draft head for a LLaVA target on
//! the target's own answers to world prompts; writes OUT/head (config.json + model.safetensors).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use glance_train::draft::trainer::RunEnd;
use glance_train::draft::EvalReport;
use glance_train::draft::{DraftObserver, DraftStepReport, DraftTrainConfig, DraftTrainer};
use glance_train::Budget;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DraftKind {
    /// Vision adaptor + global visual feature injection (ViSpec).
    Vispec,
    /// Text-only baseline: no adaptor, no injection.
    Eagle,
}

#[derive(Args)]
pub struct DraftArgs {
    /// The target model directory (a LLaVA checkpoint, e.g. models/glance-tiny).
    #[arg(long)]
    pub target: PathBuf,
    /// Output directory (checkpoint, metrics.jsonl, head/). Default: runs/draft-<kind>.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "vispec")]
    pub kind: DraftKind,
    /// Compressed tokens per image of the vision adaptor (vispec).
    #[arg(long, default_value_t = 16)]
    pub adaptor_queries: usize,
    /// No vision adaptor: image rows enter the draft as they are.
    #[arg(long)]
    pub no_adaptor: bool,
    /// No global visual feature injection.
    #[arg(long)]
    pub no_injection: bool,
    /// Optimiser steps (default 1000).
    #[arg(long, conflicts_with = "minutes")]
    pub steps: Option<u64>,
    /// Fit the run into this many minutes (the step count is fixed after timing the first steps;
    /// the early steps generate most of the data, so the run tends to end early).
    #[arg(long)]
    pub minutes: Option<f64>,
    /// Continue from OUT/checkpoint.safetensors (its saved settings are used).
    #[arg(long)]
    pub resume: bool,
    /// Start over even if OUT already holds a checkpoint.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads in all (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Samples per step.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Passes of the multi-step forward (draft depths trained).
    #[arg(long)]
    pub passes: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Checkpoint every N steps.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Validate every N steps (0: only at the end).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Stop (with a checkpoint) after this many steps of this invocation; continue with --resume.
    #[arg(long)]
    pub stop_after: Option<u64>,
}

pub fn run(a: DraftArgs) -> Result<()> {
    let threads = crate::threads::init(a.threads)?;
    glance_train::runtime::prepare_cpu_for_training();
    crate::threads::set(threads);
    let kind = match a.kind {
        DraftKind::Vispec => "vispec",
        DraftKind::Eagle => "eagle",
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("runs/draft-{kind}")));
    let ckpt = DraftTrainer::checkpoint_path(&out);
    let mut trainer = if a.resume {
        if !ckpt.is_file() {
            bail!("--resume: no checkpoint at {}", ckpt.display());
        }
        let t = DraftTrainer::resume(&out)
            .with_context(|| format!("resuming from {}", ckpt.display()))?;
        eprintln!(
            "resuming {} at step {} (saved settings win over command-line ones)",
            out.display(),
            t.state.step
        );
        t
    } else {
        if ckpt.is_file() && !a.force {
            bail!(
                "{} already holds a checkpoint: pass --resume to continue or --force to start over",
                out.display()
            );
        }
        let config = build_config(&a)?;
        DraftTrainer::new(config, &out).with_context(|| format!("setting up {}", out.display()))?
    };
    let c = &trainer.state.config;
    let n: usize = trainer
        .params()
        .iter()
        .map(|p| p.var.as_tensor().elem_count())
        .sum();
    eprintln!(
        "glance train draft ({}): {n} parameters, adaptor {}, injection {}, {} passes, batch {}, \
         {} thread(s), target {}",
        trainer.head_config.kind(),
        c.adaptor_queries
            .map_or("off".to_string(), |q| format!("{q} queries")),
        if c.global_injection { "on" } else { "off" },
        c.passes,
        c.batch,
        threads,
        c.target.display()
    );
    let start = Instant::now();
    let mut obs = Progress::default();
    let end = trainer.run(&mut obs, a.stop_after)?;
    obs.finish();
    match end {
        RunEnd::Finished => eprintln!(
            "done in {:.1} min ({} samples generated in {:.0} s): head in {} (metrics: {})",
            start.elapsed().as_secs_f64() / 60.0,
            trainer.source.generated,
            trainer.source.generate_seconds,
            DraftTrainer::head_dir(&out).display(),
            out.join("metrics.jsonl").display()
        ),
        RunEnd::Stopped => eprintln!("stopped; continue with --resume"),
    }
    Ok(())
}

fn build_config(a: &DraftArgs) -> Result<DraftTrainConfig> {
    let budget = match (a.steps, a.minutes) {
        (Some(n), _) => Budget::Steps(n),
        (None, Some(m)) => Budget::Seconds(m * 60.0),
        (None, None) => Budget::Steps(1000),
    };
    let mut c = match a.kind {
        DraftKind::Vispec => {
            let mut c = DraftTrainConfig::vispec(a.target.clone(), a.adaptor_queries, budget);
            if a.no_adaptor {
                c.adaptor_queries = None;
            }
            if a.no_injection {
                c.global_injection = false;
            }
            c
        }
        DraftKind::Eagle => DraftTrainConfig::eagle(a.target.clone(), budget),
    };
    c.seed = a.seed;
    if let Some(b) = a.batch {
        c.batch = b;
    }
    if let Some(p) = a.passes {
        c.passes = p;
    }
    if let Some(lr) = a.lr {
        c.optim.lr = lr;
    }
    if let Some(v) = a.checkpoint_every {
        c.checkpoint_every = v;
    }
    if let Some(v) = a.eval_every {
        c.eval_every = v;
    }
    c.validate()?;
    Ok(c)
}

/// indicatif bar: smoothed loss, top-1 agreement with the target (depth 1 and chain to the last
/// depth), lr, s/step.
#[derive(Default)]
struct Progress {
    bar: Option<ProgressBar>,
    ema: Option<(f32, f64, f64)>,
    last_line: Option<Instant>,
}

impl Progress {
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish();
        }
    }

    fn print(&self, text: &str) {
        match &self.bar {
            Some(b) if !b.is_hidden() => b.println(text),
            _ => eprintln!("{text}"),
        }
    }
}

impl DraftObserver for Progress {
    fn started(&mut self, step: u64, total: Option<u64>) {
        let bar = ProgressBar::new(total.unwrap_or(0));
        bar.set_style(
            ProgressStyle::with_template("draft [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_position(step);
        self.bar = Some(bar);
    }

    fn step(&mut self, r: &DraftStepReport) {
        let a = &r.agreement;
        let k = a.rows.len();
        let (acc, chain) = (a.accuracy(1), a.chain_rate(k));
        let ema = match self.ema {
            None => (r.loss, acc, chain),
            Some((l, x, c)) => (
                0.9 * l + 0.1 * r.loss,
                0.9 * x + 0.1 * acc,
                0.9 * c + 0.1 * chain,
            ),
        };
        self.ema = Some(ema);
        let msg = format!(
            "loss {:.4} | top-1 {:.3} | chain@{k} {:.3} | lr {:.2e} | {:.2} s/step",
            ema.0, ema.1, ema.2, r.lr, r.seconds
        );
        if let Some(b) = &self.bar {
            if let Some(t) = r.total {
                b.set_length(t);
            }
            b.set_position(r.step);
            if b.is_hidden() {
                let last = r.total == Some(r.step);
                if last || self.last_line.is_none_or(|t| t.elapsed().as_secs() >= 30) {
                    let total = r.total.map_or("?".to_string(), |t| t.to_string());
                    eprintln!("draft step {}/{total}: {msg}", r.step);
                    self.last_line = Some(Instant::now());
                }
            }
            b.set_message(msg);
        }
    }

    fn eval(&mut self, r: &EvalReport) {
        self.print(&format!(
            "[step {}] validation: {} ({:.0} s)",
            r.step,
            r.summary(),
            r.seconds
        ));
    }

    fn message(&mut self, text: &str) {
        self.print(text);
    }
}
