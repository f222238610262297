//! glance-world: the synthetic world glance's tiny VLM is trained and evaluated on.
//!
//! * [`scene`]: a seeded [`Scene`] (1–6 objects of 6 colours × 5 shapes × 2 sizes on a 3×3 grid,
//!   a two-digit sign in about half the scenes, a pale plain / gradient / textured background).
//! * [`render()`]: 224×224 RGB rendering; [`labels`]: per-patch ground truth (16×16 at patch 14).
//! * [`qa`]: question families with ground truth and multi-turn dialogues.
//! * [`split`]: disjoint train / validation / test seeds and [`sample()`] → [`Example`].
//! * [`score`]: normalised exact match and description precision / recall / F1.
//! * [`tokenizer`]: the closed word-level vocabulary as HF `tokenizer.json` + `tokenizer_config.json`.
//! * [`write_sample`]: PNGs + `questions.jsonl` for `glance world sample`.
//!
//! Everything is a pure function of a `u64` seed and bit-identical across platforms.

pub mod describe;
mod families;
pub mod labels;
pub mod qa;
pub mod render;
pub mod rng;
pub mod sample;
pub mod scene;
pub mod score;
pub mod shapes;
pub mod split;
pub mod tokenizer;
pub mod vocab;

use std::path::PathBuf;

pub use labels::{
    patch_labels, patch_labels_with, PatchContent, PatchIds, PatchLabel, PatchLabels,
};
pub use qa::{dialogue, generate, question_set, relation, Dialogue, Family, Qa};
pub use render::{pixel_hash, render};
pub use rng::WorldRng;
pub use sample::{write_sample, write_sample_range, SampleSummary};
pub use scene::{
    Background, CellContent, Colour, Object, Position, Scene, Shape, Sign, Size, IMAGE_SIZE,
};
pub use score::{description_prf, exact_match, normalize, Prf};
pub use split::{sample, Example, Split};

/// Errors of the glance world.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("unknown {what} {name:?}")]
    UnknownName { what: &'static str, name: String },
    #[error("index {index} is out of range (must be < {max})")]
    IndexOutOfRange { index: u64, max: u64 },
    #[error("patch size {patch} does not divide the image size {image}")]
    InvalidPatchSize { patch: usize, image: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    // Causes are printed inline and not exposed as `source()`, so `{:#}` prints each once.
    #[error("I/O error on {}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("cannot encode image {}: {cause}", path.display())]
    Image {
        path: PathBuf,
        cause: image::ImageError,
    },
    #[error("JSON error: {0}")]
    Json(serde_json::Error),
}

impl From<serde_json::Error> for WorldError {
    fn from(e: serde_json::Error) -> Self {
        WorldError::Json(e)
    }
}
