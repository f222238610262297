//! The Llama-family decoder (HF `LlamaModel` / `MistralModel` / `Qwen2Model` + `lm_head`).
//!
//! Pre-norm blocks: `x + attn(rms(x))`, then `x + mlp(rms(x))`; attention with RoPE on q and k and
//! grouped-query heads; SwiGLU MLP `down(act(gate(x)) * up(x))`. Weight names follow HF
//! (`layers.{i}.self_attn.q_proj`, …); the caller's `VarBuilder` points at the model root (the
//! prefix holding `embed_tokens`, `layers`, `norm`) and the LM head is passed separately because
//! LLaVA checkpoints place it differently across transformers versions.

use super::config::TextConfig;
use candle_core::{Device, Module, Tensor};
use candle_nn::{Embedding, VarBuilder};
use glance_core::{Error, Result};
use glance_nn::weights::{linear, param, rms_norm};
use glance_nn::{attention, AttnMask, CausalLm, KvCache, LayerCache, Linear, Mode, RmsNorm, RotaryEmbedding};

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn load(vb: &VarBuilder, c: &TextConfig) -> Result<Self> {
        let (h, hd) = (c.hidden_size, c.head_dim);
        Ok(Self {
            q: linear(&vb.pp("q_proj"), h, c.num_heads * hd, c.qkv_bias)?,
            k: linear(&vb.pp("k_proj"), h, c.num_kv_heads * hd, c.qkv_bias)?,
            v: linear(&vb.pp("v_proj"), h, c.num_kv_heads * hd, c.qkv_bias)?,
            o: linear(&vb.pp("o_proj"), c.num_heads * hd, h, c.o_bias)?,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: hd,
        })
    }

    /// `x`: `(t, hidden)` → `(t, hidden)`.
    fn forward(
        &self,
        x: &Tensor,
        rope: &RotaryEmbedding,
        positions: &Tensor,
        mask: Option<&Tensor>,
        cache: Option<&mut LayerCache>,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let t = x.dim(0)?;
        let hd = self.head_dim;
        // (t, heads * hd) -> (1, heads, t, hd)
        let split = |y: Tensor, heads: usize| y.reshape((1, t, heads, hd))?.transpose(1, 2)?.contiguous();
        let q = split(self.q.forward(x)?, self.num_heads)?;
        let k = split(self.k.forward(x)?, self.num_kv_heads)?;
        let v = split(self.v.forward(x)?, self.num_kv_heads)?;
        let (q, k) = rope.apply(&q, &k, positions)?;
        let (k, v) = match cache {
            Some(c) => c.append(&k, &v)?,
            None => (k, v),
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let out = attention(&q, &k, &v, mask, scale, mode, false)?.out;
        // (1, heads, t, hd) -> (t, heads * hd)
        let out = out.transpose(1, 2)?.reshape((t, self.num_heads * hd))?;
        self.o.forward(&out)
    }
}

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    act: glance_nn::Activation,
}

impl Mlp {
    fn load(vb: &VarBuilder, c: &TextConfig) -> Result<Self> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        Ok(Self {
            gate: linear(&vb.pp("gate_proj"), h, i, c.mlp_bias)?,
            up: linear(&vb.pp("up_proj"), h, i, c.mlp_bias)?,
            down: linear(&vb.pp("down_proj"), i, h, c.mlp_bias)?,
            act: c.hidden_act,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let g = self.act.forward(&self.gate.forward(x)?)?;
        self.down.forward(&(g * self.up.forward(x)?)?)
    }
}

struct Layer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
    window: Option<usize>,
}

/// A Llama-family decoder with its LM head.
pub struct TextModel {
    config: TextConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RotaryEmbedding,
    mode: Mode,
    device: Device,
}

