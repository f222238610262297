//! One forward pass over the rows of several requests ([`CausalLm::forward_groups`]): the
//! scheduler's step, where plain decode rows, draft-tree rows and diffusion blocks of different
//! requests go through every linear layer as one batch of rows while each request attends over
//! its own cache under its own mask. A draft head's one layer shares its passes the same way
//! ([`glance_nn::DraftLm::forward_groups`]: one pass per tree level for every request).
//!
//! Every row gets the bits its request's pass alone gives it:
//! * the linear layers run each row through the single-row arithmetic
//!   ([`glance_nn::Linear::forward_rows`]), which is what [`CausalLm::forward`] runs on a pass of
//!   up to [`glance_nn::matvec::MAX_SMALL_ROWS`] rows (wider non-invariant groups are run alone);
//! * norms, RoPE, activations and residuals are row-wise;
//! * a group's attention is the call its own pass makes: [`glance_nn::attention`] (or
//!   [`glance_nn::attention_batch_invariant`]) on its rows, keys and materialised mask; one-row
//!   causal groups (plain decode steps) share [`glance_nn::attend_rows::attend_rows`], whose
//!   steps are those of the row-wise kernel a one-row pass takes.

use super::{Attention, Layer, MaskCache, Step, TextModel};
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use glance_nn::matvec::MAX_SMALL_ROWS;
use glance_nn::{
    attention, attention_batch_invariant, AttnMask, Linear, Mode, RotaryEmbedding, RowGroup,
};

