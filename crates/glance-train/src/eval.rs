//! The one world evaluation runner: greedy answers to the world's questions about a split's
//! images, scored per question family with glance-world's scorers (normalised exact match; object
//! precision / recall / F1 for descriptions).
//!
//! Every evaluation in glance goes through [`evaluate`] / [`evaluate_specs`]: `glance eval`,
//! `glance demo`, the training validation ([`crate::Trainer::evaluate`]) and the accuracy half of
//! `glance bench prune`.
//!
//! * Questions: each example's independent questions ([`glance_world::Example::questions`], one
//!   per applicable family) — never the dialogue's follow-ups, which only make sense in context.
//! * Prompt: the model's chat template ([`PromptFormat::Chat`]) around the question, one image.
//! * Decoding: greedy; at most [`EvalOptions::short_max_new_tokens`] tokens for short answers and
//!   [`EvalOptions::max_new_tokens`] for descriptions.
//! * Pruning: each [`PruneSpec`] is one evaluation of the same questions (the image is encoded
//!   once for all of them). Pruned prefills go through [`glance_prune::prefill_llava`]. An
//!   unpruned prefill shares work across an image's questions: the prompt up to the last image
//!   token is the same for every question, so it is prefilled once and its KV cache forked per
//!   question (the same rows as prefilling each full prompt, causal attention over the cache).
//! * Timing: time to first token of a question counts what a lone request would pay — image
//!   pre-processing, vision encoding, selection and the prefill of the whole prompt (with the
//!   shared prefix's time) — and the first token's pick.

use crate::Result;
use candle_core::Device;
use glance_core::{Error, SamplingParams};
use glance_decode::{check_prompt, decode, GenerateConfig, Generation, Prefilled, Sampler};
use glance_models::llava::{ImageEncoding, Llava, LlavaProcessor, PromptFormat};
use glance_nn::{AttnMask, CausalLm, KvCache};
use glance_prune::{prefill_llava, PruneSpec};
use glance_world::{description_prf, exact_match, Example, Family, Split};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Default cap on a short answer's tokens (the longest world answer is a few words).
pub const SHORT_MAX_NEW_TOKENS: usize = 24;
/// Default cap on a description's tokens.
pub const DESCRIPTION_MAX_NEW_TOKENS: usize = 160;

/// The short-answer families, whose mean accuracy is [`EvalReport::mean`].
pub const SHORT_FAMILIES: [Family; 5] = [
    Family::Attribute,
    Family::Counting,
    Family::Spatial,
    Family::Existence,
    Family::Sign,
];

/// What to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub split: Split,
    /// Index of the first image in the split.
    pub start: u64,
    /// Images to go through (fewer when `per_family` is met earlier).
    pub images: usize,
    /// Stop taking questions of a family once it has this many (`None`: every question).
    pub per_family: Option<usize>,
    /// Longest generated description.
    pub max_new_tokens: usize,
    /// Longest generated short answer.
    pub short_max_new_tokens: usize,
    /// How many (question, reference, answer) triples to keep in [`EvalReport::examples`].
    pub examples: usize,
    /// Keep every answer in [`EvalReport::answers`].
    pub record_answers: bool,
}

impl EvalOptions {
    /// Every question of `images` images of `split` from index 0, default token caps.
    pub fn new(split: Split, images: usize) -> Self {
        Self {
            split,
            start: 0,
            images,
            per_family: None,
            max_new_tokens: DESCRIPTION_MAX_NEW_TOKENS,
            short_max_new_tokens: SHORT_MAX_NEW_TOKENS,
            examples: 0,
            record_answers: false,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.images == 0 {
            return Err(invalid("the evaluation needs at least one image"));
        }
        if self.max_new_tokens == 0 || self.short_max_new_tokens == 0 {
            return Err(invalid("the answer token caps must be at least 1"));
        }
        if self.per_family == Some(0) {
            return Err(invalid("per-family question cap must be at least 1"));
        }
        let last = self.start.checked_add(self.images as u64 - 1);
        if last.is_none_or(|l| self.split.seed(l).is_err()) {
            return Err(invalid("the image range runs past the end of the split"));
        }
        Ok(())
    }
}

fn invalid(msg: &str) -> crate::TrainError {
    Error::InvalidParam(msg.to_string()).into()
}

/// Score of one family.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyScore {
    pub family: Family,
    pub questions: usize,
    /// Exact-match accuracy (descriptions: mean object F1); `None` without questions.
    pub score: Option<f64>,
}

