//! Vision pretraining heads (training only, never exported) and their losses.
//!
//! * Per patch, on `LayerNorm(h_patch)`: what covers the patch — `kind` (background / object /
//!   sign plate / sign digit) over every patch; `colour`, `shape`, `size` over object patches;
//!   `digit` over digit patches; and where the patch is — the `row` and `column` of the world's
//!   3 × 3 grid its centre falls in — over every patch, so the layer LLaVA reads keeps each
//!   patch's place in a form the decoder can use for "where" and "is A above B" questions. One
//!   GEMM computes all seven heads' logits.
//! * On [CLS]: `post_layernorm(h_cls)` (CLIP's pooled output; the LayerNorm *is* exported, as
//!   `vision_tower.vision_model.post_layernorm`) → multi-label logits of the scene's object set
//!   (see [`set_labels`]), with binary cross-entropy. This makes [CLS] a global scene embedding.

use crate::params::HEADS_PREFIX;
use crate::Result;
use candle_core::{DType, Tensor, D};
use candle_nn::VarBuilder;
use glance_models::llava::{LlavaConfig, WeightLayout};
use glance_nn::weights::{layer_norm, linear};
use glance_nn::{LayerNorm, Linear, Mode};
use glance_world::{Colour, PatchIds, Scene, Shape, Size};

/// Classes of each per-patch head, in the column order of the fused head.
pub const KIND: usize = PatchIds::KINDS;
pub const COLOUR: usize = Colour::COUNT + 1;
pub const SHAPE: usize = Shape::COUNT + 1;
pub const SIZE: usize = Size::COUNT + 1;
pub const DIGIT: usize = PatchIds::DIGITS;
/// Rows (and columns) of the world's grid.
pub const GRID: usize = 3;
const PATCH_OUT: usize = KIND + COLOUR + SHAPE + SIZE + DIGIT + 2 * GRID;

/// Multi-label targets of the [CLS] head: (colour, shape) pairs, colours, shapes, sizes, "has a
/// sign", and which of the 9 grid cells are occupied.
pub const SET_LABELS: usize =
    Colour::COUNT * Shape::COUNT + Colour::COUNT + Shape::COUNT + Size::COUNT + 1 + 9;

/// The scene's object set as 0/1 targets (length [`SET_LABELS`]).
pub fn set_labels(scene: &Scene) -> Vec<f32> {
    let mut y = vec![0f32; SET_LABELS];
    let pairs = Colour::COUNT * Shape::COUNT;
    let (c0, s0, z0) = (
        pairs,
        pairs + Colour::COUNT,
        pairs + Colour::COUNT + Shape::COUNT,
    );
    let sign = z0 + Size::COUNT;
    for o in &scene.objects {
        y[o.colour.id() * Shape::COUNT + o.shape.id()] = 1.0;
        y[c0 + o.colour.id()] = 1.0;
        y[s0 + o.shape.id()] = 1.0;
        y[z0 + o.size.id()] = 1.0;
        y[sign + 1 + o.position.id()] = 1.0;
    }
    if let Some(s) = &scene.sign {
        y[sign] = 1.0;
        y[sign + 1 + s.position.id()] = 1.0;
    }
    y
}

/// Targets of one image for the vision stage.
#[derive(Debug, Clone)]
pub struct VisionTargets {
    /// Per patch, row-major.
    pub patches: Vec<PatchIds>,
    /// Per patch, the (row, column) of the grid cell its centre falls in.
    pub cells: Vec<(u32, u32)>,
    /// [`set_labels`].
    pub set: Vec<f32>,
}

/// Losses and accuracies of one vision batch (or of one part of it).
pub struct VisionLoss {
    /// Scalar: sum of the head losses.
    pub loss: Tensor,
    /// Accuracy of each head over the patches it is trained on.
    pub accuracy: Vec<Metric>,
}

/// Hits out of a total (summed over the parts of a batch, then reported as a ratio).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub hits: usize,
    pub total: usize,
}

impl Metric {
    pub fn value(&self) -> f32 {
        self.hits as f32 / self.total.max(1) as f32
    }
}

/// How many rows each head is trained on in a whole batch: each part of a batch split across
/// workers scales its head means by `local / whole`, so the parts' gradients add up to the
/// whole batch's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadCounts {
    pub patches: usize,
    pub objects: usize,
    pub digits: usize,
    pub images: usize,
}

impl HeadCounts {
    pub fn of(targets: &[VisionTargets]) -> Self {
        let mut c = HeadCounts {
            images: targets.len(),
            ..Default::default()
        };
        for p in targets.iter().flat_map(|t| t.patches.iter()) {
            c.patches += 1;
            c.objects += (p.kind == 1) as usize;
            c.digits += (p.kind == 3) as usize;
        }
        c
    }
}

