//! The Llama-family decoder (HF `LlamaModel` / `MistralModel` / `Qwen2Model` + `lm_head`).
//!
//! Pre-norm blocks: `x + attn(rms(x))`, then `x + mlp(rms(x))`; attention with RoPE on q and k and
//! grouped-query heads; SwiGLU MLP `down(act(gate(x)) * up(x))`. Weight names follow HF
//! (`layers.{i}.self_attn.q_proj`, …); the caller's `VarBuilder` points at the model root (the
//! prefix holding `embed_tokens`, `layers`, `norm`) and the LM head is passed separately because
//! LLaVA checkpoints place it differently across transformers versions.

mod groups;

pub(crate) use groups::{batchable, layers_groups};

use super::config::TextConfig;
use candle_core::{Device, Module, Tensor};
use candle_nn::{Embedding, VarBuilder};
use glance_core::{Error, Result};
use glance_nn::quant::WeightFormat;
use glance_nn::weights::{linear_as, pack_tensor, param, rms_norm};
use glance_nn::{
    attention, attention_batch_invariant, AttnMask, CausalLm, KvCache, LayerCache, Linear, Mode,
    RmsNorm, RotaryEmbedding, RowGroup, WeightLoad,
};

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
    fn load(vb: &VarBuilder, c: &TextConfig, load: &WeightLoad) -> Result<Self> {
        let (h, hd) = (c.hidden_size, c.head_dim);
        Ok(Self {
            q: linear_as(&vb.pp("q_proj"), h, c.num_heads * hd, c.qkv_bias, load)?,
            k: linear_as(&vb.pp("k_proj"), h, c.num_kv_heads * hd, c.qkv_bias, load)?,
            v: linear_as(&vb.pp("v_proj"), h, c.num_kv_heads * hd, c.qkv_bias, load)?,
            o: linear_as(&vb.pp("o_proj"), c.num_heads * hd, h, c.o_bias, load)?,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: hd,
        })
    }

    /// Queries, keys and values of rows `x` `(t, hidden)` through `project` (a linear layer's
    /// forward), each `(1, heads, t, hd)`, RoPE applied at `step.positions`.
    fn qkv(
        &self,
        x: &Tensor,
        step: &Step,
        project: fn(&Linear, &Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let (t, hd) = (x.dim(0)?, self.head_dim);
        // (t, heads * hd) -> (1, heads, t, hd)
        let split =
            |y: Tensor, heads: usize| y.reshape((1, t, heads, hd))?.transpose(1, 2)?.contiguous();
        // One group pass where the projections are packed (the rows quantized once).
        let [q, k, v]: [Tensor; 3] =
            Linear::forward_group(&[&self.q, &self.k, &self.v], x, project)?
                .try_into()
                .expect("three layers, three results");
        let q = split(q, self.num_heads)?;
        let k = split(k, self.num_kv_heads)?;
        let v = split(v, self.num_kv_heads)?;
        let (q, k) = match step.angles {
            Some((cos, sin)) => step.rope.apply_cos_sin(&q, &k, cos, sin)?,
            None => step.rope.apply(&q, &k, step.positions)?,
        };
        Ok((q, k, v))
    }

    /// `x`: `(t, hidden)` → `(t, hidden)`, and the attention probabilities if `want_probs`.
    fn forward(
        &self,
        x: &Tensor,
        step: &Step,
        mask: Option<&Tensor>,
        keys: Keys<'_>,
        want_probs: bool,
    ) -> candle_core::Result<AttnResult> {
        let t = x.dim(0)?;
        let hd = self.head_dim;
        let project = if step.batch_invariant {
            Linear::forward_rows
        } else {
            Linear::forward
        };
        let (q, k, v) = self.qkv(x, step, project)?;
        // (1, kv_heads, s, hd): the keys and values these rows attend over.
        let (all_k, all_v) = match keys {
            Keys::Cache(c) => c.append(&k, &v)?,
            Keys::Own => (k.clone(), v.clone()),
            Keys::After(pk, pv) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let (out, probs) = if step.batch_invariant && !want_probs {
            (
                attention_batch_invariant(&q, &all_k, &all_v, mask, scale)?,
                None,
            )
        } else {
            let att = attention(&q, &all_k, &all_v, mask, scale, step.mode, want_probs)?;
            (att.out, att.probs)
        };
        // (1, heads, t, hd) -> (t, heads * hd)
        let out = out.transpose(1, 2)?.reshape((t, self.num_heads * hd))?;
        Ok(AttnResult {
            out: project(&self.o, &out)?,
            probs,
            k,
            v,
        })
    }
}

/// Which keys and values the new rows attend over, after their own are computed.
pub(crate) enum Keys<'a> {
    /// Appended to a layer cache: cached rows, then the new ones.
    Cache(&'a mut LayerCache),
    /// The new rows only.
    Own,
    /// Given keys / values `(1, kv_heads, s, head_dim)` (RoPE applied), then the new rows: a
    /// differentiable stand-in for a cache (its in-place writes have no backward pass).
    After(&'a Tensor, &'a Tensor),
}

/// One attention call's output `(t, hidden)`, probabilities if asked for, and the new rows' keys
/// and values `(1, kv_heads, t, head_dim)` (RoPE applied).
pub(crate) struct AttnResult {
    pub out: Tensor,
    pub probs: Option<Tensor>,
    pub k: Tensor,
    pub v: Tensor,
}

/// What every layer of one forward pass shares.
#[derive(Clone, Copy)]
pub(crate) struct Step<'a> {
    pub rope: &'a RotaryEmbedding,
    /// `(t,)` u32
    pub positions: &'a Tensor,
    /// Rotation angles `(cos, sin)`, each `(t, head_dim / 2)`, replacing `positions` (M-RoPE rows
    /// with three position components).
    pub angles: Option<(&'a Tensor, &'a Tensor)>,
    pub mode: Mode,
    /// Every row as a decode step computes it alone ([`CausalLm::forward_batch_invariant`]).
    pub batch_invariant: bool,
}

