//! The conversion loop: AdamW over the text decoder, checkpoints, resume, validation,
//! `metrics.jsonl`, export.
//!
//! Output directory:
//! * `model/` — the converted model: the source directory's files (tokenizer, processor, chat
//!   template, …), `model.safetensors` with every weight (the text decoder's trained, the vision
//!   tower's and projector's as they were) and `config.json` with a `block_diffusion` entry
//!   (`mask_token_id`, the block sizes trained), written at the end;
//! * `checkpoint.safetensors` — the text decoder's parameters, the AdamW moments and the
//!   [`DiffusionState`] in the header; written atomically;
//! * `metrics.jsonl` — one JSON line per step (`"kind": "step"`) and per validation (`"eval"`).
//!
//! Determinism: the weights start as the source's; a step's data (which samples, block sizes,
//! phases, masks) is a function of `(seed, step, schedule length)` and the samples of the frozen
//! source model. A run stopped after step k and resumed repeats the uninterrupted run exactly.

use super::convert::{self, Converted, MaskToken};
use super::layout::{blocks, draw_masks, Layout, MaskPattern};
use super::DiffusionTrainConfig;
use crate::checkpoint::{read_state_file, write_state_file};
use crate::config::Budget;
use crate::draft::samples::{Length, Sample, SampleSource};
use crate::export::{write_atomic, write_weights};
use crate::optim::AdamW;
use crate::params::Param;
pub use crate::trainer::RunEnd;
use crate::{Result, TrainError};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use glance_nn::{AttnMask, CausalLm};
use glance_world::{Split, WorldRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Format tag of conversion checkpoints.
pub const FORMAT: &str = "glance-diffusion-checkpoint/1";
const META_KEY: &str = "glance_diffusion_state";
/// Stream of the per-step data draws.
const DRAW_STREAM: u64 = 0x6466_6673_6e00;
/// The mask token glance's world tokenizer reserves.
pub const MASK_TOKEN: &str = "[MASK]";

/// Where a run stands: enough to continue it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffusionState {
    pub format: String,
    pub config: DiffusionTrainConfig,
    pub step: u64,
    pub total: Option<u64>,
    pub seconds: f64,
}

/// What one step did.
#[derive(Debug, Clone)]
pub struct DiffusionStepReport {
    pub step: u64,
    pub total: Option<u64>,
    pub loss: f32,
    /// Mean cross-entropy of the diffusion and causal targets.
    pub diffusion: f64,
    pub causal: f64,
    /// Top-1 accuracy on the diffusion / causal targets of the batch.
    pub diffusion_acc: f64,
    pub causal_acc: f64,
    pub block: usize,
    pub lr: f64,
    pub grad_norm: f64,
    pub seconds: f64,
}

/// A validation on held-out samples: the causal mode's top-1 agreement with the source model's
/// greedy answers, and per block size the mean number of draft tokens a linear self-speculative
/// step would accept (a block `[x, M…]` after the exact prefix; leading drafts equal to the
/// answer).
#[derive(Debug, Clone)]
pub struct EvalReport {
    pub step: u64,
    pub samples: usize,
    pub causal_agreement: f64,
    /// Mean cross-entropy of the causal targets and of the diffusion targets (at the first
    /// validation block size, every draft slot masked).
    pub causal_loss: f64,
    pub diffusion_loss: f64,
    /// `(block size, mean accepted drafts per block)`.
    pub accepted: Vec<(usize, f64)>,
    pub seconds: f64,
}

impl EvalReport {
    pub fn summary(&self) -> String {
        let acc: Vec<String> = self
            .accepted
            .iter()
            .map(|(b, a)| format!("B={b}: {a:.2}"))
            .collect();
        format!(
            "causal agreement {:.4}, loss {:.4} | diffusion loss {:.4} | accepted drafts per \
             block {} ({} samples)",
            self.causal_agreement,
            self.causal_loss,
            self.diffusion_loss,
            acc.join(", "),
            self.samples
        )
    }
}

/// Receives progress; every method has a no-op default.
pub trait DiffusionObserver {
    fn started(&mut self, _step: u64, _total: Option<u64>) {}
    fn step(&mut self, _report: &DiffusionStepReport) {}
    fn eval(&mut self, _report: &EvalReport) {}
    fn message(&mut self, _text: &str) {}
}

/// One sample slot of a step.
#[derive(Debug, Clone, Copy)]
struct Draw {
    length: Length,
    j: u64,
    block: usize,
    mask_seed: u64,
}

