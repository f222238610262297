//! InternViT (transformers' `InternVLVisionModel`, the `vision_tower.*` weights): a stride-`p`
//! patch convolution with bias (done as one GEMM over flattened patches), a learned [CLS] token
//! and learned positions, then pre-norm blocks with layer scale:
//! `x += λ₁ · attn(norm₁(x))`, `x += λ₂ · mlp(norm₂(x))`. The norms are LayerNorm or RMSNorm
//! (`norm_type`); InternViT-6B adds RMSNorm over all heads' queries and keys (`use_qk_norm`) and
//! a final LayerNorm when `use_mean_pooling` is false.
//!
//! Reference: Chen et al., "InternVL: Scaling up Vision Foundation Models and Aligning for Generic
//! Visual-Linguistic Tasks" (2024); transformers `models/internvl/modeling_internvl.py`.

use super::config::{InternVisionConfig, VisionNorm};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::weights::{layer_norm, linear_as, param, rms_norm};
use glance_nn::{attention, LayerNorm, Linear, Mode, RmsNorm, WeightLoad};

/// `eps` of the QK-norm (transformers' `InternVLVisionRMSNorm` default; not `layer_norm_eps`).
const QK_NORM_EPS: f64 = 1e-6;

enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    fn load(vb: &VarBuilder, c: &InternVisionConfig, mode: Mode) -> Result<Self> {
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        Ok(match c.norm {
            VisionNorm::LayerNorm => Norm::Layer(layer_norm(vb, h, eps, mode)?),
            VisionNorm::RmsNorm => Norm::Rms(rms_norm(vb, h, eps, mode)?),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Norm::Layer(n) => n.forward(x)?,
            Norm::Rms(n) => n.forward(x)?,
        })
    }
}

