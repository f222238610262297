//! [`Engine`]: a loaded model, its processors, its thread pool and caches, and the one request
//! path every command (and the server) goes through:
//!
//! ```text
//! Request ─→ render + tokenise ─→ images: decode → pre-process → encode (cached by content)
//!         ─→ prompt plan (rows embedded once) ─→ [pruning: transform of the plan]
//!         ─→ prefill (prefix cache on the unpruned path) ─→ DecodeStrategy ─→ stop strings ─→ Response
//! ```
//!
//! An `Arc<Engine>` serves several threads at once: the model is read-only, every request has its
//! own KV cache, sampler and detokeniser, and the shared caches hand out immutable entries (a
//! cached prefix is forked before a request appends to it).

mod auto;
mod finite;
mod gguf;
mod internvl;
pub mod model;
mod output;
mod qwen;
pub(crate) mod scheduler;

use crate::cache::{CachedEncoding, ContentHasher, Encoding, EncodingCache, ImageKey, PrefixCache};
use crate::options::{thread_pool, EngineOptions};
use crate::request::{ImageInput, KeptPatches, Message, Part, Prompt, Request};
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use glance_decode::{
    Autoregressive, BlockDiffusion, DecodeSpec, DecodeStrategy, DiffusionSettings, Grammar,
    GrammarVocab, LogprobSink, OutputFormat, Prefilled, PrefilledImage, Sampler, Speculative,
};
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::family::Family;
use glance_models::llava::{
    Llava, LlavaConfig, LlavaProcessor, PreparedPrompt, PromptFormat, PromptPlan,
};
pub use model::{Model, ModelConfig, Processor, TextRef};

use glance_models::processing::chat::{ChatMessage, ContentPart};
use glance_models::processing::image::decode_image_with_limit;
use glance_nn::{AttnMask, CausalLm, DraftKind, DraftLm};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Entries and bytes held by the engine's caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub images: usize,
    pub image_bytes: usize,
    pub prefixes: usize,
    pub prefix_bytes: usize,
}

/// A loaded vision-language checkpoint (LLaVA, Qwen2-VL, Qwen2.5-VL) ready to answer requests.
pub struct Engine {
    dir: Option<PathBuf>,
    model: Model,
    processor: Processor,
    pool: rayon::ThreadPool,
    threads: usize,
    options: EngineOptions,
    hasher: ContentHasher,
    encodings: EncodingCache,
    prefixes: PrefixCache,
    /// Draft heads loaded so far, by kind.
    drafts: Mutex<HashMap<DraftKind, Arc<dyn DraftLm>>>,
    /// The measured cost model, once a request needed it ([`auto`]).
    cost: Mutex<Option<glance_decode::CostModel>>,
    /// The kinds of the heads `--draft` names, once read ([`auto`]).
    named_kinds: std::sync::OnceLock<Vec<DraftKind>>,
    /// The tokens as bytes for constrained decoding, built on first use (`Err`: the tokenizer
    /// cannot spell arbitrary text).
    grammar_vocab: std::sync::OnceLock<std::result::Result<GrammarVocab, String>>,
    /// What `auto`'s greedy requests met (acceptance, the clock), per draft head (by its
    /// address).
    plan_memory: Mutex<HashMap<usize, Arc<Mutex<glance_decode::speculative::plan::Memory>>>>,
    load_time: Duration,
}

/// A prompt rendered and tokenised, with its images.
struct Rendered<'a> {
    prompt: PreparedPrompt,
    /// The text query pruning policies read (every message's text).
    query: String,
    images: Vec<&'a ImageInput>,
}

/// A prompt prefilled before it reaches the scheduler (a pruned Qwen2-VL prompt), and what its
/// pruning did.
struct PrefillOutcome {
    state: Prefilled,
    /// Visual tokens kept by pruning (`None`: every one).
    kept_visual: Option<usize>,
    /// The patches each image kept (empty: every one).
    kept_patches: Vec<KeptPatches>,
    select: Duration,
}

