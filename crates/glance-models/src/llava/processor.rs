//! `LlavaProcessor`: a prompt and images → token ids with each `<image>` placeholder expanded to
//! the image's token count, plus pixel tensors — as transformers' `LlavaProcessor` (and
//! `apply_chat_template`) produce them.

use super::anyres::{Anyres, AnyresPixels, AnyresProcessor};
use super::config::LlavaConfig;
use crate::checkpoint::required_file;
use crate::processing::chat::{cut_after_final, ChatMessage};
use crate::processing::image::{ImageProcessor, PreprocessorConfig};
use crate::processing::tokenizer::TextProcessor;
use glance_core::{Error, Result};
use std::path::Path;

/// How the user's prompt becomes model input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptFormat {
    /// One user turn rendered with the model's chat template (images first, then the text), ending
    /// with the generation prompt. Without a template, LLaVA-1.5's `USER: <image>\n… ASSISTANT:`.
    Chat,
    /// The text exactly as given, `<image>` placeholders where the images go, tokenised as
    /// `tokenizer(text)` (BOS only if the tokenizer's post-processor adds it).
    Raw,
}

/// Model-ready text input.
#[derive(Debug, Clone)]
pub struct PreparedPrompt {
    /// The prompt text before image expansion (the rendered chat template in `Chat` format).
    pub text: String,
    /// Token ids with every placeholder expanded.
    pub ids: Vec<u32>,
    /// How many of `ids` are image-token positions.
    pub image_tokens: usize,
}

/// Where a processor's parts came from, for errors: the model, and the names of its
/// pre-processing, tokenizer and configuration sources.
#[derive(Debug, Clone)]
pub struct ProcessorFiles {
    pub source: String,
    pub preprocessor: &'static str,
    pub tokenizer: &'static str,
    pub config: &'static str,
}

/// Tokenizer + image processor of one LLaVA checkpoint.
pub struct LlavaProcessor {
    pub text: TextProcessor,
    pub image: ImageProcessor,
    image_token: String,
    image_token_id: u32,
    tokens_per_image: usize,
    /// LLaVA-NeXT: tiling and per-image token counts.
    anyres: Option<AnyresProcessor>,
}