/// Materialised masks of one forward pass, keyed by (sliding window, keys): the mask is described
/// relative to the new rows ([`AttnMask`]) and each layer needs it for its own window and cache
/// length (FastV-pruned layers hold fewer rows). `None`: nothing hidden.
type MaskCache = Vec<((Option<usize>, usize), Option<Tensor>)>;

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    act: glance_nn::Activation,
}

impl Mlp {
    fn load(vb: &VarBuilder, c: &TextConfig, load: &WeightLoad) -> Result<Self> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        Ok(Self {
            gate: linear_as(&vb.pp("gate_proj"), h, i, c.mlp_bias, load)?,
            up: linear_as(&vb.pp("up_proj"), h, i, c.mlp_bias, load)?,
            down: linear_as(&vb.pp("down_proj"), i, h, c.mlp_bias, load)?,
            act: c.hidden_act,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_with(x, Linear::forward)
    }

    /// [`Mlp::forward`] on rows of different sequences `(n, hidden)`, each weight read once.
    fn forward_rows(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_with(x, Linear::forward_rows)
    }

    /// `down(act(gate(x)) * up(x))`, the gate and up projections in one group pass where they
    /// are packed, else each through `project`.
    fn forward_with(
        &self,
        x: &Tensor,
        project: fn(&Linear, &Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        let [g, u]: [Tensor; 2] = Linear::forward_group(&[&self.gate, &self.up], x, project)?
            .try_into()
            .expect("two layers, two results");
        project(&self.down, &self.act.gated(&g, &u)?)
    }
}

/// One pre-norm decoder block.
pub(crate) struct Layer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
    pub window: Option<usize>,
}

impl Layer {
    /// The block under `vb` (`input_layernorm`, `self_attn`, `post_attention_layernorm`, `mlp`).
    pub(crate) fn load(
        vb: &VarBuilder,
        c: &TextConfig,
        window: Option<usize>,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        Ok(Layer {
            input_norm: rms_norm(
                &vb.pp("input_layernorm"),
                c.hidden_size,
                c.rms_norm_eps,
                mode,
            )?,
            attn: Attention::load(&vb.pp("self_attn"), c, load)?,
            post_norm: rms_norm(
                &vb.pp("post_attention_layernorm"),
                c.hidden_size,
                c.rms_norm_eps,
                mode,
            )?,
            mlp: Mlp::load(&vb.pp("mlp"), c, load)?,
            window,
        })
    }