/// An image after the encoding step.
struct Encoded {
    key: ImageKey,
    entry: Arc<CachedEncoding>,
    hit: bool,
}

impl Engine {
    /// Loads a Hugging Face checkpoint directory (config, weights, tokenizer, pre-processor) of
    /// any family glance runs ([`Family`], from `config.json`).
    pub fn load(dir: &Path, options: EngineOptions) -> Result<Self> {
        let threads = options.validate()?;
        let pool = thread_pool(threads)?;
        let start = Instant::now();
        let family = Family::of_dir(dir)?;
        if options.twin.is_some() && !family.is_llava() {
            return Err(Error::InvalidParam(format!(
                "twins embed LLaVA checkpoints only, not {} ones",
                family.name()
            )));
        }
        let (model, processor) = pool.install(|| match family {
            f if f.is_llava() => Self::build_llava(dir, &options),
            Family::InternVl => Self::build_internvl(dir, &options),
            _ => Self::build_qwen(dir, &options),
        })?;
        let mut engine = Self::assemble(model, processor, options, pool, threads);
        engine.dir = Some(dir.to_path_buf());
        engine.load_time = start.elapsed();
        Ok(engine)
    }

    /// The model and processor of a LLaVA (or LLaVA-NeXT) checkpoint, or its twin.
    fn build_llava(dir: &Path, options: &EngineOptions) -> Result<(Model, Processor)> {
        let config = LlavaConfig::from_dir(dir)?;
        let processor = LlavaProcessor::from_dir(dir, &config)?;
        let mut model = match &options.twin {
            Some(shape) => {
                glance_models::twin::load_llava(dir, &Device::Cpu, options.weights, shape)?
            }
            None => Llava::load_as(dir, &Device::Cpu, options.weights)?,
        };
        // Ids the tokenizer cannot decode are never produced, by any strategy.
        model.limit_vocab(processor.text.id_limit());
        Ok((
            Model::Llava(Arc::new(model)),
            Processor::llava_processor(Arc::new(processor)),
        ))
    }

    /// An engine over a model already in memory (e.g. the weights being trained). Unlike
    /// [`Engine::load`], the model's logits are used as they are: call [`Llava::limit_vocab`]
    /// first if its vocabulary holds ids the tokenizer cannot decode.
    pub fn from_parts(
        model: Arc<Llava>,
        processor: Arc<LlavaProcessor>,
        options: EngineOptions,
    ) -> Result<Self> {
        let threads = options.validate()?;
        let pool = thread_pool(threads)?;
        Ok(Self::assemble(
            Model::Llava(model),
            Processor::llava_processor(processor),
            options,
            pool,
            threads,
        ))
    }

    fn assemble(
        model: Model,
        processor: Processor,
        options: EngineOptions,
        pool: rayon::ThreadPool,
        threads: usize,
    ) -> Self {
        Self {
            dir: None,
            model,
            processor,
            pool,
            threads,
            hasher: ContentHasher::new(),
            encodings: EncodingCache::new(options.image_cache_bytes),
            prefixes: PrefixCache::new(options.prefix_cache_bytes),
            drafts: Mutex::new(HashMap::new()),
            cost: Mutex::new(None),
            named_kinds: std::sync::OnceLock::new(),
            grammar_vocab: std::sync::OnceLock::new(),
            plan_memory: Mutex::new(HashMap::new()),
            options,
            load_time: Duration::ZERO,
        }
    }

    /// The model ([`Model::llava`] for LLaVA-only tools).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The processors: `processor().text` is the tokenizer ([`Processor::llava`] for LLaVA-only
    /// tools).
    pub fn processor(&self) -> &Processor {
        &self.processor
    }

    /// The directory the model was loaded from (`None` for [`Engine::from_parts`]).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Threads of the engine's pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// What the shared caches hold now.
    pub fn cache_stats(&self) -> CacheStats {
        let (images, image_bytes) = self.encodings.usage();
        let (prefixes, prefix_bytes) = self.prefixes.usage();
        CacheStats {
            images,
            image_bytes,
            prefixes,
            prefix_bytes,
        }
    }

