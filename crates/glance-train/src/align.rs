//! Word–patch alignment of the projected visual tokens (an auxiliary loss of the QA stages).
//!
//! Text-relevance pruning (`text`, `mix`, `adaptive`; after AdaFV) ranks visual tokens by the
//! cosine between the question's pre-LLM word embeddings and the projected visual tokens. That
//! only works when the two are aligned: a projected patch of a red star must point towards the
//! embeddings of "red" and "star", and words that name nothing in the image ("what", "the") must
//! sit equally far from every patch so that they spread their relevance evenly. LLaVA-1.5 gets
//! there through its caption-alignment pre-training; glance-tiny's recipe, trained from scratch
//! on QA alone, has no such pressure. This term supplies it from the world's ground truth:
//!
//! * a patch *matches* the words that describe it — its object's colour, shape (singular and
//!   plural), size and "object(s)"; "sign" and "number" on the sign; and the words of its grid
//!   cell ("top", "left", …) whatever covers it;
//! * loss = `mean_matched (cos − c)² + mean_unmatched cos²` over every patch and every vocabulary
//!   word, with `c` = [`MATCHED_COS`]. Several words match one patch, so `c` is well below 1.
//!
//! Gradients reach the projector and the word embeddings.

use crate::{Result, TrainError};
use candle_core::{Device, Tensor, D};
use glance_models::llava::LlavaProcessor;
use glance_world::{patch_labels, PatchContent, Position, Scene};

/// Target cosine between a patch and each word that describes it.
pub const MATCHED_COS: f64 = 0.3;

/// The vocabulary the alignment ranges over, with each token's column in the targets.
#[derive(Debug, Clone)]
pub struct AlignVocab {
    /// Every token of the tokenizer but the special ones (punctuation and digits included: they
    /// appear in questions too and must spread their relevance evenly), `(v,)` ids.
    pub ids: Vec<u32>,
    index: std::collections::HashMap<String, usize>,
}

impl AlignVocab {
    /// The non-special tokens of `processor`'s vocabulary.
    pub fn new(processor: &LlavaProcessor) -> Result<Self> {
        let tok = &processor.text;
        let mut ids = Vec::new();
        let mut index = std::collections::HashMap::new();
        for id in 0..tok.vocab_size() as u32 {
            let Some(word) = tok.id_to_token(id) else {
                continue;
            };
            if tok.is_special(id) {
                continue;
            }
            index.insert(word, ids.len());
            ids.push(id);
        }
        if ids.is_empty() {
            return Err(TrainError::Config(
                "the tokenizer has no plain tokens to align visual tokens with".into(),
            ));
        }
        Ok(Self { ids, index })
    }

    fn mark(&self, row: &mut [f32], phrase: &str) {
        for w in phrase.split(' ') {
            if let Some(&j) = self.index.get(w) {
                row[j] = 1.0;
            }
        }
    }

    /// 0/1 targets `(patches, v)`, row-major: which words describe each patch of `scene`.
    pub fn targets(&self, scene: &Scene, patch: usize) -> Result<Vec<f32>> {
        let labels = patch_labels(scene, patch)?;
        let (grid, v) = (labels.grid, self.ids.len());
        let mut y = vec![0f32; grid * grid * v];
        // The 3×3 grid cell row (or column) of the centre of patch row (or column) `i`.
        let cell = |i: usize| ((2 * i + 1) * 3 / (2 * grid)).min(2);
        for (p, label) in labels.labels.iter().enumerate() {
            let row = &mut y[p * v..(p + 1) * v];
            if let Some(pos) = Position::at(cell(p / grid), cell(p % grid)) {
                self.mark(row, pos.name());
            }
            match label.content {
                PatchContent::Object {
                    colour,
                    shape,
                    size,
                    ..
                } => {
                    let words = [colour.name(), shape.name(), shape.plural(), size.name()];
                    for w in words.into_iter().chain(["object objects"]) {
                        self.mark(row, w);
                    }
                }
                PatchContent::SignPlate | PatchContent::SignDigit { .. } => {
                    self.mark(row, "sign number")
                }
                PatchContent::Background => {}
            }
        }
        Ok(y)
    }
}

/// The alignment loss of one image's projected tokens `feats` `(n, h)` against the word
/// embeddings `words` `(v, h)` with 0/1 `targets` `(n, v)`.
pub fn loss(feats: &Tensor, words: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let unit = |x: &Tensor| -> Result<Tensor> {
        let norm = (x.sqr()?.sum_keepdim(D::Minus1)? + 1e-12)?.sqrt()?;
        Ok(x.broadcast_div(&norm)?)
    };
    // (n, v) cosines
    let cos = unit(feats)?.matmul(&unit(words)?.t()?)?;
    let matched = targets.sum_all()?.to_scalar::<f32>()? as f64;
    let total = targets.elem_count() as f64;
    let err = (cos - (targets * MATCHED_COS)?)?.sqr()?;
    let on = (&err * targets)?.sum_all()?;
    let off = (&err * (1.0 - targets)?)?.sum_all()?;
    Ok(((on / matched.max(1.0))? + (off / (total - matched).max(1.0))?)?)
}

/// `targets` as a `(n, v)` tensor.
pub fn targets_tensor(y: Vec<f32>, v: usize, device: &Device) -> Result<Tensor> {
    let n = y.len() / v.max(1);
    Ok(Tensor::from_vec(y, (n, v), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_is_zero_exactly_at_the_targets() {
        let dev = Device::Cpu;
        // Orthonormal words; a patch matching words 0 and 1 at cos 0.3 each.
        let words = Tensor::new(
            &[[1f32, 0., 0., 0.], [0., 1., 0., 0.], [0., 0., 1., 0.]],
            &dev,
        )
        .unwrap();
        let rest = (1.0 - 2.0 * MATCHED_COS * MATCHED_COS).sqrt() as f32;
        let c = MATCHED_COS as f32;
        let feats = Tensor::new(&[[c, c, 0., rest], [0., 0., 0., 1.]], &dev).unwrap();
        let y = Tensor::new(&[[1f32, 1., 0.], [0., 0., 0.]], &dev).unwrap();
        let l: f32 = loss(&feats, &words, &y).unwrap().to_scalar().unwrap();
        assert!(l.abs() < 1e-6, "{l}");
        let y = Tensor::new(&[[1f32, 0., 1.], [0., 0., 0.]], &dev).unwrap();
        let l: f32 = loss(&feats, &words, &y).unwrap().to_scalar().unwrap();
        // matched: (0.3-0.3)² + (0-0.3)², unmatched: 0.3² + 0 + 0 + 0
        let want = (0.09 / 2.0 + 0.09 / 4.0) as f32;
        assert!((l - want).abs() < 1e-5, "{l} vs {want}");
    }
}