/// Mean object-level precision / recall / F1 of the descriptions.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DescriptionScore {
    pub questions: usize,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
}

/// The pruning an evaluation ran with and what it kept.
#[derive(Debug, Clone, Serialize)]
pub struct PruneSummary {
    pub policy: String,
    pub keep: String,
    pub visual_tokens: usize,
    pub mean_kept_visual_tokens: f64,
}

/// Speed over every question.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EvalTiming {
    /// Mean time to first token (see the module docs for what it counts).
    pub mean_ttft_s: f64,
    /// Tokens after the first per second of decoding, over all answers.
    pub decode_tokens_per_s: f64,
    pub generated_tokens: usize,
}

/// One answered question.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// Index of the image in the split.
    pub image: u64,
    pub family: Family,
    pub question: String,
    pub reference: String,
    pub answer: String,
    /// 1 / 0 for short answers; object F1 for a description.
    pub score: f64,
    /// Object precision / recall for a description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision_recall: Option<(f64, f64)>,
    pub ttft_s: f64,
    pub decode_tokens_per_s: f64,
    pub generated_tokens: usize,
    pub kept_visual_tokens: usize,
}

/// A (question, reference, answer) triple to eyeball.
#[derive(Debug, Clone, Serialize)]
pub struct ExampleAnswer {
    pub question: String,
    pub reference: String,
    pub answer: String,
}

/// One evaluation (one pruning spec).
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub split: Split,
    /// Images gone through.
    pub images: usize,
    pub questions: usize,
    pub prune: PruneSummary,
    /// Every family, in [`Family::ALL`] order.
    pub families: Vec<FamilyScore>,
    /// Mean accuracy over the short-answer families that have questions ([`SHORT_FAMILIES`]).
    pub mean: f64,
    pub description: Option<DescriptionScore>,
    pub timing: EvalTiming,
    /// Wall time of the whole call (shared by the specs evaluated together).
    pub seconds: f64,
    pub examples: Vec<ExampleAnswer>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<Answer>,
}

impl EvalReport {
    /// The score of `family`, `None` without questions.
    pub fn score(&self, family: Family) -> Option<f64> {
        self.families
            .iter()
            .find(|f| f.family == family)
            .and_then(|f| f.score)
    }

    /// Mean score over those of `families` that have questions (`None` if none has).
    pub fn mean_of(&self, families: &[Family]) -> Option<f64> {
        let s: Vec<f64> = families.iter().filter_map(|&f| self.score(f)).collect();
        (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64)
    }
}

/// Progress after each image.
#[derive(Debug, Clone, Copy)]
pub struct EvalProgress {
    pub images_done: usize,
    pub images_total: usize,
    pub questions_done: usize,
}

/// Evaluates `model` once, unpruned or pruned as `prune` says.
pub fn evaluate(
    model: &Llava,
    processor: &LlavaProcessor,
    options: &EvalOptions,
    prune: Option<&PruneSpec>,
    progress: &mut dyn FnMut(EvalProgress),
) -> Result<EvalReport> {
    let spec = prune.cloned().unwrap_or_default();
    let mut reports = evaluate_specs(model, processor, options, &[spec], progress)?;
    reports
        .pop()
        .ok_or_else(|| crate::TrainError::Config("no report for the spec".into()))
}