    /// Makes `head` the draft of its kind (`vispec` or `eagle`) for later requests, replacing
    /// any loaded before. The head must fit the model (see [`DraftConfig::check_target`]).
    pub fn set_draft(&self, head: Arc<dyn DraftLm>) {
        let kind = head.kind();
        let new = auto::head_key(&head);
        let old = self.drafts.lock().expect("not poisoned").insert(kind, head);
        // A replaced head's memory (acceptance, clock) goes with it (its address may be reused).
        if let Some(old) = old.map(|h| auto::head_key(&h)).filter(|&k| k != new) {
            self.plan_memory.lock().expect("not poisoned").remove(&old);
        }
    }

    /// The draft head of `kind`: loaded before, else the one of [`EngineOptions::drafts`] of
    /// that kind, else from the model directory's `draft-{kind}/`. Heads named in
    /// [`EngineOptions::drafts`] are the only ones used when any is named: a kind they lack is
    /// refused naming the heads given (never silently replaced by the model directory's), and
    /// two heads of one kind are refused as ambiguous.
    pub fn draft(&self, kind: DraftKind) -> Result<Arc<dyn DraftLm>> {
        if let Some(h) = self.drafts.lock().expect("not poisoned").get(&kind) {
            return Ok(h.clone());
        }
        let mut looked = Vec::new();
        let mut given: Vec<(&Path, DraftKind)> = Vec::new();
        for dir in &self.options.drafts {
            given.push((dir, DraftConfig::load(dir)?.kind()));
        }
        let of_kind: Vec<&Path> = given
            .iter()
            .filter(|(_, k)| *k == kind)
            .map(|(d, _)| *d)
            .collect();
        match of_kind.as_slice() {
            [dir] => return self.load_draft(dir),
            [] if !given.is_empty() => {
                let named: Vec<String> = given
                    .iter()
                    .map(|(d, k)| format!("{} ({k} head)", d.display()))
                    .collect();
                return Err(Error::Config(format!(
                    "--decode {kind} needs a {kind} draft head, but --draft names only {}; pass \
                     --draft with a {kind} head",
                    named.join(", ")
                )));
            }
            [] => {}
            several => {
                let named: Vec<String> = several.iter().map(|d| d.display().to_string()).collect();
                return Err(Error::Config(format!(
                    "--draft names {} {kind} heads ({}): give one head per kind",
                    several.len(),
                    named.join(", ")
                )));
            }
        }
        if let Some(dir) = &self.dir {
            let default = dir.join(format!("draft-{kind}"));
            if default.join("config.json").is_file() {
                return self.load_draft(&default);
            }
            looked.push(default.display().to_string());
        }
        Err(Error::Config(format!(
            "--decode {kind} needs a {kind} draft head, and none was found (looked in: {}); \
             train one with `glance train draft --target MODEL_DIR` or pass --draft DIR",
            if looked.is_empty() {
                "nowhere: the engine has no model directory".to_string()
            } else {
                looked.join(", ")
            }
        )))
    }

    /// Loads the draft head in `dir` for this engine's model without making it the engine's
    /// head: as a twin when the model is one ([`EngineOptions::twin`]), in the model's weight
    /// format ([`EngineOptions::weights`]), and checked to fit the model.
    pub fn read_draft(&self, dir: &Path) -> Result<DraftHead> {
        let head = self.pool.install(|| match &self.options.twin {
            Some(shape) => {
                glance_models::twin::load_draft(dir, &Device::Cpu, self.options.weights, shape)
            }
            None => DraftHead::load_as(dir, &Device::Cpu, self.options.weights),
        })?;
        let t = self.model.text();
        head.config()
            .check_target(t.hidden_size(), t.vocab_size())
            .map_err(|e| Error::Config(format!("draft head {}: {e}", dir.display())))?;
        Ok(head)
    }

