//! Loading a model directory into everything a request needs, with timings; the visual-token
//! pruning options every generating command shares (`--prune`, `--keep`, `--tau`,
//! `--prune-layer`).

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use clap::Args;
use glance_models::llava::{
    ImageEncoding, Llava, LlavaConfig, LlavaProcessor, PreparedPrompt, PromptFormat,
};
use glance_models::processing::image::load_image;
use glance_prune::{Budget, Policy, PruneSpec, PrunedPrefill};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What every single-image command takes: a model, an image and a prompt.
#[derive(clap::Args)]
pub struct InputArgs {
    /// Model directory (Hugging Face LLaVA layout: config.json, *.safetensors, tokenizer.json, …).
    #[arg(long)]
    pub model: PathBuf,
    /// Image file (PNG or JPEG).
    #[arg(long)]
    pub image: PathBuf,
    /// The question or instruction, wrapped in the model's chat template unless --raw.
    #[arg(long)]
    pub prompt: String,
    /// Use the prompt exactly as given: no chat template, BOS only if the tokenizer adds it, and
    /// an `<image>` placeholder where the image goes (expanded as transformers' LlavaProcessor does).
    #[arg(long)]
    pub raw: bool,
}

impl InputArgs {
    pub fn format(&self) -> PromptFormat {
        if self.raw {
            PromptFormat::Raw
        } else {
            PromptFormat::Chat
        }
    }
}

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
        let config = LlavaConfig::from_dir(dir)
            .with_context(|| format!("loading the model config from {}", dir.display()))?;
        let processor = LlavaProcessor::from_dir(dir, &config).with_context(|| {
            format!("loading the tokenizer / preprocessor of {}", dir.display())
        })?;
        let model = Llava::load(dir, &Device::Cpu)
            .with_context(|| format!("loading the weights of {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            model,
            processor,
            load_time: start.elapsed(),
        })
    }

    /// Token ids of the text query pruning policies read: `text` with any image placeholder
    /// removed, without special tokens.
    pub fn query_ids(&self, text: &str) -> Result<Vec<u32>> {
        let text = text.replace(self.processor.image_token(), " ");
        Ok(self.processor.text.encode_plain(&text)?)
    }
}

/// A prompt and its image, ready for the decoder.
pub struct Prepared {
    pub prompt: PreparedPrompt,
    /// Prompt rows `(t, hidden)`, unpruned.
    pub embeddings: Tensor,
    /// The image after the vision tower and projector.
    pub encoding: ImageEncoding,
    /// The text query for pruning: the user's prompt.
    pub query_ids: Vec<u32>,
    pub preprocess_time: Duration,
    pub vision_time: Duration,
}

/// Decodes and pre-processes `image`, encodes it, tokenises `prompt` and builds the embeddings.
pub fn prepare(vlm: &Vlm, image: &Path, prompt: &str, format: PromptFormat) -> Result<Prepared> {
    let start = Instant::now();
    let prepared = vlm.processor.prepare(prompt, 1, format)?;
    let query_ids = vlm.query_ids(prompt)?;
    let img = load_image(image)?;
    let pixels = vlm.processor.image.preprocess_tensor(&img, &Device::Cpu)?;
    let preprocess_time = start.elapsed();
    let start = Instant::now();
    let encoding = vlm.model.encode_image(&pixels)?;
    let embeddings = vlm
        .model
        .embed_prompt(&prepared.ids, &[&encoding.features])?;
    Ok(Prepared {
        prompt: prepared,
        embeddings,
        encoding,
        query_ids,
        preprocess_time,
        vision_time: start.elapsed(),
    })
}

/// Prefills a prepared prompt, pruning its visual tokens as `spec` says.
pub fn prefill(vlm: &Vlm, prep: &Prepared, spec: &PruneSpec) -> Result<PrunedPrefill> {
    Ok(glance_prune::prefill_llava(
        &vlm.model,
        &prep.prompt.ids,
        &[&prep.encoding],
        &prep.query_ids,
        spec,
    )?)
}

/// Visual-token pruning options.
#[derive(Args, Clone, Debug, Default)]
pub struct PruneArgs {
    /// Visual-token pruning policy: none, random, pool, saliency, text, mix, adaptive, fastv or
    /// hier. A bare budget (`--prune 0.25`) means `adaptive` with that budget.
    #[arg(long, value_name = "POLICY")]
    pub prune: Option<String>,
    /// Visual tokens to keep: a ratio (0.25), a percentage (25%) or a count (64). Default 25% when
    /// a policy is given; alone, it implies `--prune adaptive`.
    #[arg(long, value_name = "RATIO|COUNT")]
    pub keep: Option<String>,
    /// Temperature of the text-relevance scores (and of the [CLS]-cosine saliency).
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub tau: Option<f32>,
    /// FastV only: drop visual rows after this decoder layer (default 2, or the last layer
    /// boundary of a shallower model).
    #[arg(long, value_name = "LAYER")]
    pub prune_layer: Option<usize>,
}

/// The default budget when a policy is given without `--keep`.
const DEFAULT_KEEP: Budget = Budget::Ratio(0.25);

impl PruneArgs {
    /// The validated pruning request.
    pub fn spec(&self) -> Result<PruneSpec> {
        let keep = self.keep.as_deref().map(str::parse::<Budget>).transpose()?;
        let (policy, budget) = match self.prune.as_deref() {
            None => match keep {
                None => (Policy::None, Budget::Ratio(1.0)),
                Some(b) => (Policy::Adaptive, b),
            },
            Some(p) => match (p.parse::<Policy>(), p.parse::<Budget>()) {
                (Ok(policy), _) => (policy, keep.unwrap_or(DEFAULT_KEEP)),
                (Err(_), Ok(b)) if keep.is_none() => (Policy::Adaptive, b),
                (Err(_), Ok(_)) => bail!(
                    "give the budget once: `--prune {p}` already is one, and --keep is set too"
                ),
                (Err(e), Err(_)) => return Err(e.into()),
            },
        };
        let mut spec = PruneSpec::new(policy, budget);
        if let Some(t) = self.tau {
            spec.tau = t;
        }
        if let Some(l) = self.prune_layer {
            if policy != Policy::FastV {
                bail!("--prune-layer only applies to --prune fastv");
            }
            spec.fastv_layer = Some(l);
        }
        spec.validate()?;
        Ok(spec)
    }
}
