//! Losses and gradients of one batch in each stage.
//!
//! The models run batch 1, so a batch is a list of per-image graphs. [`batch_grads`] splits the
//! images into `workers` contiguous parts, builds and differentiates each part on its own thread
//! (GEMMs single-threaded inside; see [`crate::runtime`]) and returns one `GradStore` per part;
//! the optimiser adds them. Each part's loss is scaled by its share of the whole batch's
//! supervised units, so the parts' gradients sum to exactly the whole batch's gradient. The split
//! is a function of the batch size and `workers` only, so runs are deterministic for a given
//! worker count.

use crate::align;
use crate::config::Stage;
use crate::data::{ImageSample, TurnMix, Turns, WorldData};
use crate::heads::{argmax_hits, HeadCounts, Metric, VisionTargets};
use crate::packing::Packed;
use crate::params::TrainModel;
use crate::token_drop::{self, DropPlan, TokenDrop};
use crate::{Result, TrainError};
use candle_core::backprop::GradStore;
use candle_core::Tensor;
use glance_models::llava::ImageEncoding;
use glance_nn::{AttnMask, CausalLm};

/// The scalar loss of a batch (or part) and what to report about it.
pub struct BatchLoss {
    pub loss: Tensor,
    /// Supervised units: patches (vision) or answer tokens (QA stages).
    pub units: usize,
    /// Head accuracies (vision) or answer-token accuracy (QA stages).
    pub metrics: Vec<Metric>,
}

/// One stage's inputs for a batch.
pub enum Batch<'a> {
    /// Pixels `(3, H, W)` and targets per image.
    Vision {
        pixels: Vec<&'a Tensor>,
        targets: &'a [VisionTargets],
    },
    /// Pixels and packed sequence per image; each image's visual-token drop (empty: none) and
    /// the word–patch alignment term ([`crate::align`]).
    Qa {
        items: Vec<(&'a Tensor, &'a Packed)>,
        drops: &'a [Option<DropPlan>],
        align: Option<AlignBatch<'a>>,
    },
}

impl Batch<'_> {
    /// Relative cost of each image: 1 for vision, decoder rows for QA.
    fn costs(&self) -> Vec<usize> {
        match self {
            Batch::Vision { pixels, .. } => vec![1; pixels.len()],
            Batch::Qa { items, drops, .. } => items
                .iter()
                .enumerate()
                .map(|(i, (_, p))| match drops.get(i) {
                    // the kept share of the rows, roughly (most rows are image rows)
                    Some(Some(d)) => (p.len() as f64 * d.keep_ratio()).ceil() as usize,
                    _ => p.len(),
                })
                .collect(),
        }
    }
}

/// The alignment term of a QA batch.
#[derive(Clone, Copy)]
pub struct AlignBatch<'a> {
    /// Token ids of the vocabulary words, `v`.
    pub words: &'a [u32],
    /// Per image, 0/1 targets `(patches, v)`.
    pub targets: &'a [Tensor],
    /// Weight of the term (the batch mean over images).
    pub weight: f64,
}

/// Splits items with `costs` into at most `parts` contiguous, non-empty ranges of about equal
/// total cost (a pure function of its inputs, so runs stay deterministic).
pub fn split(costs: &[usize], parts: usize) -> Vec<std::ops::Range<usize>> {
    let n = costs.len();
    let parts = parts.clamp(1, n.max(1));
    // prefix[j] = cost of items ..j
    let prefix: Vec<usize> = std::iter::once(0)
        .chain(costs.iter().scan(0, |a, c| {
            *a += c;
            Some(*a)
        }))
        .collect();
    let total = prefix[n] as f64;
    let mut bounds = vec![0];
    for k in 1..parts {
        let lo = bounds[k - 1] + 1;
        let hi = n - (parts - k); // leave one item for each later part
        let target = total * k as f64 / parts as f64;
        let best = (lo..=hi)
            .min_by(|&a, &b| {
                (prefix[a] as f64 - target)
                    .abs()
                    .total_cmp(&(prefix[b] as f64 - target).abs())
            })
            .unwrap_or(lo);
        bounds.push(best);
    }
    bounds.push(n);
    bounds
        .windows(2)
        .map(|w| w[0]..w[1])
        .filter(|r| !r.is_empty())
        .collect()
}