    fn load_draft(&self, dir: &Path) -> Result<Arc<dyn DraftLm>> {
        let head: Arc<dyn DraftLm> = Arc::new(self.read_draft(dir)?);
        self.set_draft(head.clone());
        Ok(head)
    }

    /// Checks that this engine can run `decode` — a model converted for block diffusion, a
    /// draft head of the speculative kind — loading what it needs, so that a server refuses a
    /// default strategy it cannot run at start-up rather than on every request.
    pub fn check_decode(&self, decode: &DecodeSpec) -> Result<()> {
        let request = Request {
            decode: decode.clone(),
            ..Request::new(Prompt::Raw {
                text: String::new(),
                images: Vec::new(),
            })
        };
        self.strategy(&request).map(|_| ())
    }

    /// The draft tree of `request`: its own, else the engine's.
    fn tree(&self, request: &Request) -> glance_decode::TreeSettings {
        request
            .decode
            .tree()
            .cloned()
            .unwrap_or_else(|| self.options.tree.clone())
    }

    /// The block-diffusion settings of `request` (its own, else the engine's, else the defaults
    /// with the model's block size) and the model's mask token; an unconverted model is refused.
    fn diffusion_settings(&self, request: &Request) -> Result<(DiffusionSettings, u32)> {
        let bd = self.model.config().block_diffusion.ok_or_else(|| {
            Error::InvalidParam(format!(
                "--decode {}: this model is not converted for block diffusion (its \
                     config.json has no `block_diffusion` entry); convert it with `glance train \
                     diffusion --from DIR`",
                request.decode
            ))
        })?;
        let settings = match (request.decode.diffusion_settings(), &self.options.diffusion) {
            (Some(s), _) | (None, Some(s)) => s.clone(),
            (None, None) => DiffusionSettings {
                block: bd.block_size.min(glance_decode::diffusion::MAX_BLOCK),
                ..DiffusionSettings::default()
            },
        };
        Ok((settings, bd.mask_token_id))
    }

    /// The strategy `request` names (or `auto` chooses), with what it needs loaded, and why
    /// `auto` chose it.
    fn strategy(&self, request: &Request) -> Result<(Box<dyn DecodeStrategy>, Option<String>)> {
        if let Some(choice) = self.choose(request)? {
            let strategy: Box<dyn DecodeStrategy> = match (choice.spec, choice.cost) {
                (DecodeSpec::Diffusion { mode, .. }, Some(cost)) => {
                    let (settings, mask) = self.diffusion_settings(request)?;
                    Box::new(BlockDiffusion::new(mode, settings, mask)?.cost_aware(cost)?)
                }
                (DecodeSpec::Speculative { kind, .. }, Some(cost)) => {
                    let tree = self.tree(request);
                    let head = self.draft(kind)?;
                    let memory = self.plan_memory(&head);
                    Box::new(
                        Speculative::new(head, tree)?
                            .cost_aware(cost)?
                            .remembering(memory),
                    )
                }
                _ => Box::new(Autoregressive),
            };
            return Ok((strategy, Some(choice.reason)));
        }
        Ok((self.named_strategy(request)?, None))
    }

    /// The strategy `request` names.
    fn named_strategy(&self, request: &Request) -> Result<Box<dyn DecodeStrategy>> {
        Ok(match &request.decode {
            DecodeSpec::Autoregressive => Box::new(Autoregressive),
            DecodeSpec::Diffusion { mode, .. } => {
                let (settings, mask) = self.diffusion_settings(request)?;
                Box::new(BlockDiffusion::new(*mode, settings, mask)?)
            }
            DecodeSpec::Auto { .. } => {
                return Err(Error::InvalidParam(
                    "`auto` is resolved per request, before a strategy is built".into(),
                ))
            }
            DecodeSpec::Speculative { kind, .. } => {
                let tree = self.tree(request);
                Box::new(Speculative::new(self.draft(*kind)?, tree)?)
            }
        })
    }

