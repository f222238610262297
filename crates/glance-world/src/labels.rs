//! Dense per-patch ground truth for training the vision tower.
//!
//! For a patch size `p` dividing 224 (14 → a 16×16 grid), each patch gets the item covering most of
//! it — an object (with its colour / shape / size), the sign plate, or one sign digit — provided it
//! covers at least `min_coverage` of the patch; otherwise it is background. Object coverage is
//! measured with the renderer's own 4×4 supersampling, so labels agree with the pixels exactly.

use serde::{Deserialize, Serialize};

use crate::scene::{sign_geometry as g, Colour, Scene, Shape, Size, IMAGE_SIZE};
use crate::shapes::{object_bbox, object_coverage, sign_pixel, SignPixel, SAMPLES_PER_PIXEL};
use crate::WorldError;

/// Default minimum covered fraction for a patch to be labelled with an item.
pub const DEFAULT_MIN_COVERAGE: f32 = 0.15;
/// A sign patch is labelled with a digit when that digit's ink covers at least this fraction.
pub const MIN_INK: f32 = 0.04;

/// What a patch shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PatchContent {
    Background,
    /// `index` into `Scene::objects`.
    Object {
        index: usize,
        colour: Colour,
        shape: Shape,
        size: Size,
    },
    /// Plate or border of the sign without (enough) ink.
    SignPlate,
    /// Ink of digit `place` (0 = tens, 1 = units) whose value is `digit`.
    SignDigit {
        place: u8,
        digit: u8,
    },
}

/// Label of one patch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PatchLabel {
    pub content: PatchContent,
    /// Fraction of the patch covered by the labelled item (object, or the whole sign plate);
    /// for background, the largest item coverage (below the threshold).
    pub coverage: f32,
}

/// Class ids of one patch for classification heads. Each head has one extra "none" class
/// (= the head's `COUNT`) used for patches where it does not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchIds {
    /// 0 background, 1 object, 2 sign plate, 3 sign digit ([`PatchIds::KINDS`] classes).
    pub kind: u32,
    /// `Colour::id()` or `Colour::COUNT`.
    pub colour: u32,
    /// `Shape::id()` or `Shape::COUNT`.
    pub shape: u32,
    /// `Size::id()` or `Size::COUNT`.
    pub size: u32,
    /// Digit 0..=9 or 10.
    pub digit: u32,
}

impl PatchIds {
    /// Classes of the `kind` head.
    pub const KINDS: usize = 4;
    /// Classes of the `digit` head (10 digits + none).
    pub const DIGITS: usize = 11;
}

impl PatchLabel {
    /// Class ids for the classification heads.
    pub fn ids(&self) -> PatchIds {
        let mut ids = PatchIds {
            kind: 0,
            colour: Colour::COUNT as u32,
            shape: Shape::COUNT as u32,
            size: Size::COUNT as u32,
            digit: 10,
        };
        match self.content {
            PatchContent::Background => {}
            PatchContent::Object {
                colour,
                shape,
                size,
                ..
            } => {
                ids.kind = 1;
                ids.colour = colour.id() as u32;
                ids.shape = shape.id() as u32;
                ids.size = size.id() as u32;
            }
            PatchContent::SignPlate => ids.kind = 2,
            PatchContent::SignDigit { digit, .. } => {
                ids.kind = 3;
                ids.digit = digit as u32;
            }
        }
        ids
    }
}

/// Labels of all patches, row-major (`labels[row * grid + col]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PatchLabels {
    /// Patch side in pixels.
    pub patch: usize,
    /// Patches per image side.
    pub grid: usize,
    pub labels: Vec<PatchLabel>,
}

impl PatchLabels {
    /// Label of the patch at (`row`, `col`).
    pub fn get(&self, row: usize, col: usize) -> Option<&PatchLabel> {
        if row < self.grid && col < self.grid {
            self.labels.get(row * self.grid + col)
        } else {
            None
        }
    }
    /// Class ids of every patch, row-major.
    pub fn ids(&self) -> Vec<PatchIds> {
        self.labels.iter().map(PatchLabel::ids).collect()
    }
}

