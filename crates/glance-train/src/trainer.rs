//! The training loop: stages in order, checkpoints, resume, validation, export.
//!
//! Output directory:
//! * `model/` — the HF LLaVA directory (config and tokenizer written at the start; weights after
//!   every stage and at the end);
//! * `checkpoint.safetensors` — the latest checkpoint ([`crate::checkpoint`]);
//! * `metrics.jsonl` — one JSON line per step and per validation ([`crate::metrics::Record`]).
//!
//! Determinism: initial weights are a function of the seed; the data stream of the train-split
//! cursor; everything else (curriculum, schedule) of the step. A run stopped after step k and
//! resumed therefore repeats the uninterrupted run's computation exactly.

use crate::checkpoint::{self, TrainState};
use crate::config::{Budget, Stage, StageSpec, TrainConfig};
use crate::data::WorldData;
use crate::export::{write_model_files, write_weights};
use crate::metrics::{EvalRecord, Record, StepRecord};
use crate::optim::AdamW;
use crate::params::TrainModel;
use crate::step::{batch_grads, drop_plans, image_turns, AlignBatch, Batch};
use crate::{Result, TrainError};
use candle_core::Device;
use glance_engine::eval::{evaluate, EvalOptions, EvalReport, SHORT_MAX_NEW_TOKENS};
use glance_engine::{Engine, EngineOptions};
use glance_world::Split;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Steps timed before a time-budgeted stage fixes its step count (the first is not timed).
pub const PROBE_STEPS: u64 = 4;

/// What one step did.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub stage: Stage,
    /// Steps done in this stage (1-based after the step).
    pub step: u64,
    /// Steps of this stage, once known.
    pub total: Option<u64>,
    pub loss: f32,
    pub lr: f64,
    pub grad_norm: f64,
    pub images: usize,
    /// Supervised units (patches or answer tokens).
    pub units: usize,
    /// Wall time of the step (data, forward, backward, optimiser).
    pub seconds: f64,
    /// Head accuracies (vision) or answer-token accuracy (QA stages) on this batch.
    pub metrics: Vec<(&'static str, f32)>,
}

/// Receives progress; every method has a no-op default.
pub trait Observer {
    fn stage_started(&mut self, _stage: Stage, _step: u64, _total: Option<u64>) {}
    fn step(&mut self, _report: &StepReport) {}
    fn eval(&mut self, _stage: Stage, _step: u64, _report: &EvalReport) {}
    fn message(&mut self, _text: &str) {}
}

/// An observer that ignores everything.
pub struct Silent;
impl Observer for Silent {}

/// Why [`Trainer::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Every stage is done and the model is exported.
    Finished,
    /// `stop_after` steps were taken; the checkpoint holds the state.
    Stopped,
    /// A stop was requested ([`crate::interrupt`], e.g. by Ctrl-C) with this signal number; the
    /// checkpoint holds the state.
    Interrupted(i32),
}

pub struct Trainer {
    pub out: PathBuf,
    pub model: TrainModel,
    pub data: WorldData,
    pub state: TrainState,
    optim: Option<AdamW>,
    metrics: std::fs::File,
}

impl Trainer {
    /// The checkpoint file of an output directory.
    pub fn checkpoint_path(out: &Path) -> PathBuf {
        out.join("checkpoint.safetensors")
    }

    /// The exported model directory of an output directory.
    pub fn model_dir(out: &Path) -> PathBuf {
        out.join("model")
    }

    /// Starts a new run in `out` (an existing checkpoint there is overwritten at the first save).
    pub fn new(config: TrainConfig, out: &Path) -> Result<Self> {
        config.validate()?;
        let device = Device::Cpu;
        let model = TrainModel::new(&config.model, config.seed, &device)?;
        Self::assemble(out, model, TrainState::new(config), None, false)
    }

    /// Continues the run whose checkpoint is in `out`; its saved configuration is used.
    pub fn resume(out: &Path) -> Result<Self> {
        let device = Device::Cpu;
        let loaded = checkpoint::load(&Self::checkpoint_path(out), &device)?;
        let model = TrainModel::new(
            &loaded.state.config.model,
            loaded.state.config.seed,
            &device,
        )?;
        for p in model.all_params() {
            let t = loaded
                .params
                .get(&p.name)
                .ok_or_else(|| TrainError::Checkpoint {
                    path: Self::checkpoint_path(out),
                    reason: format!("no tensor for parameter {}", p.name),
                })?;
            p.var.set(t)?;
        }
        Self::assemble(out, model, loaded.state, Some(loaded.optim), true)
    }