    /// Time [`Engine::load`] took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Runs `f` on the engine's thread pool (benchmarks time model parts this way).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// The logits of every position of the prompt, `(prompt_tokens, vocab)`, from one causal
    /// prefill (no pruning, no cache), no id masked: the hook for parity checks. Non-finite
    /// logits are an [`Error::NonFinite`] naming the first layer whose output is not finite.
    pub fn prompt_logits(&self, prompt: &Prompt) -> Result<Tensor> {
        let logits = self.pool.install(|| {
            let rendered = self.render(prompt, false, false, None)?;
            let encoded = self.encode_all(&rendered.images)?;
            let plan = self.plan(&rendered.prompt.ids, &encoded)?;
            let text = self.model.text();
            let mut cache = text.new_cache();
            let rows = plan.rows()?;
            let hidden = match plan.mrope_positions() {
                Some(pos) => text.forward_mrope(&rows, &pos, &AttnMask::causal(), &mut cache)?,
                None => text.forward(&rows, &plan.positions(), &AttnMask::causal(), &mut cache)?,
            };
            text.raw_logits(&hidden)
        })?;
        if !finite::all_finite(&logits)? {
            let e = Error::NonFinite(format!(
                "the prompt's logits {:?} hold non-finite values",
                logits.dims()
            ));
            return Err(self.pool.install(|| self.explain_non_finite(e, prompt)));
        }
        Ok(logits)
    }

