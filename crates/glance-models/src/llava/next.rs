//! LLaVA-NeXT's image encoding: the base image and every tile through the CLIP tower and the
//! projector, then `pack_image_features` (transformers `modeling_llava_next.py`): the base image's
//! tokens, then the tiles' patch grid stitched into one, unpadded, each of its rows closed by the
//! `image_newline` row.

use super::anyres::{Anyres, AnyresPixels};
use super::model::{ImageEncoding, Llava};
use super::processor::LlavaProcessor;
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_nn::CausalLm;

/// Where an image's tokens lie in its packed encoding (LLaVA-NeXT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedLayout {
    /// Tokens of the base image (`grid²`), first.
    pub base: usize,
    /// Patches per side of the base image's grid.
    pub grid: usize,
    /// The unpadded tile grid `(rows, cols)` that follows; each row is followed by one newline
    /// token, so it holds `rows · (cols + 1)` tokens.
    pub rows: usize,
    pub cols: usize,
}

impl PackedLayout {
    pub fn len(&self) -> usize {
        self.base + self.rows * (self.cols + 1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether packed token `i` is a newline row.
    pub fn is_newline(&self, i: usize) -> bool {
        i >= self.base && (i - self.base) % (self.cols + 1) == self.cols
    }
}

impl Llava {
    /// The anyres geometry of a LLaVA-NeXT model; `None` for LLaVA-1.5.
    pub fn anyres(&self) -> Option<Anyres> {
        let c = self.config();
        c.grid_pinpoints.as_ref().map(|p| Anyres {
            pinpoints: p.clone(),
            tile: c.vision.image_size,
            grid: c.vision.grid(),
        })
    }

    /// Where the tokens of an image of `height × width` pixels lie in its encoding.
    pub fn packed_layout(&self, height: usize, width: usize) -> Result<PackedLayout> {
        let g = self
            .anyres()
            .ok_or_else(|| Error::InvalidParam("anyres images need a LLaVA-NeXT model".into()))?;
        let (rows, cols) = g.unpadded(height, width);
        Ok(PackedLayout {
            base: g.grid * g.grid,
            grid: g.grid,
            rows: rows.len(),
            cols: cols.len(),
        })
    }

    /// Pre-processes and encodes one image with `processor` (this model's): tiled for LLaVA-NeXT,
    /// one fixed-size image for LLaVA-1.5.
    pub fn encode_picture(
        &self,
        processor: &LlavaProcessor,
        img: &image::DynamicImage,
    ) -> Result<ImageEncoding> {
        let device = self.text().device().clone();
        match processor.anyres() {
            Some(a) => self.encode_anyres(&a.preprocess(img, &device)?),
            None => self.encode_image(&processor.image.preprocess_tensor(img, &device)?),
        }
    }

    /// Encodes one pre-processed LLaVA-NeXT image: `features` `(tokens, text_hidden)` packed as
    /// the module docs say; `vision_hidden` and `cls_attention` are the base image's, `anyres`
    /// holds the layout and the tiles' signals.
    pub fn encode_anyres(&self, image: &AnyresPixels) -> Result<ImageEncoding> {
        let g = self
            .anyres()
            .ok_or_else(|| Error::InvalidParam("anyres images need a LLaVA-NeXT model".into()))?;
        let newline = self.image_newline().ok_or_else(|| Error::MissingTensor {
            name: "image_newline".into(),
        })?;
        let (height, width) = image.size;
        let (tr, tc) = g.tiles(height, width);
        let n = image.pixels.dim(0)?;
        if n != 1 + tr * tc {
            return Err(Error::Input(format!(
                "a {width}x{height} image takes the base image and {} tiles, the pixels hold {n}",
                tr * tc
            )));
        }
        let g2 = g.grid * g.grid;
        let (mut selected, mut hidden, mut attention) = (Vec::new(), Vec::new(), Vec::new());
        let mut base = None;
        for i in 0..n {
            // (3, tile, tile) -> (grid², vision_hidden · n_layers)
            let tower = self.encode_tower(&image.pixels.get(i)?)?;
            selected.push(tower.features.clone());
            if i == 0 {
                base = Some(tower);
                continue;
            }
            // The tile's own signals without its [CLS]: (grid², vision), (grid², heads).
            hidden.push(tower.vision_hidden.narrow(0, 1, g2)?);
            if let Some(a) = &tower.cls_attention {
                attention.push(a.narrow(1, 1, g2)?.t()?);
            }
        }
        let base = base.expect("n >= 1");
        // ((1 + tiles) · grid², vision) -> ((1 + tiles) · grid², text_hidden)
        let projected = self.projector().forward(&Tensor::cat(&selected, 0)?)?;
        let d = projected.dim(1)?;
        let (rows, cols) = g.unpadded(height, width);
        let (uh, uw) = (rows.len(), cols.len());
        let stitch = |x: &Tensor| stitch(x, (tr, tc), g.grid, (&rows, &cols));
        // (uh · uw, d) ++ newline -> (uh, uw + 1, d) -> (uh · (uw + 1), d)
        let grid = stitch(&projected.narrow(0, g2, tr * tc * g2)?)?.reshape((uh, uw, d))?;
        let nl = newline.reshape((1, 1, d))?.broadcast_as((uh, 1, d))?;
        let grid = Tensor::cat(&[&grid, &nl], 1)?.reshape((uh * (uw + 1), d))?;
        let signals = AnyresSignals {
            layout: self.packed_layout(height, width)?,
            tiles: (tr, tc),
            tile_of: (0..uh * uw)
                .map(|i| {
                    let (r, c) = (rows.start + i / uw, cols.start + i % uw);
                    (r / g.grid) * tc + c / g.grid
                })
                .collect(),
            vision: stitch(&Tensor::cat(&hidden, 0)?)?,
            cls_attention: if attention.is_empty() {
                None
            } else {
                Some(stitch(&Tensor::cat(&attention, 0)?)?.t()?.contiguous()?)
            },
        };
        Ok(ImageEncoding {
            features: Tensor::cat(&[&projected.narrow(0, 0, g2)?, &grid], 0)?,
            vision_hidden: base.vision_hidden,
            cls_attention: base.cls_attention,
            anyres: Some(signals),
        })
    }
}

/// A LLaVA-NeXT image's layout and its tiles' signals, per token of the unpadded grid (row-major,
/// without the newline rows).
#[derive(Debug, Clone)]
pub struct AnyresSignals {
    pub layout: PackedLayout,
    /// The tile grid `(rows, cols)` before unpadding.
    pub tiles: (usize, usize),
    /// The tile (row-major index) each grid token comes from.
    pub tile_of: Vec<usize>,
    /// Vision-tower features at the deepest feature layer `(rows · cols, vision_hidden)`.
    pub vision: Tensor,
    /// Each token's own tile's [CLS]→token attention at that layer, `(heads, rows · cols)`.
    pub cls_attention: Option<Tensor>,
}

/// Per-tile rows `(tiles · grid², d)` → the tiles' grid stitched together (row-major over
/// tiles, then patches) and unpadded to `rows × cols`: `(rows.len() · cols.len(), d)`.
fn stitch(
    x: &Tensor,
    (tr, tc): (usize, usize),
    grid: usize,
    (rows, cols): (&std::ops::Range<usize>, &std::ops::Range<usize>),
) -> Result<Tensor> {
    let d = x.dim(1)?;
    // (tr, tc, grid, grid, d) -> (tr, grid, tc, grid, d) -> (tr · grid, tc · grid, d)
    let full = x
        .reshape((tr, tc, grid, grid, d))?
        .permute((0, 2, 1, 3, 4))?
        .contiguous()?
        .reshape((tr * grid, tc * grid, d))?;
    Ok(full
        .narrow(0, rows.start, rows.len())?
        .narrow(1, cols.start, cols.len())?
        .contiguous()?
        .reshape((rows.len() * cols.len(), d))?)
}