    /// `x` `(t, hidden)` → the block's output `(t, hidden)`; the attention result carries the
    /// probabilities (if `want_probs`) and the new rows' keys and values.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        step: &Step,
        mask: Option<&Tensor>,
        keys: Keys<'_>,
        want_probs: bool,
    ) -> candle_core::Result<(Tensor, AttnResult)> {
        let h = self.input_norm.forward(x)?;
        let att = self.attn.forward(&h, step, mask, keys, want_probs)?;
        let x = (x + &att.out)?;
        let post = self.post_norm.forward(&x)?;
        let h = if step.batch_invariant {
            self.mlp.forward_rows(&post)?
        } else {
            self.mlp.forward(&post)?
        };
        Ok(((x + h)?, att))
    }
}

/// Which kernels a pass runs on.
#[derive(Debug, Clone, Copy)]
enum Kernels {
    /// GEMM for many rows, the decode kernels for a few; `Some(l)`: also return layer `l`'s
    /// attention probabilities of the last row.
    Default(Option<usize>),
    /// Every row as a decode step computes it alone ([`CausalLm::forward_batch_invariant`]).
    BatchInvariant,
}

/// A Llama-family decoder with its LM head.
pub struct TextModel {
    config: TextConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// Ids at and above this are never produced: their logits are −∞ ([`TextModel::limit_vocab`]).
    decodable: usize,
    rope: RotaryEmbedding,
    mode: Mode,
    device: Device,
}

impl TextModel {
    /// `vb` at the decoder root (`embed_tokens`, `layers`, `norm`); `head_vb` at the LM head
    /// (`lm_head`), ignored when the embeddings are tied.
    pub fn load(
        vb: &VarBuilder,
        head_vb: &VarBuilder,
        config: &TextConfig,
        mode: Mode,
    ) -> Result<Self> {
        Self::load_as(vb, head_vb, config, mode, &WeightLoad::f32())
    }

    /// [`TextModel::load`] with the linear weights (attention, MLP, LM head) held as `load`
    /// says; the token embeddings are kept in [`WeightFormat::companion`] (f32, or a 16-bit
    /// float), the norms in f32. Packed weights are for inference (`mode` Infer).
    pub fn load_as(
        vb: &VarBuilder,
        head_vb: &VarBuilder,
        config: &TextConfig,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let c = config;
        if load.format != WeightFormat::F32 && mode == Mode::Train {
            return Err(Error::InvalidParam(format!(
                "{} weights are for inference; training needs f32",
                load.format
            )));
        }
        // A config that declares fewer layers than the checkpoint holds would silently run a
        // truncated model.
        let extra = format!("layers.{}.input_layernorm.weight", c.num_layers);
        if vb.contains_tensor(&extra) {
            return Err(Error::Config(format!(
                "the checkpoint holds more decoder layers than num_hidden_layers = {} in \
                 config.json (it has `{}`)",
                c.num_layers,
                vb.pp(&extra).prefix()
            )));
        }
        // The embeddings and the LM head first, while little else is resident: the embeddings
        // are read in f32 (a tied head is packed from those values) and kept in the companion
        // format, so their f32 copy (the largest tensor of a Llama) is gone before the layers
        // load, and the peak of a packed load stays near what the model holds.
        // (vocab, hidden)
        let embed_w = param(
            &vb.pp("embed_tokens"),
            (c.vocab_size, c.hidden_size),
            "weight",
        )?;
        let head_format = load.format.for_in_dim(c.hidden_size);
        let tied_head = match (c.tie_word_embeddings, head_format) {
            (true, WeightFormat::F32) => Some(Linear::new(embed_w.clone(), None)),
            (true, format) => Some(Linear::packed(pack_tensor(format, &embed_w)??, None)),
            (false, _) => None,
        };
        // (vocab, hidden) in the companion format: a 16-bit float beside packed weights. Taken
        // by value, so the f32 tensor is dropped here (a shadowed binding would live on to the
        // end of the load).
        let embed_w = in_companion(embed_w, load.format)?;
        let lm_head = match tied_head {
            Some(head) => head,
            None => linear_as(head_vb, c.hidden_size, c.vocab_size, false, load)?,
        };
        let layers = (0..c.num_layers)
            .map(|i| {
                let lv = vb.pp(format!("layers.{i}"));
                Layer::load(&lv, c, c.layer_windows[i], mode, load)
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = RotaryEmbedding::new(
            c.head_dim,
            c.rope_theta,
            c.rope_scaling.as_ref(),
            mode,
            vb.device(),
        )?;
        Ok(Self {
            config: c.clone(),
            embed: Embedding::new(embed_w, c.hidden_size),
            layers,
            norm: rms_norm(&vb.pp("norm"), c.hidden_size, c.rms_norm_eps, mode)?,
            lm_head,
            decodable: c.vocab_size,
            rope,
            mode,
            device: vb.device().clone(),
        })
    }

    /// Masks the logits of ids `>= n` (−∞) in [`CausalLm::logits`] and
    /// [`TextModel::logits_rows`], so that no decoding strategy (greedy, sampling, speculative
    /// drafts read through the same head, block diffusion) ever produces them: ids the tokenizer
    /// cannot decode (LLaVA-1.5 pads 32002 tokens to 32064 rows), or a twin's padded vocabulary.
    /// A second call can only lower the limit.
    pub fn limit_vocab(&mut self, n: usize) {
        self.decodable = self.decodable.min(n.max(1));
    }

    /// Ids below this can be produced (the vocabulary unless [`TextModel::limit_vocab`] lowered
    /// it).
    pub fn decodable_vocab(&self) -> usize {
        self.decodable
    }

    /// The LM head's logits `(t, vocab)` of every id, none masked: for parity checks against
    /// other implementations.
    pub fn raw_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.lm_head.forward(hidden)?)
    }

