//! Validation: greedy answers on the world's validation split, scored per question family with
//! glance-world's scorers (normalised exact match; object-level F1 for descriptions).
//!
//! Runs the fused-op (`Mode::Infer`) view of the weights through glance_decode. The image prefix
//! (`<s> USER : <image>×N`) is prefilled once per image and its KV cache forked for each question,
//! which gives the same rows as prefilling each full prompt (causal attention over the cache).

use crate::data::WorldData;
use crate::params::TrainModel;
use crate::Result;
use glance_core::SamplingParams;
use glance_decode::{decode, GenerateConfig, Prefilled, Sampler};
use glance_nn::{AttnMask, CausalLm};
use glance_world::{description_prf, exact_match, Family, Split};
use serde::Serialize;
use std::time::Instant;

/// Score of one family.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyScore {
    pub family: Family,
    pub questions: usize,
    /// Exact-match accuracy (descriptions: mean object F1).
    pub score: f64,
}

/// One validation pass.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub families: Vec<FamilyScore>,
    /// Mean over the short-answer families (attribute, counting, spatial, existence, sign).
    pub mean: f64,
    pub seconds: f64,
    /// A few (question, reference, prediction) triples to eyeball.
    pub examples: Vec<(String, String, String)>,
}

/// Answers `per_family` validation questions of each family (fewer for families the first
/// `per_family * 4` images cannot supply).
pub fn evaluate(
    model: &TrainModel,
    data: &WorldData,
    per_family: usize,
    max_new_tokens: usize,
) -> Result<EvalReport> {
    let start = Instant::now();
    let llava = &model.infer;
    let text = llava.text();
    let mut sums: Vec<(Family, usize, f64)> = Family::ALL.iter().map(|f| (*f, 0, 0.0)).collect();
    let mut examples = Vec::new();
    let prefix = data.prefix();
    let p = prefix.len();
    let eos = data.processor.text.eos_token_ids().to_vec();
    for index in 0..(per_family as u64 * 4).max(1) {
        if sums.iter().all(|(_, n, _)| *n >= per_family) {
            break;
        }
        let ex = glance_world::sample(Split::Validation, index)?;
        let wanted: Vec<_> = ex
            .questions
            .iter()
            .filter(|q| {
                sums.iter()
                    .any(|(f, n, _)| *f == q.family && *n < per_family)
            })
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let pixels = data.pixels(&ex.scene)?;
        let feats = llava.encode_image(&pixels)?.features;
        let xs = llava.embed_prompt(prefix, &[&feats])?;
        let positions: Vec<u32> = (0..p as u32).collect();
        let mut base = text.new_cache();
        text.forward(&xs, &positions, &AttnMask::causal(), &mut base)?;
        for qa in wanted {
            let tail = data.prompt_tail(&qa.question)?;
            let mut cache = base.fork()?;
            let rows = text.embed_tokens(&tail)?;
            let pos: Vec<u32> = (p as u32..(p + tail.len()) as u32).collect();
            let t0 = Instant::now();
            let hidden = text.forward(&rows, &pos, &AttnMask::causal(), &mut cache)?;
            let state = Prefilled {
                cache,
                last_hidden: hidden.narrow(0, tail.len() - 1, 1)?,
                last_pos: (p + tail.len() - 1) as u32,
                prompt_len: p + tail.len(),
                elapsed: t0.elapsed(),
            };
            let config = GenerateConfig {
                max_new_tokens,
                sampling: SamplingParams::greedy(),
                eos_token_ids: eos.clone(),
            };
            let sampler = Sampler::new(config.sampling.clone())?;
            let gen = decode(text, state, sampler, &config, &mut |_| Ok(false))?;
            let answer = data.processor.text.decode(&gen.tokens, true)?;
            let score = match qa.family {
                Family::Description => description_prf(&answer, &ex.scene.objects).f1,
                _ => exact_match(&answer, &qa.answer) as u8 as f64,
            };
            let slot = sums
                .iter_mut()
                .find(|(f, _, _)| *f == qa.family)
                .expect("every family has a slot");
            slot.1 += 1;
            slot.2 += score;
            if examples.len() < 6 && index % 3 == 0 {
                examples.push((qa.question.clone(), qa.answer.clone(), answer));
            }
        }
    }
    let families: Vec<FamilyScore> = sums
        .iter()
        .map(|(f, n, s)| FamilyScore {
            family: *f,
            questions: *n,
            score: if *n > 0 { s / *n as f64 } else { 0.0 },
        })
        .collect();
    let short: Vec<&FamilyScore> = families
        .iter()
        .filter(|f| f.family != Family::Description && f.questions > 0)
        .collect();
    let mean = short.iter().map(|f| f.score).sum::<f64>() / short.len().max(1) as f64;
    Ok(EvalReport {
        families,
        mean,
        seconds: start.elapsed().as_secs_f64(),
        examples,
    })
}
