//! The step loop of the single-stage trainers (draft heads, block-diffusion conversion): train
//! until the budget is spent, fixing the step count of a time budget after the first steps,
//! checkpointing and validating on their cadence, then export, checkpoint and validate once more;
//! or stop with a checkpoint after `stop_after` steps of this call, or when a stop is requested
//! ([`crate::interrupt`]: Ctrl-C).

use crate::config::Budget;
use crate::trainer::{RunEnd, PROBE_STEPS};
use crate::Result;

/// Where a run stands and how often it checkpoints and validates.
pub(crate) struct Progress {
    pub step: u64,
    pub total: Option<u64>,
    pub budget: Budget,
    pub checkpoint_every: u64,
    pub eval_every: u64,
}

/// What a trainer does for [`run`].
pub(crate) trait Steps {
    /// The run's position and cadence.
    fn progress(&self) -> Progress;
    /// One optimiser step: its wall time in seconds (the trainer's step counter advances).
    fn step(&mut self) -> Result<f64>;
    /// A time budget fixed the step count at `total`.
    fn fix_total(&mut self, total: u64);
    /// A line for the user.
    fn message(&mut self, text: &str);
    fn checkpoint(&mut self) -> Result<()>;
    fn validate(&mut self) -> Result<()>;
    fn export(&mut self) -> Result<()>;
}

/// Runs `t` to the end of its budget, or `stop_after` steps of this call.
pub(crate) fn run(t: &mut impl Steps, stop_after: Option<u64>) -> Result<RunEnd> {
    let mut taken = 0u64;
    let mut probe_time = 0.0;
    loop {
        let p = t.progress();
        if p.total.is_some_and(|total| p.step >= total) {
            break;
        }
        if let Some(signal) = crate::interrupt::requested() {
            t.checkpoint()?;
            crate::interrupt::clear();
            return Ok(RunEnd::Interrupted(signal));
        }
        if stop_after.is_some_and(|n| taken >= n) {
            t.checkpoint()?;
            return Ok(RunEnd::Stopped);
        }
        let seconds = t.step()?;
        taken += 1;
        let p = t.progress();
        let step = p.step;
        if let (Budget::Seconds(budget), None) = (p.budget, p.total) {
            if step > 1 {
                probe_time += seconds;
            }
            if step == PROBE_STEPS.max(2) {
                let per_step = probe_time / (step - 1) as f64;
                let total = ((budget / per_step).floor() as u64).max(step);
                t.fix_total(total);
                t.message(&format!(
                    "{per_step:.2} s/step over the probe → {total} steps in {budget:.0} s"
                ));
            }
        }
        let p = t.progress();
        let done = p.total.is_some_and(|total| step >= total);
        if p.checkpoint_every > 0 && step.is_multiple_of(p.checkpoint_every) && !done {
            t.checkpoint()?;
        }
        if p.eval_every > 0 && step.is_multiple_of(p.eval_every) && !done {
            t.validate()?;
        }
    }
    t.export()?;
    t.checkpoint()?;
    t.validate()?;
    Ok(RunEnd::Finished)
}

/// The adaptor through which [`run`] drives a single-stage trainer and its observer: `$trainer`
/// has `state` (`step`, `total`, `config.{budget, checkpoint_every, eval_every}`), `optim`,
/// `train_step`, `save_checkpoint`, `run_eval(obs)` and `export`; `$observer` is its observer
/// trait.
macro_rules! drive_with_loop {
    ($trainer:ty, $observer:path) => {
        /// The trainer and its observer as the shared step loop drives them.
        struct Driven<'a> {
            t: &'a mut $trainer,
            obs: &'a mut dyn $observer,
        }

        impl $crate::run_loop::Steps for Driven<'_> {
            fn progress(&self) -> $crate::run_loop::Progress {
                let c = &self.t.state.config;
                $crate::run_loop::Progress {
                    step: self.t.state.step,
                    total: self.t.state.total,
                    budget: c.budget,
                    checkpoint_every: c.checkpoint_every,
                    eval_every: c.eval_every,
                }
            }

            fn step(&mut self) -> $crate::Result<f64> {
                let report = self.t.train_step()?;
                self.obs.step(&report);
                Ok(report.seconds)
            }

            fn fix_total(&mut self, total: u64) {
                self.t.state.total = Some(total);
                self.t.optim.total_steps = total;
            }

            fn message(&mut self, text: &str) {
                self.obs.message(text);
            }

            fn checkpoint(&mut self) -> $crate::Result<()> {
                self.t.save_checkpoint()
            }

            fn validate(&mut self) -> $crate::Result<()> {
                self.t.run_eval(self.obs)
            }

            fn export(&mut self) -> $crate::Result<()> {
                self.t.export().map(|_| ())
            }
        }
    };
}
pub(crate) use drive_with_loop;