impl TextModel {
    /// [`CausalLm::forward_groups`] with every weight read once for all groups.
    pub(super) fn forward_groups_batched(
        &self,
        xs: &Tensor,
        groups: &mut [RowGroup<'_>],
    ) -> Result<Tensor> {
        if !batchable(groups, self.mode) {
            return glance_nn::lm::forward_each(self, xs, groups);
        }
        let x = layers_groups(
            &self.layers,
            &self.rope,
            self.mode,
            &self.device,
            xs,
            groups,
            Some(self.config.max_position_embeddings),
        )?;
        Ok(self.norm.forward(&x)?)
    }
}

/// Whether `groups` can share one pass with the bits of their own passes: at least two of
/// them, in inference mode, and no group wider than the passes whose linear layers run the
/// single-row arithmetic (a wider non-invariant group's own pass takes the GEMM kernels).
pub(crate) fn batchable(groups: &[RowGroup<'_>], mode: Mode) -> bool {
    let wide = groups
        .iter()
        .any(|g| !g.invariant && g.positions.len() > MAX_SMALL_ROWS);
    groups.len() >= 2 && !wide && mode == Mode::Infer
}

/// Runs `layers` (layer `i` over layer `i` of each group's cache) on the rows of every group
/// `xs` `(n, hidden)`, each weight read once for all of them, and returns the last layer's
/// output `(n, hidden)` (before any final norm). The target's decoder and a draft head's one
/// layer both share their passes through it. `max`: the most positions (and, for
/// non-invariant groups, cached plus new rows) a group may reach; `None` leaves the bound to
/// the rotary tables, as a draft head's own pass does.
pub(crate) fn layers_groups(
    layers: &[Layer],
    rope: &RotaryEmbedding,
    mode: Mode,
    device: &Device,
    xs: &Tensor,
    groups: &mut [RowGroup<'_>],
    max: Option<usize>,
) -> Result<Tensor> {
    let n: usize = groups.iter().map(|g| g.positions.len()).sum();
    if xs.dim(0)? != n || groups.iter().any(|g| g.positions.is_empty()) {
        return Err(Error::Input(format!(
            "a shared pass of {} rows for groups of {n} rows (none may be empty)",
            xs.dim(0)?
        )));
    }
    if let Some(max) = max {
        for g in groups.iter() {
            let past = g.cache.len();
            let t = g.positions.len();
            let p = *g.positions.iter().max().expect("non-empty") as usize;
            if p >= max || (!g.invariant && past + t > max) {
                return Err(Error::PromptTooLong {
                    len: (past + t).max(p + 1),
                    max,
                });
            }
        }
    }
    let positions: Vec<u32> = groups
        .iter()
        .flat_map(|g| g.positions.iter().copied())
        .collect();
    // (n,) u32
    let pos = Tensor::new(positions.as_slice(), device)?;
    let step = Step {
        rope,
        positions: &pos,
        angles: None,
        mode,
        batch_invariant: true,
    };
    let mut masks: Vec<MaskCache> = groups.iter().map(|_| Vec::new()).collect();
    let mut x = xs.clone();
    for (i, layer) in layers.iter().enumerate() {
        x = layer.forward_groups(&x, &step, groups, i, &mut masks)?;
    }
    Ok(x)
}

impl Layer {
    /// The block on the rows of every group `(n, hidden)` → `(n, hidden)`.
    fn forward_groups(
        &self,
        x: &Tensor,
        step: &Step,
        groups: &mut [RowGroup<'_>],
        layer: usize,
        masks: &mut [MaskCache],
    ) -> Result<Tensor> {
        let h = self.input_norm.forward(x)?;
        let att = self
            .attn
            .forward_groups(&h, step, groups, layer, self.window, masks)?;
        let x = (x + att)?;
        let h = self.mlp.forward_rows(&self.post_norm.forward(&x)?)?;
        Ok((x + h)?)
    }
}

impl Attention {
    /// Each group's rows of `x` `(n, hidden)` attend over its own cache (appended here) under its
    /// own mask; the projections run on all rows at once. Returns `(n, hidden)`.
    fn forward_groups(
        &self,
        x: &Tensor,
        step: &Step,
        groups: &mut [RowGroup<'_>],
        layer: usize,
        window: Option<usize>,
        masks: &mut [MaskCache],
    ) -> Result<Tensor> {
        let hd = self.head_dim;
        let width = self.num_heads * hd;
        let scale = 1.0 / (hd as f64).sqrt();
        // (1, heads | kv_heads, n, hd), RoPE applied row by row.
        let (q, k, v) = self.qkv(x, step, Linear::forward_rows)?;
        let single =
            |g: &RowGroup<'_>| g.positions.len() == 1 && matches!(g.mask, AttnMask::Causal);
        // Per group, its output rows `(t, heads * hd)`.
        let mut outs: Vec<Option<Tensor>> = vec![None; groups.len()];
        // One-row causal groups: one call of the batched decode-attention kernel.
        let mut rows = Vec::new();
        let mut kv = Vec::new();
        let mut first = 0;
        let mut starts = Vec::with_capacity(groups.len());
        for g in groups.iter_mut() {
            starts.push(first);
            if single(g) {
                let (kr, vr) = (k.narrow(2, first, 1)?, v.narrow(2, first, 1)?);
                kv.push(g.cache.layer_mut(layer).append(&kr, &vr)?);
                rows.push(first as u32);
            }
            first += g.positions.len();
        }
        let single_out = if rows.is_empty() {
            None
        } else {
            let idx = Tensor::new(rows.as_slice(), x.device())?;
            // (1, heads, s, hd)
            let qs = q.index_select(&idx, 2)?.contiguous()?;
            // (s, heads * hd)
            Some(glance_nn::attend_rows::attend_rows(
                &qs, &kv, window, scale,
            )?)
        };
        let mut s = 0;
        for (gi, g) in groups.iter_mut().enumerate() {
            let t = g.positions.len();
            if single(g) {
                let out = single_out.as_ref().expect("computed above");
                outs[gi] = Some(out.narrow(0, s, 1)?);
                s += 1;
                continue;
            }
            let r = starts[gi];
            let (kg, vg) = (k.narrow(2, r, t)?, v.narrow(2, r, t)?);
            let qg = q.narrow(2, r, t)?.contiguous()?;
            // (1, kv_heads, s, hd): cached rows, then the group's.
            let (all_k, all_v) = g
                .cache
                .layer_mut(layer)
                .append(&kg.contiguous()?, &vg.contiguous()?)?;
            let kv_len = all_k.dim(2)?;
            let key = (window, kv_len);
            let cache = &mut masks[gi];
            if !cache.iter().any(|(k, _)| *k == key) {
                let m = g.mask.materialize(window, t, kv_len, x.device())?;
                cache.push((key, m));
            }
            // (t, kv_len) additive, or None
            let m = cache
                .iter()
                .find(|(k, _)| *k == key)
                .and_then(|(_, m)| m.as_ref());
            let out = if g.invariant {
                attention_batch_invariant(&qg, &all_k, &all_v, m, scale)?
            } else {
                attention(&qg, &all_k, &all_v, m, scale, step.mode, false)?.out
            };
            // (1, heads, t, hd) -> (t, heads * hd)
            outs[gi] = Some(out.transpose(1, 2)?.reshape((t, width))?);
        }
        let outs: Vec<Tensor> = outs.into_iter().map(|o| o.expect("every group")).collect();
        // (n, heads * hd) -> (n, hidden)
        Ok(self.o.forward_rows(&Tensor::cat(&outs, 0)?)?)
    }
}
