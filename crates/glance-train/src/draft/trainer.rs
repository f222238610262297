//! The draft-training loop: AdamW over the head's parameters, checkpoints, resume, validation,
//! `metrics.jsonl`, export.
//!
//! Output directory:
//! * `head/` — the draft head directory `DraftHead::load` reads: `config.json` (the serialised
//!   [`DraftConfig`]) and `model.safetensors` (`fc.*`, `inject.weight`, `adaptor.*`, `layer.*`,
//!   `norm.weight`), written at the end;
//! * `checkpoint.safetensors` — parameters, AdamW moments and the [`DraftState`]
//!   ([`super::state`]); written atomically;
//! * `metrics.jsonl` — one JSON line per step (`"kind": "step"`) and per validation (`"eval"`).
//!
//! Determinism: initial weights are a function of the seed; a step's data (curriculum stage,
//! which pool samples, distractors, noise) of `(seed, step, schedule length)`; the samples of
//! the target, which is frozen. The data cursor *is* the step, so a run stopped after step k and
//! resumed repeats the uninterrupted run's computation exactly.

use super::passes::{sample_loss, Agreement, PassSettings, Perturbation};
use super::samples::{Length, Sample, SampleSource};
use super::state::{load_checkpoint, save_checkpoint, DraftState, FORMAT};
use super::DraftTrainConfig;
use crate::config::Budget;
use crate::export::{write_atomic, write_weights};
use crate::optim::AdamW;
use crate::params::{init_params, Param};
pub use crate::trainer::RunEnd;
use crate::{Result, TrainError};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use glance_models::draft::{DraftConfig, DraftHead};
use glance_nn::Mode;
use glance_world::{Split, WorldRng};
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Stream of the per-step data draws.
const DRAW_STREAM: u64 = 0x6472_6177_7300;

/// What one step did.
#[derive(Debug, Clone)]
pub struct DraftStepReport {
    /// Steps done (1-based after the step).
    pub step: u64,
    pub total: Option<u64>,
    /// The optimised loss (all passes, weighted, per pass-1 row).
    pub loss: f32,
    /// Cross-entropy and smooth-L1 per row, over all passes.
    pub ce: f64,
    pub reg: f64,
    /// Top-1 agreement with the target on this batch, per pass.
    pub agreement: Agreement,
    pub lr: f64,
    pub grad_norm: f64,
    pub missing_grads: usize,
    pub long: usize,
    pub distractors: usize,
    pub seconds: f64,
}

/// A validation: top-1 agreement per draft depth on held-out samples.
#[derive(Debug, Clone)]
pub struct EvalReport {
    pub step: u64,
    pub samples: usize,
    pub agreement: Agreement,
    pub seconds: f64,
}

impl EvalReport {
    /// `depth 1/2/3 acc …, chain …, τ …`.
    pub fn summary(&self) -> String {
        let a = &self.agreement;
        let k = a.rows.len();
        let acc: Vec<String> = (1..=k).map(|d| format!("{:.3}", a.accuracy(d))).collect();
        let chain: Vec<String> = (1..=k).map(|d| format!("{:.3}", a.chain_rate(d))).collect();
        format!(
            "top-1 acceptance by depth [{}] | chain [{}] | τ {:.2} tokens/step ({} samples, {} rows)",
            acc.join(" "),
            chain.join(" "),
            a.tokens_per_step(),
            self.samples,
            a.rows.first().copied().unwrap_or(0)
        )
    }
}

/// Receives progress; every method has a no-op default.
pub trait DraftObserver {
    fn started(&mut self, _step: u64, _total: Option<u64>) {}
    fn step(&mut self, _report: &DraftStepReport) {}
    fn eval(&mut self, _report: &EvalReport) {}
    fn message(&mut self, _text: &str) {}
}

/// Ignores everything.
pub struct Quiet;
impl DraftObserver for Quiet {}

/// One sample slot of a step.
#[derive(Debug, Clone, Copy)]
struct Draw {
    length: Length,
    j: u64,
    /// Long-pool sample whose image stands in for this one's in the draft's inputs.
    distractor: Option<u64>,
    noise_seed: u64,
}

