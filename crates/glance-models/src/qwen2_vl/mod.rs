//! Qwen2-VL (`Qwen2VLForConditionalGeneration`) and Qwen2.5-VL
//! (`Qwen2_5_VLForConditionalGeneration`): a native-resolution ViT with 2-D rotary positions and
//! a 2×2 patch merger ([`vision`]), and a Qwen2 decoder with multimodal RoPE: each prompt row has
//! a `(temporal, height, width)` position ([`rope_index`]), split over the head's frequencies by
//! `mrope_section`. Images are resized by `smart_resize` to a grid of 28-pixel cells within
//! `[min_pixels, max_pixels]` ([`processor`]). Video input is refused.
//!
//! Reference: Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World
//! at Any Resolution" (2024); Bai et al., "Qwen2.5-VL Technical Report" (2025); transformers
//! `models/qwen2_vl/`, `models/qwen2_5_vl/`.
//! Both checkpoint layouts load: published configs keep the decoder's settings flat with
//! `rope_scaling: {type: mrope}` and the image settings in `preprocessor_config.json`;
//! transformers 5 nests `text_config` with `rope_parameters` and keeps the image settings inside
//! `processor_config.json` (`size: {shortest_edge, longest_edge}`).

mod config;
mod model;
pub mod processor;
mod vision;

pub use config::{Qwen2VlConfig, QwenVisionConfig, QwenVlVersion};
pub use model::{
    largest_part, rope_index, ImageGrid, Qwen2Vl, QwenImageEncoding, QwenWeightLayout,
};
pub use processor::{smart_resize, QwenImageProcessor, QwenPixels, QwenVlProcessor, IMAGE_PAD};
pub use vision::{QwenVision, QwenVisionOutput};
