//! Block-diffusion decoding of a converted model (Fast-dVLM) beside
//! autoregressive decoding, on the questions `glance eval` asks (the world test split: each
//! image's independent questions), greedy, short answers and descriptions reported apart
//! (`glance bench diffusion`).
//!
//! Columns: autoregressive decoding of the original model and of the converted one (its causal
//! mode, the reference the lossless modes must reproduce); threshold decoding at each τ and
//! linear and quadratic self-speculation, each at every block size; both self-speculative modes
//! with a dynamic block; and, with a pruning share, the converted model's autoregressive,
//! self-speculative and threshold decoding with visual tokens pruned (adaptive policy).
//!
//! Per column and answer kind: tokens per forward pass after the prefill (NFE), decode tokens/s
//! and its ratio to the converted model's autoregressive decoding (interleaved: each question is
//! answered by every column in a balanced order, [`crate::column_order`], so machine noise hits
//! all alike), accuracy (the evaluation's scorer: exact match, description object F1), greedy
//! answers that differ from the reference (must be 0 for the lossless modes), and where the time
//! goes: the share of decode time in forward passes and the cost of one pass against one
//! autoregressive step — the wall-clock speedup is tokens per NFE divided by that cost.

use crate::tally::{ratio, Kind, Tally, TallyRow};
use crate::{bail_options, sampling, score, BenchError, Context, CostReport, Progress, Result};
use glance_decode::DiffusionSettings;
use glance_engine::{
    DecodeSpec, DiffusionMode, Engine, EngineOptions, Flow, ImageInput, Request, TwinShape,
};
use glance_engine::{Response, WeightFormat};
use glance_prune::{Budget, Policy, PruneSpec};
use serde::Serialize;
use std::path::PathBuf;

/// What `glance bench diffusion` measures.
#[derive(Debug, Clone)]
pub struct DiffusionOptions {
    /// The converted model.
    pub model: PathBuf,
    /// The autoregressive model it was converted from.
    pub original: PathBuf,
    /// Threads for the tensor kernels (`None`: one per core).
    pub threads: Option<usize>,
    /// Both models as real-shape twins.
    pub twin: Option<TwinShape>,
    /// How both models' text decoder weights are held.
    pub weights: WeightFormat,
    /// World test-split images; each brings one question per family.
    pub n: usize,
    /// Index of the first image in the test split.
    pub start: u64,
    /// Block sizes of the threshold, linear and quadratic columns.
    pub blocks: Vec<usize>,
    /// Thresholds τ of the threshold columns.
    pub thresholds: Vec<f32>,
    /// Also measure with the visual tokens pruned to this share (adaptive policy); 0: skip.
    pub prune_keep: f64,
    /// Block size of the pruned columns.
    pub prune_block: usize,
    /// Longest description in tokens (short answers stop earlier).
    pub max_new_tokens: usize,
}

/// One strategy on one of the two models.
struct Column {
    name: String,
    /// 0: the original model; 1: the converted one.
    model: usize,
    decode: DecodeSpec,
    prune: Option<PruneSpec>,
    /// The mode's family for the plot (`linear`, `quadratic`, `threshold τ=…`).
    series: Option<String>,
    block: Option<usize>,
    /// Column whose greedy answers this one must reproduce exactly.
    reference: Option<usize>,
}

fn block_settings(block: usize, threshold: f32, dynamic: bool) -> DiffusionSettings {
    DiffusionSettings::sized(Some(block), Some(threshold), dynamic)
}

