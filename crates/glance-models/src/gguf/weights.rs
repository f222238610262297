//! The tensors of a GGUF pair under their Hugging Face names, for glance's loaders: a
//! `VarBuilder` backend that dequantizes a tensor when a loader reads it (candle's GGML block
//! decoders), and a [`RawSource`] that hands F16 / BF16 / F32 tensors over as stored and Q8_0 /
//! Q4_0 blocks as glance's q8 / q4 values and scales — the same numbers: glance's q8 is Q8_0 and
//! its q4 is Q4_0 (`glance_nn::quant::store` documents the layout), so nothing is requantized.
//!
//! Names (llama.cpp's `gguf-py/gguf/tensor_mapping.py`; the mmproj's from its
//! `convert_image_encoder_to_gguf.py`): see [`TEXT_NAMES`] and [`VISION_NAMES`]. The legacy mmproj
//! converter names CLIP's `fc1` `ffn_down` and `fc2` `ffn_up`; newer files use the opposite, so
//! the two are told apart by shape (`fc1` maps `hidden → intermediate`).
//!
//! Q/K rows: llama.cpp's converter permutes the rows of `attn_q` / `attn_k` of `llama` models
//! from Hugging Face's "rotate half" RoPE layout to interleaved pairs (per head of `d` rows, HF
//! row `s · d/2 + j` becomes row `2j + s`). glance uses HF's layout, so the rows are put back
//! here, whole rows of blocks at a time: exact for every block format.

use super::file::{GgufFile, StoredTensor};
use crate::llava::LlavaConfig;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Shape, Tensor};
use glance_core::{Error, Result};
use glance_nn::quant::{RawSource, RawTensor, SharedBytes};
use glance_nn::WeightFormat;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// Text tensors: GGUF name → Hugging Face name (hub layout). Layer tensors carry `{}`.
pub const TEXT_NAMES: [(&str, &str); 20] = [
    (
        "token_embd.weight",
        "language_model.model.embed_tokens.weight",
    ),
    ("output_norm.weight", "language_model.model.norm.weight"),
    ("output.weight", "language_model.lm_head.weight"),
    (
        "blk.{}.attn_norm.weight",
        "language_model.model.layers.{}.input_layernorm.weight",
    ),
    (
        "blk.{}.attn_q.weight",
        "language_model.model.layers.{}.self_attn.q_proj.weight",
    ),
    (
        "blk.{}.attn_q.bias",
        "language_model.model.layers.{}.self_attn.q_proj.bias",
    ),
    (
        "blk.{}.attn_k.weight",
        "language_model.model.layers.{}.self_attn.k_proj.weight",
    ),
    (
        "blk.{}.attn_k.bias",
        "language_model.model.layers.{}.self_attn.k_proj.bias",
    ),
    (
        "blk.{}.attn_v.weight",
        "language_model.model.layers.{}.self_attn.v_proj.weight",
    ),
    (
        "blk.{}.attn_v.bias",
        "language_model.model.layers.{}.self_attn.v_proj.bias",
    ),
    (
        "blk.{}.attn_output.weight",
        "language_model.model.layers.{}.self_attn.o_proj.weight",
    ),
    (
        "blk.{}.attn_output.bias",
        "language_model.model.layers.{}.self_attn.o_proj.bias",
    ),
    (
        "blk.{}.ffn_norm.weight",
        "language_model.model.layers.{}.post_attention_layernorm.weight",
    ),
    (
        "blk.{}.ffn_gate.weight",
        "language_model.model.layers.{}.mlp.gate_proj.weight",
    ),
    (
        "blk.{}.ffn_gate.bias",
        "language_model.model.layers.{}.mlp.gate_proj.bias",
    ),
    (
        "blk.{}.ffn_up.weight",
        "language_model.model.layers.{}.mlp.up_proj.weight",
    ),
    (
        "blk.{}.ffn_up.bias",
        "language_model.model.layers.{}.mlp.up_proj.bias",
    ),
    (
        "blk.{}.ffn_down.weight",
        "language_model.model.layers.{}.mlp.down_proj.weight",
    ),
    (
        "blk.{}.ffn_down.bias",
        "language_model.model.layers.{}.mlp.down_proj.bias",
    ),
    ("rope_freqs.weight", ""),
];