/// Gradients of a whole batch, one store per part.
pub struct BatchGrads {
    /// The whole batch's loss (sum of the parts' scaled losses).
    pub loss: f32,
    pub stores: Vec<GradStore>,
    pub units: usize,
    pub metrics: Vec<Metric>,
}

/// A thread pool of `n` workers, built once per size and kept for the process.
fn worker_pool(n: usize) -> Result<std::sync::Arc<rayon::ThreadPool>> {
    use std::sync::{Arc, Mutex, OnceLock};
    type Pools = Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>>;
    static POOLS: OnceLock<Pools> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(k, _)| *k == n) {
        return Ok(p.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("glance-train-{i}"))
        .build()
        .map_err(|e| TrainError::Config(format!("cannot start {n} training workers: {e}")))?;
    let pool = Arc::new(pool);
    pools.push((n, pool.clone()));
    Ok(pool)
}

/// Loss of images `range` of `batch`, normalised by the whole batch.
fn part_loss(
    model: &TrainModel,
    stage: Stage,
    batch: &Batch,
    range: std::ops::Range<usize>,
) -> Result<BatchLoss> {
    match batch {
        Batch::Vision { pixels, targets } => vision_part(
            model,
            &pixels[range.clone()],
            &targets[range],
            &HeadCounts::of(targets),
        ),
        Batch::Qa {
            items,
            drops,
            align,
        } => {
            let whole: usize = items.iter().map(|(_, p)| p.targets.len()).sum();
            let extras = QaExtras {
                drops: drops.get(range.clone()).unwrap_or(&[]),
                align: align.map(|a| AlignBatch {
                    words: a.words,
                    targets: a.targets.get(range.clone()).unwrap_or(&[]),
                    // per image, so that the parts sum to the batch mean
                    weight: a.weight / items.len() as f64,
                }),
            };
            qa_part(model, stage, &items[range], &extras, whole)
        }
    }
}

/// Forward and backward of `batch` on `workers` threads.
pub fn batch_grads(
    model: &TrainModel,
    stage: Stage,
    batch: &Batch,
    workers: usize,
) -> Result<BatchGrads> {
    let bounds = split(&batch.costs(), workers);
    let run = |r: std::ops::Range<usize>| -> Result<(f32, GradStore, usize, Vec<Metric>)> {
        let part = part_loss(model, stage, batch, r)?;
        let loss: f32 = part.loss.to_scalar()?;
        let grads = part.loss.backward()?;
        Ok((loss, grads, part.units, part.metrics))
    };
    let results: Vec<Result<_>> = if bounds.len() == 1 {
        vec![run(bounds[0].clone())]
    } else {
        use rayon::prelude::*;
        // Long-lived workers: a thread (and its malloc arena) per part, reused every step.
        worker_pool(bounds.len())?.install(|| bounds.par_iter().map(|r| run(r.clone())).collect())
    };
    let mut total = BatchGrads {
        loss: 0.0,
        stores: Vec::new(),
        units: 0,
        metrics: Vec::new(),
    };
    for r in results {
        let (loss, grads, units, metrics) = r?;
        total.loss += loss;
        total.stores.push(grads);
        total.units += units;
        for m in metrics {
            match total.metrics.iter_mut().find(|t| t.name == m.name) {
                Some(t) => {
                    t.hits += m.hits;
                    t.total += m.total;
                }
                None => total.metrics.push(m),
            }
        }
    }
    Ok(total)
}

/// Vision pretraining loss of a whole batch in one graph: per-patch heads and the [CLS] set head
/// on the last vision layer.
pub fn vision_loss(
    model: &TrainModel,
    data: &WorldData,
    images: &[ImageSample],
) -> Result<BatchLoss> {
    let targets = images
        .iter()
        .map(|im| data.vision_targets(&im.scene))
        .collect::<Result<Vec<_>>>()?;
    let pixels: Vec<&Tensor> = images.iter().map(|im| &im.pixels).collect();
    vision_part(model, &pixels, &targets, &HeadCounts::of(&targets))
}