/// Per-patch labels with [`DEFAULT_MIN_COVERAGE`]. `patch` must divide 224 (14 → 16×16).
pub fn patch_labels(scene: &Scene, patch: usize) -> Result<PatchLabels, WorldError> {
    patch_labels_with(scene, patch, DEFAULT_MIN_COVERAGE)
}

/// Per-patch labels with an explicit coverage threshold in `[0, 1]`.
pub fn patch_labels_with(
    scene: &Scene,
    patch: usize,
    min_coverage: f32,
) -> Result<PatchLabels, WorldError> {
    let size = IMAGE_SIZE as usize;
    if patch == 0 || (size / patch) * patch != size {
        return Err(WorldError::InvalidPatchSize { patch, image: size });
    }
    if !(0.0..=1.0).contains(&min_coverage) {
        return Err(WorldError::InvalidArgument(format!(
            "min_coverage {min_coverage} is not in [0, 1]"
        )));
    }
    let grid = size / patch;
    let cells = grid * grid;
    let area = (patch * patch) as f32;
    // Sub-sample counts per patch and object; pixel counts per patch for the sign.
    let mut obj_cov = vec![vec![0u32; cells]; scene.objects.len()];
    for (k, o) in scene.objects.iter().enumerate() {
        let (x0, y0, x1, y1) = object_bbox(o, IMAGE_SIZE);
        for y in y0..y1 {
            for x in x0..x1 {
                let c = object_coverage(o, x, y);
                if c > 0 {
                    obj_cov[k][(y as usize / patch) * grid + x as usize / patch] += c;
                }
            }
        }
    }
    let mut sign_cov = vec![0u32; cells];
    let mut ink = vec![[0u32; 2]; cells];
    if let Some(s) = &scene.sign {
        for y in s.y..s.y.saturating_add(g::PLATE_H).min(IMAGE_SIZE) {
            for x in s.x..s.x.saturating_add(g::PLATE_W).min(IMAGE_SIZE) {
                let cell = (y as usize / patch) * grid + x as usize / patch;
                match sign_pixel(s, x, y) {
                    SignPixel::Outside => {}
                    SignPixel::Border | SignPixel::Plate => sign_cov[cell] += 1,
                    SignPixel::Ink { place } => {
                        sign_cov[cell] += 1;
                        ink[cell][place as usize & 1] += 1;
                    }
                }
            }
        }
    }
    let mut labels = Vec::with_capacity(cells);
    for cell in 0..cells {
        let mut best = PatchLabel {
            content: PatchContent::Background,
            coverage: 0.0,
        };
        for (k, o) in scene.objects.iter().enumerate() {
            let cov = obj_cov[k][cell] as f32 / (area * SAMPLES_PER_PIXEL as f32);
            if cov > best.coverage {
                best = PatchLabel {
                    content: PatchContent::Object {
                        index: k,
                        colour: o.colour,
                        shape: o.shape,
                        size: o.size,
                    },
                    coverage: cov,
                };
            }
        }
        if let Some(s) = &scene.sign {
            let cov = sign_cov[cell] as f32 / area;
            if cov > best.coverage {
                let [i0, i1] = ink[cell];
                let place = if i1 > i0 { 1 } else { 0 };
                let content = if (i0.max(i1) as f32 / area) >= MIN_INK {
                    PatchContent::SignDigit {
                        place,
                        digit: s.digits()[place as usize],
                    }
                } else {
                    PatchContent::SignPlate
                };
                best = PatchLabel {
                    content,
                    coverage: cov,
                };
            }
        }
        if best.coverage < min_coverage {
            best.content = PatchContent::Background;
        }
        labels.push(best);
    }
    Ok(PatchLabels {
        patch,
        grid,
        labels,
    })
}