/// The data of 0-based `step`: a pure function of the settings, the step and the schedule.
fn draws(c: &DraftTrainConfig, step: u64, total: Option<u64>) -> Vec<Draw> {
    let (p_long, p_distractor) = c.curriculum.mix(c.curriculum.stage(step, total));
    let mut rng = WorldRng::derive(c.seed ^ DRAW_STREAM, step);
    (0..c.batch)
        .map(|_| {
            let long = rng.chance(p_long);
            let (length, pool) = if long {
                (Length::Long, c.long_pool)
            } else {
                (Length::Short, c.short_pool)
            };
            let j = rng.below(pool) as u64;
            let distractor = rng.chance(p_distractor).then(|| {
                let d = rng.below(c.long_pool) as u64;
                if long && d == j {
                    (d + 1) % c.long_pool as u64
                } else {
                    d
                }
            });
            Draw {
                length,
                j,
                distractor,
                noise_seed: rng.next_u64(),
            }
        })
        .collect()
}

pub struct DraftTrainer {
    pub out: PathBuf,
    pub state: DraftState,
    pub head_config: DraftConfig,
    varmap: VarMap,
    head: DraftHead,
    params: Vec<Param>,
    optim: AdamW,
    pub source: SampleSource,
    metrics: std::fs::File,
}

impl DraftTrainer {
    pub fn checkpoint_path(out: &Path) -> PathBuf {
        out.join("checkpoint.safetensors")
    }

    /// The exported head directory.
    pub fn head_dir(out: &Path) -> PathBuf {
        out.join("head")
    }

    /// Starts a new run in `out` (an existing checkpoint there is overwritten at the first save).
    pub fn new(config: DraftTrainConfig, out: &Path) -> Result<Self> {
        config.validate()?;
        let total = match config.budget {
            Budget::Steps(n) => Some(n),
            Budget::Seconds(_) => None,
        };
        let state = DraftState {
            format: FORMAT.into(),
            config,
            step: 0,
            total,
            seconds: 0.0,
        };
        Self::assemble(out, state, None)
    }

    /// Continues the run whose checkpoint is in `out` (its saved settings are used).
    pub fn resume(out: &Path) -> Result<Self> {
        let path = Self::checkpoint_path(out);
        let (state, tensors) = load_checkpoint(&path)?;
        Self::assemble(out, state, Some((path, tensors)))
    }

    fn assemble(
        out: &Path,
        state: DraftState,
        saved: Option<(PathBuf, HashMap<String, Tensor>)>,
    ) -> Result<Self> {
        let c = &state.config;
        let device = Device::Cpu;
        let source = SampleSource::new(
            &c.target,
            c.seed,
            (c.max_new_short, c.max_new_long),
            c.cache_mib,
            &device,
        )?
        .with_token_drop(c.token_drop.clone())?;
        let target_json: serde_json::Value =
            glance_models::checkpoint::read_json(&c.target.join("config.json"))?;
        let text = target_json.get("text_config").unwrap_or(&target_json);
        let head_config = DraftConfig::for_target(text, c.adaptor_queries, c.global_injection)?;
        let tc = source.target.text_config();
        head_config.check_target(tc.hidden_size, tc.vocab_size)?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let head = DraftHead::from_var_builder(&vb, head_config.clone(), Mode::Train)?;
        init_head(&varmap, c.seed, tc.hidden_size)?;
        let params = head_params(&varmap);
        let mut optim = AdamW::new(
            params.clone(),
            c.optim.clone(),
            state.total.unwrap_or(u64::MAX),
        );
        if let Some((path, tensors)) = &saved {
            for p in &params {
                let t = tensors.get(&format!("param.{}", p.name)).ok_or_else(|| {
                    TrainError::Checkpoint {
                        path: path.clone(),
                        reason: format!("no tensor for parameter {}", p.name),
                    }
                })?;
                p.var.set(t)?;
            }
            optim.load_state(tensors, state.step)?;
        }
        std::fs::create_dir_all(out).map_err(|e| TrainError::io(out, e))?;
        let mpath = out.join("metrics.jsonl");
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(saved.is_some())
            .write(true)
            .truncate(saved.is_none())
            .open(&mpath)
            .map_err(|e| TrainError::io(&mpath, e))?;
        Ok(Self {
            out: out.to_path_buf(),
            state,
            head_config,
            varmap,
            head,
            params,
            optim,
            source,
            metrics,
        })
    }