/// Evaluates `model` once per spec on the same questions (the image encoded once for all).
pub fn evaluate_specs(
    model: &Llava,
    processor: &LlavaProcessor,
    options: &EvalOptions,
    specs: &[PruneSpec],
    progress: &mut dyn FnMut(EvalProgress),
) -> Result<Vec<EvalReport>> {
    options.validate()?;
    for s in specs {
        s.validate()?;
    }
    let start = Instant::now();
    let mut accs: Vec<Acc> = specs.iter().map(|_| Acc::default()).collect();
    let mut taken = [0usize; 6];
    let (mut images, mut questions) = (0, 0);
    for index in options.start..options.start + options.images as u64 {
        if let Some(cap) = options.per_family {
            if taken.iter().all(|&n| n >= cap) {
                break;
            }
        }
        let ex = glance_world::sample(options.split, index)?;
        let wanted: Vec<_> = ex
            .questions
            .iter()
            .filter(|q| !q.follow_up)
            .filter(|q| {
                let slot = &mut taken[family_index(q.family)];
                let take = options.per_family.is_none_or(|cap| *slot < cap);
                *slot += usize::from(take);
                take
            })
            .collect();
        images += 1;
        if !wanted.is_empty() {
            let mut image = ImageState::encode(model, processor, &ex)?;
            for qa in wanted {
                let ids = processor.prepare(&qa.question, 1, PromptFormat::Chat)?.ids;
                let query = processor.query_ids(&qa.question)?;
                let config = GenerateConfig {
                    max_new_tokens: if qa.family == Family::Description {
                        options.max_new_tokens
                    } else {
                        options.short_max_new_tokens
                    },
                    sampling: SamplingParams::greedy(),
                    eos_token_ids: processor.text.eos_token_ids().to_vec(),
                };
                for (spec, acc) in specs.iter().zip(accs.iter_mut()) {
                    let run = image.answer(model, &ids, &query, spec, &config)?;
                    let text = processor.text.decode(&run.gen.tokens, true)?;
                    acc.add(options, &ex, qa, text, &run);
                }
                questions += 1;
            }
        }
        progress(EvalProgress {
            images_done: images,
            images_total: options.images,
            questions_done: questions,
        });
    }
    let seconds = start.elapsed().as_secs_f64();
    let visual = model.config().image_tokens_per_image();
    Ok(specs
        .iter()
        .zip(accs)
        .map(|(spec, acc)| acc.report(options.split, images, spec, visual, seconds))
        .collect())
}

/// Position of `f` in [`Family::ALL`].
fn family_index(f: Family) -> usize {
    match f {
        Family::Attribute => 0,
        Family::Counting => 1,
        Family::Spatial => 2,
        Family::Existence => 3,
        Family::Sign => 4,
        Family::Description => 5,
    }
}

/// One image, encoded, with the unpruned prompt prefix's KV cache once it is needed.
struct ImageState {
    encoding: ImageEncoding,
    /// Pre-processing + vision encoding.
    encode_time: Duration,
    /// Prefix ids (through the last image token), their cache and its prefill time.
    prefix: Option<(Vec<u32>, KvCache, Duration)>,
}

/// What answering one question took.
struct Run {
    gen: Generation,
    kept: usize,
    ttft: Duration,
}

impl ImageState {
    fn encode(model: &Llava, processor: &LlavaProcessor, ex: &Example) -> Result<Self> {
        let start = Instant::now();
        let img = image::DynamicImage::ImageRgb8(ex.image.clone());
        let pixels = processor.image.preprocess_tensor(&img, &Device::Cpu)?;
        let encoding = model.encode_image(&pixels)?;
        Ok(Self {
            encoding,
            encode_time: start.elapsed(),
            prefix: None,
        })
    }

    fn answer(
        &mut self,
        model: &Llava,
        ids: &[u32],
        query: &[u32],
        spec: &PruneSpec,
        config: &GenerateConfig,
    ) -> Result<Run> {
        let image_id = model.config().image_token_id;
        let split = ids.iter().rposition(|&i| i == image_id).map(|i| i + 1);
        let (state, kept, extra) = match split {
            Some(p) if spec.is_noop() && p < ids.len() => {
                let (state, shared) = self.forked_prefill(model, ids, p)?;
                (state, model.config().image_tokens_per_image(), shared)
            }
            _ => {
                let p = prefill_llava(model, ids, &[&self.encoding], query, spec)?;
                (p.state, p.stats.kept_visual_tokens, p.stats.select_time)
            }
        };
        let gen = decode(
            model.text(),
            state,
            Sampler::new(config.sampling.clone())?,
            config,
            &mut |_| Ok(false),
        )?;
        let ttft = self.encode_time + extra + gen.prefill;
        Ok(Run { gen, kept, ttft })
    }

    /// Prefills `ids[p..]` over a fork of the cached `ids[..p]`; returns the state and the time
    /// of the shared prefix's prefill.
    fn forked_prefill(
        &mut self,
        model: &Llava,
        ids: &[u32],
        p: usize,
    ) -> Result<(Prefilled, Duration)> {
        let text = model.text();
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let last_pos = check_prompt(text, ids.len(), &positions)?;
        let entry = match self.prefix.take() {
            Some(e) if e.0[..] == ids[..p] => e,
            _ => {
                let start = Instant::now();
                // (p, hidden): the prompt through the last image token.
                let rows = model.embed_prompt(&ids[..p], &[&self.encoding.features])?;
                let mut cache = text.new_cache();
                text.forward(&rows, &positions[..p], &AttnMask::causal(), &mut cache)?;
                (ids[..p].to_vec(), cache, start.elapsed())
            }
        };
        let start = Instant::now();
        let fork = entry.1.fork();
        let shared = entry.2;
        self.prefix = Some(entry);
        let mut cache = fork?;
        let tail = &ids[p..];
        let rows = text.embed_tokens(tail)?;
        let hidden = text.forward(&rows, &positions[p..], &AttnMask::causal(), &mut cache)?;
        let state = Prefilled {
            cache,
            last_hidden: hidden.narrow(0, tail.len() - 1, 1)?,
            last_pos,
            prompt_len: ids.len(),
            elapsed: start.elapsed(),
        };
        Ok((state, shared))
    }
}

