//! Model architectures of glance, mirroring Hugging Face checkpoints, and their pre-processing.
//!
//! * [`checkpoint`]: a model directory (config, single or sharded safetensors) → a `VarBuilder`;
//! * [`text`]: the Llama-family decoders (Llama, Mistral, Qwen2) behind [`glance_nn::CausalLm`];
//! * [`family`]: which architecture a checkpoint holds (`architectures` / `model_type`);
//! * [`gguf`]: llama.cpp's LLaVA layout (text GGUF + mmproj GGUF) → the same model;
//! * [`llava`]: `LlavaForConditionalGeneration` — CLIP vision tower, projector, text decoder;
//! * [`qwen2_vl`]: Qwen2-VL / Qwen2.5-VL — native-resolution ViT, merger, M-RoPE decoder;
//! * [`internvl`]: InternVL-2.5 / 3 (transformers layout) — tiling, InternViT, pixel shuffle;
//! * [`processing`]: image pre-processing, tokenizer, chat template;
//! * [`presets`]: the model shapes benchmarks build with random weights;
//! * [`quantize`]: a checkpoint rewritten with packed (bf16 / f16 / q8 / q4) weights;
//! * [`twin`]: a small model embedded, function preserved, in a real model's shape.
//!
//! Models return hidden states and logits; they never sample and never know about requests.

pub mod checkpoint;
pub mod draft;
pub mod family;
pub mod gguf;
pub mod internvl;
pub mod llava;
pub mod presets;
pub mod processing;
pub mod quantize;
pub mod qwen2_vl;
pub mod random;
pub mod text;
pub mod twin;