pub struct VisionHeads {
    post_layernorm: LayerNorm,
    patch_norm: LayerNorm,
    /// `(PATCH_OUT, h)`: kind | colour | shape | size | digit | row | column.
    patch: Linear,
    cls: Linear,
}

impl VisionHeads {
    pub fn new(
        vb: &VarBuilder,
        layout: &WeightLayout,
        config: &LlavaConfig,
        mode: Mode,
    ) -> Result<Self> {
        let h = config.vision.hidden_size;
        let eps = config.vision.layer_norm_eps;
        let hv = vb.pp(HEADS_PREFIX);
        Ok(Self {
            post_layernorm: layer_norm(&vb.pp(&layout.vision).pp("post_layernorm"), h, eps, mode)?,
            patch_norm: layer_norm(&hv.pp("patch_norm"), h, eps, mode)?,
            patch: linear(&hv.pp("patch"), h, PATCH_OUT, true)?,
            cls: linear(&hv.pp("cls"), h, SET_LABELS, true)?,
        })
    }

    /// `hidden`: each image's last vision hidden state `(1 + patches, h)`, [CLS] first. Head
    /// means are over `whole` (the batch this part belongs to; `HeadCounts::of(targets)` for a
    /// batch of one part).
    pub fn loss(
        &self,
        hidden: &[Tensor],
        targets: &[VisionTargets],
        whole: &HeadCounts,
    ) -> Result<VisionLoss> {
        let dev = hidden[0].device().clone();
        let n_patch = hidden[0].dim(0)? - 1;
        // (B·patches, h) and (B, h)
        let patches: Vec<Tensor> = hidden
            .iter()
            .map(|x| x.narrow(0, 1, n_patch))
            .collect::<candle_core::Result<_>>()?;
        let cls: Vec<Tensor> = hidden
            .iter()
            .map(|x| x.narrow(0, 0, 1))
            .collect::<candle_core::Result<_>>()?;
        let patches = Tensor::cat(&patches, 0)?;
        let cls = Tensor::cat(&cls, 0)?;
        // (B·patches, PATCH_OUT)
        let logits = self.patch.forward(&self.patch_norm.forward(&patches)?)?;
        let all: Vec<&PatchIds> = targets.iter().flat_map(|t| t.patches.iter()).collect();
        let cells: Vec<(u32, u32)> = targets
            .iter()
            .flat_map(|t| t.cells.iter().copied())
            .collect();
        let rows_where = |f: &dyn Fn(&PatchIds) -> bool| -> Vec<u32> {
            all.iter()
                .enumerate()
                .filter(|(_, p)| f(p))
                .map(|(i, _)| i as u32)
                .collect()
        };
        let every = rows_where(&|_| true);
        let objects = rows_where(&|p| p.kind == 1);
        let digits = rows_where(&|p| p.kind == 3);
        type Head<'a> = (
            &'static str,
            usize,
            usize,
            &'a Vec<u32>,
            usize,
            fn(&PatchIds) -> u32,
        );
        let heads: [Head; 5] = [
            ("kind", 0, KIND, &every, whole.patches, |p| p.kind),
            ("colour", KIND, COLOUR, &objects, whole.objects, |p| {
                p.colour
            }),
            (
                "shape",
                KIND + COLOUR,
                SHAPE,
                &objects,
                whole.objects,
                |p| p.shape,
            ),
            (
                "size",
                KIND + COLOUR + SHAPE,
                SIZE,
                &objects,
                whole.objects,
                |p| p.size,
            ),
            (
                "digit",
                KIND + COLOUR + SHAPE + SIZE,
                DIGIT,
                &digits,
                whole.digits,
                |p| p.digit,
            ),
        ];
        let mut loss = Tensor::zeros((), DType::F32, &dev)?;
        let mut accuracy = Vec::new();
        let mut head = |name, start, width, rows: &[u32], norm: usize, y: Vec<u32>| -> Result<()> {
            if rows.is_empty() || norm == 0 {
                return Ok(());
            }
            let idx = Tensor::new(rows, &dev)?;
            // (n, width)
            let l = logits.index_select(&idx, 0)?.narrow(1, start, width)?;
            let yt = Tensor::new(y.as_slice(), &dev)?;
            let ce =
                (candle_nn::loss::cross_entropy(&l, &yt)? * (rows.len() as f64 / norm as f64))?;
            loss = (&loss + ce)?;
            accuracy.push(Metric {
                name,
                hits: argmax_hits(&l, &y)?,
                total: y.len(),
            });
            Ok(())
        };
        for (name, start, width, rows, norm, target) in heads {
            let y = rows.iter().map(|&r| target(all[r as usize])).collect();
            head(name, start, width, rows, norm, y)?;
        }
        let grid = KIND + COLOUR + SHAPE + SIZE + DIGIT;
        let (rows, cols): (Vec<u32>, Vec<u32>) = cells.iter().copied().unzip();
        head("row", grid, GRID, &every, whole.patches, rows)?;
        head("column", grid + GRID, GRID, &every, whole.patches, cols)?;
        // Multi-label [CLS] head: (B, SET_LABELS)
        let cl = self.cls.forward(&self.post_layernorm.forward(&cls)?)?;
        let y: Vec<f32> = targets.iter().flat_map(|t| t.set.iter().copied()).collect();
        let yt = Tensor::from_vec(y.clone(), cl.shape(), &dev)?;
        let scale = targets.len() as f64 / whole.images.max(1) as f64;
        loss = (loss + (bce_with_logits(&cl, &yt)? * scale)?)?;
        let pred: Vec<f32> = cl.flatten_all()?.to_vec1()?;
        let hits = pred
            .iter()
            .zip(&y)
            .filter(|(p, t)| (**p > 0.0) == (**t > 0.5))
            .count();
        accuracy.push(Metric {
            name: "set",
            hits,
            total: y.len(),
        });
        Ok(VisionLoss { loss, accuracy })
    }
}

