//! GGUF models in llama.cpp's LLaVA layout: a text-model GGUF (`llama`: Llama / Mistral, or
//! `qwen2`) plus a CLIP/projector "mmproj" GGUF, read with candle's GGUF reader
//! (`candle_core::quantized::gguf_file`, the GGUF spec's layout).
//!
//! * [`open`] is the one entry point: the two files → the same [`Llava`] and
//!   [`LlavaProcessor`] a model directory gives.
//! * Configuration from metadata ([`config`]), tokenizer and chat template from
//!   `tokenizer.ggml.*` / `tokenizer.chat_template` ([`tokenizer`]), tensors under their Hugging
//!   Face names ([`weights`]; Q/K rows put back in Hugging Face order).
//! * Weight formats: F16 / BF16 / Q8_0 / Q4_0 are glance's f16 / bf16 / q8 / q4 bit for bit and
//!   are used as stored. Other block types (K-quants: Q4_K, Q5_K, Q6_K, …) are dequantized and
//!   quantized again to the nearest glance format ([`weights::nearest_format`]); [`GgufModel::notes`]
//!   says so, for the caller to print.

pub mod config;
pub mod file;
pub mod tokenizer;
pub mod weights;

use crate::llava::{Llava, LlavaConfig, LlavaProcessor, ProcessorFiles, WeightLayout};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use file::GgufFile;
use glance_core::{Error, Result};
use glance_nn::{Mode, WeightFormat, WeightLoad};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weights::{GgufBackend, GgufSource, GgufWeights};

/// A GGUF pair, loaded.
pub struct GgufModel {
    pub model: Llava,
    pub processor: LlavaProcessor,
    /// The format the text decoder's linear weights are held in.
    pub format: WeightFormat,
    /// The mmproj used (given, or found beside the text model).
    pub mmproj: PathBuf,
    /// Lines for the user: an mmproj found beside the text model, weights converted at load.
    pub notes: Vec<String>,
}

impl GgufModel {
    pub fn config(&self) -> &LlavaConfig {
        self.model.config()
    }
}

/// Whether `path` names a GGUF file (by its `.gguf` suffix).
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The mmproj files beside `text`: `*.gguf` files in its directory whose name contains
/// `mmproj`, sorted.
pub fn mmproj_beside(text: &Path) -> Vec<PathBuf> {
    let dir = match text.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            is_gguf(p)
                && p.is_file()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().to_lowercase().contains("mmproj"))
        })
        .collect();
    found.sort();
    found
}

/// Loads a LLaVA model from a text GGUF and its mmproj (`None`: the text file itself when it
/// holds the vision tower, else the one `*mmproj*.gguf` file beside it). `format`: how the text
/// decoder's linear weights are held; `None` takes the file's own ([`weights::file_format`]).
pub fn open(
    text: &Path,
    mmproj: Option<&Path>,
    device: &Device,
    format: Option<WeightFormat>,
) -> Result<GgufModel> {
    let mut notes = Vec::new();
    let text_file = Arc::new(GgufFile::open(text)?);
    let arch = config::text_arch(&text_file)?.to_string();
    let mm_file = match mmproj {
        Some(p) => Arc::new(GgufFile::open(p)?),
        None if text_file.tensors.contains_key("v.class_embd") => text_file.clone(),
        None => {
            let beside = mmproj_beside(text);
            match beside.as_slice() {
                [one] => {
                    notes.push(format!(
                        "using the mmproj beside the model: {}",
                        one.display()
                    ));
                    Arc::new(GgufFile::open(one)?)
                }
                [] => {
                    return Err(Error::MissingFile {
                        dir: text.parent().unwrap_or(Path::new(".")).to_path_buf(),
                        what: format!(
                            "mmproj: {} is a text model only; LLaVA also needs its \
                             CLIP/projector GGUF (llama.cpp's mmproj): pass --mmproj FILE",
                            text.display()
                        ),
                    })
                }
                several => {
                    let names: Vec<String> =
                        several.iter().map(|p| p.display().to_string()).collect();
                    return Err(Error::InvalidParam(format!(
                        "several mmproj files lie beside {} ({}): choose one with --mmproj FILE",
                        text.display(),
                        names.join(", ")
                    )));
                }
            }
        }
    };

    let mut text_processor = tokenizer::text_processor(&text_file, None)?;
    // (image token id, rows added to the embeddings and LM head, ids that can be produced)
    let (image_token_id, extra_rows, decodable) = match text_processor.token_id("<image>") {
        Some(id) => (id, 0, None),
        None => {
            // The original LLaVA checkpoints' vocabularies have no placeholder: add one after
            // the last token, with a row nothing reads, and never produce it.
            let n = text_processor.vocab_size();
            let rows = text_file
                .tensors
                .get("token_embd.weight")
                .and_then(|t| t.shape.first().copied())
                .unwrap_or(0);
            text_processor = tokenizer::text_processor(&text_file, Some("<image>"))?;
            notes.push(format!(
                "the vocabulary has no `<image>` token: added as id {n} for image placeholders"
            ));
            (n as u32, (n + 1).saturating_sub(rows), Some(n))
        }
    };
    let (config, pre) = config::llava_config(&text_file, &mm_file, image_token_id, extra_rows)?;
    let files = ProcessorFiles {
        source: format!("{} + {}", text.display(), mm_file.path.display()),
        preprocessor: "the mmproj's clip.vision metadata",
        tokenizer: "the tokenizer.ggml metadata",
        config: "the model metadata",
    };
    let processor = LlavaProcessor::from_parts(text_processor, pre, &config, None, &files)?;

    let (file_format, top) = weights::file_format(&text_file);
    let format = format.unwrap_or(file_format);
    let weights = Arc::new(GgufWeights::new(
        text_file.clone(),
        mm_file.clone(),
        &arch,
        &config,
        format,
        extra_rows,
    ));
    let converted = weights.converted_types();
    if !converted.is_empty() {
        let kinds: Vec<String> = converted
            .iter()
            .map(|(t, n)| format!("{n} {t:?}"))
            .collect();
        notes.push(format!(
            "converting {} tensors at load (dequantized, then held as {format}; glance has no \
             kernels for these block types)",
            kinds.join(", ")
        ));
    } else if let Some(t) = top.filter(|_| format != file_format) {
        notes.push(format!(
            "the file's linear weights are {t:?}; converting them to {format} as asked"
        ));
    }

    let vb = VarBuilder::from_backend(
        Box::new(GgufBackend(weights.clone())),
        DType::F32,
        device.clone(),
    );
    let mut load = WeightLoad::new(format);
    if device.is_cpu() {
        load = load.with_source(Arc::new(GgufSource(weights)));
    }
    let mut model =
        Llava::from_var_builder_as(&vb, config, &WeightLayout::hub(), Mode::Infer, &load)
            .map_err(|e| name_missing(e, &text_file.path, &mm_file.path))?;
    if let Some(n) = decodable {
        model.limit_vocab(n);
    }
    Ok(GgufModel {
        model,
        processor,
        format,
        mmproj: mm_file.path.clone(),
        notes,
    })
}

/// A missing tensor named as the GGUF files name it, and in which file it was looked for.
fn name_missing(e: Error, text: &Path, mm: &Path) -> Error {
    match e {
        Error::MissingTensor { name } => {
            let file = if name.starts_with("language_model.") {
                text
            } else {
                mm
            };
            match weights::gguf_name(&name) {
                Some(g) => Error::MissingTensor {
                    name: format!("{g} (in {}; glance's name: {name})", file.display()),
                },
                None => Error::MissingTensor { name },
            }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests;