    /// `logits` `(t, vocab)` with the ids at and above [`TextModel::decodable_vocab`] at −∞.
    fn mask(&self, logits: Tensor) -> Result<Tensor> {
        let vocab = logits.dim(1)?;
        if self.decodable >= vocab {
            return Ok(logits);
        }
        let t = logits.dim(0)?;
        // (t, vocab - decodable)
        let masked = Tensor::full(f32::NEG_INFINITY, (t, vocab - self.decodable), &self.device)?;
        Ok(Tensor::cat(
            &[&logits.narrow(1, 0, self.decodable)?, &masked],
            1,
        )?)
    }

    pub fn config(&self) -> &TextConfig {
        &self.config
    }

    /// Every linear layer (attention, MLP per layer, then the LM head).
    pub fn linears(&self) -> Vec<&Linear> {
        let mut out = Vec::with_capacity(7 * self.layers.len() + 1);
        for l in &self.layers {
            let (a, m) = (&l.attn, &l.mlp);
            out.extend([&a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down]);
        }
        out.push(&self.lm_head);
        out
    }

    /// Bytes of one stored token-embedding value (4 in f32, 2 beside packed weights).
    pub fn embedding_bytes_per_value(&self) -> usize {
        self.embed.embeddings().dtype().size_in_bytes()
    }

    /// Bytes of the linear weights as held: what one decode step streams, besides one embedding
    /// row and the norms.
    pub fn linear_weight_bytes(&self) -> usize {
        self.linears().iter().map(|l| l.weight_bytes()).sum()
    }

    /// Full-sequence forward without a cache (training, reference checks): `xs` `(t, hidden)`.
    pub fn forward_uncached(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
    ) -> Result<Tensor> {
        self.run(xs, positions, mask, None)
    }

    fn run(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let all = 0..self.layers.len();
        let (x, _) = self.run_layers(
            xs,
            positions,
            None,
            mask,
            cache,
            all,
            Kernels::Default(None),
        )?;
        Ok(self.norm.forward(&x)?)
    }

    /// M-RoPE rotation angles of rows at `rows` (temporal, height, width) → `(cos, sin)`, each
    /// `(t, head_dim / 2)`.
    fn mrope_angles(&self, rows: &[[u32; 3]]) -> Result<(Tensor, Tensor)> {
        let section = self.config.mrope_section.as_deref().ok_or_else(|| {
            Error::InvalidParam("3-D positions given to a decoder without M-RoPE".into())
        })?;
        let t = rows.len();
        // (3, t): component-major
        let flat: Vec<u32> = (0..3)
            .flat_map(|c| rows.iter().map(move |r| r[c]))
            .collect();
        let pos = Tensor::from_vec(flat, (3, t), &self.device)?;
        Ok(self.rope.cos_sin_mrope(&pos, section)?)
    }