    /// `format` compiled over the model's tokens: [`Error::Input`] when the tokenizer cannot
    /// spell arbitrary text (glance-tiny's word-level vocabulary), [`Error::InvalidParam`] for a
    /// schema llguidance refuses.
    pub fn grammar(&self, format: &OutputFormat) -> Result<Grammar> {
        let vocab = self.grammar_vocab.get_or_init(|| {
            let text = &self.processor.text;
            let json = text
                .tokenizer()
                .to_string(false)
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))?;
            GrammarVocab::from_tokenizer_json(
                &json,
                self.model.text().vocab_size(),
                text.eos_token_ids(),
            )
            .map_err(|e| e.to_string())
        });
        match vocab {
            Ok(v) => v.compile(format),
            Err(e) => Err(Error::Input(format!(
                "this model cannot produce structured output: {e}"
            ))),
        }
    }

    /// The request's sampler, knowing its prompt and end-of-sequence tokens, and where it records
    /// log-probabilities when the request asks for them.
    fn sampler(
        &self,
        sampling: &glance_core::SamplingParams,
        logprobs: Option<usize>,
        prompt_ids: &[u32],
    ) -> Result<(Sampler, Option<LogprobSink>)> {
        let vocab = self.model.text().vocab_size();
        if let Some(id) = sampling.logit_bias.keys().find(|&&id| id as usize >= vocab) {
            return Err(Error::InvalidParam(format!(
                "logit_bias names token {id}, beyond the model's vocabulary of {vocab} tokens"
            )));
        }
        let sampler = Sampler::new(sampling.clone())?
            .with_context(prompt_ids, self.processor.text.eos_token_ids());
        Ok(match logprobs {
            Some(top) => {
                let sink = LogprobSink::default();
                (sampler.with_logprobs(top, sink.clone()), Some(sink))
            }
            None => (sampler, None),
        })
    }

    /// The tokens that end a generation (none with `ignore_eos`).
    fn eos(&self, ignore_eos: bool) -> &[u32] {
        if ignore_eos {
            &[]
        } else {
            self.processor.text.eos_token_ids()
        }
    }

    /// Renders the prompt and tokenises it (a conversation's last message continued with
    /// `continue_final`, the template's `tools` variable set to `tools`); with `want_query`, also
    /// the text query.
    fn render<'a>(
        &self,
        prompt: &'a Prompt,
        continue_final: bool,
        want_query: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<Rendered<'a>> {
        let images = prompt.images();
        crate::messages::check_image_count(images.len(), self.options.max_images)?;
        if let Some(qwen) = self.processor.qwen() {
            return self.render_sized(qwen, prompt, images, continue_final, want_query, tools);
        }
        if let Some(internvl) = self.processor.internvl() {
            return self.render_sized(internvl, prompt, images, continue_final, want_query, tools);
        }
        let llava = self.processor.llava()?;
        // Each image's token count: LLaVA-NeXT's depends on the image's size (read from its
        // header before any pixel is decoded).
        let tokens = images
            .iter()
            .map(|img| match llava.anyres() {
                Some(_) => {
                    let (w, h) = qwen::image_dims(img, self.options.max_image_pixels)?;
                    Ok(llava.tokens_for(h, w))
                }
                None => Ok(llava.tokens_for(0, 0)),
            })
            .collect::<Result<Vec<usize>>>()?;
        let (prompt, query) = match prompt {
            Prompt::Raw { text, .. } => (
                llava.prepare_sized(text, &tokens, PromptFormat::Raw)?,
                text.clone(),
            ),
            Prompt::Chat(messages) => {
                let chat: Vec<ChatMessage> = messages.iter().map(to_chat).collect();
                let query = if want_query {
                    let texts: Vec<String> = chat.iter().map(ChatMessage::text).collect();
                    texts.join("\n")
                } else {
                    String::new()
                };
                let prepared = if continue_final {
                    llava.prepare_continuation_sized(&chat, &tokens, tools)?
                } else {
                    llava.prepare_chat_sized(&chat, &tokens, tools)?
                };
                (prepared, query)
            }
        };
        Ok(Rendered {
            prompt,
            query,
            images,
        })
    }

    /// Encodes every image, through the encoding cache.
    fn encode_all(&self, images: &[&ImageInput]) -> Result<Vec<Encoded>> {
        images
            .iter()
            .enumerate()
            .map(|(i, img)| {
                self.encode(img).map_err(|e| match e {
                    Error::Image(msg) if images.len() > 1 => {
                        Error::Image(format!("image {i}: {msg}"))
                    }
                    other => other,
                })
            })
            .collect()
    }

    fn encode(&self, image: &ImageInput) -> Result<Encoded> {
        let key = self.hasher.key(image);
        if let Some(entry) = self.encodings.get(&key) {
            return Ok(Encoded {
                key,
                entry,
                hit: true,
            });
        }
        let start = Instant::now();
        let decoded;
        let img = match image {
            ImageInput::Bytes(bytes) => {
                decoded = decode_image_with_limit(bytes, self.options.max_image_pixels)?;
                &decoded
            }
            ImageInput::Decoded(img) => {
                let pixels = img.width() as u64 * img.height() as u64;
                if pixels == 0 || pixels > self.options.max_image_pixels {
                    return Err(Error::Image(format!(
                        "{}x{} pixels: images must have between 1 and {} pixels",
                        img.width(),
                        img.height(),
                        self.options.max_image_pixels
                    )));
                }
                img.as_ref()
            }
        };
        let (encoding, preprocess, vision) = self.model.encode(&self.processor, img, start)?;
        let bytes = encoding.bytes();
        let entry = Arc::new(CachedEncoding {
            encoding,
            preprocess,
            vision,
        });
        self.encodings.insert(key, entry.clone(), bytes);
        Ok(Encoded {
            key,
            entry,
            hit: false,
        })
    }

    fn plan(&self, ids: &[u32], encoded: &[Encoded]) -> Result<PromptPlan> {
        let encodings: Vec<&Encoding> = encoded.iter().map(|e| &e.entry.encoding).collect();
        self.model.plan(ids, &encodings)
    }
}

/// The log-probabilities the sampler recorded for the `i`-th emitted token, `id`.
fn take_logprob(sink: &LogprobSink, i: usize, id: u32) -> Result<glance_decode::TokenLogprob> {
    sink.lock()
        .expect("not poisoned")
        .get(i)
        .filter(|e| e.token == id)
        .cloned()
        .ok_or_else(|| {
            Error::Input(format!(
                "no log-probability recorded for token {i} ({id}) of the answer"
            ))
        })
}