fn columns(args: &DiffusionOptions) -> Vec<Column> {
    let plain = |name: &str, model, prune: Option<PruneSpec>| Column {
        name: name.into(),
        model,
        decode: DecodeSpec::Autoregressive,
        prune,
        series: None,
        block: None,
        reference: None,
    };
    let mut cols = vec![plain("ar (original)", 0, None), plain("ar", 1, None)];
    let diffusion = |name: String,
                     mode: DiffusionMode,
                     s: DiffusionSettings,
                     series: Option<String>,
                     prune: Option<PruneSpec>,
                     reference: usize| {
        let decode = DecodeSpec::Diffusion {
            mode,
            settings: Some(s.clone()),
        };
        Column {
            name,
            model: 1,
            block: (!s.dynamic).then_some(s.block),
            reference: decode.lossless().then_some(reference),
            decode,
            prune,
            series,
        }
    };
    for (decode, short) in [
        (DiffusionMode::Linear, "linear"),
        (DiffusionMode::Quadratic, "quadratic"),
    ] {
        for &b in &args.blocks {
            let s = block_settings(b, 0.9, false);
            cols.push(diffusion(
                format!("{short} B={b}"),
                decode,
                s,
                Some(short.into()),
                None,
                1,
            ));
        }
        let s = block_settings(8, 0.9, true);
        cols.push(diffusion(
            format!("{short} dynamic"),
            decode,
            s,
            None,
            None,
            1,
        ));
    }
    // `auto` on the converted model: cost-aware linear blocks up to the model's block size, or
    // plain decoding, as this machine's measured costs say.
    cols.push(Column {
        name: "auto".into(),
        decode: DecodeSpec::auto(),
        reference: Some(1),
        ..plain("auto", 1, None)
    });
    for &tau in &args.thresholds {
        for &b in &args.blocks {
            cols.push(diffusion(
                format!("threshold τ={tau} B={b}"),
                DiffusionMode::Threshold,
                block_settings(b, tau, false),
                Some(format!("threshold τ={tau}")),
                None,
                1,
            ));
        }
    }
    if args.prune_keep > 0.0 {
        let prune = Some(PruneSpec::new(
            Policy::Adaptive,
            Budget::Ratio(args.prune_keep),
        ));
        let keep = format!("{:.1}%", 100.0 * args.prune_keep);
        let reference = cols.len();
        cols.push(plain(&format!("ar + prune {keep}"), 1, prune.clone()));
        let b = args.prune_block;
        for (decode, short, tau) in [
            (DiffusionMode::Linear, "linear", 0.9),
            (DiffusionMode::Quadratic, "quadratic", 0.9),
            (DiffusionMode::Threshold, "threshold τ=0.9", 0.9),
        ] {
            cols.push(diffusion(
                format!("{short} B={b} + prune {keep}"),
                decode,
                block_settings(b, tau, false),
                None,
                prune.clone(),
                reference,
            ));
        }
    }
    cols
}

impl DiffusionOptions {
    /// Checks every option before anything loads.
    pub fn validate(&self) -> Result<()> {
        crate::check_test_images(self.n, self.start)?;
        if self.max_new_tokens == 0 {
            bail_options!("--max-new-tokens must be at least 1");
        }
        if self.blocks.is_empty() {
            bail_options!("--blocks needs at least one block size");
        }
        for &b in self.blocks.iter().chain([&self.prune_block]) {
            block_settings(b, 0.9, false)
                .validate()
                .context("--blocks / --prune-block")?;
        }
        for &t in &self.thresholds {
            block_settings(4, t, false)
                .validate()
                .context("--thresholds")?;
        }
        if !(0.0..=1.0).contains(&self.prune_keep) {
            bail_options!("--prune-keep must be a share in [0, 1] (0: no pruned columns)");
        }
        Ok(())
    }
}

/// Per answer kind, a tally per column.
struct Measured {
    tallies: [Vec<Tally>; 2],
    questions: usize,
    seconds: f64,
}

/// The two models loaded and the columns to measure.
pub struct DiffusionBench {
    options: DiffusionOptions,
    engines: [Engine; 2],
    columns: Vec<Column>,
}

impl DiffusionBench {
    /// Checks the options, loads both models and refuses a model not converted for block
    /// diffusion.
    pub fn load(options: DiffusionOptions) -> Result<Self> {
        options.validate()?;
        glance_engine::resolve_threads(options.threads).context("--threads")?;
        let load = |dir: &PathBuf| {
            let engine_options = EngineOptions {
                weights: options.weights,
                ..EngineOptions::default()
            }
            .with_threads(options.threads)
            .with_twin(options.twin.clone());
            Engine::load(dir, engine_options)
                .with_context(|| format!("loading the model in {}", dir.display()))
        };
        let engines = [load(&options.original)?, load(&options.model)?];
        if engines[1].model().config().block_diffusion.is_none() {
            bail_options!(
                "{} is not converted for block diffusion (no `block_diffusion` in config.json): \
                 convert it with `glance train diffusion --from DIR`",
                options.model.display()
            );
        }
        let columns = columns(&options);
        Ok(Self {
            options,
            engines,
            columns,
        })
    }

    /// The converted model's thread count.
    pub fn threads(&self) -> usize {
        self.engines[1].threads()
    }

    /// Columns measured.
    pub fn columns(&self) -> usize {
        self.columns.len()
    }