/// The data of 0-based `step`: a pure function of the settings, the step and the schedule.
fn draws(c: &DiffusionTrainConfig, step: u64, total: Option<u64>) -> Vec<Draw> {
    let top = c.stage_block(step, total);
    let smaller: Vec<usize> = c.block_sizes.iter().copied().filter(|&b| b < top).collect();
    let mut rng = WorldRng::derive(c.seed ^ DRAW_STREAM, step);
    (0..c.batch)
        .map(|_| {
            let (length, pool) = if rng.chance(c.long_share) {
                (Length::Long, c.long_pool)
            } else {
                (Length::Short, c.short_pool)
            };
            let j = rng.below(pool) as u64;
            let block = if smaller.is_empty() || rng.chance(0.5) {
                top
            } else {
                smaller[rng.below(smaller.len())]
            };
            Draw {
                length,
                j,
                block,
                mask_seed: rng.next_u64(),
            }
        })
        .collect()
}

/// The layout of a training sample: a random phase, then per block a prefix or ratio pattern.
fn train_layout(c: &DiffusionTrainConfig, s: &Sample, block: usize, seed: u64) -> Layout {
    let mut rng = WorldRng::derive(seed, 0);
    let r = s.answer.len();
    let first = 1 + rng.below(block);
    let bl = blocks(r, block, first);
    let share = c.prefix_share;
    let mut pat = WorldRng::derive(seed, 1);
    let mut uni = WorldRng::derive(seed, 2);
    let masks = draw_masks(
        r,
        &bl,
        |_, len| {
            if pat.chance(share) {
                MaskPattern::Prefix {
                    known: pat.below(len.max(1)),
                }
            } else {
                MaskPattern::Ratio {
                    ratio: unit(&mut pat),
                }
            }
        },
        || unit(&mut uni),
    );
    Layout::complementary(s.prompt_len, bl, masks)
}

