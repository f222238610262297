//! Arguments every generating command shares, and their translation into the engine's types:
//! the model and its thread count, the prompt (`--prompt` with any number of `--image`, or a
//! `--messages` file of OpenAI chat messages), generation settings, the decoding strategy and
//! visual-token pruning. Everything is validated here, before a model is loaded.

use anyhow::{bail, Context, Result};
use clap::Args;
use glance_core::SamplingParams;
use glance_decode::{DiffusionOptions, DiffusionSettings, OptionNames, TreeSettings};
use glance_engine::messages::{read_image_files, read_messages_file, ImageSources};
use glance_engine::{
    Budget, DecodeSpec, Engine, EngineOptions, Message, Policy, Prompt, PruneSpec, Request,
    DEFAULT_MAX_IMAGES,
};
use std::path::{Path, PathBuf};

/// `--model` resolved as [`glance_home::locate`] does (no `--model`: the shipped glance-tiny,
/// installed to the glance home on first use).
pub fn model_dir(arg: Option<&Path>) -> Result<PathBuf> {
    let arg = arg.map(|p| p.to_string_lossy());
    Ok(glance_home::locate(arg.as_deref(), None)?.dir)
}

/// The model to load and the engine's thread count.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// The model: a directory (Hugging Face LLaVA layout: config.json, *.safetensors,
    /// tokenizer.json, …), a shipped model (glance-tiny, glance-tiny-dvlm), a directory under
    /// the glance home's models/, or a Hugging Face repo id (org/name) in the local HF cache
    /// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). `glance models` lists
    /// them. Or a GGUF text model (a `.gguf` file, llama.cpp's LLaVA layout) with its
    /// CLIP/projector GGUF beside it or named by --mmproj. Default: glance-tiny, embedded in this
    /// binary.
    #[arg(long, value_name = "DIR|NAME|ORG/NAME|FILE.gguf")]
    pub model: Option<String>,
    /// The CLIP/projector GGUF ("mmproj") of a GGUF --model. Default: the one `*mmproj*.gguf`
    /// file in the model's folder, if there is exactly one.
    #[arg(long, value_name = "FILE.gguf", requires = "model")]
    pub mmproj: Option<PathBuf>,
    /// The revision of a Hugging Face repo id: a branch, tag or commit hash [default: main].
    #[arg(long, requires = "model")]
    pub revision: Option<String>,
    /// Threads for the tensor kernels (default: one per core; at most 4 per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How the text decoder's linear weights are held: f32, bf16 or f16 (kept as stored when the
    /// checkpoint has that dtype), q8 (8-bit, blocks of 32) or q4 (4-bit Q4_0). The vision tower
    /// and projector use f32 with f32, else a 16-bit float. Default: the format a `glance
    /// quantize` directory records, or that of a GGUF model's weights, else f32; a directory
    /// written by quantize loads in its own format only (a GGUF one converts, saying so).
    #[arg(long, value_parser = parse_weights)]
    pub weights: Option<glance_engine::WeightFormat>,
    #[command(flatten)]
    pub twin: TwinArgs,
}

/// `--twin SHAPE`.
#[derive(Args, Clone, Debug, Default)]
pub struct TwinArgs {
    /// Load the model as its real-shape twin: the same answers, computed by a decoder of the
    /// named shape that streams its bytes and does its multiply-adds — tinyllama-1.1b (22
    /// layers, d2048), llava-7b (Llama-2-7B: 32 layers, d4096), or the decoder of llava-next-7b,
    /// qwen2.5-vl-3b, qwen2.5-vl-7b or internvl2.5-4b (where the model fits the shape: a
    /// refusal names the size that does not). Built at load time in the --weights format
    /// (nothing is written); draft heads load as twins too.
    #[arg(long, value_name = "SHAPE", value_parser = parse_twin)]
    pub twin: Option<glance_engine::TwinShape>,
}

/// `--twin`: a named twin shape (an unknown name lists the shapes).
pub fn parse_twin(s: &str) -> std::result::Result<glance_engine::TwinShape, String> {
    s.parse().map_err(|e: glance_core::Error| e.to_string())
}

/// `--weights`.
pub fn parse_weights(s: &str) -> std::result::Result<glance_engine::WeightFormat, String> {
    s.parse().map_err(|e: glance_core::Error| e.to_string())
}

impl ModelArgs {
    /// The model directory and its name.
    pub fn locate(&self) -> Result<glance_home::Located> {
        Ok(glance_home::locate(
            self.model.as_deref(),
            self.revision.as_deref(),
        )?)
    }

