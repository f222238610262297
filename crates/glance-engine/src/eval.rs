//! The one world evaluation runner: greedy answers to the world's questions about a split's
//! images, scored per question family with glance-world's scorers (normalised exact match; object
//! precision / recall / F1 for descriptions).
//!
//! Every evaluation in glance goes through [`evaluate`] / [`evaluate_specs`]: `glance eval`,
//! `glance demo`, the training validation and the accuracy half of `glance bench prune`. Each
//! question is one [`Engine::generate`] request, so evaluation measures exactly what a user gets.
//!
//! * Questions: each example's independent questions ([`glance_world::Example::questions`], one
//!   per applicable family), scored per family and by the scene's object count. Optionally
//!   ([`EvalOptions::relations`]) each image's relation question ("is A above B?"), and
//!   ([`EvalOptions::dialogues`]) its dialogue turn by turn, with the earlier turns' true answers in
//!   context, follow-ups included, and each non-follow-up turn asked alone too
//!   ([`conversation`]).
//! * Prompt: the model's chat template around the question, one image.
//! * Decoding: greedy, with the strategy of [`EvalOptions::decode`]; at most
//!   [`EvalOptions::short_max_new_tokens`] tokens for short answers and
//!   [`EvalOptions::max_new_tokens`] for descriptions.
//! * Pruning: each [`PruneSpec`] is one evaluation of the same questions. The engine's caches do
//!   the sharing: an image is encoded once for all its questions and specs, and (unpruned) the
//!   prompt through the last image token — the same for every question — is prefilled once and
//!   forked per question.
//! * Timing: time to first token of a question counts what a lone request would pay — image
//!   pre-processing, vision encoding, selection and the prefill of the whole prompt — so the work
//!   the caches saved ([`crate::Timings::cache_saved_s`]) is added back.

use crate::{Engine, Flow, ImageInput, Message, Prompt, Request, Response};
use glance_core::{Error, Result, SamplingParams};
use glance_decode::DecodeSpec;
use glance_prune::PruneSpec;
use glance_world::{description_prf, exact_match, Example, Family, Qa, Split};
use serde::Serialize;
use std::time::Instant;

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
    /// The decoding strategy.
    pub decode: DecodeSpec,
    /// Also ask each image's relation question ([`glance_world::Example::relation`]).
    pub relations: bool,
    /// Also ask each image's dialogue turn by turn ([`conversation`]).
    pub dialogues: bool,
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
            decode: DecodeSpec::default(),
            relations: false,
            dialogues: false,
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

fn invalid(msg: &str) -> Error {
    Error::InvalidParam(msg.to_string())
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

/// A score over some questions: exact-match accuracy (a description's: its object F1).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rate {
    pub questions: usize,
    /// `None` without questions.
    pub score: Option<f64>,
}

impl Rate {
    fn of((sum, n): (f64, usize)) -> Rate {
        Rate {
            questions: n,
            score: (n > 0).then(|| sum / n as f64),
        }
    }
}

/// The independent questions about scenes of one object count.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ObjectsScore {
    pub objects: usize,
    /// The short-answer questions.
    pub short: Rate,
    /// The descriptions' object F1.
    pub description_f1: Rate,
}

/// Speed over every question.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EvalTiming {
    /// Mean time to first token (see the module docs for what it counts).
    pub mean_ttft_s: f64,
    /// Tokens after the first per second of decoding, over all answers.
    pub decode_tokens_per_s: f64,
    pub generated_tokens: usize,
    /// Forward passes of the model after the prefills, and the tokens after each answer's first
    /// per pass (1 for autoregressive decoding; the mean accepted length plus one for
    /// speculative decoding).
    pub forward_passes: u64,
    pub tokens_per_forward: f64,
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
    /// The independent questions by the scene's object count (0 to 6).
    pub by_objects: Vec<ObjectsScore>,
    /// The relation questions ([`EvalOptions::relations`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relation: Option<Rate>,
    /// The dialogues ([`EvalOptions::dialogues`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialogue: Option<DialogueScore>,
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

/// Evaluates once, unpruned or pruned as `prune` says.
pub fn evaluate(
    engine: &Engine,
    options: &EvalOptions,
    prune: Option<&PruneSpec>,
    progress: &mut dyn FnMut(EvalProgress),
) -> Result<EvalReport> {
    let spec = prune.cloned().unwrap_or_default();
    let mut reports = evaluate_specs(engine, options, &[spec], progress)?;
    reports
        .pop()
        .ok_or_else(|| Error::InvalidParam("no report for the spec".into()))
}