    /// The scalar position each M-RoPE row is bounded by (its largest component).
    fn mrope_scalar(rows: &[[u32; 3]]) -> Vec<u32> {
        rows.iter().map(|r| r[0].max(r[1]).max(r[2])).collect()
    }

    /// [`CausalLm::forward_mrope`] without a cache (reference checks).
    pub fn forward_uncached_mrope(
        &self,
        xs: &Tensor,
        positions: &[[u32; 3]],
        mask: &AttnMask,
    ) -> Result<Tensor> {
        let scalar = Self::mrope_scalar(positions);
        let all = 0..self.layers.len();
        let (x, _) = self.run_layers(
            xs,
            &scalar,
            Some(positions),
            mask,
            None,
            all,
            Kernels::Default(None),
        )?;
        Ok(self.norm.forward(&x)?)
    }

    /// Runs only the decoder layers `layers` on rows `xs` `(t, hidden)` (the embeddings for a range
    /// starting at 0, else the output of the layer before), without the final norm. With
    /// `probe = Some(l)`, also returns layer `l`'s attention probabilities of the last row,
    /// `(heads, kv_len)` — what FastV ranks visual tokens by. Layers may hold different numbers of
    /// cached rows (FastV drops rows from the deeper layers only).
    pub fn forward_layers(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
        layers: std::ops::Range<usize>,
        probe: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.layer_range(xs, positions, None, mask, cache, layers, probe)
    }

    /// [`Self::forward_layers`] of rows at 3-D (M-RoPE) positions.
    pub fn forward_layers_mrope(
        &self,
        xs: &Tensor,
        positions: &[[u32; 3]],
        mask: &AttnMask,
        cache: &mut KvCache,
        layers: std::ops::Range<usize>,
        probe: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let scalar = Self::mrope_scalar(positions);
        self.layer_range(xs, &scalar, Some(positions), mask, cache, layers, probe)
    }

    /// Layers `layers` over `xs` with the cache, the range checked.
    #[allow(clippy::too_many_arguments)]
    fn layer_range(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mrope: Option<&[[u32; 3]]>,
        mask: &AttnMask,
        cache: &mut KvCache,
        layers: std::ops::Range<usize>,
        probe: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if layers.end > self.layers.len() || layers.start > layers.end {
            return Err(Error::InvalidParam(format!(
                "layer range {layers:?} of {}",
                self.layers.len()
            )));
        }
        self.run_layers(
            xs,
            positions,
            mrope,
            mask,
            Some(cache),
            layers,
            Kernels::Default(probe),
        )
    }

    /// The logits of rows of different sequences `(n, hidden)` → `(n, vocab)`, the LM head read
    /// once; row `r` equals [`CausalLm::logits`] of that row alone.
    pub fn logits_rows(&self, hidden: &Tensor) -> Result<Tensor> {
        self.mask(self.lm_head.forward_rows(hidden)?)
    }