    /// The head's parameters, sorted by name.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    pub fn head(&self) -> &DraftHead {
        &self.head
    }

    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    fn log(&mut self, value: serde_json::Value) -> Result<()> {
        let path = self.out.join("metrics.jsonl");
        writeln!(self.metrics, "{value}").map_err(|e| TrainError::io(path, e))
    }

    /// Writes the checkpoint of the current state atomically.
    pub fn save_checkpoint(&self) -> Result<()> {
        save_checkpoint(
            &Self::checkpoint_path(&self.out),
            &self.state,
            &self.params,
            &self.optim,
        )
    }

    /// Writes `head/config.json` and `head/model.safetensors` from the current weights.
    pub fn export(&self) -> Result<PathBuf> {
        let dir = Self::head_dir(&self.out);
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
        write_atomic(
            &dir.join("config.json"),
            serde_json::to_string_pretty(&self.head_config)?.as_bytes(),
        )?;
        write_weights(&dir, &self.params)?;
        Ok(dir)
    }

    fn settings(&self) -> PassSettings {
        let c = &self.state.config;
        PassSettings {
            passes: c.passes,
            hidden_weight: c.hidden_weight,
            pass_decay: c.pass_decay,
        }
    }

    /// Top-1 agreement per depth on the held-out samples (validation split; no noise, no
    /// distractors).
    pub fn evaluate(&mut self) -> Result<EvalReport> {
        let c = &self.state.config;
        let held_out = HeldOut {
            long: c.eval_long,
            short: c.eval_short,
            passes: c.passes,
        };
        let mut r = evaluate_head(&self.head, &mut self.source, &held_out)?;
        r.step = self.state.step;
        Ok(r)
    }

    fn run_eval(&mut self, obs: &mut dyn DraftObserver) -> Result<()> {
        let r = self.evaluate()?;
        let a = &r.agreement;
        let k = a.rows.len();
        self.log(json!({
            "kind": "eval",
            "step": r.step,
            "samples": r.samples,
            "acceptance": (1..=k).map(|d| a.accuracy(d)).collect::<Vec<_>>(),
            "chain": (1..=k).map(|d| a.chain_rate(d)).collect::<Vec<_>>(),
            "tokens_per_step": a.tokens_per_step(),
            "rows": a.rows,
            "seconds": r.seconds,
        }))?;
        obs.eval(&r);
        Ok(())
    }

    /// Trains until the budget is spent (then exports and validates) or, with `stop_after`,
    /// until that many steps of this call are done (then checkpoints).
    pub fn run(&mut self, obs: &mut dyn DraftObserver, stop_after: Option<u64>) -> Result<RunEnd> {
        obs.started(self.state.step, self.state.total);
        crate::run_loop::run(&mut Driven { t: self, obs }, stop_after)
    }

    /// One optimiser step over a batch of samples.
    pub fn train_step(&mut self) -> Result<DraftStepReport> {
        let start = Instant::now();
        let step = self.state.step;
        let c = self.state.config.clone();
        let draws = draws(&c, step, self.state.total);
        let mut batch: Vec<(Arc<Sample>, Option<Tensor>, Draw)> = Vec::with_capacity(draws.len());
        for d in draws {
            let s = self.source.get(Split::Train, d.length, d.j)?;
            // A distractor stands in for the image's rows only when it has as many (under token
            // drop, a pruned sample and its distractor usually differ: the draw is skipped).
            let visual = match d.distractor {
                Some(j) => Some(self.source.get(Split::Train, Length::Long, j)?.visual()?)
                    .filter(|v| v.dim(0).is_ok_and(|n| n == s.image_rows.len())),
                None => None,
            };
            batch.push((s, visual, d));
        }
        let norm: f64 = batch
            .iter()
            .map(|(s, _, _)| (s.len() - s.prompt_len) as f64)
            .sum();
        let settings = self.settings();
        let mut stores = Vec::with_capacity(batch.len());
        let (mut loss, mut ce, mut reg) = (0f64, 0f64, 0f64);
        let mut agreement = Agreement::default();
        for (s, visual, d) in &batch {
            let perturb = Perturbation {
                noise: c.noise,
                noise_seed: d.noise_seed,
                distractor: visual.as_ref(),
            };
            let out = sample_loss(
                &self.head,
                self.source.target.text(),
                s,
                &settings,
                &perturb,
                norm,
            )?;
            loss += out.loss.to_scalar::<f32>()? as f64;
            ce += out.ce;
            reg += out.reg;
            agreement.add(&out.agreement);
            stores.push(out.loss.backward()?);
        }
        let loss = loss as f32;
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                stage: "draft".into(),
                step,
                loss,
            });
        }
        let stats = self.optim.step(&stores)?;
        self.state.step += 1;
        let seconds = start.elapsed().as_secs_f64();
        self.state.seconds += seconds;
        let rows = agreement.rows.iter().sum::<u64>().max(1) as f64;
        let report = DraftStepReport {
            step: self.state.step,
            total: self.state.total,
            loss,
            ce: ce / rows,
            reg: reg / rows,
            agreement,
            lr: stats.lr,
            grad_norm: stats.grad_norm,
            missing_grads: stats.missing_grads,
            long: batch
                .iter()
                .filter(|(_, _, d)| d.length == Length::Long)
                .count(),
            distractors: batch.iter().filter(|(_, v, _)| v.is_some()).count(),
            seconds,
        };
        let a = &report.agreement;
        self.log(json!({
            "kind": "step",
            "step": report.step,
            "loss": report.loss,
            "ce": report.ce,
            "reg": report.reg,
            "acc": (1..=a.rows.len()).map(|d| a.accuracy(d)).collect::<Vec<_>>(),
            "lr": report.lr,
            "grad_norm": report.grad_norm,
            "long": report.long,
            "distractors": report.distractors,
            "rows": a.rows.first().copied().unwrap_or(0),
            "seconds": seconds,
        }))?;
        Ok(report)
    }
}

