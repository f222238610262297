//! The Qwen2-VL / Qwen2.5-VL parts of the request path: loading, and rendering a prompt whose
//! image token counts depend on each image's size (`smart_resize`), read from the image header
//! before any pixel is decoded.

use super::model::{Model, Processor};
use super::{attach_images, to_chat, Encoded, Engine, PrefillOutcome, Rendered};
use crate::cache::Encoding;
use crate::options::EngineOptions;
use crate::request::KeptPatches;
use crate::request::{ImageInput, Prompt};
use candle_core::Device;
use glance_core::{Error, Result};
use glance_models::llava::PromptFormat;
use glance_models::llava::{PromptPlan, SegmentKind};
use glance_models::processing::chat::ChatMessage;
use glance_models::processing::sized::SizedPrompts;
use glance_models::qwen2_vl::QwenImageEncoding;
use glance_models::qwen2_vl::{Qwen2Vl, Qwen2VlConfig, QwenVlProcessor};
use glance_prune::PruneSpec;
use std::path::Path;
use std::sync::Arc;

impl Engine {
    /// The pruned prefill of a Qwen2-VL plan: kept tokens at their own 3-D positions; the kept
    /// patches are reported on each image's merged grid.
    pub(super) fn prefill_pruned_qwen(
        &self,
        model: &Qwen2Vl,
        plan: PromptPlan,
        encoded: &[Encoded],
        query: &str,
        spec: &PruneSpec,
    ) -> Result<PrefillOutcome> {
        let encodings: Vec<&QwenImageEncoding> = encoded
            .iter()
            .filter_map(|e| match &e.entry.encoding {
                Encoding::Qwen2Vl(q) => Some(q),
                _ => None,
            })
            .collect();
        let query = self.processor.query_ids(query)?;
        let pruned = glance_prune::transform_qwen(model, plan, &encodings, &query, spec)?;
        let mut state = glance_prune::prefill_qwen(model, &pruned)?;
        attach_images(&mut state, &pruned.plan);
        // Each image's kept tokens, as (row, col) on its merged grid from their 3-D positions
        // (FastV's cut, made inside the decoder, is not reported per patch).
        let mut kept_patches = Vec::new();
        let segments = match pruned.fastv {
            None => &pruned.plan.segments[..],
            Some(_) => &[],
        };
        for seg in segments {
            let SegmentKind::Image { index } = seg.kind else {
                continue;
            };
            let (rows, cols) = encodings[index].grid.tokens_hw();
            let mut kept: Vec<u32> = seg
                .mrope
                .iter()
                .flatten()
                .map(|p| (p[1] - p[0]) * cols as u32 + (p[2] - p[0]))
                .collect();
            kept.sort_unstable();
            kept_patches.push(KeptPatches { rows, cols, kept });
        }
        Ok(PrefillOutcome {
            state,
            kept_visual: Some(pruned.stats.kept_visual_tokens),
            kept_patches,
            select: pruned.stats.select_time,
        })
    }

    /// The model and processor of a Qwen2-VL / Qwen2.5-VL checkpoint.
    pub(super) fn build_qwen(dir: &Path, options: &EngineOptions) -> Result<(Model, Processor)> {
        let config = Qwen2VlConfig::from_dir(dir)?;
        let processor = QwenVlProcessor::from_dir(dir, &config)?;
        let mut model = Qwen2Vl::load_as(dir, &Device::Cpu, options.weights)?;
        model.limit_vocab(processor.text.id_limit());
        Ok((
            Model::Qwen2Vl(Arc::new(model)),
            Processor::qwen2_vl(Arc::new(processor)),
        ))
    }

    /// [`Engine::render`] for a family whose image token counts depend on each image's size
    /// (Qwen2-VL, InternVL).
    pub(super) fn render_sized<'a, P: SizedPrompts>(
        &self,
        qwen: &P,
        prompt: &'a Prompt,
        images: Vec<&'a ImageInput>,
        continue_final: bool,
        want_query: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<Rendered<'a>> {
        let tokens = images
            .iter()
            .map(|img| {
                let (w, h) = image_dims(img, self.options.max_image_pixels)?;
                qwen.tokens_for(h, w)
            })
            .collect::<Result<Vec<usize>>>()?;
        let (prompt, query) = match prompt {
            Prompt::Raw { text, .. } => (
                qwen.prepare(text, &tokens, PromptFormat::Raw)?,
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
                    qwen.prepare_continuation_with(&chat, &tokens, tools)?
                } else {
                    qwen.prepare_chat_with(&chat, &tokens, tools)?
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
}

/// `(width, height)` of an image, from its header when given as bytes (size-capped as decoding
/// is).
pub(super) fn image_dims(image: &ImageInput, max_pixels: u64) -> Result<(usize, usize)> {
    match image {
        ImageInput::Decoded(img) => Ok((img.width() as usize, img.height() as usize)),
        ImageInput::Bytes(bytes) => {
            let (w, h) = image::ImageReader::new(std::io::Cursor::new(&bytes[..]))
                .with_guessed_format()
                .map_err(|e| Error::Image(format!("cannot read image data: {e}")))?
                .into_dimensions()
                .map_err(|e| Error::Image(format!("invalid image header: {e}")))?;
            let pixels = w as u64 * h as u64;
            if pixels == 0 || pixels > max_pixels {
                return Err(Error::Image(format!(
                    "{w}x{h} pixels: images must have between 1 and {max_pixels} pixels"
                )));
            }
            Ok((w as usize, h as usize))
        }
    }
}