    /// The final RMSNorm, `(t, hidden)`.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.norm.forward(x)?)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_layers(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mrope: Option<&[[u32; 3]]>,
        mask: &AttnMask,
        mut cache: Option<&mut KvCache>,
        layers: std::ops::Range<usize>,
        kernels: Kernels,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (probe, batch_invariant) = match kernels {
            Kernels::Default(probe) => (probe, false),
            Kernels::BatchInvariant => (None, true),
        };
        let t = xs.dim(0)?;
        if positions.len() != t {
            return Err(Error::Input(format!(
                "{} positions for {t} rows",
                positions.len()
            )));
        }
        let max = self.config.max_position_embeddings;
        let past = cache.as_ref().map_or(0, |c| c.len());
        if let Some(&p) = positions.iter().max() {
            // Batch-invariant passes may hold more speculative rows than the context has positions (a
            // quadratic block-diffusion pass runs `B (B + 1)` rows at `2B` positions), and so may
            // an uncached training pass (a diffusion layout's noisy copies share the clean rows'
            // positions); only the positions are bounded there.
            let cached = cache.is_some();
            if p as usize >= max || (!batch_invariant && cached && past + t > max) {
                return Err(Error::PromptTooLong {
                    len: (past + t).max(p as usize + 1),
                    max,
                });
            }
        }
        let pos = Tensor::new(positions, &self.device)?;
        let angles = match mrope {
            None => None,
            Some(rows) => Some(self.mrope_angles(rows)?),
        };
        // One materialised mask per distinct (sliding window, cached rows).
        let mut masks: MaskCache = Vec::new();
        let mut x = xs.clone();
        let mut probed = None;
        for i in layers {
            let layer = &self.layers[i];
            let kv_len = cache.as_ref().map_or(0, |c| c.layer(i).len()) + t;
            let key = (layer.window, kv_len);
            if !masks.iter().any(|(k, _)| *k == key) {
                let m = mask.materialize(layer.window, t, kv_len, &self.device)?;
                masks.push((key, m));
            }
            // (t, kv_len) additive, or None
            let m = masks
                .iter()
                .find(|(k, _)| *k == key)
                .and_then(|(_, m)| m.as_ref());
            let keys = match cache.as_mut() {
                Some(c) => Keys::Cache(c.layer_mut(i)),
                None => Keys::Own,
            };
            let want = probe == Some(i);
            let step = Step {
                rope: &self.rope,
                positions: &pos,
                angles: angles.as_ref().map(|(c, s)| (c, s)),
                mode: self.mode,
                batch_invariant,
            };
            let (out, att) = layer.forward(&x, &step, m, keys, want)?;
            if let Some(p) = att.probs {
                // (1, heads, t, kv_len) -> last query row (heads, kv_len)
                probed = Some(p.squeeze(0)?.narrow(1, t - 1, 1)?.squeeze(1)?);
            }
            x = out;
        }
        Ok((x, probed))
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
        Ok(self
            .embed
            .forward(&ids)?
            .to_dtype(candle_core::DType::F32)?)
    }

    fn forward(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        self.run(xs, positions, mask, Some(cache))
    }

    fn forward_batch_invariant(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let all = 0..self.layers.len();
        let (x, _) = self.run_layers(
            xs,
            positions,
            None,
            mask,
            Some(cache),
            all,
            Kernels::BatchInvariant,
        )?;
        Ok(self.norm.forward(&x)?)
    }

    /// With `mrope_section` in the config, each row turns at its three positions; without, as
    /// the trait's default (equal parts only).
    fn forward_mrope(
        &self,
        xs: &Tensor,
        positions: &[[u32; 3]],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        if self.config.mrope_section.is_none() {
            let scalar = glance_nn::lm::equal_parts(positions)?;
            return self.run(xs, &scalar, mask, Some(cache));
        }
        let scalar = Self::mrope_scalar(positions);
        let all = 0..self.layers.len();
        let (x, _) = self.run_layers(
            xs,
            &scalar,
            Some(positions),
            mask,
            Some(cache),
            all,
            Kernels::Default(None),
        )?;
        Ok(self.norm.forward(&x)?)
    }

    /// The LM head's logits, ids at and above [`TextModel::decodable_vocab`] masked (−∞).
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.mask(self.lm_head.forward(hidden)?)
    }

    fn forward_groups(&self, xs: &Tensor, groups: &mut [RowGroup<'_>]) -> Result<Tensor> {
        self.forward_groups_batched(xs, groups)
    }

    fn logits_rows(&self, hidden: &Tensor) -> Result<Tensor> {
        TextModel::logits_rows(self, hidden)
    }

    fn lm_head_rows(&self, ids: &[u32]) -> Result<Option<Linear>> {
        Ok(Some(self.lm_head.select_rows(ids)?))
    }
}

/// `w` in `format`'s [`WeightFormat::companion`] (a 16-bit float beside packed weights, f32
/// beside f32), consuming `w`.
fn in_companion(w: Tensor, format: WeightFormat) -> Result<Tensor> {
    Ok(match format.companion() {
        WeightFormat::Bf16 => w.to_dtype(candle_core::DType::BF16)?,
        WeightFormat::F16 => w.to_dtype(candle_core::DType::F16)?,
        _ => w,
    })
}