/// Vision tower and projector tensors of an mmproj: GGUF name → Hugging Face name. `fc1` /
/// `fc2` are assigned by shape (see the module docs); the table lists the legacy names.
pub const VISION_NAMES: [(&str, &str); 25] = [
    (
        "v.class_embd",
        "vision_tower.vision_model.embeddings.class_embedding",
    ),
    (
        "v.patch_embd.weight",
        "vision_tower.vision_model.embeddings.patch_embedding.weight",
    ),
    (
        "v.position_embd.weight",
        "vision_tower.vision_model.embeddings.position_embedding.weight",
    ),
    (
        "v.pre_ln.weight",
        "vision_tower.vision_model.pre_layrnorm.weight",
    ),
    (
        "v.pre_ln.bias",
        "vision_tower.vision_model.pre_layrnorm.bias",
    ),
    (
        "v.post_ln.weight",
        "vision_tower.vision_model.post_layernorm.weight",
    ),
    (
        "v.post_ln.bias",
        "vision_tower.vision_model.post_layernorm.bias",
    ),
    (
        "v.blk.{}.attn_q.weight",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.q_proj.weight",
    ),
    (
        "v.blk.{}.attn_q.bias",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.q_proj.bias",
    ),
    (
        "v.blk.{}.attn_k.weight",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.k_proj.weight",
    ),
    (
        "v.blk.{}.attn_k.bias",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.k_proj.bias",
    ),
    (
        "v.blk.{}.attn_v.weight",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.v_proj.weight",
    ),
    (
        "v.blk.{}.attn_v.bias",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.v_proj.bias",
    ),
    (
        "v.blk.{}.attn_out.weight",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.out_proj.weight",
    ),
    (
        "v.blk.{}.attn_out.bias",
        "vision_tower.vision_model.encoder.layers.{}.self_attn.out_proj.bias",
    ),
    (
        "v.blk.{}.ln1.weight",
        "vision_tower.vision_model.encoder.layers.{}.layer_norm1.weight",
    ),
    (
        "v.blk.{}.ln1.bias",
        "vision_tower.vision_model.encoder.layers.{}.layer_norm1.bias",
    ),
    (
        "v.blk.{}.ln2.weight",
        "vision_tower.vision_model.encoder.layers.{}.layer_norm2.weight",
    ),
    (
        "v.blk.{}.ln2.bias",
        "vision_tower.vision_model.encoder.layers.{}.layer_norm2.bias",
    ),
    (
        "v.blk.{}.ffn_down.weight",
        "vision_tower.vision_model.encoder.layers.{}.mlp.fc1.weight",
    ),
    (
        "v.blk.{}.ffn_down.bias",
        "vision_tower.vision_model.encoder.layers.{}.mlp.fc1.bias",
    ),
    (
        "v.blk.{}.ffn_up.weight",
        "vision_tower.vision_model.encoder.layers.{}.mlp.fc2.weight",
    ),
    (
        "v.blk.{}.ffn_up.bias",
        "vision_tower.vision_model.encoder.layers.{}.mlp.fc2.bias",
    ),
    ("mm.0.weight", "multi_modal_projector.linear_1.weight"),
    ("mm.2.weight", "multi_modal_projector.linear_2.weight"),
];

/// Projector biases (kept out of [`VISION_NAMES`] only to keep its length readable).
const PROJECTOR_BIASES: [(&str, &str); 2] = [
    ("mm.0.bias", "multi_modal_projector.linear_1.bias"),
    ("mm.2.bias", "multi_modal_projector.linear_2.bias"),
];

/// `name` matched against a table pattern (`{}`: a layer index), from `from` to `to`.
fn translate(name: &str, from: &str, to: &str) -> Option<String> {
    match from.split_once("{}") {
        None => (name == from).then(|| to.to_string()),
        Some((pre, post)) => {
            let layer = name.strip_prefix(pre)?.strip_suffix(post)?;
            (!layer.is_empty() && layer.bytes().all(|b| b.is_ascii_digit()))
                .then(|| to.replace("{}", layer))
        }
    }
}

fn all_names() -> impl Iterator<Item = (&'static str, &'static str)> {
    TEXT_NAMES
        .into_iter()
        .chain(VISION_NAMES)
        .chain(PROJECTOR_BIASES)
        .filter(|(_, hf)| !hf.is_empty())
}