    /// Answers every question with every column, interleaved, and reports.
    pub fn run(&self, progress: &mut dyn Progress) -> Result<DiffusionReport> {
        let m = measure(&self.engines, &self.options, &self.columns, progress)?;
        let o = &self.options;
        Ok(DiffusionReport {
            groups: groups(&self.columns, &m),
            questions: m.questions,
            seconds: m.seconds,
            model: o.model.display().to_string(),
            original: o.original.display().to_string(),
            images: o.n,
            threads: self.threads(),
            weights: o.weights.name(),
            cost_model: self.engines[1]
                .measured_cost()
                .as_ref()
                .map(CostReport::from),
            columns: self
                .columns
                .iter()
                .map(|c| ColumnInfo {
                    name: c.name.clone(),
                    series: c.series.clone(),
                    block: c.block,
                })
                .collect(),
        })
    }
}

fn measure(
    engines: &[Engine; 2],
    o: &DiffusionOptions,
    cols: &[Column],
    progress: &mut dyn Progress,
) -> Result<Measured> {
    let mut tallies: [Vec<Tally>; 2] = std::array::from_fn(|_| {
        cols.iter()
            .map(|c| Tally {
                mismatches: c.reference.map(|_| 0),
                ..Tally::default()
            })
            .collect()
    });
    let ask = |c: &Column, question: &str, image: &ImageInput, max: usize| -> Result<Response> {
        let request = Request {
            sampling: sampling(0.0, 0),
            max_new_tokens: max,
            decode: c.decode.clone(),
            prune: c.prune.clone(),
            ..Request::chat(question, vec![image.clone()])
        };
        engines[c.model]
            .generate(&request, &mut |_| Flow::Continue)
            .with_context(|| format!("{} on `{question}`", c.name))
    };
    let max_tokens = |f| crate::max_tokens(f, o.max_new_tokens);
    // Warm-up: every column answers the first question once, untimed.
    if let Some((qa, image)) = crate::warm_up_question(o.start)? {
        for c in cols {
            ask(c, &qa.question, &image, max_tokens(qa.family))?;
        }
    }
    let mut serial = 0usize;
    let seconds =
        crate::for_each_question(progress, "diffusion", o.n, o.start, |ex, qa, image| {
            let group = &mut tallies[Kind::of(qa.family) as usize];
            let mut ids: Vec<Vec<u32>> = vec![Vec::new(); cols.len()];
            for c in crate::column_order(cols.len(), serial) {
                let r = ask(&cols[c], &qa.question, image, max_tokens(qa.family))?;
                let text = engines[cols[c].model]
                    .processor()
                    .text
                    .decode(&r.token_ids, true)?;
                group[c].add(&r, qa.family, score(ex, qa, &text));
                ids[c] = r.token_ids;
            }
            for (c, col) in cols.iter().enumerate() {
                if let (Some(r), Some(m)) = (col.reference, group[c].mismatches.as_mut()) {
                    *m += usize::from(ids[c] != ids[r]);
                }
            }
            serial += 1;
            Ok(())
        })?;
    Ok(Measured {
        tallies,
        questions: serial,
        seconds,
    })
}

/// Milliseconds per forward pass (forward and logits time over passes).
fn ms_per_pass(t: &Tally) -> f64 {
    ratio(t.forward_us as f64 / 1e3, t.forwards as f64)
}

/// Mean accepted drafts per step (self-speculation) or tokens decided per pass (threshold).
fn mean_accepted(t: &Tally) -> f64 {
    let (mut n, mut s) = (0u64, 0u64);
    for (a, &c) in t.accepted_length.iter().enumerate() {
        n += c;
        s += a as u64 * c;
    }
    ratio(s as f64, n as f64)
}

/// A column of the report: one strategy on one model, one answer kind.
#[derive(Debug, Clone, Serialize)]
pub struct DiffusionRow {
    #[serde(flatten)]
    pub tally: TallyRow,
    pub decode: &'static str,
    /// `original` or `converted`.
    pub model: &'static str,
    pub block: Option<usize>,
    pub settings: Option<DiffusionSettings>,
    pub pruned: bool,
    pub steps: u64,
    pub block_tokens: u64,
    pub iterations: u64,
    pub accepted_length: Vec<u64>,
    /// Mean accepted drafts per step (self-speculation) or tokens decided per pass
    /// (threshold).
    pub mean_accepted: f64,
    /// Share of decode time in forward passes.
    pub forward_share: f64,
    pub ms_per_pass: f64,
    /// One pass against one autoregressive step of the converted model.
    pub pass_cost_vs_ar_step: f64,
}

/// One answer kind's columns.
#[derive(Debug, Clone, Serialize)]
pub struct DiffusionGroup {
    /// The answer kind's name.
    pub kind: &'static str,
    pub questions: usize,
    /// The converted model's (causal) score over the original's.
    pub retention: f64,
    /// Decode time of one autoregressive step of the converted model.
    pub ar_step_ms: f64,
    pub columns: Vec<DiffusionRow>,
    #[serde(skip)]
    pub answer_kind: Kind,
}

