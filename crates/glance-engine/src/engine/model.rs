//! The engine's model and processors, one variant per family ([`glance_models::family::Family`]):
//! what the request path asks of every family (render, encode an image, plan the prompt, the
//! text decoder) behind one type, and the family's own types for tools that need them.

use crate::cache::Encoding;
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use glance_models::family::Family;
use glance_models::internvl::{InternImageEncoding, InternVl, InternVlProcessor};
use glance_models::llava::{
    BlockDiffusionConfig, Llava, LlavaProcessor, PreparedPrompt, PromptFormat, PromptPlan,
};
use glance_models::processing::chat::ChatMessage;
use glance_models::processing::tokenizer::TextProcessor;
use glance_models::qwen2_vl::QwenImageEncoding;
use glance_models::qwen2_vl::{Qwen2Vl, QwenVlProcessor};
use glance_models::text::{TextConfig, TextModel};
use image::DynamicImage;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loaded vision-language model.
#[derive(Clone)]
pub enum Model {
    Llava(Arc<Llava>),
    Qwen2Vl(Arc<Qwen2Vl>),
    InternVl(Arc<InternVl>),
}

/// What the request path reads of every family's config.
#[derive(Clone, Copy)]
pub struct ModelConfig<'a> {
    pub image_token_id: u32,
    pub text: &'a TextConfig,
    /// Set on a model converted for block-diffusion decoding.
    pub block_diffusion: Option<&'a BlockDiffusionConfig>,
}

impl Model {
    /// Pre-processes and encodes one image (`started`: when decoding it began); returns the
    /// encoding, the time up to the vision tower and the tower's time.
    pub(crate) fn encode(
        &self,
        processor: &Processor,
        img: &DynamicImage,
        started: Instant,
    ) -> Result<(Encoding, Duration, Duration)> {
        match (self, processor.qwen()) {
            (Model::Qwen2Vl(model), Some(qwen)) => {
                let pixels = qwen.image.preprocess(img, &Device::Cpu)?;
                let preprocess = started.elapsed();
                let start = Instant::now();
                let encoding = Encoding::Qwen2Vl(model.encode_image(&pixels)?);
                Ok((encoding, preprocess, start.elapsed()))
            }
            (Model::Llava(model), _) => {
                let llava = processor.llava()?;
                let (preprocess, start, encoding) = match llava.anyres() {
                    // LLaVA-NeXT: base image and tiles.
                    Some(anyres) => {
                        let pixels = anyres.preprocess(img, &Device::Cpu)?;
                        let (preprocess, start) = (started.elapsed(), Instant::now());
                        (preprocess, start, model.encode_anyres(&pixels)?)
                    }
                    None => {
                        let pixels = llava.image.preprocess_tensor(img, &Device::Cpu)?;
                        let (preprocess, start) = (started.elapsed(), Instant::now());
                        (preprocess, start, model.encode_image(&pixels)?)
                    }
                };
                Ok((Encoding::Llava(encoding), preprocess, start.elapsed()))
            }
            (Model::InternVl(model), _) => {
                let pixels = processor
                    .internvl()
                    .ok_or_else(|| {
                        Error::Config("an InternVL model needs its own processor".into())
                    })?
                    .image
                    .preprocess(img, &Device::Cpu)?;
                let preprocess = started.elapsed();
                let start = Instant::now();
                let encoding = Encoding::InternVl(model.encode_image(&pixels)?);
                Ok((encoding, preprocess, start.elapsed()))
            }
            (Model::Qwen2Vl(_), None) => Err(Error::Config(
                "a Qwen2-VL model needs its own processor".into(),
            )),
        }
    }

    /// The prompt plan of `ids` (placeholders expanded) with the images' encodings in order.
    pub(crate) fn plan(&self, ids: &[u32], encodings: &[&Encoding]) -> Result<PromptPlan> {
        match self {
            Model::Llava(model) => {
                let features: Vec<&Tensor> = encodings.iter().map(|e| e.features()).collect();
                model.plan(ids, &features)
            }
            Model::Qwen2Vl(model) => {
                let qwen: Vec<&QwenImageEncoding> = encodings
                    .iter()
                    .filter_map(|e| match e {
                        Encoding::Qwen2Vl(q) => Some(q),
                        _ => None,
                    })
                    .collect();
                if qwen.len() != encodings.len() {
                    return Err(Error::Input(
                        "an image was encoded for another model".into(),
                    ));
                }
                model.plan(ids, &qwen)
            }
            Model::InternVl(model) => model.plan(ids, &internvl_encodings(encodings)?),
        }
    }

    pub fn family(&self) -> Family {
        match self {
            Model::Llava(m) if m.config().is_next() => Family::LlavaNext,
            Model::Llava(_) => Family::Llava,
            Model::Qwen2Vl(m) => match m.config().version {
                glance_models::qwen2_vl::QwenVlVersion::V2 => Family::Qwen2Vl,
                glance_models::qwen2_vl::QwenVlVersion::V2_5 => Family::Qwen25Vl,
            },
            Model::InternVl(_) => Family::InternVl,
        }
    }

    /// The text decoder, as decoding strategies drive it.
    pub fn text(&self) -> &TextModel {
        match self {
            Model::Llava(m) => m.text(),
            Model::Qwen2Vl(m) => m.text(),
            Model::InternVl(m) => m.text(),
        }
    }