/// The GGUF name of a Hugging Face tensor name (for errors), if the tables have it.
pub fn gguf_name(hf: &str) -> Option<String> {
    all_names().find_map(|(g, h)| translate(hf, h, g))
}

/// One tensor: which file, as stored, and the heads whose Q/K rows to put back in HF order.
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    gguf: String,
    stored: StoredTensor,
    unpermute_heads: Option<usize>,
    /// Zero rows appended (the embeddings and LM head of a vocabulary given an image
    /// placeholder at load).
    pad_rows: usize,
}

/// The tensors of a text GGUF and its mmproj under Hugging Face names.
pub struct GgufWeights {
    files: Vec<Arc<GgufFile>>,
    entries: HashMap<String, Entry>,
    /// The format raw q8 / q4 values are handed over in (none in any other format).
    format: WeightFormat,
}

impl GgufWeights {
    /// Maps the tensors of `text` (architecture `arch`) and `mm` (the same file when the text
    /// GGUF carries the vision tower itself). Unknown names are left out. `pad_rows` zero rows
    /// are appended to the token embeddings and the LM head.
    pub fn new(
        text: Arc<GgufFile>,
        mm: Arc<GgufFile>,
        arch: &str,
        config: &LlavaConfig,
        format: WeightFormat,
        pad_rows: usize,
    ) -> Self {
        let c = &config.text;
        let mut entries = HashMap::new();
        let same = Arc::ptr_eq(&text, &mm);
        let files = if same { vec![text] } else { vec![text, mm] };
        for (i, f) in files.iter().enumerate() {
            for (name, stored) in &f.tensors {
                let hf = all_names().find_map(|(g, h)| translate(name, g, h));
                let Some(mut hf) = hf else { continue };
                // fc1 maps hidden → intermediate: (intermediate, hidden) rows × cols, or an
                // intermediate-long bias.
                if hf.contains(".mlp.fc") {
                    let fc1 = stored.shape.first() == Some(&config.vision.intermediate_size);
                    let want = if fc1 { ".mlp.fc1." } else { ".mlp.fc2." };
                    hf = hf.replace(".mlp.fc1.", want).replace(".mlp.fc2.", want);
                }
                let unpermute_heads = match arch {
                    "llama" if name.contains(".attn_q.") => Some(c.num_heads),
                    "llama" if name.contains(".attn_k.") => Some(c.num_kv_heads),
                    _ => None,
                }
                .filter(|_| name.starts_with("blk."));
                let padded = i == 0 && (name == "token_embd.weight" || name == "output.weight");
                entries.insert(
                    hf,
                    Entry {
                        file: i,
                        gguf: name.clone(),
                        stored: stored.clone(),
                        unpermute_heads,
                        pad_rows: if padded { pad_rows } else { 0 },
                    },
                );
            }
        }
        Self {
            files,
            entries,
            format,
        }
    }

    /// The GGML types of the tensors glance reads with no glance format of their own (K-quants
    /// and the other block types): `(type, count)`, most common first.
    pub fn converted_types(&self) -> Vec<(GgmlDType, usize)> {
        let mut counts: HashMap<String, (GgmlDType, usize)> = HashMap::new();
        for e in self.entries.values() {
            let native = matches!(
                e.stored.dtype,
                GgmlDType::F32
                    | GgmlDType::F16
                    | GgmlDType::BF16
                    | GgmlDType::Q8_0
                    | GgmlDType::Q4_0
            );
            if !native {
                counts
                    .entry(format!("{:?}", e.stored.dtype))
                    .or_insert((e.stored.dtype, 0))
                    .1 += 1;
            }
        }
        let mut v: Vec<_> = counts.into_values().collect();
        v.sort_by_key(|(t, n)| (std::cmp::Reverse(*n), format!("{t:?}")));
        v
    }

    /// The bytes of `e` with Q/K rows in Hugging Face order and its zero rows appended, and its
    /// row-major shape.
    fn bytes(&self, e: &Entry) -> Result<(Cow<'_, [u8]>, Vec<usize>)> {
        let mut bytes = self.ordered_bytes(e)?;
        let mut shape = e.stored.shape.clone();
        if e.pad_rows > 0 {
            let rows = shape.first().copied().unwrap_or(0).max(1);
            let row_bytes = e.stored.len / rows;
            let mut owned = bytes.into_owned();
            // Zero bytes are zero values in every GGML type (a zero scale for block types).
            owned.resize(owned.len() + e.pad_rows * row_bytes, 0);
            bytes = Cow::Owned(owned);
            shape[0] += e.pad_rows;
        }
        Ok((bytes, shape))
    }