fn vision_part(
    model: &TrainModel,
    pixels: &[&Tensor],
    targets: &[VisionTargets],
    whole: &HeadCounts,
) -> Result<BatchLoss> {
    let layer = model.config.vision.num_hidden_layers;
    let mut hidden = Vec::with_capacity(pixels.len());
    for px in pixels {
        // (1 + patches, h)
        let out = model.train.vision().forward(px, &[layer])?;
        hidden.push(
            out.hidden_states
                .into_iter()
                .next()
                .expect("one layer requested"),
        );
    }
    let units = targets.iter().map(|t| t.patches.len()).sum();
    let l = model.heads.loss(&hidden, targets, whole)?;
    Ok(BatchLoss {
        loss: l.loss,
        units,
        metrics: l.accuracy,
    })
}

/// One image for a QA stage: projected tokens `(image_tokens, text_hidden)` through the frozen
/// tower (fused ops, detached) for [`Stage::Llava`], through the trainable one for
/// [`Stage::EndToEnd`]; the tower's features and [CLS] attention come along for pruning.
pub fn image_encoding(model: &TrainModel, stage: Stage, pixels: &Tensor) -> Result<ImageEncoding> {
    match stage {
        Stage::EndToEnd => Ok(model.train.encode_image(pixels)?),
        _ => {
            let tower = model.infer.encode_tower(pixels)?;
            Ok(ImageEncoding {
                features: model.train.projector().forward(&tower.features.detach())?,
                vision_hidden: tower.vision_hidden.detach(),
                cls_attention: tower.cls_attention.map(|a| a.detach()),
                anyres: None,
            })
        }
    }
}

/// QA stages, whole batch in one graph: packed independent turns per image, cross-entropy on
/// answer tokens only.
pub fn qa_loss(
    model: &TrainModel,
    data: &WorldData,
    stage: Stage,
    images: &[ImageSample],
    turns: usize,
) -> Result<BatchLoss> {
    let packed = pack_images(data, images, turns)?;
    let items: Vec<(&Tensor, &Packed)> = images.iter().map(|im| &im.pixels).zip(&packed).collect();
    let whole = packed.iter().map(|p| p.targets.len()).sum();
    qa_part(model, stage, &items, &QaExtras::default(), whole)
}

/// The packed training sequence of each image: up to `turns` independent turns each (v1's mix).
pub fn pack_images(data: &WorldData, images: &[ImageSample], turns: usize) -> Result<Vec<Packed>> {
    image_turns(data, images, turns, &TurnMix::default())
        .iter()
        .map(|t| data.pack(t))
        .collect()
}

/// Each image's training turns under `mix`.
pub fn image_turns(
    data: &WorldData,
    images: &[ImageSample],
    turns: usize,
    mix: &TurnMix,
) -> Vec<Turns> {
    images
        .iter()
        .map(|im| data.turns_with(&im.scene, im.seed, turns, mix))
        .collect()
}

/// The drop plan of each image (with its `turns`), drawn from `drop` (see
/// [`crate::token_drop`]); the query is the first packed question, as `glance run` would pass it.
pub fn drop_plans(
    data: &WorldData,
    images: &[ImageSample],
    turns: &[Turns],
    drop: &TokenDrop,
) -> Result<Vec<Option<DropPlan>>> {
    images
        .iter()
        .zip(turns)
        .map(|(im, qs)| {
            let query = match qs.first() {
                Some(q) => data.processor.query_ids(&q.question)?,
                None => Vec::new(),
            };
            drop.plan(im.seed, query)
        })
        .collect()
}

/// What a part of a QA batch adds to the answer loss, per image (missing entries: nothing).
#[derive(Default)]
struct QaExtras<'a> {
    drops: &'a [Option<DropPlan>],
    /// With the weight of each image's term.
    align: Option<AlignBatch<'a>>,
}

