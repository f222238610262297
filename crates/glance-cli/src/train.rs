//! `glance train world …`: train the glance world VLM from scratch (vision pretraining → LLaVA
//! stage → optional end-to-end fine-tune), with checkpoints, resume, validation and HF export.

use crate::progress::TrainBar;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use glance_engine::eval::EvalReport;
use glance_train::trainer::{RunEnd, StepReport};
use glance_train::{Budget, Observer, Stage, TrainConfig, Trainer};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand)]
pub enum TrainCommand {
    /// Train a LLaVA checkpoint on the synthetic world (writes OUT/model, an HF LLaVA directory).
    World(WorldArgs),
    /// Train an EAGLE / ViSpec draft head for a LLaVA target on the target's own answers to
    /// world prompts (writes OUT/head: config.json + model.safetensors).
    Draft(crate::train_draft::DraftArgs),
    /// Keep with a draft head the tokens its target emits on the head's training data (FR-Spec's
    /// reduced draft vocabulary): its draft steps then compute logits for those tokens only.
    DraftVocab(crate::train_vocab::VocabArgs),
    /// Convert an autoregressive LLaVA model into a block-diffusion one (Fast-dVLM) on its own
    /// answers to world prompts (writes OUT/model, a model directory).
    Diffusion(crate::train_diffusion::DiffusionArgs),
    /// The whole glance-tiny family by one command, staged and resumable: the base, both draft
    /// heads, the block-diffusion conversion, then the eval, with a table of every artifact's
    /// numbers and each stage's wall time.
    All(crate::train_all::AllArgs),
    /// Validation accuracy against training time from training runs' metrics.jsonl: a table,
    /// an SVG plot and JSON.
    Curve(crate::curve::CurveArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StageArg {
    Vision,
    Llava,
    E2e,
    All,
}

#[derive(Args)]
pub struct WorldArgs {
    /// A few minutes on a small model: proves the pipeline end to end.
    #[arg(long)]
    pub quick: bool,
    /// Output directory (checkpoint, metrics.jsonl, model/). Default: runs/glance-tiny[-quick].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue from OUT/checkpoint.safetensors (its saved settings are used).
    #[arg(long)]
    pub resume: bool,
    /// Start over even if OUT already holds a checkpoint.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Which stages to run.
    #[arg(long, value_enum, default_value = "all")]
    pub stage: StageArg,
    /// Fit the selected stages into this many minutes of training (split in proportion to the
    /// preset's step budgets); default: the preset's step counts.
    #[arg(long, conflicts_with = "steps")]
    pub minutes: Option<f64>,
    /// Train each selected stage for this many optimiser steps (default: the preset's).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Initial weights from a model directory (e.g. OUT/model of a vision-stage run) instead of
    /// random ones; tensors it lacks keep their random initialisation.
    #[arg(long, conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Seed of the initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Validate every N steps of the QA stages (0: only at the end of each stage).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Validation questions per family (0: no validation).
    #[arg(long)]
    pub eval_per_family: Option<usize>,
    /// Checkpoint every N steps.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Stop (with a checkpoint) after this many steps of this invocation; continue with --resume.
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// Show this share of the QA stages' images to the decoder through a pre-LLM pruning policy
    /// (every policy alike, at 50 / 25 / 12.5 / 6.25% of the visual tokens), so the model answers
    /// from pruned token sets too. 0: off.
    #[arg(long)]
    pub token_drop: Option<f64>,
    /// Weight of the word–patch alignment term in the QA stages: projected visual tokens are
    /// pulled towards the input embeddings of the words that describe them (colour, shape, size,
    /// grid cell, sign), the rest of the vocabulary towards orthogonal, so that text-relevance
    /// pruning can find what a question names. 0: off.
    #[arg(long)]
    pub align: Option<f64>,
    /// Share of the QA stages' images whose turns open with one of the world's dialogues (2–8
    /// turns, follow-ups included), packed causally so each turn sees the earlier turns and their
    /// answers; the other turns stay independent. 0: off.
    #[arg(long, value_name = "SHARE")]
    pub dialogue: Option<f64>,
    /// Chance that an image's independent turns include a relation question ("is A above B?").
    #[arg(long, value_name = "SHARE")]
    pub relations: Option<f64>,
    /// Factor on the spatial family's weight among the independent turns (default 1).
    #[arg(long, value_name = "FACTOR")]
    pub spatial_weight: Option<f64>,
    /// Peak learning rate of the selected stages (default: the preset's).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Draw scenes with any number of objects from the first step (for a fine-tune of a trained
    /// model; the preset ramps the object count up over the first half of a stage).
    #[arg(long)]
    pub no_curriculum: bool,
    /// Threads in all (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Split each batch over this many worker threads (default: one per thread); GEMMs run on
    /// threads / workers threads each. Saved in the checkpoint: it fixes how gradients are
    /// summed. Data-parallel workers beat multi-threaded GEMMs here: candle runs element-wise
    /// ops on one thread, so only workers keep every core busy.
    #[arg(long)]
    pub workers: Option<usize>,
}

pub fn run(cmd: TrainCommand) -> Result<()> {
    match cmd {
        TrainCommand::World(a) => world(a),
        TrainCommand::Draft(a) => crate::train_draft::run(a),
        TrainCommand::DraftVocab(a) => crate::train_vocab::run(a),
        TrainCommand::Diffusion(a) => crate::train_diffusion::run(a),
        TrainCommand::Curve(a) => crate::curve::run(a),
        TrainCommand::All(a) => crate::train_all::run(a),
    }
}

fn world(a: WorldArgs) -> Result<()> {
    let threads = crate::threads::init(a.threads)?;
    let cpu = glance_train::runtime::prepare_cpu_for_training();
    let preset = if a.quick { "quick" } else { "base" };
    let out = a.out.clone().unwrap_or_else(|| {
        PathBuf::from(if a.quick {
            "runs/glance-tiny-quick"
        } else {
            "runs/glance-tiny"
        })
    });
    let ckpt = Trainer::checkpoint_path(&out);
    let mut trainer = if a.resume {
        if !ckpt.is_file() {
            bail!("--resume: no checkpoint at {}", ckpt.display());
        }
        let t =
            Trainer::resume(&out).with_context(|| format!("resuming from {}", ckpt.display()))?;
        eprintln!(
            "resuming {}: stage {}/{} step {} (saved settings win over command-line ones)",
            out.display(),
            t.state.stage_index + 1,
            t.state.config.stages.len(),
            t.state.stage_step
        );
        t
    } else {
        if ckpt.is_file() && !a.force {
            bail!(
                "{} already holds a checkpoint: pass --resume to continue or --force to start over",
                out.display()
            );
        }
        let config = build_config(&a, preset, threads)?;
        let t =
            Trainer::new(config, &out).with_context(|| format!("setting up {}", out.display()))?;
        if let Some(dir) = &a.init {
            let n = t
                .model
                .load_weights(dir)
                .with_context(|| format!("loading initial weights from {}", dir.display()))?;
            eprintln!("initial weights: {n} tensors from {}", dir.display());
        }
        t
    };
    // Before the start-up line: from then on, Ctrl-C checkpoints.
    crate::signals::checkpoint_on_signals();
    let c = &trainer.state.config;
    let gemm_threads = (threads / c.workers).max(1);
    crate::threads::set(gemm_threads);
    eprintln!(
        "glance train world ({preset}): {} parameters, stages [{}], {} worker(s) × {gemm_threads} GEMM thread(s){}{}",
        glance_train::TrainModel::count(&trainer.model.all_params()),
        c.stages.iter().map(describe_stage).collect::<Vec<_>>().join(", "),
        c.workers,
        if cpu.elementwise_single_thread { ", element-wise ops on 1 thread" } else { "" },
        if cpu.allocator_tuned { ", allocator tuned" } else { "" },
    );
    let start = Instant::now();
    let mut obs = Progress::default();
    let end = trainer.run(&mut obs, a.stop_after)?;
    obs.bar.finish();
    match end {
        RunEnd::Finished => eprintln!(
            "done in {:.1} min: model in {} (metrics: {})",
            start.elapsed().as_secs_f64() / 60.0,
            Trainer::model_dir(&out).display(),
            out.join("metrics.jsonl").display()
        ),
        RunEnd::Stopped => eprintln!("stopped; continue with --resume"),
        RunEnd::Interrupted(signal) => {
            crate::signals::exit_interrupted(signal, trainer.state.stage_step, &ckpt)
        }
    }
    Ok(())
}

fn describe_stage(s: &glance_train::StageSpec) -> String {
    let b = match s.budget {
        Budget::Steps(n) => format!("{n} steps"),
        Budget::Seconds(x) => format!("{:.1} min", x / 60.0),
    };
    let drop = match &s.token_drop {
        Some(d) => format!(", {:.0}% token-dropped", d.fraction * 100.0),
        None => String::new(),
    };
    let align = match s.align {
        Some(w) => format!(", alignment weight {w}"),
        None => String::new(),
    };
    let m = &s.mix;
    let mix = if *m == glance_train::TurnMix::default() {
        String::new()
    } else {
        format!(
            ", {:.0}% dialogues, {:.0}% relations, spatial ×{}",
            m.dialogue * 100.0,
            m.relation * 100.0,
            m.spatial
        )
    };
    format!(
        "{} {b} × {} img{drop}{align}{mix}",
        s.stage, s.images_per_step
    )
}

fn build_config(a: &WorldArgs, preset: &str, threads: usize) -> Result<TrainConfig> {
    let mut c = TrainConfig::preset(preset)?;
    let stages: Vec<Stage> = match a.stage {
        StageArg::Vision => vec![Stage::Vision],
        StageArg::Llava => vec![Stage::Llava],
        StageArg::E2e => vec![Stage::EndToEnd],
        StageArg::All => Stage::ALL.to_vec(),
    };
    c = c.only(&stages);
    c.stages.retain(|s| s.budget != Budget::Steps(0));
    if let Some(n) = a.steps {
        if n == 0 {
            bail!("--steps must be at least 1");
        }
        for s in &mut c.stages {
            s.budget = Budget::Steps(n);
        }
    }
    if let Some(m) = a.minutes {
        c = c.with_minutes(m)?;
    }
    let align = glance_train::config::augmentation_flag("--align", a.align, None)?;
    let token_drop =
        glance_train::config::augmentation_flag("--token-drop", a.token_drop, Some(1.0))?;
    for s in &mut c.stages {
        if let Some(lr) = a.lr {
            s.optim.lr = lr;
        }
        if a.no_curriculum {
            s.curriculum_start = None;
        }
        if s.stage != Stage::Vision {
            s.align = align;
            s.token_drop = token_drop.map(glance_train::TokenDrop::every_policy);
            s.mix = glance_train::TurnMix {
                dialogue: a.dialogue.unwrap_or(s.mix.dialogue),
                relation: a.relations.unwrap_or(s.mix.relation),
                spatial: a.spatial_weight.unwrap_or(s.mix.spatial),
            };
        }
    }
    c.seed = a.seed;
    c.workers = a.workers.unwrap_or(threads);
    if let Some(v) = a.eval_every {
        c.eval_every = v;
    }
    if let Some(v) = a.eval_per_family {
        c.eval_per_family = v;
    }
    if let Some(v) = a.checkpoint_every {
        c.checkpoint_every = v;
    }
    c.validate()?;
    Ok(c)
}

/// indicatif bar per stage: loss (smoothed), images/s, lr, the stage's first metric.
#[derive(Default)]
struct Progress {
    bar: TrainBar,
    ema: Option<f32>,
    images: usize,
    seconds: f64,
}

impl Observer for Progress {
    fn stage_started(&mut self, stage: Stage, step: u64, total: Option<u64>) {
        self.bar.start(&stage.to_string(), step, total);
        self.ema = None;
        self.images = 0;
        self.seconds = 0.0;
    }

    fn step(&mut self, r: &StepReport) {
        let ema = match self.ema {
            None => r.loss,
            Some(e) => 0.9 * e + 0.1 * r.loss,
        };
        self.ema = Some(ema);
        self.images += r.images;
        self.seconds += r.seconds;
        let extra: String = r
            .metrics
            .iter()
            .map(|(k, v)| format!(" {k} {v:.3}"))
            .collect();
        let msg = format!(
            "loss {ema:.4} | {:.1} img/s | lr {:.2e}{extra}",
            self.images as f64 / self.seconds.max(1e-9),
            r.lr
        );
        self.bar.update(&r.stage.to_string(), r.step, r.total, msg);
    }

    fn eval(&mut self, stage: Stage, step: u64, r: &EvalReport) {
        let fams: String = r
            .families
            .iter()
            .map(|f| match f.score {
                Some(s) => format!(" {} {s:.2} (n={})", f.family, f.questions),
                None => format!(" {} - (n=0)", f.family),
            })
            .collect();
        self.bar.print(&format!(
            "[{stage} step {step}] validation: mean {:.3} |{fams} ({:.0} s)",
            r.mean, r.seconds
        ));
        for e in &r.examples {
            self.bar.print(&format!(
                "    Q: {}\n      want: {}\n      got:  {}",
                e.question, e.reference, e.answer
            ));
        }
    }

    fn message(&mut self, text: &str) {
        self.bar.print(text);
    }
}