    /// The bytes of `e` with Q/K rows in Hugging Face order.
    fn ordered_bytes(&self, e: &Entry) -> Result<Cow<'_, [u8]>> {
        let file = &self.files[e.file];
        let raw = file.bytes(&e.stored);
        let Some(heads) = e.unpermute_heads else {
            return Ok(Cow::Borrowed(raw));
        };
        let rows = e.stored.shape.first().copied().unwrap_or(0);
        if heads == 0 || rows == 0 || !rows.is_multiple_of(2 * heads) {
            return Err(Error::Config(format!(
                "{}: `{}` has {rows} rows, not a whole number of {heads} heads",
                file.path.display(),
                e.gguf
            )));
        }
        let row_bytes = raw.len() / rows;
        let d = rows / heads;
        let mut out = vec![0u8; raw.len()];
        // HF row h·d + s·d/2 + j ← GGUF row h·d + 2j + s.
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..d / 2 {
                    let to = h * d + s * d / 2 + j;
                    let from = h * d + 2 * j + s;
                    out[to * row_bytes..(to + 1) * row_bytes]
                        .copy_from_slice(&raw[from * row_bytes..(from + 1) * row_bytes]);
                }
            }
        }
        Ok(Cow::Owned(out))
    }

    /// `name` dequantized to f32, in its row-major shape.
    fn dequantize(&self, e: &Entry) -> Result<Tensor> {
        let (bytes, shape) = self.bytes(e)?;
        let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
            e.stored.dtype,
            &bytes,
            shape,
            &Device::Cpu,
        )?;
        Ok(q.dequantize(&Device::Cpu)?)
    }

    /// `name` as stored bytes for the raw source: (dtype, shape, bytes).
    fn raw_tensor(&self, name: &str) -> Option<RawTensor> {
        let owned = |dtype: DType, shape: Vec<usize>, bytes: Vec<u8>| {
            let len = bytes.len();
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(bytes);
            Some(RawTensor {
                dtype,
                shape,
                bytes: SharedBytes::new(owner, 0, len)?,
            })
        };
        if let Some(e) = self.entries.get(name) {
            let dtype = match e.stored.dtype {
                GgmlDType::F32 => DType::F32,
                GgmlDType::F16 => DType::F16,
                GgmlDType::BF16 => DType::BF16,
                _ => return None,
            };
            return match self.bytes(e).ok()? {
                (Cow::Borrowed(_), shape) => {
                    let file = &self.files[e.file];
                    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = file.map.clone();
                    Some(RawTensor {
                        dtype,
                        shape,
                        bytes: SharedBytes::new(owner, e.stored.start, e.stored.len)?,
                    })
                }
                (Cow::Owned(b), shape) => owned(dtype, shape, b),
            };
        }
        // `{matrix}.q8` / `.q4` / `.scales` of a Q8_0 / Q4_0 matrix, in the loaded format only.
        let (base, part) = name.rsplit_once('.')?;
        let e = self.entries.get(base)?;
        let (block_bytes, values) = match (e.stored.dtype, self.format) {
            (GgmlDType::Q8_0, WeightFormat::Q8) => (34, 32),
            (GgmlDType::Q4_0, WeightFormat::Q4) => (18, 16),
            _ => return None,
        };
        let (bytes, shape) = self.bytes(e).ok()?;
        let [rows, cols] = shape[..] else {
            return None;
        };
        // Each block: f16 scale, then its values (Q8_0: 32 i8; Q4_0: 16 bytes of nibbles).
        let blocks = bytes.chunks_exact(block_bytes);
        match part {
            "scales" => owned(
                DType::F16,
                vec![rows, cols / 32],
                blocks.flat_map(|b| [b[0], b[1]]).collect(),
            ),
            "q8" if values == 32 => owned(
                DType::U8,
                vec![rows, cols],
                blocks.flat_map(|b| b[2..].to_vec()).collect(),
            ),
            "q4" if values == 16 => owned(
                DType::U8,
                vec![rows, cols / 2],
                blocks.flat_map(|b| b[2..].to_vec()).collect(),
            ),
            _ => None,
        }
    }
}

