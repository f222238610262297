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

/// The default model: glance-tiny, trained on the glance world.
pub const DEFAULT_MODEL: &str = "models/glance-tiny";

/// `--model`, or else the default model: `models/glance-tiny` under the current directory, or
/// failing that under the source tree this binary was built from.
pub fn model_dir(arg: Option<&Path>) -> Result<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = manifest.ancestors().nth(2).unwrap_or(manifest);
    resolve_model(
        arg,
        &[PathBuf::from(DEFAULT_MODEL), repo.join(DEFAULT_MODEL)],
    )
}

/// `arg` if given, else the first of `candidates` that is a directory.
fn resolve_model(arg: Option<&Path>, candidates: &[PathBuf]) -> Result<PathBuf> {
    if let Some(dir) = arg {
        return Ok(dir.to_path_buf());
    }
    if let Some(dir) = candidates.iter().find(|c| c.is_dir()) {
        return Ok(dir.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    bail!(
        "no --model given and the default model (glance-tiny) is not installed (looked in {}); \
         pass --model DIR with a Hugging Face LLaVA directory, e.g. --model fixtures/models/llama-gqa",
        looked.join(" and ")
    )
}

/// What every single-image command takes: a model, an image and a prompt.
#[derive(clap::Args)]
pub struct InputArgs {
    /// Model directory (Hugging Face LLaVA layout: config.json, *.safetensors, tokenizer.json, …).
    /// Default: models/glance-tiny (in the current directory, else in the glance source tree).
    #[arg(long)]
    pub model: Option<PathBuf>,
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
    /// Loads the model and prepares this prompt and image for it.
    pub fn load_and_prepare(&self) -> Result<(Vlm, Prepared)> {
        let vlm = Vlm::load(&self.model_dir()?)?;
        let prepared = prepare(&vlm, &self.image, &self.prompt, self.format())?;
        Ok((vlm, prepared))
    }

    /// The model directory: `--model` or the default.
    pub fn model_dir(&self) -> Result<PathBuf> {
        model_dir(self.model.as_deref())
    }

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
        Ok(self.processor.query_ids(text)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_defaults_to_the_first_existing_candidate() {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let missing = here.join("no-such-model");
        let given = Path::new("/given/model");
        let r = resolve_model(Some(given), std::slice::from_ref(&missing)).unwrap();
        assert_eq!(r, given);
        let r = resolve_model(None, &[missing.clone(), here.clone()]).unwrap();
        assert_eq!(r, here);
        let e = resolve_model(None, std::slice::from_ref(&missing)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("--model DIR"), "{msg}");
        assert!(msg.contains("no-such-model"), "{msg}");
    }
}
