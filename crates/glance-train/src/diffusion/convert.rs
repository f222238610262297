//! What a conversion needs to know of the source's family: the model it trains (LLaVA or
//! Qwen2-VL / Qwen2.5-VL, Fast-dVLM's own base), the mask token, and the files export rewrites.
//!
//! **The mask token.** glance's world tokenizer reserves `[MASK]`. A tokenizer without it (Qwen's)
//! gets it as a new special token: the first id past the tokenizer's, which is an unused row of
//! the embedding when the vocabulary is padded (Qwen2.5-VL-3B: 151,936 rows for 151,665 ids);
//! otherwise the vocabulary grows by one row, initialised to the mean of the source's rows, in
//! the embedding and (untied) LM head. The conversion trains that row with the rest of the
//! decoder, and export writes the token into `tokenizer.json` and the vocabulary size into
//! `config.json`.

use super::trainer::MASK_TOKEN;
use crate::draft::samples::Target;
use crate::{Result, TrainError};
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use glance_models::llava::{Llava, WeightLayout};
use glance_models::qwen2_vl::{Qwen2Vl, Qwen2VlConfig, QwenWeightLayout};
use glance_models::text::TextModel;
use glance_nn::{Mode, WeightLoad};
use serde_json::{json, Value};
use std::path::Path;

/// The model being converted: its text decoder trains, the rest stays as it was.
pub enum Converted {
    Llava(Box<Llava>),
    Qwen2Vl(Box<Qwen2Vl>),
}

impl Converted {
    pub fn text(&self) -> &TextModel {
        match self {
            Converted::Llava(m) => m.text(),
            Converted::Qwen2Vl(m) => m.text(),
        }
    }
}

/// The mask token of a conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskToken {
    pub id: u32,
    /// New to the tokenizer: export adds it.
    pub added: bool,
    /// The vocabulary grows by one row for it (to `id + 1` rows).
    pub grows: bool,
}

/// The source's mask token: its own `[MASK]`, else a new one after the tokenizer's last id.
pub fn mask_token(dir: &Path, target: &Target, vocab_rows: usize) -> Result<MaskToken> {
    let tokenizer: Value = glance_models::checkpoint::read_json(&dir.join("tokenizer.json"))?;
    let mut last = None::<u64>;
    let mut own = None;
    if let Some(vocab) = tokenizer["model"]["vocab"].as_object() {
        for (token, id) in vocab {
            let id = id.as_u64();
            last = last.max(id);
            if token == MASK_TOKEN {
                own = id;
            }
        }
    }
    for t in tokenizer["added_tokens"].as_array().into_iter().flatten() {
        let id = t["id"].as_u64();
        last = last.max(id);
        if t["content"] == MASK_TOKEN {
            own = id;
        }
    }
    if let Some(id) = own {
        return Ok(MaskToken {
            id: id as u32,
            added: false,
            grows: false,
        });
    }
    if matches!(target, Target::Llava(_)) {
        return Err(TrainError::Config(format!(
            "{}: the tokenizer has no {MASK_TOKEN} token",
            dir.display()
        )));
    }
    let id = last.map_or(0, |l| l + 1) as usize;
    Ok(MaskToken {
        id: id as u32,
        added: true,
        grows: id >= vocab_rows,
    })
}

/// Builds the trainable model of `target`'s family in `vb` (`Mode::Train`), with one more
/// vocabulary row when `mask` grows it. Returns it with the text decoder's and LM head's weight
/// prefixes.
pub fn build(
    dir: &Path,
    target: &Target,
    vb: &VarBuilder,
    ckpt: &VarBuilder,
    mask: MaskToken,
) -> Result<(Converted, [String; 2])> {
    let grow = |text: &mut glance_models::text::TextConfig| {
        if mask.grows {
            text.vocab_size = mask.id as usize + 1;
        }
    };
    match target {
        Target::Llava(m) => {
            let layout = WeightLayout::detect(ckpt);
            let mut config = m.config().clone();
            grow(&mut config.text);
            let model = Llava::from_var_builder(vb, config, &layout, Mode::Train)?;
            Ok((
                Converted::Llava(Box::new(model)),
                [layout.text, layout.lm_head],
            ))
        }
        Target::Qwen2Vl(_) => {
            let layout = QwenWeightLayout::detect(ckpt);
            let mut config = Qwen2VlConfig::from_dir(dir)?;
            grow(&mut config.text);
            let model =
                Qwen2Vl::from_var_builder_as(vb, config, &layout, Mode::Train, &WeightLoad::f32())?;
            Ok((
                Converted::Qwen2Vl(Box::new(model)),
                [layout.text, layout.lm_head],
            ))
        }
        Target::InternVl(_) => Err(TrainError::Config(
            "the block-diffusion conversion takes LLaVA and Qwen2-VL / Qwen2.5-VL checkpoints; \
             InternVL is not supported yet"
                .into(),
        )),
    }
}

/// The source's weight `name` in `shape`: as stored, or — for a vocabulary grown by one row —
/// the stored rows and their mean.
pub fn source_weight(ckpt: &VarBuilder, name: &str, shape: &candle_core::Shape) -> Result<Tensor> {
    if let Ok(t) = ckpt.get(shape.clone(), name) {
        return Ok(t);
    }
    let dims = shape.dims();
    if dims.len() == 2 && dims[0] > 1 {
        if let Ok(t) = ckpt.get((dims[0] - 1, dims[1]), name) {
            // (1, hidden)
            let mean = t.to_dtype(DType::F32)?.mean_keepdim(0)?;
            return Ok(Tensor::cat(&[&t, &mean], 0)?);
        }
    }
    Err(TrainError::Config(format!(
        "source weight `{name}`: not found with shape {shape:?} (or one vocabulary row fewer)"
    )))
}

/// Rewrites the exported `tokenizer.json` and `config.json` (in `dir`, as JSON values) for a
/// mask token the conversion added.
pub fn export_mask(tokenizer: &mut Value, config: &mut Value, mask: MaskToken) -> Result<()> {
    if !mask.added {
        return Ok(());
    }
    let added = tokenizer["added_tokens"]
        .as_array_mut()
        .ok_or_else(|| TrainError::Config("tokenizer.json has no added_tokens list".into()))?;
    added.push(json!({
        "id": mask.id,
        "content": MASK_TOKEN,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": true,
    }));
    if mask.grows {
        let rows = json!(mask.id + 1);
        if config.get("vocab_size").is_some() {
            config["vocab_size"] = rows.clone();
        }
        if let Some(text) = config.get_mut("text_config").filter(|t| t.is_object()) {
            text["vocab_size"] = rows;
        }
    }
    Ok(())
}