    pub fn dir(&self) -> Result<PathBuf> {
        Ok(self.locate()?.dir)
    }

    /// Loads the engine with `options` and this thread count.
    pub fn engine(&self, options: EngineOptions) -> Result<(PathBuf, Engine)> {
        glance_engine::resolve_threads(self.threads).context("--threads")?;
        let dir = self.dir()?;
        if glance_models::gguf::is_gguf(&dir) && !dir.is_dir() {
            return self.gguf_engine(&dir, options);
        }
        if self.mmproj.is_some() {
            bail!(
                "--mmproj goes with a GGUF --model (a .gguf file), not {}",
                dir.display()
            );
        }
        let weights = match self.weights {
            Some(w) => w,
            None => glance_models::checkpoint::recorded_format(&dir)
                .with_context(|| format!("reading the weights of {}", dir.display()))?
                .unwrap_or(glance_engine::WeightFormat::F32),
        };
        let options = options
            .with_threads(self.threads)
            .with_weights(weights)
            .with_twin(self.twin.twin.clone());
        let engine = Engine::load(&dir, options)
            .with_context(|| format!("loading the model in {}", dir.display()))?;
        Ok((dir, engine))
    }
}

impl ModelArgs {
    /// A GGUF text model and its mmproj; the weights in --weights, else in the file's format.
    /// What the load converts (and an mmproj found beside the model) is printed to stderr.
    fn gguf_engine(&self, text: &Path, options: EngineOptions) -> Result<(PathBuf, Engine)> {
        if self.twin.twin.is_some() {
            bail!("--twin builds from a model directory; it does not apply to a GGUF model");
        }
        let options = options.with_threads(self.threads);
        let (engine, notes) =
            Engine::load_gguf(text, self.mmproj.as_deref(), options, self.weights)
                .with_context(|| format!("loading the GGUF model {}", text.display()))?;
        for note in notes {
            eprintln!("glance: {note}");
        }
        Ok((text.to_path_buf(), engine))
    }
}

/// What to ask: a prompt with images, or a conversation.
#[derive(Args, Clone, Debug)]
pub struct PromptArgs {
    /// Image file (PNG, JPEG or WebP); repeat for several images (they come first in the user turn, in
    /// order).
    #[arg(long, conflicts_with = "messages")]
    pub image: Vec<PathBuf>,
    /// The question or instruction, wrapped in the model's chat template unless --raw.
    #[arg(
        long,
        required_unless_present = "messages",
        conflicts_with = "messages"
    )]
    pub prompt: Option<String>,
    /// A conversation instead of --prompt / --image: a JSON file of OpenAI chat messages (or a
    /// request body with a `messages` list); image parts as file paths, file:// or data: URLs.
    #[arg(long, value_name = "FILE.json")]
    pub messages: Option<PathBuf>,
    /// Use the prompt exactly as given: no chat template, BOS only if the tokenizer adds it, and
    /// one `<image>` placeholder per image where it goes (expanded as transformers'
    /// LlavaProcessor does).
    #[arg(long, conflicts_with = "messages")]
    pub raw: bool,
}

impl PromptArgs {
    /// Reads the images (size-capped) or the messages file; the image count is checked against
    /// the engine's default limit before any image is read.
    pub fn prompt(&self) -> Result<Prompt> {
        if let Some(path) = &self.messages {
            let messages = read_messages_file(path, &ImageSources::AnyFile, DEFAULT_MAX_IMAGES)
                .context("--messages")?;
            return Ok(Prompt::Chat(messages));
        }
        let text = self.prompt.clone().unwrap_or_default();
        let images = read_image_files(&self.image, DEFAULT_MAX_IMAGES).context("--image")?;
        Ok(if self.raw {
            Prompt::Raw { text, images }
        } else {
            Prompt::Chat(vec![Message::user(&text, images)])
        })
    }
}

