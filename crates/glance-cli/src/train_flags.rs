//! Flags and start-up shared by the single-stage training commands (`train draft`, `train
//! diffusion`): the budget, resume / force, seed, threads, batch, learning rate and cadence, and
//! opening a run (new, or resumed from its checkpoint).

use anyhow::{bail, Context, Result};
use clap::Args;
use glance_train::Budget;
use std::path::Path;

#[derive(Args)]
pub struct RunFlags {
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

impl RunFlags {
    /// `--steps N`, `--minutes M`, else 1000 steps.
    pub fn budget(&self) -> Budget {
        match (self.steps, self.minutes) {
            (Some(n), _) => Budget::Steps(n),
            (None, Some(m)) => Budget::Seconds(m * 60.0),
            (None, None) => Budget::Steps(1000),
        }
    }

    /// Threads set up for training; returns how many.
    pub fn init_threads(&self) -> Result<usize> {
        let threads = crate::threads::init(self.threads)?;
        glance_train::runtime::prepare_cpu_for_training();
        crate::threads::set(threads);
        Ok(threads)
    }

    /// The run in `out`: resumed from `checkpoint` with `--resume` (whose step `step` reports),
    /// else new — refused when a checkpoint is there and `--force` is not given.
    pub fn open<T>(
        &self,
        out: &Path,
        checkpoint: &Path,
        resume: impl FnOnce() -> Result<T>,
        step: impl Fn(&T) -> u64,
        new: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if self.resume {
            if !checkpoint.is_file() {
                bail!("--resume: no checkpoint at {}", checkpoint.display());
            }
            let t = resume().with_context(|| format!("resuming from {}", checkpoint.display()))?;
            eprintln!(
                "resuming {} at step {} (saved settings win over command-line ones)",
                out.display(),
                step(&t)
            );
            return Ok(t);
        }
        if checkpoint.is_file() && !self.force {
            bail!(
                "{} already holds a checkpoint: pass --resume to continue or --force to start over",
                out.display()
            );
        }
        new().with_context(|| format!("setting up {}", out.display()))
    }
}