/// Mean answer-token cross-entropy of `items`, scaled to a batch of `whole` answer tokens, plus
/// the weighted alignment loss of the images that have targets; image `i` is pruned as
/// `extras.drops[i]` says.
fn qa_part(
    model: &TrainModel,
    stage: Stage,
    items: &[(&Tensor, &Packed)],
    extras: &QaExtras,
    whole: usize,
) -> Result<BatchLoss> {
    let dev = model.train.text().device().clone();
    let mut logits = Vec::with_capacity(items.len());
    let mut targets: Vec<u32> = Vec::new();
    let image_id = model.config.image_token_id;
    let mut align_losses = Vec::new();
    // (v, text_hidden)
    let words = match &extras.align {
        Some(a) => Some(model.train.text().embed_tokens(a.words)?),
        None => None,
    };
    for (i, (pixels, packed)) in items.iter().enumerate() {
        let enc = image_encoding(model, stage, pixels)?;
        if let (Some(words), Some(a)) = (&words, &extras.align) {
            if let Some(y) = a.targets.get(i) {
                align_losses.push((align::loss(&enc.features, words, y)? * a.weight)?);
            }
        }
        let pruned;
        let (feats, packed) = match extras.drops.get(i) {
            Some(Some(plan)) => {
                let (f, p) = token_drop::apply(&model.train, &enc, packed, image_id, plan)?;
                pruned = p;
                (f, &pruned)
            }
            _ => (enc.features, *packed),
        };
        // (t, hidden)
        let xs = model.train.embed_prompt(&packed.ids, &[&feats])?;
        let mask = AttnMask::Custom(packed.mask_tensor(&dev)?);
        let hidden = model
            .train
            .text()
            .forward_uncached(&xs, &packed.positions, &mask)?;
        let rows = Tensor::new(packed.target_rows.as_slice(), &dev)?;
        // (n_targets, vocab)
        logits.push(model.train.text().logits(&hidden.index_select(&rows, 0)?)?);
        targets.extend_from_slice(&packed.targets);
    }
    let logits = Tensor::cat(&logits, 0)?;
    let y = Tensor::new(targets.as_slice(), &dev)?;
    let scale = targets.len() as f64 / whole.max(1) as f64;
    let mut loss = (candle_nn::loss::cross_entropy(&logits, &y)? * scale)?;
    for a in align_losses {
        loss = (loss + a)?;
    }
    let hits = argmax_hits(&logits, &targets)?;
    Ok(BatchLoss {
        loss,
        units: targets.len(),
        metrics: vec![Metric {
            name: "tok_acc",
            hits,
            total: targets.len(),
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn splits_are_contiguous_balanced_and_non_empty() {
        assert_eq!(split(&[1, 1, 1, 1], 2), vec![0..2, 2..4]);
        assert_eq!(split(&[1, 1, 1], 2), vec![0..1, 1..3]); // ties go to the earlier boundary
        assert_eq!(split(&[5], 3), vec![0..1]);
        assert_eq!(split(&[300, 300, 600, 300], 2), vec![0..2, 2..4]);
        assert_eq!(split(&[900, 100, 100, 100], 2), vec![0..1, 1..4]);
        assert_eq!(split(&[1, 1, 1, 100], 3), vec![0..2, 2..3, 3..4]);
        assert_eq!(split(&[2, 2, 2, 2, 2, 2], 3), vec![0..2, 2..4, 4..6]);
        for n in 1..9 {
            for p in 1..5 {
                let costs: Vec<usize> = (0..n).map(|i| 1 + (i * 7) % 5).collect();
                let s = split(&costs, p);
                assert_eq!(s.len(), p.min(n));
                assert_eq!(s.first().unwrap().start, 0);
                assert_eq!(s.last().unwrap().end, n);
                assert!(s
                    .windows(2)
                    .all(|w| w[0].end == w[1].start && !w[0].is_empty()));
            }
        }
    }
}