/// The held-out set of a validation: the first `long` / `short` samples of the validation
/// split's pools (a function of the source's seed), drafted to depth `passes`.
#[derive(Debug, Clone, Copy)]
pub struct HeldOut {
    pub long: usize,
    pub short: usize,
    pub passes: usize,
}

/// Top-1 agreement per depth of `head` (training or inference ops) on the held-out samples of
/// `source`: no noise, no distractors. What the trainer's validations run, and what
/// `glance train draft --eval-head DIR` runs on an exported head.
pub fn evaluate_head(
    head: &DraftHead,
    source: &mut SampleSource,
    held_out: &HeldOut,
) -> Result<EvalReport> {
    let start = Instant::now();
    let settings = PassSettings {
        passes: held_out.passes,
        hidden_weight: 0.0,
        pass_decay: 1.0,
    };
    let mut agreement = Agreement::default();
    let mut samples = 0;
    for (length, n) in [
        (Length::Long, held_out.long),
        (Length::Short, held_out.short),
    ] {
        for j in 0..n as u64 {
            let s = source.get(Split::Validation, length, j)?;
            let out = sample_loss(
                head,
                source.target.text(),
                &s,
                &settings,
                &Perturbation::default(),
                1.0,
            )?;
            agreement.add(&out.agreement);
            samples += 1;
        }
    }
    Ok(EvalReport {
        step: 0,
        samples,
        agreement,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The head's parameters sorted by name; weight decay on matrices other than norms and the
/// adaptor's queries.
fn head_params(varmap: &VarMap) -> Vec<Param> {
    let data = varmap.data().lock().expect("varmap lock poisoned");
    let mut v: Vec<Param> = data
        .iter()
        .map(|(name, var)| Param {
            name: name.clone(),
            var: var.clone(),
            decay: var.as_tensor().rank() >= 2 && !name.ends_with("queries"),
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// The world trainer's initialisation ([`init_params`]: norms 1, biases 0, the rest N(0, 0.02)),
/// then `inject.weight = [I | 0]`: the injection starts as the identity on the row and ignores the
/// global feature.
fn init_head(varmap: &VarMap, seed: u64, hidden: usize) -> Result<()> {
    init_params(varmap, seed)?;
    let data = varmap.data().lock().expect("varmap lock poisoned");
    if let Some(var) = data.get("inject.weight") {
        let mut w = vec![0f32; hidden * 2 * hidden];
        for i in 0..hidden {
            w[i * 2 * hidden + i] = 1.0;
        }
        let t = var.as_tensor();
        var.set(&Tensor::from_vec(w, t.shape(), t.device())?)?;
    }
    Ok(())
}

crate::run_loop::drive_with_loop!(DraftTrainer, DraftObserver);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_curriculum() {
        let mut c = DraftTrainConfig::vispec(PathBuf::from("x"), 4, Budget::Steps(100));
        c.batch = 64;
        let early = draws(&c, 0, Some(100));
        assert!(early
            .iter()
            .all(|d| d.length == Length::Short && d.distractor.is_none()));
        let late: Vec<Draw> = (90..100).flat_map(|s| draws(&c, s, Some(100))).collect();
        let long = late.iter().filter(|d| d.length == Length::Long).count();
        let distract = late.iter().filter(|d| d.distractor.is_some()).count();
        assert!(long > 500 && long < 640, "{long}");
        assert!(distract > 20 && distract < 120, "{distract}");
        // A pure function of the step.
        let again = draws(&c, 42, Some(100));
        let first = draws(&c, 42, Some(100));
        assert!(again
            .iter()
            .zip(&first)
            .all(|(a, b)| a.j == b.j && a.noise_seed == b.noise_seed));
    }
}
