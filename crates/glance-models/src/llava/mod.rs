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

mod config;
mod model;
mod plan;
mod processor;
mod projector;
mod vision;

pub use config::{BlockDiffusionConfig, FeatureSelect, LlavaConfig, VisionConfig};
pub use model::{ImageEncoding, Llava, WeightLayout};
pub use plan::{plan_1d, PromptPlan, Segment, SegmentKind};
pub use processor::{LlavaProcessor, PreparedPrompt, ProcessorFiles, PromptFormat};
pub use projector::Projector;
pub use vision::{ClipVision, VisionOutput};