/// Generation options shared by every command that generates.
#[derive(Args, Clone, Debug)]
pub struct GenArgs {
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample from the smallest set of tokens with this much probability (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Seed of the sampler: the same seed gives the same answer.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sample only among tokens at least this fraction as likely as the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Divide the positive logits (multiply the negative ones) of tokens already in the prompt
    /// or the answer by this (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtract this from the logit of every token already in the answer (-2 to 2; 0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtract this times its count in the answer from a token's logit (-2 to 2; 0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Add BIAS (-100 to 100) to token ID's logit, as `ID=BIAS` (repeatable).
    #[arg(long = "logit-bias", value_name = "ID=BIAS", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// End-of-sequence tokens cannot be picked before the answer has this many tokens.
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// Keep generating after end-of-sequence tokens (up to --max-new-tokens or a --stop).
    #[arg(long)]
    pub ignore_eos: bool,
    /// With --json: each token's log-probability and its N most likely alternatives (0 to 20).
    #[arg(long, value_name = "N")]
    pub logprobs: Option<usize>,
    /// Stop when the answer contains this text (repeatable); the text itself is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub decode: DecodeArgs,
}

/// `ID=BIAS` of `--logit-bias`.
fn parse_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected ID=BIAS, e.g. 42=-100"))?;
    let id = id
        .trim()
        .parse::<u32>()
        .map_err(|e| format!("`{s}`: token id: {e}"))?;
    let bias = bias
        .trim()
        .parse::<f32>()
        .map_err(|e| format!("`{s}`: bias: {e}"))?;
    Ok((id, bias))
}

impl GenArgs {
    /// A validated request for `prompt`.
    pub fn request(&self, prompt: Prompt, prune: Option<PruneSpec>) -> Result<Request> {
        if self.max_new_tokens == 0 {
            bail!("--max-new-tokens must be at least 1");
        }
        let request = Request {
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                logit_bias: self.logit_bias.iter().copied().collect(),
                min_tokens: self.min_tokens,
            },
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs,
            max_new_tokens: self.max_new_tokens,
            stop: self.stop.clone(),
            prune,
            decode: self.decode.spec()?,
            ..Request::new(prompt)
        };
        request.validate()?;
        Ok(request)
    }
}

/// The decoding strategy.
#[derive(Args, Clone, Debug, Default)]
pub struct DecodeArgs {
    /// Decoding strategy: `auto` (the fastest lossless strategy the model offers on this
    /// machine, chosen per request from a cost model measured once and cached: cost-aware
    /// speculation where a draft can pay, else `ar`), `ar` (autoregressive, one token per
    /// forward pass), `vispec`
    /// (speculative decoding with the vision-aware ViSpec draft head), `eagle` (the same with
    /// the text-only head), or, on a model converted with `glance train diffusion`,
    /// `diffusion-threshold` (parallel unmasking, lossy), `diffusion-linear` or
    /// `diffusion-quadratic` (block-diffusion self-speculation). Every strategy but
    /// diffusion-threshold gives the same output as `ar` under greedy decoding.
    #[arg(long, value_name = "STRATEGY", default_value = "auto")]
    pub decode: String,
    /// Draft head directory for vispec / eagle (repeatable, one per kind; each serves the kind
    /// its config names). When given, only these heads are used. Default: the model
    /// directory's draft-vispec/ or draft-eagle/.
    #[arg(long, value_name = "DIR")]
    pub draft: Vec<PathBuf>,
    #[command(flatten)]
    pub tree: TreeArgs,
    #[command(flatten)]
    pub diffusion: DiffusionFlags,
}

impl DecodeArgs {
    /// The strategy with the tree and block-diffusion settings the flags give it; a flag that
    /// does not apply to it (`--draft` or a tree flag without a speculative strategy, a block
    /// flag without a diffusion one) is refused naming both.
    pub fn spec(&self) -> Result<DecodeSpec> {
        let tree = self.tree.any().then(|| self.tree.settings()).transpose()?;
        let spec = DecodeSpec::parse_with(
            &self.decode,
            tree,
            &self.diffusion.options(),
            &OptionNames::FLAGS,
        )?;
        if !self.draft.is_empty() && spec.draft_kind().is_none() && !spec.is_auto() {
            bail!("--draft applies to --decode vispec, eagle or auto, not `{spec}`");
        }
        Ok(spec)
    }

    /// A server's default strategy, by name: the tree, block-diffusion flags and draft heads
    /// become the engine's defaults ([`Self::engine_options`]) for every request, whichever
    /// strategy it names, so they are allowed with any default strategy here.
    pub fn server_spec(&self) -> Result<DecodeSpec> {
        let spec = self.decode.parse::<DecodeSpec>()?;
        self.diffusion.settings(&spec)?;
        Ok(spec)
    }

    /// `base` with the draft heads, tree and block-diffusion settings of the flags.
    pub fn engine_options(&self, base: EngineOptions) -> Result<EngineOptions> {
        Ok(EngineOptions {
            drafts: self.draft.clone(),
            tree: self.tree.settings()?,
            diffusion: self.diffusion.settings(&self.server_spec()?)?,
            cost_cache: glance_home::cache_root().map(|d| d.join("cost")),
            ..base
        })
    }
}