    fn assemble(
        out: &Path,
        model: TrainModel,
        state: TrainState,
        optim_state: Option<std::collections::HashMap<String, candle_core::Tensor>>,
        append: bool,
    ) -> Result<Self> {
        let dir = Self::model_dir(out);
        write_model_files(&dir, &state.config.model)?;
        let data = WorldData::new(&dir, &model.config, &Device::Cpu)?;
        let path = out.join("metrics.jsonl");
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(&path)
            .map_err(|e| TrainError::io(&path, e))?;
        let mut t = Self {
            out: out.to_path_buf(),
            model,
            data,
            state,
            optim: None,
            metrics,
        };
        if let Some(os) = optim_state {
            if !t.state.finished() {
                let mut opt = t.new_optim();
                opt.load_state(&os, t.state.stage_step)?;
                t.optim = Some(opt);
            }
        }
        Ok(t)
    }

    fn spec(&self) -> &StageSpec {
        &self.state.config.stages[self.state.stage_index]
    }

    fn new_optim(&self) -> AdamW {
        let spec = self.spec();
        let total = self.state.stage_total.unwrap_or(u64::MAX);
        AdamW::new(
            self.model.stage_params(spec.stage),
            spec.optim.clone(),
            total,
        )
    }

    fn log(&mut self, record: &Record) -> Result<()> {
        let line = serde_json::to_string(record)?;
        let path = self.out.join("metrics.jsonl");
        writeln!(self.metrics, "{line}").map_err(|e| TrainError::io(path, e))
    }

    /// Writes the checkpoint of the current state.
    pub fn save_checkpoint(&self) -> Result<()> {
        let params: Vec<_> = self
            .model
            .all_params()
            .into_iter()
            .map(|p| (p.name, p.var.as_tensor().clone()))
            .collect();
        let optim = match &self.optim {
            Some(o) => o.state_tensors()?,
            None => Vec::new(),
        };
        checkpoint::save(
            &Self::checkpoint_path(&self.out),
            &self.state,
            &params,
            &optim,
        )
    }

    /// Writes `model/model.safetensors` from the current weights.
    pub fn export(&self) -> Result<PathBuf> {
        let dir = Self::model_dir(&self.out);
        write_weights(&dir, &self.model.export_params())?;
        Ok(dir)
    }

    /// Runs validation now: up to `eval_per_family` questions of each family from the first
    /// `4 × eval_per_family` validation images, through the shared runner ([`glance_engine::eval`]) on
    /// the fused-op (`Mode::Infer`) view of the weights.
    pub fn evaluate(&self) -> Result<EvalReport> {
        let c = &self.state.config;
        let per_family = c.eval_per_family.max(1);
        let options = EvalOptions {
            per_family: Some(per_family),
            max_new_tokens: c.eval_max_new_tokens,
            short_max_new_tokens: c.eval_max_new_tokens.min(SHORT_MAX_NEW_TOKENS),
            examples: 6,
            ..EvalOptions::new(Split::Validation, per_family * 4)
        };
        let engine = Engine::from_parts(
            self.model.infer.clone(),
            self.data.processor.clone(),
            EngineOptions::default(),
        )?;
        Ok(evaluate(&engine, &options, None, &mut |_| {})?)
    }

    fn run_eval(&mut self, obs: &mut dyn Observer, stage: Stage, step: u64) -> Result<()> {
        if self.state.config.eval_per_family == 0 {
            return Ok(());
        }
        let r = self.evaluate()?;
        obs.eval(stage, step, &r);
        self.log(&Record::Eval(EvalRecord::new(stage, step, &r)?))
    }

