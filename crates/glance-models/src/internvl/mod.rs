//! InternVL-2.5 / InternVL-3 in transformers' own layout (`InternVLForConditionalGeneration`,
//! model_type `internvl`, the `OpenGVLab/InternVL*-hf` checkpoints): an InternViT vision tower
//! ([`vision`]) run on each tile of a dynamically tiled image plus a thumbnail ([`processor`]),
//! a pixel shuffle that folds each 2×2 block of patches into one token, an MLP projector
//! (LayerNorm → linear → GELU → linear), and a Qwen2 or Llama decoder with 1-D positions. Each
//! image's `<IMG_CONTEXT>` becomes `<img>`, `image_seq_length` tokens per tile, `</img>`. Video
//! input is refused.
//!
//! Reference: Chen et al., "Expanding Performance Boundaries of Open-Source Multimodal Models
//! with Model, Data, and Test-Time Scaling" (InternVL 2.5, 2024); Zhu et al., "InternVL3:
//! Exploring Advanced Training and Test-Time Recipes for Open-Source Multimodal Models" (2025);
//! transformers `models/internvl/`, `models/got_ocr2/image_processing_pil_got_ocr2.py`.
//! The original remote-code checkpoints (`InternVLChatModel`) are a different layout and are not
//! read.

mod config;
mod model;
pub mod processor;
mod vision;

pub use config::{InternVisionConfig, InternVlConfig, VisionNorm};
pub use model::{pixel_shuffle, InternImageEncoding, InternVl, InternWeightLayout};
pub use processor::{
    tiled_canvas, InternImageProcessor, InternPixels, InternVlProcessor, IMG_CONTEXT,
};
pub use vision::{InternVision, InternVisionOutput};