/// Block-diffusion decoding.
#[derive(Args, Clone, Debug, Default)]
pub struct DiffusionFlags {
    /// Block diffusion: tokens per block B, 1 to 64 [default: the model's `block_diffusion`
    /// block size]. With --dynamic-block, the first block size.
    #[arg(long, value_name = "B")]
    pub block: Option<usize>,
    /// diffusion-threshold: unmask every slot whose confidence is at least τ (at least one per
    /// pass) [default: 0.9].
    #[arg(long, value_name = "TAU")]
    pub threshold: Option<f32>,
    /// Block diffusion: grow the block (doubling, up to 32) while every draft is accepted, halve
    /// it (down to 2) when fewer than a quarter are.
    #[arg(long)]
    pub dynamic_block: bool,
}

impl DiffusionFlags {
    /// The flags as the library takes them.
    pub fn options(&self) -> DiffusionOptions {
        DiffusionOptions {
            block: self.block,
            threshold: self.threshold,
            dynamic: self.dynamic_block,
        }
    }

    /// The settings the flags give `spec` (`None` when no flag is set: the model's defaults
    /// apply); a flag that does not apply to `spec` is refused naming both.
    pub fn settings(&self, spec: &DecodeSpec) -> Result<Option<DiffusionSettings>> {
        Ok(self.options().settings_for(spec, &OptionNames::FLAGS)?)
    }
}

/// The draft tree of speculative decoding.
#[derive(Args, Clone, Debug, Default)]
pub struct TreeArgs {
    /// Speculative decoding: most draft tokens on one path of the tree [default: 6].
    #[arg(long, value_name = "N")]
    pub draft_depth: Option<usize>,
    /// Speculative decoding: children per expanded node and nodes expanded per depth
    /// [default: 2].
    #[arg(long, value_name = "K")]
    pub draft_top_k: Option<usize>,
    /// Speculative decoding: most draft tokens verified per target pass [default: 8].
    #[arg(long, value_name = "N")]
    pub draft_budget: Option<usize>,
    /// Speculative decoding: draft a chain (the most likely token at each depth) instead of a
    /// tree.
    #[arg(long)]
    pub chain: bool,
}

impl TreeArgs {
    /// Whether any tree flag is given.
    pub fn any(&self) -> bool {
        self.draft_depth.is_some()
            || self.draft_top_k.is_some()
            || self.draft_budget.is_some()
            || self.chain
    }

    /// The draft tree the flags describe.
    pub fn settings(&self) -> Result<TreeSettings> {
        let base = TreeSettings::default();
        let depth = self.draft_depth.unwrap_or(base.depth);
        let mut tree = if self.chain {
            if self.draft_top_k.is_some_and(|k| k != 1) {
                bail!("--chain drafts one token per depth: --draft-top-k must be 1 or absent");
            }
            TreeSettings::chain(depth)
        } else {
            TreeSettings {
                depth,
                top_k: self.draft_top_k.unwrap_or(base.top_k),
                ..base
            }
        };
        if let Some(b) = self.draft_budget {
            tree.budget = b;
        }
        tree.validate()?;
        Ok(tree)
    }
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
    /// LLaVA-NeXT: share each image's budget between its base image and tiles by size
    /// (`global`, the default) or by the base image's attention over each tile (`per-tile`,
    /// HiRED).
    #[arg(long, value_name = "global|per-tile")]
    pub prune_tiles: Option<String>,
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
        if let Some(t) = &self.prune_tiles {
            spec.tiles = t.parse()?;
        }
        spec.validate()?;
        Ok(spec)
    }

    /// The spec, or `None` when it changes nothing.
    pub fn request_spec(&self) -> Result<Option<PruneSpec>> {
        let spec = self.spec()?;
        Ok((!spec.is_noop()).then_some(spec))
    }
}

/// Checks before a long job that `path` can be written (creating its directory), so that a bad
/// `--json` path fails now rather than after the work.
pub fn check_writable(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.is_dir() {
        bail!("{} is a directory; give a file name", path.display());
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("{} cannot be written", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritable_outputs_fail_early() {
        let dir = std::env::temp_dir();
        assert!(check_writable(&dir).is_err());
        assert!(check_writable(Path::new("/proc/no/such/dir/out.json")).is_err());
    }
}