/// Evaluates once per spec on the same questions.
pub fn evaluate_specs(
    engine: &Engine,
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
        let ex = glance_world::sample(options.split, index)
            .map_err(|e| Error::InvalidParam(format!("world: {e}")))?;
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
        let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
        for qa in wanted {
            for (spec, acc) in specs.iter().zip(accs.iter_mut()) {
                let messages = vec![Message::user(&qa.question, vec![image.clone()])];
                let (text, response) = ask(engine, options, spec, qa, messages)?;
                acc.add(options, &ex, qa, text, &response);
            }
            questions += 1;
        }
        if let Some(qa) = ex.relation.as_ref().filter(|_| options.relations) {
            for (spec, acc) in specs.iter().zip(accs.iter_mut()) {
                let messages = vec![Message::user(&qa.question, vec![image.clone()])];
                let (text, _) = ask(engine, options, spec, qa, messages)?;
                let slot = &mut acc.relation;
                slot.0 += score(qa, &text, &ex).0;
                slot.1 += 1;
            }
            questions += 1;
        }
        if options.dialogues {
            for (spec, acc) in specs.iter().zip(accs.iter_mut()) {
                questions += conversation::ask_dialogue(engine, options, spec, &ex, &image, acc)?;
            }
        }
        progress(EvalProgress {
            images_done: images,
            images_total: options.images,
            questions_done: questions,
        });
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every world image has the same size (LLaVA-NeXT's count depends on it).
    let side = glance_world::IMAGE_SIZE as usize;
    let visual = engine.processor().llava()?.tokens_for(side, side);
    Ok(specs
        .iter()
        .zip(accs)
        .map(|(spec, acc)| acc.report(options, images, spec, visual, seconds))
        .collect())
}

/// One greedy answer to the last user turn of `messages`, capped for `qa`'s family: its text
/// and the response.
fn ask(
    engine: &Engine,
    options: &EvalOptions,
    spec: &PruneSpec,
    qa: &Qa,
    messages: Vec<Message>,
) -> Result<(String, Response)> {
    let max_new_tokens = if qa.family == Family::Description {
        options.max_new_tokens
    } else {
        options.short_max_new_tokens
    };
    let request = Request {
        sampling: SamplingParams::greedy(),
        max_new_tokens,
        prune: (!spec.is_noop()).then(|| spec.clone()),
        decode: options.decode.clone(),
        ..Request::new(Prompt::Chat(messages))
    };
    let response = engine.generate(&request, &mut |_| Flow::Continue)?;
    let text = engine.processor().text.decode(&response.token_ids, true)?;
    Ok((text, response))
}

/// The score of an answer: 1 / 0 by exact match, or for a description its object F1 with the
/// precision and recall.
fn score(qa: &Qa, text: &str, ex: &Example) -> (f64, Option<(f64, f64)>) {
    if qa.family == Family::Description {
        let prf = description_prf(text, &ex.scene.objects);
        (prf.f1, Some((prf.precision, prf.recall)))
    } else {
        (f64::from(u8::from(exact_match(text, &qa.answer))), None)
    }
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
    forwards: u64,
    examples: Vec<ExampleAnswer>,
    answers: Vec<Answer>,
    /// (score sum, questions) of the short answers and of the descriptions by object count.
    by_objects: [[(f64, usize); 2]; MAX_OBJECTS + 1],
    relation: (f64, usize),
    dialogue: conversation::DialogueAcc,
}

/// The most objects a world scene has.
const MAX_OBJECTS: usize = 6;

impl Acc {
    fn add(
        &mut self,
        options: &EvalOptions,
        ex: &Example,
        qa: &glance_world::Qa,
        text: String,
        response: &Response,
    ) {
        let (score, pr) = score(qa, &text, ex);
        if let Some((p, r)) = pr {
            self.precision += p;
            self.recall += r;
        }
        let slot = &mut self.family[family_index(qa.family)];
        slot.0 += score;
        slot.1 += 1;
        let kind = usize::from(qa.family == Family::Description);
        let slot = &mut self.by_objects[ex.scene.objects.len().min(MAX_OBJECTS)][kind];
        slot.0 += score;
        slot.1 += 1;
        let (usage, timings) = (&response.usage, &response.timings);
        let tokens = response.token_ids.len();
        let ttft = timings.time_to_first_token_s + timings.cache_saved_s;
        self.ttft += ttft;
        self.kept += usage.kept_visual_tokens;
        self.runs += 1;
        self.tokens += tokens;
        self.decoded += tokens.saturating_sub(1);
        self.decode_s += timings.decode_s;
        self.forwards += response.decode.forward_passes;
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
                decode_tokens_per_s: timings.decode_tokens_per_s,
                generated_tokens: tokens,
                kept_visual_tokens: usage.kept_visual_tokens,
            });
        }
    }

    fn report(
        self,
        options: &EvalOptions,
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
        let by_objects = self
            .by_objects
            .iter()
            .enumerate()
            .map(|(objects, &[short, description])| ObjectsScore {
                objects,
                short: Rate::of(short),
                description_f1: Rate::of(description),
            })
            .collect();
        let mut report = EvalReport {
            split: options.split,
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
            by_objects,
            relation: options.relations.then(|| Rate::of(self.relation)),
            dialogue: options.dialogues.then(|| self.dialogue.report()),
            timing: EvalTiming {
                mean_ttft_s: self.ttft / runs,
                decode_tokens_per_s: if self.decode_s > 0.0 {
                    self.decoded as f64 / self.decode_s
                } else {
                    0.0
                },
                generated_tokens: self.tokens,
                forward_passes: self.forwards,
                tokens_per_forward: if self.forwards > 0 {
                    self.decoded as f64 / self.forwards as f64
                } else {
                    0.0
                },
            },
            seconds,
            examples: self.examples,
            answers: self.answers,
        };
        report.mean = report.mean_of(&SHORT_FAMILIES).unwrap_or(0.0);
        report
    }
}

mod conversation;
#[cfg(test)]
mod tests;

pub use conversation::DialogueScore;