    pub fn config(&self) -> ModelConfig<'_> {
        match self {
            Model::Llava(m) => ModelConfig {
                image_token_id: m.config().image_token_id,
                text: &m.config().text,
                block_diffusion: m.config().block_diffusion.as_ref(),
            },
            Model::Qwen2Vl(m) => ModelConfig {
                image_token_id: m.config().image_token_id,
                text: &m.config().text,
                block_diffusion: m.config().block_diffusion.as_ref(),
            },
            Model::InternVl(m) => ModelConfig {
                image_token_id: m.config().image_token_id,
                text: &m.config().text,
                block_diffusion: None,
            },
        }
    }

    /// Whether prompt rows carry 3-D (M-RoPE) positions. Such prompts prefill at those positions
    /// (in the scheduler's chunks, or through [`glance_decode::prefill_mrope`] when pruned); the
    /// rows after them have three equal parts, so they decode batched with any other request.
    pub fn uses_mrope(&self) -> bool {
        self.family().uses_mrope()
    }

    /// The LLaVA model, for tools that run LLaVA checkpoints only.
    pub fn llava(&self) -> Result<&Llava> {
        match self {
            Model::Llava(m) => Ok(m),
            other => Err(other.only_llava()),
        }
    }

    /// The error a LLaVA-only feature gives on another family.
    pub fn only_llava(&self) -> Error {
        Error::InvalidParam(format!(
            "this needs a LLaVA checkpoint; the model is {:?}",
            self.family()
        ))
    }
}

/// The processors of a loaded model: `processor.text` is the tokenizer every family has.
#[derive(Clone)]
pub struct Processor {
    pub text: TextRef,
}

#[derive(Clone)]
enum Kind {
    Llava(Arc<LlavaProcessor>),
    Qwen2Vl(Arc<QwenVlProcessor>),
    InternVl(Arc<InternVlProcessor>),
}

/// A processor's tokenizer (dereferences to [`TextProcessor`]).
#[derive(Clone)]
pub struct TextRef(Kind);

impl std::ops::Deref for TextRef {
    type Target = TextProcessor;

    fn deref(&self) -> &TextProcessor {
        match &self.0 {
            Kind::Llava(p) => &p.text,
            Kind::Qwen2Vl(p) => &p.text,
            Kind::InternVl(p) => &p.text,
        }
    }
}

impl Processor {
    pub fn llava_processor(p: Arc<LlavaProcessor>) -> Self {
        Self {
            text: TextRef(Kind::Llava(p)),
        }
    }

    pub fn qwen2_vl(p: Arc<QwenVlProcessor>) -> Self {
        Self {
            text: TextRef(Kind::Qwen2Vl(p)),
        }
    }

    pub fn internvl_processor(p: Arc<InternVlProcessor>) -> Self {
        Self {
            text: TextRef(Kind::InternVl(p)),
        }
    }

    /// The InternVL processor, when the model is one.
    pub fn internvl(&self) -> Option<&InternVlProcessor> {
        match &self.text.0 {
            Kind::InternVl(p) => Some(p),
            _ => None,
        }
    }

    /// The LLaVA processor, for tools that run LLaVA checkpoints only.
    pub fn llava(&self) -> Result<&LlavaProcessor> {
        match &self.text.0 {
            Kind::Llava(p) => Ok(p),
            Kind::Qwen2Vl(_) => Err(Error::InvalidParam(
                "this needs a LLaVA checkpoint; the model is Qwen2-VL".into(),
            )),
            Kind::InternVl(_) => Err(Error::InvalidParam(
                "this needs a LLaVA checkpoint; the model is InternVL".into(),
            )),
        }
    }

    /// The Qwen2-VL processor, when the model is one.
    pub fn qwen(&self) -> Option<&QwenVlProcessor> {
        match &self.text.0 {
            Kind::Qwen2Vl(p) => Some(p),
            _ => None,
        }
    }

    /// Token ids of the text query pruning policies read (placeholders removed, no special
    /// tokens).
    pub fn query_ids(&self, text: &str) -> Result<Vec<u32>> {
        match &self.text.0 {
            Kind::Llava(p) => p.query_ids(text),
            Kind::Qwen2Vl(p) => p.text.encode_plain(&text.replace(p.image_token(), " ")),
            Kind::InternVl(p) => p.text.encode_plain(&text.replace(p.image_token(), " ")),
        }
    }

    /// [`LlavaProcessor::prepare_chat`]; Qwen2-VL's prompts depend on the images' sizes and are
    /// prepared by the engine.
    pub fn prepare_chat(&self, messages: &[ChatMessage]) -> Result<PreparedPrompt> {
        self.llava()?.prepare_chat(messages)
    }

    /// [`LlavaProcessor::prepare`] (LLaVA; see [`Processor::prepare_chat`]).
    pub fn prepare(
        &self,
        prompt: &str,
        n_images: usize,
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        self.llava()?.prepare(prompt, n_images, format)
    }
}

/// The InternVL encodings of a request's images (an image encoded for another model refused).
pub(crate) fn internvl_encodings<'a>(
    encodings: &[&'a Encoding],
) -> Result<Vec<&'a InternImageEncoding>> {
    encodings
        .iter()
        .map(|e| match e {
            Encoding::InternVl(x) => Ok(x),
            _ => Err(Error::Input(
                "an image was encoded for another model".into(),
            )),
        })
        .collect()
}