/// KV-cache bytes of a prefill of `rows` rows (f32 keys and values in every layer; buffers hold
/// at least 128 rows).
fn cache_bytes(c: ModelConfig<'_>, rows: usize) -> usize {
    c.text.kv_bytes(rows.max(128))
}

/// What encoding the request's images cost: (vision time spent, time the encoding cache saved,
/// images found in it).
fn encode_costs(encoded: &[Encoded]) -> (Duration, Duration, usize) {
    let (mut vision, mut saved, mut hits) = (Duration::ZERO, Duration::ZERO, 0);
    for e in encoded {
        if e.hit {
            saved += e.entry.preprocess + e.entry.vision;
            hits += 1;
        } else {
            vision += e.entry.vision;
        }
    }
    (vision, saved, hits)
}

/// Records the prompt's images in the prefill state for strategies that read them. An image's
/// rows are found by position, since every prefill keeps each row's position: this covers plans
/// rewritten by pruning and FastV, which drops rows inside the decoder.
/// The patches each image kept, from the positions of the rows the prefill's last layer ran:
/// pruning keeps every kept row at its original position (a merged row takes one patch's), and
/// FastV's cut keeps positions too. `images` are the unpruned plan's image segments (their
/// positions are their token indices), in prompt order; each ends with its `side × side` patches
/// (a leading [CLS] under the `full` feature strategy is not a patch). A LLaVA-NeXT image
/// (`anyres`) starts with its base image's patches: those are reported.
fn kept_patches(
    images: &[std::ops::Range<usize>],
    grids: &[(usize, usize)],
    positions: &[u32],
    anyres: bool,
) -> Vec<KeptPatches> {
    images
        .iter()
        .zip(grids)
        .map(|(r, &(rows, cols))| {
            let patches = rows * cols;
            let (start, end) = if anyres {
                (r.start, (r.start + patches).min(r.end))
            } else {
                (r.end.saturating_sub(patches).max(r.start), r.end)
            };
            let mut kept: Vec<u32> = positions
                .iter()
                .map(|&p| p as usize)
                .filter(|p| (start..end).contains(p))
                .map(|p| (p - start) as u32)
                .collect();
            kept.sort_unstable();
            kept.dedup();
            KeptPatches { rows, cols, kept }
        })
        .collect()
}

fn attach_images(state: &mut Prefilled, plan: &PromptPlan) {
    state.images = image_rows_at(plan, &state.positions);
}

/// Per image of `plan`, the indices of the rows at `positions` (a prefill's, maybe pruned) that
/// hold its visual tokens.
fn image_rows_at(plan: &PromptPlan, positions: &[u32]) -> Vec<PrefilledImage> {
    let plan_positions = plan.positions();
    let image_rows = plan.image_rows();
    let owner: std::collections::HashMap<u32, usize> = image_rows
        .iter()
        .enumerate()
        .flat_map(|(j, rows)| rows.iter().map(move |&r| (r, j)))
        .map(|(r, j)| (plan_positions[r], j))
        .collect();
    let mut rows = vec![Vec::new(); image_rows.len()];
    for (i, p) in positions.iter().enumerate() {
        if let Some(&j) = owner.get(p) {
            rows[j].push(i);
        }
    }
    rows.into_iter()
        .map(|rows| PrefilledImage { rows })
        .collect()
}

/// A message in the processor's form (images as placeholders; the pixels travel separately).
fn to_chat(m: &Message) -> ChatMessage {
    let content = m
        .content
        .iter()
        .map(|p| match p {
            Part::Text(text) => ContentPart::Text { text: text.clone() },
            Part::Image(_) => ContentPart::Image {},
        })
        .collect();
    ChatMessage {
        extra: m.extra.clone(),
        ..ChatMessage::new(m.role.name(), content)
    }
}
