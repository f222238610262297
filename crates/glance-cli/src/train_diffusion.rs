//! `glance train diffusion --from DIR …`: convert an autoregressive LLaVA model into a
//! block-diffusion one (Fast-dVLM) on its own answers to world prompts; writes OUT/model, a model
//! directory `glance run --decode diffusion-…` loads.

use crate::progress::TrainBar;
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_train::diffusion::trainer::RunEnd;
use glance_train::diffusion::{
    DiffusionObserver, DiffusionStepReport, DiffusionTrainConfig, DiffusionTrainer, EvalReport,
};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct DiffusionArgs {
    /// The autoregressive source model: a directory or a name as --model takes it (e.g.
    /// glance-tiny).
    #[arg(long)]
    pub from: PathBuf,
    /// Output directory (checkpoint, metrics.jsonl, model/). Default: runs/diffusion.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub run: crate::train_flags::RunFlags,
    /// Weight of the diffusion loss (the causal loss gets 1 - alpha).
    #[arg(long)]
    pub alpha: Option<f64>,
    /// Block sizes of the annealing, increasing (e.g. 2,4,8,16,32).
    #[arg(long, value_delimiter = ',')]
    pub blocks: Option<Vec<usize>>,
    /// Held-out samples of each validation: long answers.
    #[arg(long)]
    pub eval_long: Option<usize>,
    /// Train nothing: write OUT/model from OUT's last checkpoint (a run stopped early), then
    /// validate it.
    #[arg(long, conflicts_with_all = ["resume", "force", "stop_after"])]
    pub export: bool,
    /// Show this share of the training samples' images through a pre-LLM pruning policy (every
    /// policy alike, at 50 / 25 / 12.5 / 6.25% of the visual tokens), so the converted model
    /// decodes pruned prompts too and pruning stacks with block diffusion.
    #[arg(long, value_name = "SHARE")]
    pub token_drop: Option<f64>,
}

pub fn run(a: DiffusionArgs) -> Result<()> {
    let threads = a.run.init_threads()?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs/diffusion"));
    let ckpt = DiffusionTrainer::checkpoint_path(&out);
    if a.export {
        if !ckpt.is_file() {
            bail!("--export: no checkpoint at {}", ckpt.display());
        }
        let mut t = DiffusionTrainer::resume(&out)
            .with_context(|| format!("loading {}", ckpt.display()))?;
        let dir = t.export()?;
        let r = t.evaluate()?;
        eprintln!(
            "exported step {} to {}; validation: {}",
            t.state.step,
            dir.display(),
            r.summary()
        );
        return Ok(());
    }
    let mut trainer = a.run.open(
        &out,
        &ckpt,
        || Ok(DiffusionTrainer::resume(&out)?),
        |t| t.state.step,
        || Ok(DiffusionTrainer::new(build_config(&a)?, &out)?),
    )?;
    // Before the start-up line: from then on, Ctrl-C checkpoints.
    crate::signals::checkpoint_on_signals();
    let c = &trainer.state.config;
    let n: usize = trainer
        .params()
        .iter()
        .map(|p| p.var.as_tensor().elem_count())
        .sum();
    eprintln!(
        "glance train diffusion: {n} text-decoder parameters, [MASK] = {}, blocks {:?}, \
         α {} β {}, batch {}, {} thread(s), from {}",
        trainer.mask_id(),
        c.block_sizes,
        c.alpha,
        c.beta,
        c.batch,
        threads,
        c.from.display()
    );
    let start = Instant::now();
    let mut obs = Progress::default();
    let end = trainer.run(&mut obs, a.run.stop_after)?;
    obs.bar.finish();
    match end {
        RunEnd::Finished => eprintln!(
            "done in {:.1} min: model in {} (metrics: {})",
            start.elapsed().as_secs_f64() / 60.0,
            DiffusionTrainer::model_dir(&out).display(),
            out.join("metrics.jsonl").display()
        ),
        RunEnd::Stopped => eprintln!("stopped; continue with --resume"),
        RunEnd::Interrupted(signal) => {
            crate::signals::exit_interrupted(signal, trainer.state.step, &ckpt)
        }
    }
    Ok(())
}

fn build_config(a: &DiffusionArgs) -> Result<DiffusionTrainConfig> {
    let from = crate::args::model_dir(Some(&a.from))?;
    let mut c = DiffusionTrainConfig::new(from, a.run.budget());
    c.seed = a.run.seed;
    if let Some(b) = a.run.batch {
        c.batch = b;
    }
    if let Some(lr) = a.run.lr {
        c.optim.lr = lr;
    }
    if let Some(x) = a.alpha {
        c.alpha = x;
        c.beta = 1.0 - x;
    }
    if let Some(b) = &a.blocks {
        c.block_sizes = b.clone();
    }
    if let Some(v) = a.run.checkpoint_every {
        c.checkpoint_every = v;
    }
    if let Some(v) = a.run.eval_every {
        c.eval_every = v;
    }
    if let Some(v) = a.eval_long {
        c.eval_long = v;
    }
    c.token_drop =
        glance_train::config::augmentation_flag("--token-drop", a.token_drop, Some(1.0))?
            .map(glance_train::TokenDrop::every_policy);
    c.validate()?;
    Ok(c)
}

/// indicatif bar: smoothed diffusion and causal losses, their top-1 accuracies, block size, lr.
#[derive(Default)]
struct Progress {
    bar: TrainBar,
    ema: Option<[f64; 4]>,
}

impl DiffusionObserver for Progress {
    fn started(&mut self, step: u64, total: Option<u64>) {
        self.bar.start("dvlm", step, total);
    }

    fn step(&mut self, r: &DiffusionStepReport) {
        let now = [r.diffusion, r.causal, r.diffusion_acc, r.causal_acc];
        let ema = match self.ema {
            None => now,
            Some(e) => std::array::from_fn(|i| 0.9 * e[i] + 0.1 * now[i]),
        };
        self.ema = Some(ema);
        let msg = format!(
            "diff {:.3} ({:.3}) | causal {:.3} ({:.3}) | B≤{} | lr {:.2e} | {:.2} s/step",
            ema[0], ema[2], ema[1], ema[3], r.block, r.lr, r.seconds
        );
        self.bar.update("dvlm", r.step, r.total, msg);
    }

    fn eval(&mut self, r: &EvalReport) {
        self.bar.validation(r.step, &r.summary(), r.seconds);
    }

    fn message(&mut self, text: &str) {
        self.bar.print(text);
    }
}