/// A column's name and where it goes in the plot (its mode's series and block size).
#[derive(Debug, Clone)]
pub struct ColumnInfo {
    pub name: String,
    pub series: Option<String>,
    pub block: Option<usize>,
}

/// What `glance bench diffusion` reports (the JSON it writes).
#[derive(Debug, Clone, Serialize)]
pub struct DiffusionReport {
    pub groups: Vec<DiffusionGroup>,
    pub questions: usize,
    pub seconds: f64,
    pub model: String,
    pub original: String,
    pub images: usize,
    pub threads: usize,
    pub weights: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostReport>,
    #[serde(skip)]
    pub columns: Vec<ColumnInfo>,
}

impl DiffusionReport {
    /// Greedy answers of the lossless modes that differ from their reference's.
    pub fn mismatches(&self) -> usize {
        self.groups
            .iter()
            .flat_map(|g| &g.columns)
            .filter_map(|c| c.tally.greedy_mismatches)
            .sum()
    }

    /// Refuses a report whose lossless modes broke their contract.
    pub fn check(&self) -> Result<()> {
        match self.mismatches() {
            0 => Ok(()),
            m => Err(BenchError::Check(format!(
                "{m} greedy self-speculative answers differ from the converted model's \
                 autoregressive ones: the lossless contract is broken"
            ))),
        }
    }
}

fn groups(cols: &[Column], m: &Measured) -> Vec<DiffusionGroup> {
    Kind::ALL
        .iter()
        .map(|&kind| {
            let ts = &m.tallies[kind as usize];
            let ar = &ts[1];
            let ar_tps = ar.tokens_per_s();
            let ar_step_ms = ratio(ar.decode_s * 1e3, ar.forwards as f64);
            let columns = cols
                .iter()
                .zip(ts)
                .map(|(c, t)| {
                    let pass_ms = ms_per_pass(t);
                    DiffusionRow {
                        tally: t.row(&c.name, ar_tps),
                        decode: c.decode.name(),
                        model: if c.model == 0 {
                            "original"
                        } else {
                            "converted"
                        },
                        block: c.block,
                        settings: c.decode.diffusion_settings().cloned(),
                        pruned: c.prune.is_some(),
                        steps: t.steps,
                        block_tokens: t.block_tokens,
                        iterations: t.iterations,
                        accepted_length: t.accepted_length.clone(),
                        mean_accepted: mean_accepted(t),
                        forward_share: ratio(t.forward_us as f64 / 1e6, t.decode_s),
                        ms_per_pass: pass_ms,
                        pass_cost_vs_ar_step: ratio(pass_ms, ar_step_ms),
                    }
                })
                .collect();
            DiffusionGroup {
                kind: kind.name(),
                questions: ts[0].questions,
                retention: ratio(ts[1].accuracy(), ts[0].accuracy()),
                ar_step_ms,
                columns,
                answer_kind: kind,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> DiffusionOptions {
        DiffusionOptions {
            model: PathBuf::from("converted"),
            original: PathBuf::from("original"),
            threads: None,
            twin: None,
            weights: WeightFormat::F32,
            n: 1,
            start: 0,
            blocks: vec![4, 8],
            thresholds: vec![0.9],
            prune_keep: 0.125,
            prune_block: 16,
            max_new_tokens: 64,
        }
    }

    #[test]
    fn lossless_columns_name_their_reference() {
        let cols = columns(&options());
        let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(&names[..3], ["ar (original)", "ar", "linear B=4"]);
        // Every self-speculative column is checked against the converted model's AR, the
        // pruned ones against AR with the same pruning.
        let pruned_ar = names
            .iter()
            .position(|n| n.starts_with("ar + prune"))
            .unwrap();
        for c in &cols {
            match (c.name.starts_with("linear"), c.prune.is_some()) {
                (true, false) => assert_eq!(c.reference, Some(1)),
                (true, true) => assert_eq!(c.reference, Some(pruned_ar)),
                _ => {}
            }
        }
        assert!(cols.iter().any(|c| c.name == "threshold τ=0.9 B=8"));
        assert!(options().validate().is_ok());
        let bad = DiffusionOptions {
            prune_keep: 2.0,
            ..options()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn mean_accepted_weighs_each_length_by_its_count() {
        let t = Tally {
            accepted_length: vec![1, 0, 3],
            forward_us: 4000,
            forwards: 2,
            ..Tally::default()
        };
        assert_eq!(mean_accepted(&t), 1.5);
        assert_eq!(ms_per_pass(&t), 2.0);
    }
}
