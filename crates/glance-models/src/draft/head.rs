//! The draft head: `fc([embedding ; previous hidden])` → (global-feature fusion) → one decoder
//! layer → RMSNorm, predicting the target's next final hidden state. Draft row `r` reads token
//! `x_r` and the target hidden state `h_{r-1}` that predicted it (EAGLE's shifted pairing).

use super::config::DraftConfig;
use crate::checkpoint::var_builder;
use crate::random::with_random_weights;
use crate::text::{batchable, layers_groups, Keys, Layer, Step, TextConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::weights::{linear, linear_as, param, rms_norm};
use glance_nn::{
    attention, AttnMask, CausalLm, DraftContext, DraftKind, DraftLm, DraftLogits, DraftPrompt,
    DraftStart, KvCache, Linear, Mode, RmsNorm, RotaryEmbedding, RowGroup, WeightFormat,
    WeightLoad,
};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// ViSpec's vision adaptor: `queries` cross-attend over an image's visual rows.
struct Adaptor {
    /// `(n_q, hidden)`
    queries: Tensor,
    norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
    head_dim: usize,
}

impl Adaptor {
    fn load(vb: &VarBuilder, c: &TextConfig, n_q: usize, mode: Mode) -> Result<Self> {
        let (h, inner) = (c.hidden_size, c.num_heads * c.head_dim);
        Ok(Self {
            queries: param(vb, (n_q, h), "queries")?,
            norm: rms_norm(&vb.pp("norm"), h, c.rms_norm_eps, mode)?,
            q: linear(&vb.pp("q_proj"), h, inner, false)?,
            k: linear(&vb.pp("k_proj"), h, inner, false)?,
            v: linear(&vb.pp("v_proj"), h, inner, false)?,
            o: linear(&vb.pp("o_proj"), inner, h, false)?,
            heads: c.num_heads,
            head_dim: c.head_dim,
        })
    }

    /// An image's visual rows `(n, hidden)` → its compressed tokens `(n_q, hidden)`.
    fn forward(&self, features: &Tensor, mode: Mode) -> Result<Tensor> {
        let (heads, hd) = (self.heads, self.head_dim);
        // (rows, heads * hd) -> (1, heads, rows, hd)
        let split = |y: Tensor| -> candle_core::Result<Tensor> {
            let rows = y.dim(0)?;
            y.reshape((1, rows, heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let kv = self.norm.forward(features)?;
        let q = split(self.q.forward(&self.queries)?)?;
        let k = split(self.k.forward(&kv)?)?;
        let v = split(self.v.forward(&kv)?)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let att = attention(&q, &k, &v, None, scale, mode, false)?;
        let n_q = self.queries.dim(0)?;
        // (1, heads, n_q, hd) -> (n_q, heads * hd)
        let out = att.out.transpose(1, 2)?.reshape((n_q, heads * hd))?;
        Ok((&self.queries + self.o.forward(&out)?)?)
    }
}

/// An EAGLE / ViSpec draft head (see the module documentation of [`crate::draft`]).
pub struct DraftHead {
    config: DraftConfig,
    layer_config: TextConfig,
    /// `(hidden, 2·hidden)` with bias: `[embedding ; previous hidden]` → row.
    fc: Linear,
    /// `(hidden, 2·hidden)`: `[row ; global feature]` → row.
    inject: Option<Linear>,
    adaptor: Option<Adaptor>,
    layer: Layer,
    norm: RmsNorm,
    rope: RotaryEmbedding,
    mode: Mode,
    device: Device,
    /// The reduced vocabulary of the config, shared with each [`DraftLogits`].
    vocab: Option<Arc<[u32]>>,
    /// The target's LM head restricted to `vocab`, built from the first target the head drafts
    /// for (a head serves one target: the engine checks that it fits).
    vocab_head: OnceLock<Linear>,
}

impl DraftHead {
    /// Loads `dir` (`config.json`, `model.safetensors`) for inference, in f32.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_as(dir, device, WeightFormat::F32)
    }

    /// Loads `dir` with the per-row matrices (`fc`, `inject`, the decoder layer's) packed in
    /// `format`, the target's: a draft step then streams the bytes of the target's format, not
    /// f32's (the adaptor, run once per image, stays f32). The draft's weights only decide what
    /// is proposed, so every lossless strategy stays lossless in any format.
    pub fn load_as(dir: &Path, device: &Device, format: WeightFormat) -> Result<Self> {
        let config = DraftConfig::load(dir)?;
        let vb = var_builder(dir, DType::F32, device)?;
        Self::from_var_builder_as(&vb, config, Mode::Infer, &WeightLoad::new(format))
    }

    /// The head's tensors under `vb`: `fc`, `inject`, `adaptor.*`, `layer.*`, `norm`.
    pub fn from_var_builder(vb: &VarBuilder, config: DraftConfig, mode: Mode) -> Result<Self> {
        Self::from_var_builder_as(vb, config, mode, &WeightLoad::f32())
    }

    /// [`DraftHead::from_var_builder`] with the per-row matrices held as `load` says.
    pub fn from_var_builder_as(
        vb: &VarBuilder,
        config: DraftConfig,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        config.validate()?;
        let c = config.layer_config()?;
        let h = c.hidden_size;
        let adaptor = config
            .adaptor_queries
            .map(|n_q| Adaptor::load(&vb.pp("adaptor"), &c, n_q, mode))
            .transpose()?;
        let inject = config
            .global_injection
            .then(|| linear_as(&vb.pp("inject"), 2 * h, h, false, load))
            .transpose()?;
        Ok(Self {
            fc: linear_as(&vb.pp("fc"), 2 * h, h, true, load)?,
            inject,
            adaptor,
            layer: Layer::load(&vb.pp("layer"), &c, c.layer_windows[0], mode, load)?,
            norm: rms_norm(&vb.pp("norm"), h, c.rms_norm_eps, mode)?,
            rope: RotaryEmbedding::new(
                c.head_dim,
                c.rope_theta,
                c.rope_scaling.as_ref(),
                mode,
                vb.device(),
            )?,
            layer_config: c,
            vocab: config.draft_vocab.as_deref().map(Arc::from),
            vocab_head: OnceLock::new(),
            config,
            mode,
            device: vb.device().clone(),
        })
    }

    /// A head of `config` with seeded random weights (drawn as [`crate::random`] does), also
    /// written to `dir` as a head directory (`config.json`, `model.safetensors`): an untrained
    /// head for tests and benchmarks of the decoding machinery.
    pub fn write_random(dir: &Path, config: DraftConfig, seed: u64) -> Result<Self> {
        let (head, tensors) = with_random_weights(seed, &Device::Cpu, |vb| {
            Self::from_var_builder(vb, config.clone(), Mode::Infer)
        })?;
        config.save(dir)?;
        candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
        Ok(head)
    }

    pub fn config(&self) -> &DraftConfig {
        &self.config
    }

    pub fn hidden_size(&self) -> usize {
        self.layer_config.hidden_size
    }

    pub fn vocab_size(&self) -> usize {
        self.layer_config.vocab_size
    }

    /// An image's visual rows `(n, hidden)` → the adaptor's compressed tokens `(n_q, hidden)`, or
    /// `None` without an adaptor.
    pub fn compress_image(&self, rows: &Tensor) -> Result<Option<Tensor>> {
        self.adaptor
            .as_ref()
            .map(|a| a.forward(rows, self.mode))
            .transpose()
    }

    /// The global visual feature `(1, hidden)`: the mean of every image's visual rows, or `None`
    /// without injection or without images.
    pub fn global_feature(&self, images: &[Tensor]) -> Result<Option<Tensor>> {
        if self.inject.is_none() || images.is_empty() {
            return Ok(None);
        }
        let all = Tensor::cat(images, 0)?;
        Ok(Some(all.mean_keepdim(0)?))
    }

    /// Rows for embeddings `emb` `(n, hidden)` and predecessor hidden states `prev` `(n, hidden)`.
    pub fn fuse_rows(
        &self,
        emb: &Tensor,
        prev: &Tensor,
        global: Option<&Tensor>,
    ) -> Result<Tensor> {
        let x = self.fc.forward(&Tensor::cat(&[emb, prev], 1)?)?;
        self.inject_rows(x, global)
    }

    /// Fuses the global feature into rows `(n, hidden)` (identity without injection). A prompt
    /// without images gets a zero feature.
    fn inject_rows(&self, x: Tensor, global: Option<&Tensor>) -> Result<Tensor> {
        let Some(inject) = &self.inject else {
            return Ok(x);
        };
        let g = match global {
            Some(g) => g.broadcast_as(x.shape())?.contiguous()?,
            None => x.zeros_like()?,
        };
        Ok(inject.forward(&Tensor::cat(&[&x, &g], 1)?)?)
    }

    /// Positions for `n_q` compressed tokens standing in for an image at `positions`: the
    /// centres of `n_q` equal parts of the span, so the tokens keep the image's place and extent.
    pub fn spread_positions(positions: &[u32], n_q: usize) -> Vec<u32> {
        let n = positions.len();
        (0..n_q)
            .map(|q| positions[((2 * q + 1) * n / (2 * n_q)).min(n - 1)])
            .collect()
    }

    /// The layer and the final norm over rows `xs` `(t, hidden)` at `positions`, attending over
    /// `prefix` keys / values `(1, kv_heads, s, head_dim)` (if any) and then the rows themselves,
    /// under the additive `mask` `(t, s + t)`. Returns the predicted hidden states and the rows'
    /// keys and values. Differentiable: this is what training runs, pass by pass.
    pub fn step_after(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: Option<&Tensor>,
        prefix: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let keys = match prefix {
            Some((k, v)) => Keys::After(k, v),
            None => Keys::Own,
        };
        let pos = Tensor::new(positions, &self.device)?;
        let step = Step {
            rope: &self.rope,
            positions: &pos,
            angles: None,
            mode: self.mode,
            batch_invariant: false,
        };
        let (x, att) = self.layer.forward(xs, &step, mask, keys, false)?;
        Ok((self.norm.forward(&x)?, att.k, att.v))
    }
}

impl DraftHead {
    /// [`DraftLm::logits`], or with `rows` [`DraftLm::logits_rows`] (rows of several
    /// requests, each through the single-row arithmetic of its own call).
    fn draft_logits(
        &self,
        target: &dyn CausalLm,
        hidden: &Tensor,
        rows: bool,
    ) -> Result<DraftLogits> {
        let whole = |hidden: &Tensor| -> Result<DraftLogits> {
            Ok(DraftLogits {
                logits: if rows {
                    target.logits_rows(hidden)?
                } else {
                    target.logits(hidden)?
                },
                ids: None,
            })
        };
        let Some(ids) = &self.vocab else {
            return whole(hidden);
        };
        let head = match self.vocab_head.get() {
            Some(h) => h,
            None => match target.lm_head_rows(ids)? {
                // Two first drafts at once build the same rows; one is kept.
                Some(h) => self.vocab_head.get_or_init(|| h),
                None => return whole(hidden),
            },
        };
        Ok(DraftLogits {
            // (n, hidden) -> (n, |vocab|)
            logits: if rows {
                head.forward_rows(hidden)?
            } else {
                head.forward(hidden)?
            },
            ids: Some(ids.clone()),
        })
    }
}

/// Consecutive runs of the draft sequence built by [`DraftHead::start`].
enum Piece {
    /// Token rows `range` of the fused rows.
    Tokens(std::ops::Range<usize>),
    /// The compressed tokens of image `j`.
    Image(usize),
}

impl DraftLm for DraftHead {
    fn kind(&self) -> DraftKind {
        self.config.kind()
    }

    fn vocab(&self) -> Option<&[u32]> {
        self.vocab.as_deref()
    }

    fn acceptance(&self) -> Option<&[f64]> {
        self.config.acceptance.as_deref()
    }

    fn logits(&self, target: &dyn CausalLm, hidden: &Tensor) -> Result<DraftLogits> {
        self.draft_logits(target, hidden, false)
    }

    fn logits_rows(&self, target: &dyn CausalLm, hidden: &Tensor) -> Result<DraftLogits> {
        self.draft_logits(target, hidden, true)
    }

    fn new_cache(&self) -> KvCache {
        KvCache::new(1)
    }

    fn start_rows(&self, rows: usize, image_rows: &[usize]) -> usize {
        match self.config.adaptor_queries {
            None => rows,
            Some(n_q) => image_rows
                .iter()
                .filter(|&&n| n > 0)
                .fold(rows, |r, &n| r.saturating_sub(n) + n_q),
        }
    }

    fn start(&self, prompt: &DraftPrompt<'_>) -> Result<DraftStart> {
        let t = prompt.inputs.dim(0)?;
        if prompt.hidden.dim(0)? != t || prompt.positions.len() != t {
            return Err(Error::Input(format!(
                "draft prompt: {t} rows, {} hidden states, {} positions",
                prompt.hidden.dim(0)?,
                prompt.positions.len()
            )));
        }
        // (n_i, hidden) per image: its visual rows as the target saw them.
        let visual = prompt
            .images
            .iter()
            .filter(|rows| !rows.is_empty())
            .map(|rows| {
                let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
                let idx = Tensor::from_vec(idx, rows.len(), &self.device)?;
                Ok(prompt.inputs.index_select(&idx, 0)?)
            })
            .collect::<Result<Vec<_>>>()?;
        let global = self.global_feature(&visual)?;
        // Which image (if compressed) each row belongs to.
        let mut owner = vec![None; t];
        if self.adaptor.is_some() {
            for (j, rows) in prompt.images.iter().filter(|r| !r.is_empty()).enumerate() {
                for &r in rows {
                    if r >= t {
                        return Err(Error::Input(format!("image row {r} of a {t}-row prompt")));
                    }
                    owner[r] = Some(j);
                }
            }
        }
        // Token rows 1..t not replaced by compressed tokens, in order, and the layout.
        let mut token_rows = Vec::new();
        let mut pieces = Vec::new();
        let mut positions = Vec::new();
        let mut open = 0;
        let mut emitted = vec![false; visual.len()];
        for (r, owner) in owner.iter().enumerate().skip(1) {
            match *owner {
                None => {
                    token_rows.push(r as u32);
                    positions.push(prompt.positions[r]);
                }
                Some(j) => {
                    if !emitted[j] {
                        emitted[j] = true;
                        if open < token_rows.len() {
                            pieces.push(Piece::Tokens(open..token_rows.len()));
                            open = token_rows.len();
                        }
                        pieces.push(Piece::Image(j));
                        let spans: Vec<u32> = prompt
                            .images
                            .iter()
                            .filter(|r| !r.is_empty())
                            .nth(j)
                            .expect("owner indexes the non-empty images")
                            .iter()
                            .map(|&r| prompt.positions[r])
                            .collect();
                        let n_q = self.config.adaptor_queries.unwrap_or(0);
                        positions.extend(Self::spread_positions(&spans, n_q));
                    }
                }
            }
        }
        if open < token_rows.len() {
            pieces.push(Piece::Tokens(open..token_rows.len()));
        }
        let fused = if token_rows.is_empty() {
            None
        } else {
            let n = token_rows.len();
            let prev: Vec<u32> = token_rows.iter().map(|&r| r - 1).collect();
            let idx = Tensor::from_vec(token_rows, n, &self.device)?;
            let prev = Tensor::from_vec(prev, n, &self.device)?;
            // (n, hidden) each
            let emb = prompt.inputs.index_select(&idx, 0)?;
            let prev = prompt.hidden.index_select(&prev, 0)?;
            Some(self.fuse_rows(&emb, &prev, global.as_ref())?)
        };
        let mut parts = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece {
                Piece::Tokens(range) => {
                    let f = fused.as_ref().expect("token pieces come from fused rows");
                    parts.push(f.narrow(0, range.start, range.len())?);
                }
                Piece::Image(j) => {
                    let c = self
                        .compress_image(&visual[j])?
                        .expect("images are compressed only with an adaptor");
                    parts.push(self.inject_rows(c, global.as_ref())?);
                }
            }
        }
        if parts.is_empty() {
            return Err(Error::Input(
                "the draft needs a prompt of at least two rows".into(),
            ));
        }
        // (n, hidden)
        let rows = Tensor::cat(&parts, 0)?;
        Ok(DraftStart {
            rows,
            positions,
            context: DraftContext { global },
        })
    }

    fn fuse(&self, emb: &Tensor, prev: &Tensor, context: &DraftContext) -> Result<Tensor> {
        self.fuse_rows(emb, prev, context.global.as_ref())
    }

    fn forward(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let t = xs.dim(0)?;
        if positions.len() != t {
            return Err(Error::Input(format!(
                "{} positions for {t} rows",
                positions.len()
            )));
        }
        let kv_len = cache.len() + t;
        let m = mask.materialize(self.layer.window, t, kv_len, &self.device)?;
        let pos = Tensor::new(positions, &self.device)?;
        let step = Step {
            rope: &self.rope,
            positions: &pos,
            angles: None,
            mode: self.mode,
            batch_invariant: false,
        };
        let (x, _) = self.layer.forward(
            xs,
            &step,
            m.as_ref(),
            Keys::Cache(cache.layer_mut(0)),
            false,
        )?;
        Ok(self.norm.forward(&x)?)
    }

    /// The layer's shared pass ([`crate::text::layers_groups`]: the target decoder's, reading
    /// each weight once for every group), then the row-wise final norm; groups whose own
    /// passes take other kernels (a draft start's prompt rows) run alone.
    fn forward_groups(&self, xs: &Tensor, groups: &mut [RowGroup<'_>]) -> Result<Tensor> {
        if groups.iter().any(|g| g.invariant) || !batchable(groups, self.mode) {
            return glance_nn::lm::draft_forward_each(self, xs, groups);
        }
        // (n, hidden)
        let x = layers_groups(
            std::slice::from_ref(&self.layer),
            &self.rope,
            self.mode,
            &self.device,
            xs,
            groups,
            None,
        )?;
        Ok(self.norm.forward(&x)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random head written to a directory loads back with the same weights.
    #[test]
    fn a_written_random_head_loads_back_identically() {
        let text = serde_json::json!({"model_type": "llama", "vocab_size": 50, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 128});
        let dir = std::env::temp_dir().join(format!("glance-random-head-{}", std::process::id()));
        let config = DraftConfig::for_target(&text, Some(3), true).unwrap();
        let written = DraftHead::write_random(&dir, config.clone(), 7).unwrap();
        let loaded = DraftHead::load(&dir, &Device::Cpu).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(loaded.config(), &config);
        assert_eq!(loaded.kind(), DraftKind::Vispec);
        let x = Tensor::arange(0f32, 64.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 32))
            .unwrap();
        let x = (x / 64.0).unwrap();
        let global = x.narrow(0, 0, 1).unwrap();
        let run = |h: &DraftHead| -> Vec<Vec<f32>> {
            let rows = h.fuse_rows(&x, &x, Some(&global)).unwrap();
            let mut cache = h.new_cache();
            h.forward(&rows, &[0, 1], &AttnMask::causal(), &mut cache)
                .unwrap()
                .to_vec2()
                .unwrap()
        };
        assert_eq!(run(&written), run(&loaded));
    }
}