/// Running sums of one spec.
#[derive(Default)]
struct Acc {
    /// (sum of scores, questions) per family, in [`Family::ALL`] order.
    family: [(f64, usize); 6],
    precision: f64,
    recall: f64,
    ttft: f64,
    kept: usize,
    runs: usize,
    tokens: usize,
    /// Tokens after the first, and the time decoding them took.
    decoded: usize,
    decode_s: f64,
    examples: Vec<ExampleAnswer>,
    answers: Vec<Answer>,
}

impl Acc {
    fn add(
        &mut self,
        options: &EvalOptions,
        ex: &Example,
        qa: &glance_world::Qa,
        text: String,
        run: &Run,
    ) {
        let (score, pr) = if qa.family == Family::Description {
            let prf = description_prf(&text, &ex.scene.objects);
            self.precision += prf.precision;
            self.recall += prf.recall;
            (prf.f1, Some((prf.precision, prf.recall)))
        } else {
            (f64::from(u8::from(exact_match(&text, &qa.answer))), None)
        };
        let slot = &mut self.family[family_index(qa.family)];
        slot.0 += score;
        slot.1 += 1;
        let ttft = run.ttft.as_secs_f64();
        self.ttft += ttft;
        self.kept += run.kept;
        self.runs += 1;
        self.tokens += run.gen.tokens.len();
        self.decoded += run.gen.tokens.len().saturating_sub(1);
        self.decode_s += run.gen.decode.as_secs_f64();
        if self.examples.len() < options.examples {
            self.examples.push(ExampleAnswer {
                question: qa.question.clone(),
                reference: qa.answer.clone(),
                answer: text.clone(),
            });
        }
        if options.record_answers {
            self.answers.push(Answer {
                image: ex.index,
                family: qa.family,
                question: qa.question.clone(),
                reference: qa.answer.clone(),
                answer: text,
                score,
                precision_recall: pr,
                ttft_s: ttft,
                decode_tokens_per_s: run.gen.decode_tokens_per_sec(),
                generated_tokens: run.gen.tokens.len(),
                kept_visual_tokens: run.kept,
            });
        }
    }

    fn report(
        self,
        split: Split,
        images: usize,
        spec: &PruneSpec,
        visual_tokens: usize,
        seconds: f64,
    ) -> EvalReport {
        let families: Vec<FamilyScore> = Family::ALL
            .iter()
            .zip(&self.family)
            .map(|(&family, &(sum, n))| FamilyScore {
                family,
                questions: n,
                score: (n > 0).then(|| sum / n as f64),
            })
            .collect();
        let (f1_sum, nd) = self.family[family_index(Family::Description)];
        let description = (nd > 0).then(|| DescriptionScore {
            questions: nd,
            precision: self.precision / nd as f64,
            recall: self.recall / nd as f64,
            f1: f1_sum / nd as f64,
        });
        let runs = self.runs.max(1) as f64;
        let mut report = EvalReport {
            split,
            images,
            questions: self.runs,
            prune: PruneSummary {
                policy: if spec.is_noop() {
                    "none"
                } else {
                    spec.policy.name()
                }
                .to_string(),
                keep: spec.budget.to_string(),
                visual_tokens,
                mean_kept_visual_tokens: self.kept as f64 / runs,
            },
            families,
            mean: 0.0,
            description,
            timing: EvalTiming {
                mean_ttft_s: self.ttft / runs,
                decode_tokens_per_s: if self.decode_s > 0.0 {
                    self.decoded as f64 / self.decode_s
                } else {
                    0.0
                },
                generated_tokens: self.tokens,
            },
            seconds,
            examples: self.examples,
            answers: self.answers,
        };
        report.mean = report.mean_of(&SHORT_FAMILIES).unwrap_or(0.0);
        report
    }
}

#[cfg(test)]
mod tests;