/// A uniform draw in `[0, 1)` (53 bits).
fn unit(rng: &mut WorldRng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The validation layout at block size `block`: one copy, blocks aligned to the answer's start,
/// each with its first token known and the rest masked.
fn eval_layout(s: &Sample, block: usize) -> Layout {
    let r = s.answer.len();
    let bl = blocks(r, block, block);
    let m = draw_masks(r, &bl, |_, _| MaskPattern::Prefix { known: 1 }, || 0.0);
    Layout {
        prompt_len: s.prompt_len,
        answer_len: r,
        blocks: bl,
        masked: vec![m],
    }
}

/// Forward of one sample's layout through `model`'s text decoder: the logits of the causal and
/// diffusion target rows.
struct SampleLogits {
    /// `(n_causal, vocab)`, `(n_diffusion, vocab)`
    causal: Tensor,
    diffusion: Option<Tensor>,
    causal_targets: Vec<u32>,
    diffusion_targets: Vec<u32>,
    diffusion_rows: Vec<u32>,
}

/// The position of every row of `layout`: clean row `r` at the sample's position of `r` (the
/// identity unless the prompt was pruned: kept rows keep theirs, the answer follows the whole
/// prompt's), noisy rows at their clean twin's.
fn row_positions(layout: &Layout, sample: &[u32]) -> Vec<u32> {
    layout
        .positions()
        .iter()
        .map(|&r| sample[r as usize])
        .collect()
}

fn forward_layout(
    model: &Converted,
    s: &Sample,
    layout: &Layout,
    mask_id: u32,
) -> Result<SampleLogits> {
    let text = model.text();
    let dev = text.device().clone();
    if s.prompt_ids.len() != s.prompt_len {
        return Err(TrainError::Config(format!(
            "a sample's prompt has {} ids for {} rows",
            s.prompt_ids.len(),
            s.prompt_len
        )));
    }
    let ids = layout.input_ids(&s.prompt_ids, &s.answer, mask_id);
    let (a, n) = (s.image_rows[0], s.image_rows.len());
    // (P, hidden): the prompt's text through the trainable embeddings, the image rows from the
    // frozen vision tower and projector.
    let mut parts = Vec::with_capacity(3);
    if a > 0 {
        parts.push(text.embed_tokens(&s.prompt_ids[..a])?);
    }
    parts.push(s.visual()?);
    if a + n < s.prompt_len {
        parts.push(text.embed_tokens(&s.prompt_ids[a + n..])?);
    }
    let prompt = Tensor::cat(&parts, 0)?;
    // (rows - P, hidden)
    let rest = text.embed_tokens(&ids[s.prompt_len..])?;
    let xs = Tensor::cat(&[&prompt, &rest], 0)?;
    let n = layout.rows();
    let additive: Vec<f32> = layout
        .visible()
        .into_iter()
        .map(|v| if v { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    let mask = AttnMask::Custom(Tensor::from_vec(additive, (n, n), &dev)?);
    // (rows, hidden)
    let positions = row_positions(layout, &s.positions);
    let hidden = match &s.mrope {
        // Prompt rows at their 3-D positions, answer rows at (p, p, p).
        Some(m) => {
            let m: Vec<[u32; 3]> = layout
                .positions()
                .iter()
                .zip(&positions)
                .map(|(&r, &p)| m.get(r as usize).copied().unwrap_or([p; 3]))
                .collect();
            text.forward_uncached_mrope(&xs, &m, &mask)?
        }
        None => text.forward_uncached(&xs, &positions, &mask)?,
    };
    let pick = |rows: &[u32]| -> Result<Tensor> {
        let idx = Tensor::new(rows, &dev)?;
        Ok(text.logits(&hidden.index_select(&idx, 0)?)?)
    };
    let (crow, ctgt) = layout.causal_targets(&s.answer);
    let (drow, dtgt) = layout.diffusion_targets(&s.answer);
    Ok(SampleLogits {
        causal: pick(&crow)?,
        diffusion: if drow.is_empty() {
            None
        } else {
            Some(pick(&drow)?)
        },
        causal_targets: ctgt,
        diffusion_targets: dtgt,
        diffusion_rows: drow,
    })
}

/// Mean cross-entropy of `(n, vocab)` logits against `targets`.
fn mean_ce(logits: &Tensor, targets: &[u32]) -> Result<f64> {
    let y = Tensor::new(targets, logits.device())?;
    Ok(candle_nn::loss::cross_entropy(logits, &y)?.to_scalar::<f32>()? as f64)
}

/// Argmax of every row of `(n, vocab)` logits.
fn argmax(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(D::Minus1)?.to_vec1()?)
}

pub struct DiffusionTrainer {
    pub out: PathBuf,
    pub state: DiffusionState,
    varmap: VarMap,
    /// Composed (differentiable) ops over the varmap.
    model: Converted,
    /// The text decoder's parameters (the optimised ones).
    params: Vec<Param>,
    optim: AdamW,
    pub source: SampleSource,
    mask: MaskToken,
    metrics: std::fs::File,
}

impl DiffusionTrainer {
    pub fn checkpoint_path(out: &Path) -> PathBuf {
        out.join("checkpoint.safetensors")
    }

    /// The exported model directory.
    pub fn model_dir(out: &Path) -> PathBuf {
        out.join("model")
    }

    pub fn new(config: DiffusionTrainConfig, out: &Path) -> Result<Self> {
        config.validate()?;
        let total = match config.budget {
            Budget::Steps(n) => Some(n),
            Budget::Seconds(_) => None,
        };
        let state = DiffusionState {
            format: FORMAT.into(),
            config,
            step: 0,
            total,
            seconds: 0.0,
        };
        Self::assemble(out, state, None)
    }

    pub fn resume(out: &Path) -> Result<Self> {
        let path = Self::checkpoint_path(out);
        let (state, tensors): (DiffusionState, HashMap<String, Tensor>) =
            read_state_file(&path, META_KEY, "diffusion-training state", &Device::Cpu)?;
        if state.format != FORMAT {
            return Err(TrainError::Checkpoint {
                path,
                reason: format!("format {:?}, this build reads {FORMAT:?}", state.format),
            });
        }
        Self::assemble(out, state, Some((path, tensors)))
    }

    fn assemble(
        out: &Path,
        state: DiffusionState,
        saved: Option<(PathBuf, HashMap<String, Tensor>)>,
    ) -> Result<Self> {
        let c = &state.config;
        let device = Device::Cpu;
        let source = SampleSource::new(
            &c.from,
            c.seed,
            (c.max_new_short, c.max_new_long),
            c.cache_mib,
            &device,
        )?
        .with_token_drop(c.token_drop.clone())?;
        // Every weight of the source under its own name; the text decoder's are optimised.
        let ckpt = glance_models::checkpoint::var_builder(&c.from, DType::F32, &device)?;
        let rows = source.target.text_config().vocab_size;
        let mask = convert::mask_token(&c.from, &source.target, rows)?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let (model, prefixes) = convert::build(&c.from, &source.target, &vb, &ckpt, mask)?;
        {
            let data = varmap.data().lock().expect("varmap lock poisoned");
            for (name, var) in data.iter() {
                var.set(&convert::source_weight(
                    &ckpt,
                    name,
                    var.as_tensor().shape(),
                )?)?;
            }
        }
        let params = text_params(&varmap, &prefixes);
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
            varmap,
            model,
            params,
            optim,
            source,
            mask,
            metrics,
        })
    }

    /// The optimised parameters (the text decoder's), sorted by name.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    pub fn mask_id(&self) -> u32 {
        self.mask.id
    }

    fn log(&mut self, value: serde_json::Value) -> Result<()> {
        let path = self.out.join("metrics.jsonl");
        writeln!(self.metrics, "{value}").map_err(|e| TrainError::io(path, e))
    }

    pub fn save_checkpoint(&self) -> Result<()> {
        let mut tensors: Vec<(String, Tensor)> = self
            .params
            .iter()
            .map(|p| (format!("param.{}", p.name), p.var.as_tensor().clone()))
            .collect();
        tensors.extend(self.optim.state_tensors()?);
        write_state_file(
            &Self::checkpoint_path(&self.out),
            META_KEY,
            &self.state,
            &tensors,
        )
    }

    /// Writes `OUT/model/`: the source's other files, every weight, and `config.json` with the
    /// `block_diffusion` entry.
    pub fn export(&self) -> Result<PathBuf> {
        let c = &self.state.config;
        let dir = Self::model_dir(&self.out);
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
        let entries = std::fs::read_dir(&c.from).map_err(|e| TrainError::io(&c.from, e))?;
        for e in entries {
            let e = e.map_err(|e| TrainError::io(&c.from, e))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            let skip = name == "config.json" || name.contains("safetensors");
            if skip || !e.path().is_file() {
                continue;
            }
            let bytes = std::fs::read(e.path()).map_err(|err| TrainError::io(e.path(), err))?;
            write_atomic(&dir.join(&*name), &bytes)?;
        }
        let cpath = c.from.join("config.json");
        let mut cfg: serde_json::Value = glance_models::checkpoint::read_json(&cpath)?;
        let obj = cfg
            .as_object_mut()
            .ok_or_else(|| TrainError::Config(format!("{}: not a JSON object", cpath.display())))?;
        obj.insert(
            "block_diffusion".into(),
            json!({
                "mask_token_id": self.mask.id,
                "block_size": c.block_sizes.last().copied().unwrap_or(8).min(8),
                "trained_block_sizes": c.block_sizes,
                "steps": self.state.step,
            }),
        );
        let tpath = c.from.join("tokenizer.json");
        let mut tokenizer: serde_json::Value = glance_models::checkpoint::read_json(&tpath)?;
        convert::export_mask(&mut tokenizer, &mut cfg, self.mask)?;
        if self.mask.added {
            write_atomic(
                &dir.join("tokenizer.json"),
                serde_json::to_string(&tokenizer)?.as_bytes(),
            )?;
        }
        write_atomic(
            &dir.join("config.json"),
            serde_json::to_string_pretty(&cfg)?.as_bytes(),
        )?;
        let data = self.varmap.data().lock().expect("varmap lock poisoned");
        let mut all: Vec<Param> = data
            .iter()
            .map(|(name, var)| Param {
                name: name.clone(),
                var: var.clone(),
                decay: false,
            })
            .collect();
        drop(data);
        all.sort_by(|a, b| a.name.cmp(&b.name));
        write_weights(&dir, &all)?;
        Ok(dir)
    }

    /// The held-out validation (see [`EvalReport`]).
    pub fn evaluate(&mut self) -> Result<EvalReport> {
        self.evaluate_on(Split::Validation)
    }

    /// [`Self::evaluate`] on the first samples of `split`'s pools (the train split's are pruned
    /// under token drop).
    pub fn evaluate_on(&mut self, split: Split) -> Result<EvalReport> {
        let start = Instant::now();
        let c = self.state.config.clone();
        let mut samples = Vec::new();
        for (length, n) in [(Length::Long, c.eval_long), (Length::Short, c.eval_short)] {
            for j in 0..n as u64 {
                samples.push(self.source.get(split, length, j)?);
            }
        }
        let (mut agree, mut total) = (0usize, 0usize);
        let (mut ce_c, mut ce_d, mut n_d) = (0f64, 0f64, 0usize);
        let mut accepted = Vec::new();
        for (bi, &block) in c.eval_blocks.iter().enumerate() {
            let (mut acc, mut nblocks) = (0usize, 0usize);
            for s in &samples {
                let layout = eval_layout(s, block);
                let out = forward_layout(&self.model, s, &layout, self.mask.id)?;
                if bi == 0 {
                    let got = argmax(&out.causal)?;
                    agree += got
                        .iter()
                        .zip(&out.causal_targets)
                        .filter(|(a, b)| a == b)
                        .count();
                    total += got.len();
                    ce_c += mean_ce(&out.causal, &out.causal_targets)? * got.len() as f64;
                    if let Some(d) = &out.diffusion {
                        ce_d += mean_ce(d, &out.diffusion_targets)?
                            * out.diffusion_targets.len() as f64;
                        n_d += out.diffusion_targets.len();
                    }
                }
                let got = match &out.diffusion {
                    Some(d) => argmax(d)?,
                    None => Vec::new(),
                };
                // Diffusion targets come block by block, in order: count each block's leading
                // hits.
                let mut k = 0;
                for b in &layout.blocks {
                    let n = b.len().saturating_sub(1);
                    let hits = (0..n)
                        .take_while(|&j| got[k + j] == out.diffusion_targets[k + j])
                        .count();
                    debug_assert!(n == 0 || out.diffusion_rows.len() >= k + n);
                    acc += hits;
                    nblocks += 1;
                    k += n;
                }
            }
            accepted.push((block, acc as f64 / nblocks.max(1) as f64));
        }
        Ok(EvalReport {
            step: self.state.step,
            samples: samples.len(),
            causal_agreement: agree as f64 / total.max(1) as f64,
            causal_loss: ce_c / total.max(1) as f64,
            diffusion_loss: ce_d / n_d.max(1) as f64,
            accepted,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    fn run_eval(&mut self, obs: &mut dyn DiffusionObserver) -> Result<()> {
        let r = self.evaluate()?;
        self.log(json!({
            "kind": "eval",
            "step": r.step,
            "samples": r.samples,
            "causal_agreement": r.causal_agreement,
            "causal_loss": r.causal_loss,
            "diffusion_loss": r.diffusion_loss,
            "accepted": r.accepted,
            "seconds": r.seconds,
        }))?;
        obs.eval(&r);
        Ok(())
    }

    /// Trains until the budget is spent (then exports and validates) or, with `stop_after`,
    /// until that many steps of this call are done (then checkpoints).
    pub fn run(
        &mut self,
        obs: &mut dyn DiffusionObserver,
        stop_after: Option<u64>,
    ) -> Result<RunEnd> {
        obs.started(self.state.step, self.state.total);
        if self.state.step == 0 && self.state.config.eval_every > 0 {
            self.run_eval(obs)?;
        }
        crate::run_loop::run(&mut Driven { t: self, obs }, stop_after)
    }

    /// One optimiser step over a batch of samples.
    pub fn train_step(&mut self) -> Result<DiffusionStepReport> {
        let start = Instant::now();
        let step = self.state.step;
        let c = self.state.config.clone();
        let draws = draws(&c, step, self.state.total);
        let mut batch: Vec<(Arc<Sample>, Layout)> = Vec::with_capacity(draws.len());
        for d in &draws {
            let s = self.source.get(Split::Train, d.length, d.j)?;
            let layout = train_layout(&c, &s, d.block, d.mask_seed);
            batch.push((s, layout));
        }
        // Means over the batch's targets of each kind.
        let mut n_diff = 0usize;
        let mut n_causal = 0usize;
        for (s, l) in &batch {
            n_diff += l.diffusion_targets(&s.answer).0.len();
            n_causal += s.answer.len();
        }
        let mut stores = Vec::with_capacity(batch.len());
        let (mut loss_sum, mut ce_d, mut ce_c) = (0f64, 0f64, 0f64);
        let (mut hit_d, mut hit_c) = (0usize, 0usize);
        for (s, layout) in &batch {
            let out = forward_layout(&self.model, s, layout, self.mask.id)?;
            let dev = out.causal.device().clone();
            let yc = Tensor::new(out.causal_targets.as_slice(), &dev)?;
            let lc = candle_nn::loss::cross_entropy(&out.causal, &yc)?;
            let wc = c.beta * out.causal_targets.len() as f64 / n_causal.max(1) as f64;
            let mut loss = (&lc * wc)?;
            ce_c += lc.to_scalar::<f32>()? as f64 * out.causal_targets.len() as f64;
            hit_c += argmax(&out.causal)?
                .iter()
                .zip(&out.causal_targets)
                .filter(|(a, b)| a == b)
                .count();
            if let Some(dl) = &out.diffusion {
                let yd = Tensor::new(out.diffusion_targets.as_slice(), &dev)?;
                let ld = candle_nn::loss::cross_entropy(dl, &yd)?;
                let wd = c.alpha * out.diffusion_targets.len() as f64 / n_diff.max(1) as f64;
                loss = (loss + (&ld * wd)?)?;
                ce_d += ld.to_scalar::<f32>()? as f64 * out.diffusion_targets.len() as f64;
                hit_d += argmax(dl)?
                    .iter()
                    .zip(&out.diffusion_targets)
                    .filter(|(a, b)| a == b)
                    .count();
            }
            loss_sum += loss.to_scalar::<f32>()? as f64;
            stores.push(loss.backward()?);
        }
        let loss = loss_sum as f32;
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                stage: "diffusion".into(),
                step,
                loss,
            });
        }
        let stats = self.optim.step(&stores)?;
        self.state.step += 1;
        let seconds = start.elapsed().as_secs_f64();
        self.state.seconds += seconds;
        let report = DiffusionStepReport {
            step: self.state.step,
            total: self.state.total,
            loss,
            diffusion: ce_d / n_diff.max(1) as f64,
            causal: ce_c / n_causal.max(1) as f64,
            diffusion_acc: hit_d as f64 / n_diff.max(1) as f64,
            causal_acc: hit_c as f64 / n_causal.max(1) as f64,
            block: draws.iter().map(|d| d.block).max().unwrap_or(0),
            lr: stats.lr,
            grad_norm: stats.grad_norm,
            seconds,
        };
        self.log(json!({
            "kind": "step",
            "step": report.step,
            "loss": report.loss,
            "diffusion": report.diffusion,
            "causal": report.causal,
            "diffusion_acc": report.diffusion_acc,
            "causal_acc": report.causal_acc,
            "block": report.block,
            "lr": report.lr,
            "grad_norm": report.grad_norm,
            "seconds": seconds,
        }))?;
        Ok(report)
    }
}

