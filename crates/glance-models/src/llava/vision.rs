//! CLIP vision transformer (HF `CLIPVisionModel`, the `vision_model.*` weights).
//!
//! Patch embedding (a stride-`p` convolution without bias, done as one GEMM over flattened
//! patches), a learned [CLS] embedding and learned positions, `pre_layrnorm` (sic, HF's name), then
//! pre-norm encoder layers with biased q/k/v/out projections and an MLP `fc2(act(fc1(x)))`.
//! Only the layers up to the deepest requested feature layer are loaded and run.

use super::config::VisionConfig;
use candle_core::Tensor;
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::weights::{layer_norm, linear_as, param};
use glance_nn::{
    attention, attention_full_bf16, LayerNorm, Linear, Mode, WeightFormat, WeightLoad,
};

struct EncoderLayer {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// Vision tower outputs for one image.
pub struct VisionOutput {
    /// Hidden states at the requested layers, each `(1 + patches, vision_hidden)`, [CLS] first.
    pub hidden_states: Vec<Tensor>,
    /// Attention probabilities of the [CLS] query, `(heads, 1 + patches)`, in the encoder layer that
    /// produced the deepest requested hidden state (`None` if that state is the embeddings).
    pub cls_attention: Option<Tensor>,
}

pub struct ClipVision {
    config: VisionConfig,
    /// Convolution weight flattened to `(hidden, channels · p · p)`.
    patch_weight: Tensor,
    /// `(hidden,)`
    class_embedding: Tensor,
    /// `(1 + patches, hidden)`
    position_embedding: Tensor,
    pre_layrnorm: LayerNorm,
    layers: Vec<EncoderLayer>,
    mode: Mode,
}

impl ClipVision {
    /// `vb` at `vision_model`; loads `num_layers` encoder layers.
    pub fn load(
        vb: &VarBuilder,
        config: &VisionConfig,
        num_layers: usize,
        mode: Mode,
    ) -> Result<Self> {
        Self::load_as(vb, config, num_layers, mode, &WeightLoad::f32())
    }