    /// Trains until every stage is done (then exports) or until `stop_after` steps were taken in
    /// this call (then checkpoints).
    pub fn run(&mut self, obs: &mut dyn Observer, stop_after: Option<u64>) -> Result<RunEnd> {
        let mut taken = 0u64;
        while !self.state.finished() {
            let spec = self.spec().clone();
            if let Budget::Steps(n) = spec.budget {
                self.state.stage_total = Some(n);
            }
            if self.optim.is_none() {
                self.optim = Some(self.new_optim());
            }
            obs.stage_started(spec.stage, self.state.stage_step, self.state.stage_total);
            let mut probe_time = 0.0;
            while self
                .state
                .stage_total
                .is_none_or(|t| self.state.stage_step < t)
            {
                if let Some(signal) = crate::interrupt::requested() {
                    self.save_checkpoint()?;
                    crate::interrupt::clear();
                    return Ok(RunEnd::Interrupted(signal));
                }
                if stop_after.is_some_and(|n| taken >= n) {
                    self.save_checkpoint()?;
                    return Ok(RunEnd::Stopped);
                }
                let report = self.train_step(&spec)?;
                taken += 1;
                let step = self.state.stage_step;
                if let (Budget::Seconds(budget), None) = (spec.budget, self.state.stage_total) {
                    if step > 1 {
                        probe_time += report.seconds;
                    }
                    if step == PROBE_STEPS.max(2) {
                        let per_step = probe_time / (step - 1) as f64;
                        let total = ((budget / per_step).floor() as u64).max(step);
                        self.state.stage_total = Some(total);
                        if let Some(o) = &mut self.optim {
                            o.total_steps = total;
                        }
                        obs.message(&format!(
                            "stage {}: {:.2} s/step → {total} steps in {budget:.0} s",
                            spec.stage, per_step
                        ));
                    }
                }
                obs.step(&report);
                let every = self.state.config.checkpoint_every;
                if every > 0 && step.is_multiple_of(every) {
                    self.save_checkpoint()?;
                }
                let eval_every = self.state.config.eval_every;
                let done = self.state.stage_total.is_some_and(|t| step >= t);
                if spec.stage != Stage::Vision
                    && eval_every > 0
                    && step.is_multiple_of(eval_every)
                    && !done
                {
                    self.run_eval(obs, spec.stage, step)?;
                }
            }
            // Stage done: export, validate, move on.
            let step = self.state.stage_step;
            self.state.stage_index += 1;
            self.state.stage_step = 0;
            self.state.stage_total = None;
            self.optim = None;
            self.export()?;
            self.save_checkpoint()?;
            if spec.stage != Stage::Vision {
                self.run_eval(obs, spec.stage, step)?;
            }
        }
        self.export()?;
        Ok(RunEnd::Finished)
    }

    fn train_step(&mut self, spec: &StageSpec) -> Result<StepReport> {
        let start = Instant::now();
        let step = self.state.stage_step;
        let max_objects = spec.max_objects(step, self.state.stage_total.unwrap_or(u64::MAX));
        let images =
            self.data
                .next_images(&mut self.state.cursor, spec.images_per_step, max_objects)?;
        let pixels: Vec<&candle_core::Tensor> = images.iter().map(|im| &im.pixels).collect();
        let (targets, packed, drops, align);
        let input = match spec.stage {
            Stage::Vision => {
                targets = images
                    .iter()
                    .map(|im| self.data.vision_targets(&im.scene))
                    .collect::<Result<Vec<_>>>()?;
                Batch::Vision {
                    pixels,
                    targets: &targets,
                }
            }
            _ => {
                let turns = image_turns(&self.data, &images, spec.turns_per_image, &spec.mix);
                packed = turns
                    .iter()
                    .map(|t| self.data.pack(t))
                    .collect::<Result<Vec<_>>>()?;
                drops = match &spec.token_drop {
                    Some(d) => drop_plans(&self.data, &images, &turns, d)?,
                    None => Vec::new(),
                };
                align = match spec.align {
                    Some(_) => images
                        .iter()
                        .map(|im| self.data.align_targets(&im.scene))
                        .collect::<Result<Vec<_>>>()?,
                    None => Vec::new(),
                };
                Batch::Qa {
                    items: pixels.into_iter().zip(&packed).collect(),
                    drops: &drops,
                    align: spec.align.map(|weight| AlignBatch {
                        words: self.data.align_words(),
                        targets: &align,
                        weight,
                    }),
                }
            }
        };
        let batch = batch_grads(&self.model, spec.stage, &input, self.state.config.workers)?;
        let loss = batch.loss;
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                stage: spec.stage.to_string(),
                step,
                loss,
            });
        }
        let optim = self
            .optim
            .as_mut()
            .expect("optimiser exists during a stage");
        let stats = optim.step(&batch.stores)?;
        self.state.stage_step += 1;
        let seconds = start.elapsed().as_secs_f64();
        self.state.stage_seconds[self.state.stage_index] += seconds;
        let report = StepReport {
            stage: spec.stage,
            step: self.state.stage_step,
            total: self.state.stage_total,
            loss,
            lr: stats.lr,
            grad_norm: stats.grad_norm,
            images: images.len(),
            units: batch.units,
            seconds,
            metrics: batch.metrics.iter().map(|m| (m.name, m.value())).collect(),
        };
        self.log(&Record::Step(StepRecord {
            stage: spec.stage,
            step: report.step,
            loss,
            lr: stats.lr,
            grad_norm: stats.grad_norm,
            images: report.images,
            units: report.units,
            seconds,
            max_objects,
            metrics: report
                .metrics
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        }))?;
        Ok(report)
    }
}
