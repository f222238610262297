//! LLaVA (`LlavaForConditionalGeneration`, the layout of llava-hf/llava-1.5-7b-hf): a CLIP vision
//! tower, a two-layer MLP projector and a Llama-family decoder. Image features replace the
//! `<image>` placeholder rows of the prompt.
//!
//! Reference: Liu et al., "Visual Instruction Tuning" (2023) and "Improved Baselines with Visual
//! Instruction Tuning" (2024); transformers `models/llava/modeling_llava.py`.
//! Quirks: `vision_feature_layer` indexes HF's `hidden_states` tuple (index 0 = embeddings after
//! `pre_layrnorm`, so -2 is the output of the second-to-last layer); strategy `default` drops [CLS].
//! Checkpoints saved by transformers < 4.52 name weights `language_model.model.*`,
//! `language_model.lm_head`, `vision_tower.*`, `multi_modal_projector.*`; newer ones
//! `model.language_model.*`, `lm_head`, `model.vision_tower.*`, `model.multi_modal_projector.*`.
//! Both load.
//!
//! LLaVA-NeXT (`LlavaNextForConditionalGeneration`, LLaVA-1.6) is the same model with "anyres"
//! images ([`anyres`], [`next`]): the image is tiled onto the best of `image_grid_pinpoints`;
//! the base image and every tile go through the tower and projector; the tiles' grid is
//! unpadded and each of its rows closed by `image_newline`. An image's token count depends on
//! its size ([`LlavaProcessor::tokens_for`]); the rest (plan, decoder) is LLaVA's. Reference:
//! transformers `models/llava_next/`. Both its layouts load: image settings in
//! `preprocessor_config.json` or inside `processor_config.json`, `image_newline` at the top
//! level or under `model.`.

mod anyres;
mod config;
mod model;
mod next;
mod plan;
mod processor;
mod projector;
mod vision;

pub use anyres::{check_pinpoints, Anyres, AnyresPixels, AnyresProcessor};
pub use config::{
    BlockDiffusionConfig, FeatureSelect, LlavaConfig, VisionConfig, DEFAULT_PINPOINTS,
};
pub use model::{ImageEncoding, Llava, WeightLayout};
pub use next::{AnyresSignals, PackedLayout};
pub use plan::{plan_1d, PromptPlan, Segment, SegmentKind};
pub use processor::{LlavaProcessor, PreparedPrompt, ProcessorFiles, PromptFormat};
pub use projector::Projector;
pub use vision::{ClipVision, VisionOutput};