    /// [`ClipVision::load`] with the encoder layers' linear weights held as `load` says (the
    /// patch and position embeddings and the norms stay f32).
    pub fn load_as(
        vb: &VarBuilder,
        config: &VisionConfig,
        num_layers: usize,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let c = config;
        let (h, p, ch) = (c.hidden_size, c.patch_size, c.num_channels);
        let emb = vb.pp("embeddings");
        let patch_weight =
            param(&emb.pp("patch_embedding"), (h, ch, p, p), "weight")?.reshape((h, ch * p * p))?;
        let class_embedding = param(&emb, h, "class_embedding")?;
        let position_embedding = param(
            &emb.pp("position_embedding"),
            (c.num_patches() + 1, h),
            "weight",
        )?;
        let eps = c.layer_norm_eps;
        // Inference meets every patch of an image at once: the layers' products go by the
        // many-row kernels where the CPU has them (`Linear::for_many_rows`).
        let linear = |vb: &VarBuilder, inp: usize, out: usize| -> Result<Linear> {
            let l = linear_as(vb, inp, out, true, load)?;
            Ok(match mode {
                Mode::Infer => l.for_many_rows(),
                _ => l,
            })
        };
        let layers = (0..num_layers)
            .map(|i| {
                let lv = vb.pp(format!("encoder.layers.{i}"));
                let at = lv.pp("self_attn");
                Ok(EncoderLayer {
                    ln1: layer_norm(&lv.pp("layer_norm1"), h, eps, mode)?,
                    q: linear(&at.pp("q_proj"), h, h)?,
                    k: linear(&at.pp("k_proj"), h, h)?,
                    v: linear(&at.pp("v_proj"), h, h)?,
                    out: linear(&at.pp("out_proj"), h, h)?,
                    ln2: layer_norm(&lv.pp("layer_norm2"), h, eps, mode)?,
                    fc1: linear(&lv.pp("mlp.fc1"), h, c.intermediate_size)?,
                    fc2: linear(&lv.pp("mlp.fc2"), c.intermediate_size, h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config: c.clone(),
            patch_weight,
            class_embedding,
            position_embedding,
            pre_layrnorm: layer_norm(&vb.pp("pre_layrnorm"), h, eps, mode)?,
            layers,
            mode,
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// Embeddings after `pre_layrnorm` (hidden state 0): `pixels` `(channels, H, W)` →
    /// `(1 + patches, hidden)`.
    fn embed(&self, pixels: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (ch, hgt, wid) = pixels.dims3()?;
        if (ch, hgt, wid) != (c.num_channels, c.image_size, c.image_size) {
            return Err(Error::Input(format!(
                "pixel tensor is {:?}, the vision tower takes ({}, {}, {})",
                (ch, hgt, wid),
                c.num_channels,
                c.image_size,
                c.image_size
            )));
        }
        let (g, p) = (c.grid(), c.patch_size);
        // (ch, g, p, g, p) -> (g_row, g_col, ch, p, p) -> (g·g, ch·p·p)
        let patches = pixels
            .reshape((ch, g, p, g, p))?
            .permute((1, 3, 0, 2, 4))?
            .contiguous()?
            .reshape((g * g, ch * p * p))?;
        // (g·g, ch·p·p) x (ch·p·p, hidden) -> (g·g, hidden)
        let patch_emb = patches.matmul(&self.patch_weight.t()?)?;
        let cls = self.class_embedding.unsqueeze(0)?;
        let x = (Tensor::cat(&[&cls, &patch_emb], 0)? + &self.position_embedding)?;
        Ok(self.pre_layrnorm.forward(&x)?)
    }

    /// Runs the tower and returns the hidden states at `layers` (indices into HF's
    /// `hidden_states` tuple, each `≤` the number of loaded layers).
    pub fn forward(&self, pixels: &Tensor, layers: &[usize]) -> Result<VisionOutput> {
        let deepest = layers.iter().copied().max().unwrap_or(0);
        if deepest > self.layers.len() {
            return Err(Error::Config(format!(
                "feature layer {deepest} requested but {} layers loaded",
                self.layers.len()
            )));
        }
        let c = &self.config;
        let heads = c.num_attention_heads;
        let hd = c.hidden_size / heads;
        let mut x = self.embed(pixels)?;
        let n = x.dim(0)?;
        let mut states = vec![None; deepest + 1];
        states[0] = Some(x.clone());
        let mut cls_attention = None;
        for (i, layer) in self.layers[..deepest].iter().enumerate() {
            let h = layer.ln1.forward(&x)?;
            // One group pass where the projections are packed (the rows rounded once).
            let [q, k, v]: [Tensor; 3] =
                Linear::forward_group(&[&layer.q, &layer.k, &layer.v], &h, Linear::forward)?
                    .try_into()
                    .expect("three layers, three results");
            let want_probs = i + 1 == deepest;
            let scale = 1.0 / (hd as f64).sqrt();
            // bf16 weights: bf16 products for the attention too (AMX or AVX-512 BF16); it takes
            // and gives the heads side by side, (n, hidden).
            let bf16 =
                !want_probs && self.mode == Mode::Infer && layer.q.format() == WeightFormat::Bf16;
            let fast = if bf16 {
                attention_full_bf16(&q, &k, &v, heads, scale)?
            } else {
                None
            };
            let a = match fast {
                Some(a) => a,
                None => {
                    // (n, hidden) -> (1, heads, n, hd)
                    let split =
                        |y: Tensor| y.reshape((1, n, heads, hd))?.transpose(1, 2)?.contiguous();
                    let att = attention(
                        &split(q)?,
                        &split(k)?,
                        &split(v)?,
                        None,
                        scale,
                        self.mode,
                        want_probs,
                    )?;
                    if let Some(p) = att.probs {
                        // (1, heads, n, n) -> [CLS] query row (heads, n)
                        cls_attention = Some(p.squeeze(0)?.narrow(1, 0, 1)?.squeeze(1)?);
                    }
                    att.out.transpose(1, 2)?.reshape((n, c.hidden_size))?
                }
            };
            x = (x + layer.out.forward(&a)?)?;
            let m = layer.fc2.forward(
                &c.hidden_act
                    .forward(&layer.fc1.forward(&layer.ln2.forward(&x)?)?)?,
            )?;
            x = (x + m)?;
            states[i + 1] = Some(x.clone());
        }
        let hidden_states = layers
            .iter()
            .map(|&l| {
                states[l]
                    .clone()
                    .expect("every state up to `deepest` is recorded")
            })
            .collect();
        Ok(VisionOutput {
            hidden_states,
            cls_attention,
        })
    }
}