struct Block {
    norm_before: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    proj: Linear,
    /// `(hidden,)` layer scales.
    lambda_1: Tensor,
    lambda_2: Tensor,
    norm_after: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// The tower's output on a batch of tiles.
pub struct InternVisionOutput {
    /// The hidden state `vision_feature_layer` names, `(tiles, 1 + patches, hidden)`, [CLS] first.
    pub features: Tensor,
}

pub struct InternVision {
    config: InternVisionConfig,
    /// Convolution weight flattened to `(hidden, channels · p · p)`.
    patch_weight: Tensor,
    /// `(hidden,)`
    patch_bias: Tensor,
    /// `(hidden,)`
    cls_token: Tensor,
    /// `(1 + patches, hidden)`
    position_embeddings: Tensor,
    blocks: Vec<Block>,
    /// The final LayerNorm (`use_mean_pooling` false).
    final_norm: Option<LayerNorm>,
    mode: Mode,
}

impl InternVision {
    /// `vb` at `vision_tower`; loads the first `num_layers` blocks (the final norm only when all
    /// are loaded).
    pub fn load(
        vb: &VarBuilder,
        config: &InternVisionConfig,
        num_layers: usize,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let c = config;
        let (h, p, ch, i) = (
            c.hidden_size,
            c.patch_size,
            c.num_channels,
            c.intermediate_size,
        );
        let emb = vb.pp("embeddings");
        let conv = emb.pp("patch_embeddings.projection");
        let patch_weight = param(&conv, (h, ch, p, p), "weight")?.reshape((h, ch * p * p))?;
        let patch_bias = param(&conv, h, "bias")?;
        let cls_token = param(&emb, (1, 1, h), "cls_token")?.reshape(h)?;
        let g = c.grid();
        let position_embeddings =
            param(&emb, (1, g * g + 1, h), "position_embeddings")?.reshape((g * g + 1, h))?;
        let blocks = (0..num_layers)
            .map(|l| {
                let lv = vb.pp(format!("encoder.layer.{l}"));
                let at = lv.pp("attention");
                let qk_norm = if c.use_qk_norm {
                    Some((
                        rms_norm(&at.pp("q_norm"), h, QK_NORM_EPS, mode)?,
                        rms_norm(&at.pp("k_norm"), h, QK_NORM_EPS, mode)?,
                    ))
                } else {
                    None
                };
                Ok(Block {
                    norm_before: Norm::load(&lv.pp("layernorm_before"), c, mode)?,
                    q: linear_as(&at.pp("q_proj"), h, h, c.attention_bias, load)?,
                    k: linear_as(&at.pp("k_proj"), h, h, c.attention_bias, load)?,
                    v: linear_as(&at.pp("v_proj"), h, h, c.attention_bias, load)?,
                    qk_norm,
                    proj: linear_as(&at.pp("projection_layer"), h, h, true, load)?,
                    lambda_1: param(&lv, h, "lambda_1")?,
                    lambda_2: param(&lv, h, "lambda_2")?,
                    norm_after: Norm::load(&lv.pp("layernorm_after"), c, mode)?,
                    fc1: linear_as(&lv.pp("mlp.fc1"), h, i, true, load)?,
                    fc2: linear_as(&lv.pp("mlp.fc2"), i, h, true, load)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let final_norm = if !c.use_mean_pooling && num_layers == c.num_layers {
            Some(layer_norm(&vb.pp("layernorm"), h, c.layer_norm_eps, mode)?)
        } else {
            None
        };
        Ok(Self {
            config: c.clone(),
            patch_weight,
            patch_bias,
            cls_token,
            position_embeddings,
            blocks,
            final_norm,
            mode,
        })
    }

    pub fn config(&self) -> &InternVisionConfig {
        &self.config
    }

    /// `tiles` `(n, channels, S, S)` → embeddings `(n · (1 + patches), hidden)`, [CLS] first in
    /// each tile.
    fn embed(&self, tiles: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (n, ch, hgt, wid) = tiles.dims4()?;
        if (ch, hgt, wid) != (c.num_channels, c.image_size, c.image_size) {
            return Err(Error::Input(format!(
                "tiles are {:?}, the vision tower takes (n, {}, {}, {})",
                tiles.dims(),
                c.num_channels,
                c.image_size,
                c.image_size
            )));
        }
        let (g, p, h) = (c.grid(), c.patch_size, c.hidden_size);
        // (n, ch, g, p, g, p) -> (n, g_row, g_col, ch, p, p) -> (n · g · g, ch · p · p)
        let patches = tiles
            .reshape((n, ch, g, p, g, p))?
            .permute((0, 2, 4, 1, 3, 5))?
            .contiguous()?
            .reshape((n * g * g, ch * p * p))?;
        // (n · g · g, hidden)
        let emb = patches
            .matmul(&self.patch_weight.t()?)?
            .broadcast_add(&self.patch_bias)?
            .reshape((n, g * g, h))?;
        let cls = self.cls_token.reshape((1, 1, h))?.broadcast_as((n, 1, h))?;
        // (n, 1 + g·g, hidden)
        let x = Tensor::cat(&[&cls, &emb], 1)?.broadcast_add(&self.position_embeddings)?;
        Ok(x.reshape((n * (g * g + 1), h))?)
    }

    /// Runs the tower on `tiles` `(n, channels, S, S)` and returns hidden state `layer`
    /// (0: the embeddings; the last with the final norm when there is one and `final_norm`).
    pub fn forward(
        &self,
        tiles: &Tensor,
        layer: usize,
        final_norm: bool,
    ) -> Result<InternVisionOutput> {
        if layer > self.blocks.len() {
            return Err(Error::Config(format!(
                "vision hidden state {layer} requested but {} layers loaded",
                self.blocks.len()
            )));
        }
        let c = &self.config;
        let (heads, hd, h) = (c.num_heads, c.head_dim(), c.hidden_size);
        let n_tiles = tiles.dim(0)?;
        let mut x = self.embed(tiles)?;
        let t = x.dim(0)? / n_tiles;
        for b in &self.blocks[..layer] {
            let y = b.norm_before.forward(&x)?;
            let (mut q, mut k) = (b.q.forward(&y)?, b.k.forward(&y)?);
            if let Some((qn, kn)) = &b.qk_norm {
                q = qn.forward(&q)?;
                k = kn.forward(&k)?;
            }
            // (n · t, hidden) -> (n, heads, t, hd)
            let split = |z: Tensor| {
                z.reshape((n_tiles, t, heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let att = attention(
                &split(q)?,
                &split(k)?,
                &split(b.v.forward(&y)?)?,
                None,
                1.0 / (hd as f64).sqrt(),
                self.mode,
                false,
            )?;
            // (n, heads, t, hd) -> (n · t, hidden)
            let a = att.out.transpose(1, 2)?.reshape((n_tiles * t, h))?;
            x = (x + b.proj.forward(&a)?.broadcast_mul(&b.lambda_1)?)?;
            let m = b.fc2.forward(
                &c.hidden_act
                    .forward(&b.fc1.forward(&b.norm_after.forward(&x)?)?)?,
            )?;
            x = (x + m.broadcast_mul(&b.lambda_2)?)?;
        }
        if let (true, Some(norm)) = (final_norm && layer == c.num_layers, &self.final_norm) {
            x = norm.forward(&x)?;
        }
        Ok(InternVisionOutput {
            features: x.reshape((n_tiles, t, h))?,
        })
    }
}
