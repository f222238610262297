//! glance-train: training on candle autograd, CPU first.
//!
//! The world VLM recipe (`glance train world`), in stages over one set of parameters:
//!
//! 1. [`Stage::Vision`] — the CLIP-style tower alone, with dense supervision from the world's
//!    ground truth: per-patch heads (kind / colour / shape / size / digit of what covers each
//!    patch) and a multi-label [CLS] head over the scene's object set ([`heads`]);
//! 2. [`Stage::Llava`] — projector + decoder with the tower frozen (its features computed with
//!    the fused inference ops and detached), on sequences that pack several independent QA
//!    turns per image over one shared image prefix ([`packing`]); loss on answer tokens only;
//! 3. [`Stage::EndToEnd`] — optional short fine-tune of everything on the same sequences.
//!
//! Training uses the models of glance-models built with `Mode::Train` (composed, differentiable
//! softmax / norms / RoPE: candle's fused kernels have no backward pass). Parameters live in one
//! `VarMap` under HF hub names, so export is a rename-free dump ([`export`]).
//!
//! Modules: [`config`] (sizes, presets, stages), [`params`] (init, parameter groups),
//! [`metrics`] (the typed `metrics.jsonl` records),
//! [`optim`] (AdamW + warm-up/cosine + global-norm clipping), [`data`] (world stream),
//! [`step`] (losses), [`token_drop`] (training on pruned visual tokens), [`align`] (word–patch
//! alignment of the projected tokens), [`trainer`] (the loop, checkpoints, resume; validation
//! through `glance_engine::eval`, the runner `glance eval` uses), [`checkpoint`], [`runtime`]
//! (thread and allocator settings for CPU training).
//!
//! `glance train draft` ([`draft`]): an EAGLE / ViSpec draft head for a frozen LLaVA target,
//! trained on the target's own answers to world prompts (multi-pass "training-time test").

pub mod align;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod diffusion;
pub mod draft;
mod error;
pub mod export;
pub mod heads;
pub mod interrupt;
pub mod metrics;
pub mod optim;
pub mod packing;
pub mod params;
mod run_loop;
pub mod runtime;
pub mod step;
pub mod token_drop;
pub mod trainer;

pub use config::{Budget, ModelSpec, OptimSpec, Stage, StageSpec, TrainConfig};
pub use data::{TurnMix, Turns};
pub use error::{Result, TrainError};
pub use params::TrainModel;
pub use token_drop::TokenDrop;
pub use trainer::{Observer, StepReport, Trainer};