impl TextModel {
    /// `vb` at the decoder root (`embed_tokens`, `layers`, `norm`); `head_vb` at the LM head
    /// (`lm_head`), ignored when the embeddings are tied.
    pub fn load(vb: &VarBuilder, head_vb: &VarBuilder, config: &TextConfig, mode: Mode) -> Result<Self> {
        let c = config;
        let embed_w = param(&vb.pp("embed_tokens"), (c.vocab_size, c.hidden_size), "weight")?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let lv = vb.pp(format!("layers.{i}"));
                Ok(Layer {
                    input_norm: rms_norm(&lv.pp("input_layernorm"), c.hidden_size, c.rms_norm_eps, mode)?,
                    attn: Attention::load(&lv.pp("self_attn"), c)?,
                    post_norm: rms_norm(&lv.pp("post_attention_layernorm"), c.hidden_size, c.rms_norm_eps, mode)?,
                    mlp: Mlp::load(&lv.pp("mlp"), c)?,
                    window: c.layer_windows[i],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if c.tie_word_embeddings {
            Linear::new(embed_w.clone(), None)
        } else {
            linear(head_vb, c.hidden_size, c.vocab_size, false)?
        };
        let rope = RotaryEmbedding::new(c.head_dim, c.rope_theta, c.rope_scaling.as_ref(), mode, vb.device())?;
        Ok(Self {
            config: c.clone(),
            embed: Embedding::new(embed_w, c.hidden_size),
            layers,
            norm: rms_norm(&vb.pp("norm"), c.hidden_size, c.rms_norm_eps, mode)?,
            lm_head,
            rope,
            mode,
            device: vb.device().clone(),
        })
    }

    pub fn config(&self) -> &TextConfig {
        &self.config
    }

    /// The input embedding matrix `(vocab, hidden)`.
    pub fn embedding_weight(&self) -> &Tensor {
        self.embed.embeddings()
    }

    /// Full-sequence forward without a cache (training, reference checks): `xs` `(t, hidden)`.
    pub fn forward_uncached(&self, xs: &Tensor, positions: &[u32], mask: &AttnMask) -> Result<Tensor> {
        self.run(xs, positions, mask, None)
    }

    fn run(&self, xs: &Tensor, positions: &[u32], mask: &AttnMask, mut cache: Option<&mut KvCache>) -> Result<Tensor> {
        let t = xs.dim(0)?;
        if positions.len() != t {
            return Err(Error::Input(format!("{} positions for {t} rows", positions.len())));
        }
        let past = cache.as_ref().map_or(0, |c| c.len());
        let kv_len = past + t;
        if let Some(&p) = positions.iter().max() {
            if p as usize >= self.config.max_position_embeddings || kv_len > self.config.max_position_embeddings {
                return Err(Error::PromptTooLong {
                    len: kv_len.max(p as usize + 1),
                    max: self.config.max_position_embeddings,
                });
            }
        }
        let pos = Tensor::new(positions, &self.device)?;
        // One materialised mask per distinct sliding window.
        let mut masks: Vec<(Option<usize>, Option<Tensor>)> = Vec::new();
        let mut x = xs.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            if !masks.iter().any(|(w, _)| *w == layer.window) {
                let m = match mask {
                    AttnMask::Causal { .. } => AttnMask::Causal {
                        sliding_window: layer.window,
                    },
                    other => other.clone(),
                };
                masks.push((layer.window, m.materialize(t, kv_len, &self.device)?));
            }
            let m = masks.iter().find(|(w, _)| *w == layer.window).and_then(|(_, m)| m.as_ref());
            let h = layer.input_norm.forward(&x)?;
            let lc = cache.as_mut().map(|c| c.layer_mut(i));
            let h = layer.attn.forward(&h, &self.rope, &pos, m, lc, self.mode)?;
            x = (x + h)?;
            let h = layer.mlp.forward(&layer.post_norm.forward(&x)?)?;
            x = (x + h)?;
        }
        Ok(self.norm.forward(&x)?)
    }
}

impl CausalLm for TextModel {
    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn num_layers(&self) -> usize {
        self.config.num_layers
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn embed_tokens(&self, ids: &[u32]) -> Result<Tensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(Error::Input(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::new(ids, &self.device)?;
        Ok(self.embed.forward(&ids)?)
    }

    fn forward(&self, xs: &Tensor, positions: &[u32], mask: &AttnMask, cache: &mut KvCache) -> Result<Tensor> {
        self.run(xs, positions, mask, Some(cache))
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.lm_head.forward(hidden)?)
    }
}
