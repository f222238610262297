//! The trainable model: one `VarMap` holding every parameter under its HF hub name, two `Llava`
//! views of it (composed ops for training, fused ops for frozen features and validation; both read
//! the same storage, so an optimiser step is seen by both), the training-only vision heads,
//! deterministic initialisation, and the parameter groups of each stage.

use crate::config::{ModelSpec, Stage};
use crate::heads::VisionHeads;
use crate::Result;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use glance_models::llava::{Llava, LlavaConfig, WeightLayout};
use glance_nn::Mode;

/// Prefix of the training-only heads (never exported).
pub const HEADS_PREFIX: &str = "train_heads";

/// Every parameter of a run and the models that read them.
pub struct TrainModel {
    pub spec: ModelSpec,
    pub config: LlavaConfig,
    pub varmap: VarMap,
    /// Composed (differentiable) ops.
    pub train: Llava,
    /// Fused ops on the same weights: frozen features and validation.
    pub infer: std::sync::Arc<Llava>,
    pub heads: VisionHeads,
}

/// One named trainable tensor.
#[derive(Clone)]
pub struct Param {
    pub name: String,
    pub var: Var,
    /// Decoupled weight decay applies (matrices other than embeddings).
    pub decay: bool,
}

impl TrainModel {
    /// Builds every parameter of `spec` and initialises it from `seed`.
    pub fn new(spec: &ModelSpec, seed: u64, device: &Device) -> Result<Self> {
        let config = spec.llava_config()?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
        let layout = WeightLayout::hub();
        let train = Llava::from_var_builder(&vb, config.clone(), &layout, Mode::Train)?;
        let heads = VisionHeads::new(&vb, &layout, &config, Mode::Train)?;
        // Built after every variable exists: only reads them.
        let infer = std::sync::Arc::new(Llava::from_var_builder(
            &vb,
            config.clone(),
            &layout,
            Mode::Infer,
        )?);
        init_params(&varmap, seed)?;
        Ok(Self {
            spec: spec.clone(),
            config,
            varmap,
            train,
            infer,
            heads,
        })
    }

    /// All parameters, sorted by name (a stable order for optimiser state and checkpoints).
    pub fn all_params(&self) -> Vec<Param> {
        let data = self.varmap.data().lock().expect("varmap lock poisoned");
        let mut v: Vec<Param> = data
            .iter()
            .map(|(name, var)| Param {
                name: name.clone(),
                var: var.clone(),
                decay: decays(name, var.as_tensor()),
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The parameters `stage` trains.
    pub fn stage_params(&self, stage: Stage) -> Vec<Param> {
        self.all_params()
            .into_iter()
            .filter(|p| trains(stage, &p.name))
            .collect()
    }

    /// Parameters that belong in the exported checkpoint (everything but the training heads).
    pub fn export_params(&self) -> Vec<Param> {
        self.all_params()
            .into_iter()
            .filter(|p| !p.name.starts_with(HEADS_PREFIX))
            .collect()
    }

    /// Overwrites parameters with the same-named tensors of a model directory's safetensors
    /// (shapes must match); returns how many were loaded. Others keep their values.
    pub fn load_weights(&self, dir: &std::path::Path) -> Result<usize> {
        let vb = glance_models::checkpoint::var_builder(dir, DType::F32, &Device::Cpu)?;
        let mut n = 0;
        for p in self.all_params() {
            if vb.contains_tensor(&p.name) {
                let t = glance_nn::weights::param(&vb, p.var.as_tensor().shape().clone(), &p.name)?;
                p.var.set(&t)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Total element count of `params`.
    pub fn count(params: &[Param]) -> usize {
        params.iter().map(|p| p.var.as_tensor().elem_count()).sum()
    }
}

/// Whether `stage` updates the parameter `name`.
pub fn trains(stage: Stage, name: &str) -> bool {
    let vision = name.starts_with("vision_tower.");
    let heads = name.starts_with(HEADS_PREFIX);
    let post_ln = name.contains(".post_layernorm.");
    let lm = name.starts_with("multi_modal_projector.") || name.starts_with("language_model.");
    match stage {
        Stage::Vision => vision || heads,
        Stage::Llava => lm,
        // post_layernorm only feeds the [CLS] head, which LLaVA does not read.
        Stage::EndToEnd => (vision && !post_ln) || lm,
    }
}

fn is_norm(name: &str) -> bool {
    let leaf = name.rsplit('.').nth(1).unwrap_or("");
    leaf.contains("norm") || leaf.contains("layrnorm")
}

fn decays(name: &str, t: &Tensor) -> bool {
    t.rank() >= 2
        && !name.contains("embed_tokens")
        && !name.contains("position_embedding")
        && !is_norm(name)
}

/// HF-style initialisation, deterministic per (seed, name): norm weights 1, biases 0, [CLS]
/// embedding N(0, d^-½), everything else N(0, 0.02).
pub fn init_params(varmap: &VarMap, seed: u64) -> Result<()> {
    let data = varmap.data().lock().expect("varmap lock poisoned");
    for (name, var) in data.iter() {
        let t = var.as_tensor();
        let n = t.elem_count();
        let values: Vec<f32> = if is_norm(name) && name.ends_with(".weight") {
            vec![1.0; n]
        } else if name.ends_with(".bias") {
            vec![0.0; n]
        } else {
            let std = if name.ends_with("class_embedding") {
                (n as f64).powf(-0.5)
            } else {
                0.02
            };
            let mut rng = glance_core::Rng::for_name(seed, name);
            (0..n).map(|_| (rng.next_normal() * std) as f32).collect()
        };
        var.set(&Tensor::from_vec(values, t.shape(), t.device())?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_decay() {
        assert!(trains(
            Stage::Vision,
            "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
        ));
        assert!(trains(Stage::Vision, "train_heads.colour.weight"));
        assert!(!trains(
            Stage::Llava,
            "vision_tower.vision_model.pre_layrnorm.weight"
        ));
        assert!(trains(Stage::Llava, "language_model.lm_head.weight"));
        assert!(!trains(
            Stage::EndToEnd,
            "vision_tower.vision_model.post_layernorm.weight"
        ));
        assert!(!trains(Stage::EndToEnd, "train_heads.cls.weight"));
        assert!(is_norm("vision_tower.vision_model.pre_layrnorm.weight"));
        assert!(is_norm(
            "language_model.model.layers.0.input_layernorm.weight"
        ));
        assert!(is_norm("language_model.model.norm.weight"));
        assert!(!is_norm("language_model.model.layers.0.mlp.up_proj.weight"));
    }
}
