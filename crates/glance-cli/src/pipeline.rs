//! Loading a model directory into everything a request needs, with timings.

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use glance_models::llava::{Llava, LlavaConfig, LlavaProcessor, PreparedPrompt, PromptFormat};
use glance_models::processing::image::load_image;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A loaded LLaVA checkpoint with its processors.
pub struct Vlm {
    pub dir: PathBuf,
    pub model: Llava,
    pub processor: LlavaProcessor,
    pub load_time: Duration,
}

impl Vlm {
    pub fn load(dir: &Path) -> Result<Self> {
        let start = Instant::now();
        let config = LlavaConfig::from_dir(dir).with_context(|| format!("loading the model config from {}", dir.display()))?;
        let processor = LlavaProcessor::from_dir(dir, &config)
            .with_context(|| format!("loading the tokenizer / preprocessor of {}", dir.display()))?;
        let model = Llava::load(dir, &Device::Cpu).with_context(|| format!("loading the weights of {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            model,
            processor,
            load_time: start.elapsed(),
        })
    }
}

/// A prompt and its image, ready for the decoder.
pub struct Prepared {
    pub prompt: PreparedPrompt,
    /// Prompt rows `(t, hidden)`.
    pub embeddings: Tensor,
    pub preprocess_time: Duration,
    pub vision_time: Duration,
}

/// Decodes and pre-processes `image`, encodes it, tokenises `prompt` and builds the embeddings.
pub fn prepare(vlm: &Vlm, image: &Path, prompt: &str, format: PromptFormat) -> Result<Prepared> {
    let start = Instant::now();
    let prepared = vlm.processor.prepare(prompt, 1, format)?;
    let img = load_image(image)?;
    let pixels = vlm.processor.image.preprocess_tensor(&img, &Device::Cpu)?;
    let preprocess_time = start.elapsed();
    let start = Instant::now();
    let encoding = vlm.model.encode_image(&pixels)?;
    let embeddings = vlm.model.embed_prompt(&prepared.ids, &[&encoding.features])?;
    Ok(Prepared {
        prompt: prepared,
        embeddings,
        preprocess_time,
        vision_time: start.elapsed(),
    })
}