/// Mean binary cross-entropy of logits `x` against 0/1 targets `y`, in the stable form
/// `relu(x) - x·y + log(1 + exp(-|x|))`.
pub fn bce_with_logits(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let soft = (x.abs()?.neg()?.exp()? + 1.0)?.log()?;
    Ok((x.relu()? - (x * y)? + soft)?.mean_all()?)
}

/// How many rows of `logits` have their argmax at the target.
pub fn argmax_hits(logits: &Tensor, y: &[u32]) -> Result<usize> {
    let pred: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    Ok(pred.iter().zip(y).filter(|(p, t)| p == t).count())
}

/// Targets of `scene` at `patch` pixels per patch side.
pub fn vision_targets(scene: &Scene, patch: usize) -> Result<VisionTargets> {
    let labels = glance_world::patch_labels(scene, patch)?;
    let patches = labels.ids();
    Ok(VisionTargets {
        cells: patch_cells(patches.len(), patch),
        patches,
        set: set_labels(scene),
    })
}

/// The grid cell (row, column) of each of `n` patches (row-major, `patch` pixels a side): the
/// cell its centre falls in.
fn patch_cells(n: usize, patch: usize) -> Vec<(u32, u32)> {
    let size = glance_world::IMAGE_SIZE as usize;
    let side = size / patch;
    let cell = |k: usize| ((2 * k + 1) * patch * GRID / (2 * size)) as u32;
    (0..n).map(|i| (cell(i / side), cell(i % side))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn bce_matches_formula() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::new(&[-30f32, -1.0, 0.0, 2.0, 40.0], &dev)?;
        let y = Tensor::new(&[0f32, 1.0, 1.0, 0.0, 1.0], &dev)?;
        let got: f32 = bce_with_logits(&x, &y)?.to_scalar()?;
        let xs = [-30f64, -1.0, 0.0, 2.0, 40.0];
        let ys = [0f64, 1.0, 1.0, 0.0, 1.0];
        let want: f64 = xs
            .iter()
            .zip(ys)
            .map(|(x, y)| {
                let p = 1.0 / (1.0 + (-x).exp());
                -(y * p.max(1e-300).ln() + (1.0 - y) * (1.0 - p).max(1e-300).ln())
            })
            .sum::<f64>()
            / 5.0;
        assert!((got as f64 - want).abs() < 1e-5, "{got} vs {want}");
        Ok(())
    }

    #[test]
    fn patch_cells_split_the_image_in_thirds_by_patch_centre() {
        // 16 × 16 patches of 14 pixels: centres 7, 21, …, 217; thirds end at 74.7 and 149.3.
        let cells = patch_cells(256, 14);
        let rows: Vec<u32> = (0..16).map(|r| cells[r * 16].0).collect();
        assert_eq!(rows, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
        let cols: Vec<u32> = cells[16..32].iter().map(|c| c.1).collect();
        assert_eq!(cols, rows);
        assert!(cells[16..32].iter().all(|c| c.0 == 0));
        // 4 × 4 patches of 56 pixels: centres 28, 84, 140, 196.
        let cells = patch_cells(16, 56);
        assert_eq!(cells[5], (1, 1));
        assert_eq!(cells[15], (2, 2));
        assert_eq!(cells[3], (0, 2));
    }

    #[test]
    fn set_labels_mark_objects_and_sign() {
        let s = Scene::generate(7);
        let y = set_labels(&s);
        assert_eq!(y.len(), SET_LABELS);
        let occupied = s.objects.len() + s.sign.is_some() as usize;
        assert_eq!(
            y[SET_LABELS - 9..].iter().filter(|v| **v > 0.5).count(),
            occupied
        );
    }
}