/// The text decoder's parameters (under the layout's text and LM-head prefixes), sorted by name.
fn text_params(varmap: &VarMap, prefixes: &[String; 2]) -> Vec<Param> {
    let data = varmap.data().lock().expect("varmap lock poisoned");
    let mut v: Vec<Param> = data
        .iter()
        .filter(|(name, _)| prefixes.iter().any(|p| name.starts_with(&format!("{p}."))))
        .map(|(name, var)| Param {
            name: name.clone(),
            var: var.clone(),
            decay: false,
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

crate::run_loop::drive_with_loop!(DiffusionTrainer, DiffusionObserver);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::layout::blocks;

    #[test]
    fn rows_sit_at_the_sample_positions_noisy_rows_at_their_twins() {
        // A pruned prompt of 3 kept rows at 0, 4, 5, then a 2-token answer at 6, 7.
        let l = Layout::complementary(3, blocks(2, 2, 2), vec![true, false]);
        let sample = [0, 4, 5, 6, 7];
        assert_eq!(row_positions(&l, &sample), [0, 4, 5, 6, 7, 6, 7, 6, 7]);
        let whole: Vec<u32> = (0..5).collect();
        assert_eq!(row_positions(&l, &whole), l.positions());
    }

    #[test]
    fn draws_anneal_and_are_a_function_of_the_step() {
        let mut c = DiffusionTrainConfig::new(PathBuf::from("x"), Budget::Steps(100));
        c.batch = 64;
        assert!(draws(&c, 0, Some(100)).iter().all(|d| d.block == 2));
        let late = draws(&c, 90, Some(100));
        assert!(late.iter().all(|d| [2, 4, 8, 16, 32].contains(&d.block)));
        let top = late.iter().filter(|d| d.block == 32).count();
        assert!(top > 20 && top < 50, "{top}");
        let a = draws(&c, 42, Some(100));
        let b = draws(&c, 42, Some(100));
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.j == y.j && x.mask_seed == y.mask_seed && x.block == y.block));
    }
}