/// The raw side of [`GgufWeights`] (see the module docs).
pub struct GgufSource(pub Arc<GgufWeights>);

impl RawSource for GgufSource {
    fn raw(&self, name: &str) -> Option<RawTensor> {
        self.0.raw_tensor(name)
    }
}

/// The dequantizing `VarBuilder` backend of [`GgufWeights`].
pub struct GgufBackend(pub Arc<GgufWeights>);

impl candle_nn::var_builder::SimpleBackend for GgufBackend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        crate::checkpoint::shape_checked(self.get_unchecked(name, dtype, dev)?, s, name)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let e = self
            .0
            .entries
            .get(name)
            .ok_or_else(|| candle_core::Error::CannotFindTensor {
                path: name.to_string(),
            })?;
        self.0
            .dequantize(e)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?
            .to_dtype(dtype)?
            .to_device(dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.entries.contains_key(name)
    }
}

/// The values of a small f32 / f16 tensor (RoPE frequency factors).
pub fn f32_values(file: &GgufFile, name: &str, t: &StoredTensor) -> Result<Vec<f32>> {
    let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
        t.dtype,
        file.bytes(t),
        t.shape.clone(),
        &Device::Cpu,
    )
    .map_err(|e| Error::Config(format!("{}: `{name}`: {e}", file.path.display())))?;
    Ok(q.dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

/// The glance format nearest to a GGML type: its own for F32 / F16 / BF16 / Q8_0 / Q4_0; q4 for
/// 2- to 4-bit blocks, q8 for 5- to 8-bit ones.
pub fn nearest_format(t: GgmlDType) -> WeightFormat {
    use GgmlDType as G;
    match t {
        G::F32 => WeightFormat::F32,
        G::F16 => WeightFormat::F16,
        G::BF16 => WeightFormat::Bf16,
        G::Q4_0 | G::Q4_1 | G::Q2K | G::Q3K | G::Q4K => WeightFormat::Q4,
        _ => WeightFormat::Q8,
    }
}

/// The format of a text GGUF: the type holding most of the decoder's linear weights'
/// values (`blk.*` matrices and `output.weight`), mapped by [`nearest_format`].
pub fn file_format(text: &GgufFile) -> (WeightFormat, Option<GgmlDType>) {
    let mut by_type: HashMap<String, (GgmlDType, usize)> = HashMap::new();
    for (name, t) in &text.tensors {
        let linear = (name.starts_with("blk.") || name == "output.weight")
            && name.ends_with(".weight")
            && t.shape.len() == 2;
        if linear {
            let n: usize = t.shape.iter().product();
            by_type
                .entry(format!("{:?}", t.dtype))
                .or_insert((t.dtype, 0))
                .1 += n;
        }
    }
    let top = by_type
        .into_values()
        .max_by_key(|(t, n)| (*n, format!("{t:?}")))
        .map(|(t, _)| t);
    (top.map_or(WeightFormat::F32, nearest_format), top)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_translate_both_ways() {
        assert_eq!(
            translate("blk.12.attn_q.weight", TEXT_NAMES[4].0, TEXT_NAMES[4].1).as_deref(),
            Some("language_model.model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(
            translate("blk.x.attn_q.weight", TEXT_NAMES[4].0, TEXT_NAMES[4].1),
            None
        );
        assert_eq!(
            gguf_name("language_model.model.layers.3.mlp.down_proj.weight").as_deref(),
            Some("blk.3.ffn_down.weight")
        );
        assert_eq!(
            gguf_name("multi_modal_projector.linear_2.bias").as_deref(),
            Some("mm.2.bias")
        );
        assert_eq!(gguf_name("nothing.weight"), None);
    }

    #[test]
    fn k_quants_map_to_the_nearest_format() {
        assert_eq!(nearest_format(GgmlDType::Q4K), WeightFormat::Q4);
        assert_eq!(nearest_format(GgmlDType::Q5K), WeightFormat::Q8);
        assert_eq!(nearest_format(GgmlDType::Q6K), WeightFormat::Q8);
        assert_eq!(nearest_format(GgmlDType::Q8_0), WeightFormat::Q8);
        assert_eq!(nearest_format(GgmlDType::BF16), WeightFormat::Bf16);
    }
}