impl LlavaProcessor {
    /// Reads the tokenizer and the image settings: `preprocessor_config.json` (published
    /// checkpoints), else the `image_processor` entry of `processor_config.json` (what
    /// transformers 5 saves).
    pub fn from_dir(dir: &Path, config: &LlavaConfig) -> Result<Self> {
        let text = TextProcessor::from_dir(dir)?;
        let proc_path = dir.join("processor_config.json");
        let processor_json: Option<serde_json::Value> = if proc_path.is_file() {
            Some(crate::checkpoint::read_json(&proc_path)?)
        } else {
            None
        };
        let pre_path = dir.join("preprocessor_config.json");
        let nested = processor_json
            .as_ref()
            .and_then(|v| v.get("image_processor"))
            .filter(|_| !pre_path.is_file());
        let (image_json, preprocessor): (serde_json::Value, &'static str) = match nested {
            Some(v) => (v.clone(), "processor_config.json"),
            None => (
                crate::checkpoint::read_json(&required_file(dir, "preprocessor_config.json")?)?,
                "preprocessor_config.json",
            ),
        };
        let pre = PreprocessorConfig::from_json(&image_json)
            .map_err(|m| Error::Config(format!("{}: {m}", dir.join(preprocessor).display())))?;
        // The placeholder is an added token (`<image>`); processor_config.json names it when
        // present.
        let named: Option<String> = processor_json
            .as_ref()
            .and_then(|v| v.get("image_token"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        let files = ProcessorFiles {
            source: dir.display().to_string(),
            preprocessor,
            tokenizer: "tokenizer.json",
            config: "config.json",
        };
        // LLaVA-NeXT: the processor tiles by its own pinpoints; they must be the model's.
        if let (Some(model), Some(p)) = (
            &config.grid_pinpoints,
            image_json.get("image_grid_pinpoints"),
        ) {
            let mine: Vec<[usize; 2]> = serde_json::from_value(p.clone())
                .map_err(|e| Error::Config(format!("{preprocessor}: image_grid_pinpoints: {e}")))?;
            if &mine != model {
                return Err(Error::Config(format!(
                    "{}: {preprocessor}'s image_grid_pinpoints {mine:?} differ from config.json's \
                     {model:?}",
                    dir.display()
                )));
            }
        }
        Self::from_parts(text, pre, config, named, &files)
    }

    /// The processor of `config` from its parts: the text processor, the image pre-processing
    /// and the image token's text when the model names it. Checks that they fit each other
    /// (`files` names the sources in errors).
    pub fn from_parts(
        text: TextProcessor,
        pre: PreprocessorConfig,
        config: &LlavaConfig,
        named: Option<String>,
        files: &ProcessorFiles,
    ) -> Result<Self> {
        let image = ImageProcessor::new(pre)?;
        let (h, w) = image.config.output_size();
        let s = config.vision.image_size;
        if (h, w) != (s, s) {
            return Err(Error::Config(format!(
                "{}: {} produces {h}x{w} pixels but the vision tower takes {s}x{s}",
                files.source, files.preprocessor
            )));
        }
        // Another model's tokenizer loads fine and then "finds 0 placeholders": say that the
        // tokenizer and config disagree instead.
        let disagree = |what: String| {
            Error::Config(format!(
                "{}: {} and {} disagree: {what} (is the tokenizer from another model?)",
                files.source, files.tokenizer, files.config
            ))
        };
        let tokenizer_vocab = text.vocab_size();
        if tokenizer_vocab > config.text.vocab_size {
            return Err(disagree(format!(
                "the tokenizer has {tokenizer_vocab} tokens but text_config.vocab_size is {}",
                config.text.vocab_size
            )));
        }
        let id = config.image_token_id;
        let image_token = text.id_to_token(id).ok_or_else(|| {
            disagree(format!(
                "image_token_index {id} is not in the tokenizer's {tokenizer_vocab}-token vocabulary"
            ))
        })?;
        // A plain vocabulary entry (a word piece, a `<0x01>` byte) is not a placeholder.
        let is_added = text
            .tokenizer()
            .get_added_tokens_decoder()
            .contains_key(&id);
        match named {
            Some(n) if n != image_token => {
                return Err(disagree(format!(
                    "image_token_index {id} is `{image_token}` in the tokenizer, but \
                     processor_config.json's image token is `{n}`"
                )))
            }
            None if !is_added => {
                return Err(disagree(format!(
                    "image_token_index {id} is `{image_token}` in the tokenizer, an ordinary \
                     vocabulary entry rather than an added image placeholder such as `<image>`"
                )))
            }
            _ => {}
        }
        let anyres = match &config.grid_pinpoints {
            Some(p) => Some(AnyresProcessor::new(
                image.config.clone(),
                Anyres {
                    pinpoints: p.clone(),
                    tile: config.vision.image_size,
                    grid: config.vision.grid(),
                },
            )?),
            None => None,
        };
        Ok(Self {
            text,
            image,
            image_token,
            image_token_id: config.image_token_id,
            tokens_per_image: config.image_tokens_per_image(),
            anyres,
        })
    }

    /// LLaVA-NeXT's tiling, `None` for LLaVA-1.5.
    pub fn anyres(&self) -> Option<&AnyresProcessor> {
        self.anyres.as_ref()
    }

    /// Image tokens of an image of `height × width` pixels in the prompt.
    pub fn tokens_for(&self, height: usize, width: usize) -> usize {
        match &self.anyres {
            Some(a) => a.geometry.tokens_for(height, width),
            None => self.tokens_per_image,
        }
    }

    /// LLaVA-NeXT's pixels of one image (base image and tiles).
    pub fn anyres_pixels(
        &self,
        img: &image::DynamicImage,
        device: &candle_core::Device,
    ) -> Result<AnyresPixels> {
        self.anyres
            .as_ref()
            .ok_or_else(|| Error::InvalidParam("anyres pixels need a LLaVA-NeXT model".into()))?
            .preprocess(img, device)
    }

    /// The image token counts of `n` images when they do not depend on the images (LLaVA-1.5).
    fn fixed_counts(&self, n: usize) -> Result<Vec<usize>> {
        if self.anyres.is_some() && n > 0 {
            return Err(Error::InvalidParam(
                "LLaVA-NeXT's image token counts depend on each image's size: prepare the prompt \
                 with the images' sizes (`*_sized`)"
                    .into(),
            ));
        }
        Ok(vec![self.tokens_per_image; n])
    }

    /// The placeholder text (`<image>`).
    pub fn image_token(&self) -> &str {
        &self.image_token
    }

    /// Token ids of the text query that pruning policies read: `text` with every image
    /// placeholder removed, without special tokens.
    pub fn query_ids(&self, text: &str) -> Result<Vec<u32>> {
        self.text
            .encode_plain(&text.replace(self.image_token.as_str(), " "))
    }

    /// Renders and tokenises `prompt` for `n_images` images: in `Chat` format, one user turn with
    /// the images first (as [`prepare_chat`](Self::prepare_chat) with that one message).
    pub fn prepare(
        &self,
        prompt: &str,
        n_images: usize,
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        self.prepare_sized(prompt, &self.fixed_counts(n_images)?, format)
    }

    /// [`prepare`](Self::prepare) with each image's token count given (LLaVA-NeXT:
    /// [`tokens_for`](Self::tokens_for) of its size).
    pub fn prepare_sized(
        &self,
        prompt: &str,
        tokens: &[usize],
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        match format {
            PromptFormat::Raw => self.tokenize(prompt.to_string(), tokens, format),
            PromptFormat::Chat => {
                self.prepare_chat_sized(&[ChatMessage::user(prompt, tokens.len())], tokens, None)
            }
        }
    }

    /// Renders a conversation with the model's chat template (adding the generation prompt) and
    /// tokenises it. Without a template, LLaVA-1.5's format: `USER: <image>\n… ASSISTANT: …`,
    /// turns separated by the EOS text after each answer, system text first.
    pub fn prepare_chat(&self, messages: &[ChatMessage]) -> Result<PreparedPrompt> {
        self.prepare_chat_with(messages, None)
    }

    /// [`Self::prepare_chat`] with the template's `tools` variable.
    pub fn prepare_chat_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<PreparedPrompt> {
        let n_images = messages.iter().map(ChatMessage::num_images).sum();
        self.prepare_chat_sized(messages, &self.fixed_counts(n_images)?, tools)
    }

    /// [`Self::prepare_chat_with`] with each image's token count given.
    pub fn prepare_chat_sized(
        &self,
        messages: &[ChatMessage],
        tokens: &[usize],
        tools: Option<&serde_json::Value>,
    ) -> Result<PreparedPrompt> {
        let text = match self.text.chat_template() {
            Some(_) => self.text.apply_chat_template_with(messages, true, tools)?,
            None => self.plain_chat(messages)?,
        };
        self.tokenize(text, tokens, PromptFormat::Chat)
    }

    /// A conversation whose last message (the assistant's, usually) is continued rather than
    /// answered: rendered without a generation prompt and cut right after that message's text
    /// (trailing whitespace trimmed), as Hugging Face's `continue_final_message` does.
    pub fn prepare_continuation(&self, messages: &[ChatMessage]) -> Result<PreparedPrompt> {
        self.prepare_continuation_with(messages, None)
    }

    /// [`Self::prepare_continuation`] with the template's `tools` variable.
    pub fn prepare_continuation_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<PreparedPrompt> {
        let n_images = messages.iter().map(ChatMessage::num_images).sum();
        self.prepare_continuation_sized(messages, &self.fixed_counts(n_images)?, tools)
    }

    /// [`Self::prepare_continuation_with`] with each image's token count given.
    pub fn prepare_continuation_sized(
        &self,
        messages: &[ChatMessage],
        tokens: &[usize],
        tools: Option<&serde_json::Value>,
    ) -> Result<PreparedPrompt> {
        let full = match self.text.chat_template() {
            Some(_) => self.text.apply_chat_template_with(messages, false, tools)?,
            None => self.plain_chat(messages)?,
        };
        self.tokenize(
            cut_after_final(&full, messages)?,
            tokens,
            PromptFormat::Chat,
        )
    }

    /// The conversation in LLaVA-1.5's plain format (models without a chat template).
    fn plain_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let eos = self.text.eos_token().unwrap_or_default();
        let mut out = String::new();
        for m in messages {
            let images = format!("{}\n", self.image_token).repeat(m.num_images());
            let text = m.text();
            match m.role.as_str() {
                "system" => out.push_str(&format!("{images}{text} ")),
                "user" => out.push_str(&format!("USER: {images}{text} ")),
                "assistant" => out.push_str(&format!("ASSISTANT: {images}{text}{eos}")),
                other => {
                    return Err(Error::Input(format!(
                        "unknown message role `{other}` (system, user or assistant)"
                    )))
                }
            }
        }
        out.push_str("ASSISTANT:");
        Ok(out)
    }

    /// Expands the `i`-th placeholder of rendered `text` to `tokens[i]` image tokens and
    /// tokenises it.
    fn tokenize(
        &self,
        text: String,
        tokens: &[usize],
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        let n_images = tokens.len();
        let placeholders = text.matches(self.image_token.as_str()).count();
        if placeholders != n_images {
            return Err(Error::Input(format!(
                "the prompt has {placeholders} `{}` placeholder(s) for {n_images} image(s)",
                self.image_token
            )));
        }
        // As `LlavaProcessor` / `LlavaNextProcessor`: placeholder `i` becomes `tokens[i]` copies.
        let mut expanded = String::with_capacity(text.len() + tokens.iter().sum::<usize>() * 8);
        for (i, piece) in text.split(self.image_token.as_str()).enumerate() {
            expanded.push_str(piece);
            if let Some(&n) = tokens.get(i) {
                expanded.push_str(&self.image_token.repeat(n));
            }
        }
        let expected: usize = tokens.iter().sum();
        let ids = match format {
            PromptFormat::Raw => self.text.encode_raw(&expanded)?,
            PromptFormat::Chat => self.text.encode_prompt(&expanded)?,
        };
        let image_tokens = ids.iter().filter(|&&i| i == self.image_token_id).count();
        if image_tokens != expected {
            return Err(Error::Input(format!(
                "tokenising the prompt gave {image_tokens} image tokens, expected {expected}"
            )));
        }
        Ok(PreparedPrompt {
            text,
            ids,
            image_tokens,
        })
    }
}
