//! Scaled dot-product attention with grouped-query heads, an arbitrary additive mask and optional
//! access to the attention probabilities — and [`AttnMask`], which says which keys the new rows of
//! a forward pass may see.
//!
//! Masks are always explicit: tree verification, diffusion blocks and pruned prefixes differ from
//! plain decoding only in the mask and the position ids they pass.
//!
//! # Masks relative to the new rows
//!
//! An [`AttnMask`] describes the `t` rows of one forward pass relative to themselves; it says
//! nothing about how many rows are cached. The decoder materialises it per layer with
//! [`AttnMask::materialize`] for that layer's sliding window and cache length `past` (after FastV
//! — Chen et al., "An Image is Worth 1/2 Tokens After Layer 2" — deeper layers hold fewer cached
//! rows than the first). The kinds:
//!
//! * [`Causal`](AttnMask::Causal): new row `i` is cache row `past + i` and sees rows `≤ past + i`.
//! * [`Block`](AttnMask::Block): the new rows are cut into consecutive blocks of `size` rows (the
//!   last may be shorter); a row sees every cached row, every row of earlier blocks and every row
//!   of its own block (block-diffusion decoding, Fast-dVLM). [`Full`](AttnMask::Full) is one block
//!   of all `t` rows.
//! * [`Tree`](AttnMask::Tree): draft-tree verification (EAGLE, ViSpec). Row `i` sees every cached
//!   row, its ancestors and itself; the caller places it at position `start + depth(i)`
//!   ([`TreeMask::positions`]).
//! * [`Visible`](AttnMask::Visible): an arbitrary boolean visibility (`true` = visible), either
//!   `(t, past + t)` (must match every layer's cache) or `(t, t)` over the new rows only (every
//!   cached row visible — the form that works whatever each layer holds).
//! * [`Custom`](AttnMask::Custom): an additive f32 `(t, past + t)` tensor used exactly as given
//!   (the training code's packed masks); no window is applied.
//!
//! # Sliding windows
//!
//! With a window `w` (Mistral, Qwen2) the window applies on top of every kind but `Custom`: each
//! new row has a *path row* — the cache row it would occupy if the rows it sees had been decoded
//! one at a time — and a key more than `w - 1` cache rows behind it is hidden (`path - key < w`
//! is visible, HF semantics: the window counts the query itself). For causal, block, full and
//! visible masks the path row of new row `i` is `past + i` (keys *ahead* of the row inside its
//! block are never hidden by the window); for a tree row it is `past + depth(i)`, and an ancestor
//! at depth `d` lies `depth(i) - d` rows behind. A chain-shaped tree is therefore exactly causal,
//! window included. Like FastV's pruned layers, the window counts cache rows, not positions.
//!
//! Materialising costs `O(t · kv_len)` only when something is hidden; the plain decode step (one
//! causal row, window not reached) yields `None` without touching memory.

use crate::row_softmax::{softmax_values, RowScores};
use crate::{softmax_last_dim, Mode};
use candle_core::{DType, Device, Result, Tensor};
use std::sync::Arc;

/// Which keys each new query row may attend to, relative to the new rows (see the module docs).
#[derive(Debug, Clone)]
pub enum AttnMask {
    /// Every new row sees every key (one bidirectional block; the layer's window still applies).
    Full,
    /// New row `i` (cache row `past + i`) sees rows `≤ past + i`.
    Causal,
    /// Bidirectional blocks of `size` consecutive new rows, causal between blocks.
    Block { size: usize },
    /// Ancestors-and-self visibility of a draft tree.
    Tree(TreeMask),
    /// Arbitrary boolean visibility.
    Visible(VisibleMask),
    /// Additive f32 mask `(t, past + t)`: `0` visible, `-inf` hidden; used as given.
    Custom(Tensor),
}

/// A draft tree over the new rows: `parents[i]` is `None` for a root (a child of the last cached
/// row) or `Some(j)` with `j < i`. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeMask {
    parents: Arc<[Option<usize>]>,
    depth: Arc<[usize]>,
}

impl TreeMask {
    /// Checks that every parent precedes its child.
    pub fn new(parents: Vec<Option<usize>>) -> Result<Self> {
        let mut depth = Vec::with_capacity(parents.len());
        for (i, p) in parents.iter().enumerate() {
            match *p {
                None => depth.push(0),
                Some(j) if j < i => depth.push(depth[j] + 1),
                Some(j) => candle_core::bail!("tree mask: node {i} has parent {j}, must be < {i}"),
            }
        }
        Ok(Self {
            parents: parents.into(),
            depth: depth.into(),
        })
    }

    /// The chain `0 ← 1 ← … ← t-1` (as a mask: causal).
    pub fn chain(t: usize) -> Self {
        Self::new((0..t).map(|i| i.checked_sub(1)).collect()).expect("a chain is a valid tree")
    }

    /// The `top_k`-ary tree of `k` nodes in breadth-first order, node 0 the root: node `i > 0`
    /// hangs below node `(i - 1) / top_k` (the shape drafting grows when every node keeps its
    /// `top_k` best children; `top_k = 1` is the chain).
    pub fn k_ary(k: usize, top_k: usize) -> Self {
        Self::new(
            (0..k)
                .map(|i| (i > 0).then(|| (i - 1) / top_k.max(1)))
                .collect(),
        )
        .expect("a breadth-first tree's parents precede their children")
    }

    /// Nodes (new rows) in the tree.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// Depth of node `i` (roots: 0).
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    /// The nodes from node `i`'s root down to `i`, increasing.
    pub fn path(&self, i: usize) -> Vec<usize> {
        let mut path = vec![i];
        let mut n = i;
        while let Some(p) = self.parents[n] {
            path.push(p);
            n = p;
        }
        path.reverse();
        path
    }

    /// Position ids of the nodes when the first new position is `start`: `start + depth(i)`.
    pub fn positions(&self, start: u32) -> Vec<u32> {
        self.depth.iter().map(|&d| start + d as u32).collect()
    }
}

/// A boolean visibility `(rows, cols)`, row-major, `true` = visible. `cols` is either the layer's
/// whole cache `past + rows` or just `rows` (the new rows; every cached row visible). Cheap to
/// clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleMask {
    rows: usize,
    cols: usize,
    data: Arc<[bool]>,
}

impl VisibleMask {
    /// `data.len()` must be `rows · cols` and `cols ≥ rows`.
    pub fn new(rows: usize, cols: usize, data: Vec<bool>) -> Result<Self> {
        if data.len() != rows * cols || cols < rows {
            candle_core::bail!(
                "visible mask: {} values for ({rows}, {cols}) (cols must be ≥ rows)",
                data.len()
            )
        }
        Ok(Self {
            rows,
            cols,
            data: data.into(),
        })
    }

    /// `(rows, cols)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Whether new row `i` sees column `j`.
    pub fn get(&self, i: usize, j: usize) -> bool {
        self.data[i * self.cols + j]
    }
}

impl AttnMask {
    /// Plain causal attention (each layer's window applies when materialised).
    pub fn causal() -> Self {
        AttnMask::Causal
    }

    /// Bidirectional blocks of `size ≥ 1` rows.
    pub fn block(size: usize) -> Result<Self> {
        if size == 0 {
            candle_core::bail!("block mask: the block size must be at least 1")
        }
        Ok(AttnMask::Block { size })
    }

    /// A draft tree from parent indices (see [`TreeMask::new`]).
    pub fn tree(parents: Vec<Option<usize>>) -> Result<Self> {
        Ok(AttnMask::Tree(TreeMask::new(parents)?))
    }

    /// Arbitrary boolean visibility (see [`VisibleMask::new`]).
    pub fn visible(rows: usize, cols: usize, data: Vec<bool>) -> Result<Self> {
        Ok(AttnMask::Visible(VisibleMask::new(rows, cols, data)?))
    }

    /// The additive mask `(t, kv_len)` for `t` new rows appended after `kv_len - t` cached ones in
    /// a layer with sliding window `window`, or `None` when nothing is hidden.
    pub fn materialize(
        &self,
        window: Option<usize>,
        t: usize,
        kv_len: usize,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        if kv_len < t {
            candle_core::bail!("attention mask: {t} new rows but only {kv_len} keys")
        }
        if window == Some(0) {
            candle_core::bail!("attention mask: a sliding window must be at least 1")
        }
        if t == 0 {
            return Ok(None);
        }
        let past = kv_len - t;
        // Lowest key the window leaves visible from path row `q`.
        let lo = |q: usize| window.map_or(0, |w| (q + 1).saturating_sub(w));
        // Every key within reach of the farthest path row (`past + t - 1` at most).
        let window_hides_nothing = window.is_none_or(|w| kv_len <= w);
        // Rows see the keys `[lo(past + i), hi(i))`.
        let interval = |hi: &dyn Fn(usize) -> usize, all_see_all: bool| {
            if all_see_all && window_hides_nothing {
                return Ok(None);
            }
            let mut data = vec![f32::NEG_INFINITY; t * kv_len];
            for (i, row) in data.chunks_exact_mut(kv_len).enumerate() {
                row[lo(past + i)..hi(i)].fill(0.0);
            }
            Tensor::from_vec(data, (t, kv_len), device).map(Some)
        };
        match self {
            AttnMask::Full => interval(&|_| kv_len, true),
            AttnMask::Causal => interval(&|i| past + i + 1, t <= 1),
            AttnMask::Block { size } => {
                if *size == 0 {
                    candle_core::bail!("block mask: the block size must be at least 1")
                }
                interval(&|i| past + ((i / size + 1) * size).min(t), *size >= t)
            }
            AttnMask::Tree(tree) => {
                if tree.len() != t {
                    candle_core::bail!("tree mask has {} nodes for {t} rows", tree.len())
                }
                if t <= 1 && window_hides_nothing {
                    return Ok(None);
                }
                let mut data = vec![f32::NEG_INFINITY; t * kv_len];
                for (i, row) in data.chunks_exact_mut(kv_len).enumerate() {
                    let d = tree.depth[i];
                    row[lo(past + d).min(past)..past].fill(0.0);
                    // Self and ancestors `d - depth(a) < w` rows up the path.
                    let mut node = Some(i);
                    while let Some(a) = node {
                        if window.is_some_and(|w| d - tree.depth[a] >= w) {
                            break;
                        }
                        row[past + a] = 0.0;
                        node = tree.parents[a];
                    }
                }
                Ok(Some(Tensor::from_vec(data, (t, kv_len), device)?))
            }
            AttnMask::Visible(vm) => {
                let (rows, cols) = vm.dims();
                if rows != t || (cols != kv_len && cols != t) {
                    candle_core::bail!(
                        "visible mask is ({rows}, {cols}), expected ({t}, {kv_len}) or ({t}, {t})"
                    )
                }
                // Columns of the mask start at key `offset` (earlier cached keys: visible).
                let offset = kv_len - cols;
                let mut data = vec![f32::NEG_INFINITY; t * kv_len];
                let mut hidden = false;
                for (i, row) in data.chunks_exact_mut(kv_len).enumerate() {
                    let lo = lo(past + i);
                    row[lo.min(offset)..offset].fill(0.0);
                    let first = lo.max(offset);
                    for (j, d) in row.iter_mut().enumerate().skip(first) {
                        if vm.get(i, j - offset) {
                            *d = 0.0;
                        }
                    }
                    if row.iter().all(|x| x.is_infinite()) {
                        candle_core::bail!("visible mask: row {i} sees no key")
                    }
                    hidden |= row.iter().any(|x| x.is_infinite());
                }
                if !hidden {
                    return Ok(None);
                }
                Ok(Some(Tensor::from_vec(data, (t, kv_len), device)?))
            }
            AttnMask::Custom(m) => {
                let dims = m.dims2()?;
                if dims != (t, kv_len) {
                    candle_core::bail!("attention mask is {dims:?}, expected ({t}, {kv_len})")
                }
                Ok(Some(m.to_dtype(DType::F32)?))
            }
        }
    }
}

/// Attention output and, when asked for, the probabilities.
pub struct AttnOutput {
    /// `(1, h, t, d)`
    pub out: Tensor,
    /// `(1, h, t, s)` when requested.
    pub probs: Option<Tensor>,
}

/// Most new rows the row-wise kernel takes: decode steps, draft trees, and prompts and vision
/// towers up to 4,096 rows; longer runs take the GEMM path. (It was 64: on an Intel Xeon with
/// AMX, a 576-row prefill of the TinyLlama-1.1B shape took 30.0 s with candle's GEMM attention
/// and 7.9 s with this kernel: docs/kernels.md, "bf16 on AMX".)
pub const MAX_ROWWISE_ROWS: usize = 4096;

/// `softmax(q kᵀ · scale + mask) v` with grouped-query heads.
///
/// * `q`: `(1, h, t, d)`; `k`, `v`: `(1, kv_h, s, d)` with `h` a multiple of `kv_h` (query head
///   `i` reads key/value head `i / (h / kv_h)`, as HF's `repeat_kv`);
/// * `mask`: additive `(t, s)`.
///
/// GQA is done without copying K/V: the query heads sharing a KV head are folded into the row
/// dimension of one matmul. Inference on a few rows (f32 on CPU, up to [`MAX_ROWWISE_ROWS`], no
/// probabilities asked for) takes a row-wise kernel instead: each query row attends over only
/// its visible keys, in key order, so a row's result depends on nothing but the keys it sees —
/// a draft-tree node verified among its siblings gets bit for bit what the same token gets
/// decoded alone, and no GEMM is dispatched for a handful of rows.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    mode: Mode,
    want_probs: bool,
) -> Result<AttnOutput> {
    let (b, h, t, d) = q.dims4()?;
    let (_, kv_h, s, _) = k.dims4()?;
    let n_rep = h / kv_h;
    let rowwise =
        mode == Mode::Infer && !want_probs && t <= MAX_ROWWISE_ROWS && rowwise_applies(q, k, v);
    if rowwise {
        return Ok(AttnOutput {
            out: attention_rowwise(q, k, v, mask, scale)?,
            probs: None,
        });
    }
    // (b, kv_h, n_rep * t, d), scaled here: t·d multiplies instead of t·s.
    let qg = (q.reshape((b, kv_h, n_rep * t, d))? * scale)?;
    // (b, kv_h, n_rep * t, s)
    let scores = qg.matmul(&k.t()?)?;
    let scores = match mask {
        Some(m) => scores
            .reshape((b * kv_h * n_rep, t, s))?
            .broadcast_add(m)?
            .reshape((b, kv_h, n_rep * t, s))?,
        None => scores,
    };
    let probs = softmax_last_dim(&scores, mode)?;
    // (b, kv_h, n_rep * t, d) -> (b, h, t, d)
    let out = probs.matmul(v)?.reshape((b, h, t, d))?;
    let probs = if want_probs {
        Some(probs.reshape((b, h, t, s))?)
    } else {
        None
    };
    Ok(AttnOutput { out, probs })
}

/// [`attention`]'s row-wise kernel at any number of rows (batch 1, f32, CPU; otherwise plain
/// [`attention`]): `(1, h, t, d)`. Each row's result depends only on the keys it sees, so rows
/// run among many others (a block-diffusion pass of `B (B + 1)` rows) equal the same rows run
/// as decode steps, bit for bit.
pub fn attention_batch_invariant(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    if rowwise_applies(q, k, v) {
        attention_rowwise(q, k, v, mask, scale)
    } else {
        Ok(attention(q, k, v, mask, scale, Mode::Infer, false)?.out)
    }
}

/// Batch 1, f32, on the CPU: what the row-wise kernel takes.
fn rowwise_applies(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    q.dims().first() == Some(&1)
        && q.device().is_cpu()
        && [q, k, v].iter().all(|x| x.dtype() == DType::F32)
}

/// The row-wise kernel of [`attention`] (batch 1, f32, CPU): `(1, h, t, d)`.
fn attention_rowwise(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    use rayon::prelude::*;
    let (_, h, t, d) = q.dims4()?;
    let (_, kv_h, s, _) = k.dims4()?;
    let n_rep = h / kv_h;
    let q: Vec<f32> = q.flatten_all()?.to_vec1()?;
    // (t, s) additive, row-major.
    let mask: Option<Vec<f32>> = match mask {
        Some(m) => Some(m.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?),
        None => None,
    };
    // Keys and values (1, kv_h, s, d): a KV-cache view holds each head's rows contiguously, heads
    // a buffer apart, so it is read in place (no copy of the cache per layer and step); any
    // other layout is made contiguous first.
    let rows_in_place = |x: &Tensor| -> Result<Tensor> {
        let st = x.stride();
        if st[3] == 1 && st[2] == d {
            Ok(x.clone())
        } else {
            x.contiguous()
        }
    };
    let (k, v) = (rows_in_place(k)?, rows_in_place(v)?);
    let (k_guard, v_guard) = (k.storage_and_layout(), v.storage_and_layout());
    let (candle_core::Storage::Cpu(ks), candle_core::Storage::Cpu(vs)) = (&*k_guard.0, &*v_guard.0)
    else {
        candle_core::bail!("attention: CPU tensors only")
    };
    let (ks, vs) = (ks.as_slice::<f32>()?, vs.as_slice::<f32>()?);
    // Where head g's s rows of d values start: (offset, head stride) of each.
    let (k_at, v_at) = (
        (k_guard.1.start_offset(), k_guard.1.stride()[1]),
        (v_guard.1.start_offset(), v_guard.1.stride()[1]),
    );
    let scale = scale as f32;
    // Tasks of `per` query heads of one KV head, at least two per thread where the KV heads
    // allow it.
    let wanted = (2 * rayon::current_num_threads()).div_ceil(kv_h);
    let parts = (1..=n_rep)
        .find(|&p| n_rep.is_multiple_of(p) && p >= wanted)
        .unwrap_or(n_rep);
    let per = n_rep / parts;
    let mut out = vec![0f32; h * t * d];
    out.par_chunks_mut(per * t * d)
        .enumerate()
        .for_each(|(task, out_task)| {
            let g = task * per / n_rep;
            let (kh, vh) = (
                &ks[k_at.0 + g * k_at.1..][..s * d],
                &vs[v_at.0 + g * v_at.1..][..s * d],
            );
            let q_task = &q[task * per * t * d..(task + 1) * per * t * d];
            // Rows in bunches that share each value row's load (bounded: a row keeps its scores).
            let mut bunch: Vec<RowScores> = Vec::new();
            // The bunch's dots: in cache whatever the prompt's length.
            let mut dots = Vec::new();
            for (b, out_b) in out_task.chunks_mut(SHARED_ROWS * d).enumerate() {
                let n_b = out_b.len() / d;
                let first = b * SHARED_ROWS;
                // Each row's mask row (its place in its head) up to the last key it sees, found
                // once: keys past the last one any row of the bunch sees are not needed (a
                // causal prompt's later keys).
                let mut visible = [&[][..]; SHARED_ROWS];
                let seen = match &mask {
                    Some(m) => {
                        for (i, vis) in visible[..n_b].iter_mut().enumerate() {
                            let r = (first + i) % t;
                            let row = &m[r * s..(r + 1) * s];
                            let end = row
                                .iter()
                                .rposition(|&x| x != f32::NEG_INFINITY)
                                .map_or(0, |j| j + 1);
                            *vis = &row[..end];
                        }
                        visible[..n_b].iter().map(|v| v.len()).max().unwrap_or(0)
                    }
                    None => s,
                };
                // Every visible key against every row of the bunch, each a canonical-order dot
                // (the same bits whatever the number of rows, and whichever side is the
                // kernel's weight: `matvec::block`). Whole tiles of query rows are the weights,
                // so each row's dots lie together, `(n_b, seen)`; otherwise the keys are,
                // `(seen, n_b)` (a decode step's one row takes the kernel's one-row tiles).
                dots.resize(seen * n_b, 0.0);
                let q_b = &q_task[first * d..(first + n_b) * d];
                let by_row = n_b.is_multiple_of(4);
                let (row_step, key_step) = if by_row {
                    crate::matvec::block(q_b, &kh[..seen * d], d, seen, &mut dots);
                    (seen, 1)
                } else {
                    crate::matvec::block(&kh[..seen * d], q_b, d, n_b, &mut dots);
                    (1, n_b)
                };
                bunch.resize_with(n_b, RowScores::default);
                for ((i, rs), vis) in bunch.iter_mut().enumerate().zip(visible) {
                    let dot = |j: usize| dots[i * row_step + j * key_step];
                    rs.clear();
                    if mask.is_none() {
                        rs.keys.extend(0..seen);
                        // `+ 0.0` as an unmasked key's score gets below (the same bits).
                        rs.scores.extend((0..seen).map(|j| dot(j) * scale + 0.0));
                        continue;
                    }
                    // The leading visible keys (a tree's or a block's cached rows) in one
                    // pass that vectorises, then the rest key by key: the same scores.
                    let lead = vis
                        .iter()
                        .position(|&m| m == f32::NEG_INFINITY)
                        .unwrap_or(vis.len());
                    rs.keys.extend(0..lead);
                    rs.scores.extend((0..lead).map(|j| dot(j) * scale + vis[j]));
                    for (j, &m) in vis.iter().enumerate().skip(lead) {
                        if m != f32::NEG_INFINITY {
                            rs.push(j, dot(j) * scale + m);
                        }
                    }
                }
                softmax_values(&mut bunch, |j| &vh[j * d..(j + 1) * d], out_b);
            }
        });
    drop((k_guard, v_guard));
    Tensor::from_vec(out, (1, h, t, d), &Device::Cpu)
}

/// Query rows a row-wise kernel runs through [`softmax_values`] together (each value row is
/// loaded once for all of them).
const SHARED_ROWS: usize = 16;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Reference: repeat K/V per query head and attend head by head.
    pub(crate) fn reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        scale: f64,
    ) -> Result<Tensor> {
        let (_, h, _, _) = q.dims4()?;
        let kv_h = k.dim(1)?;
        let mut outs = Vec::new();
        for i in 0..h {
            let qi = q.narrow(1, i, 1)?.squeeze(1)?.squeeze(0)?; // (t, d)
            let ki = k.narrow(1, i / (h / kv_h), 1)?.squeeze(1)?.squeeze(0)?;
            let vi = v.narrow(1, i / (h / kv_h), 1)?.squeeze(1)?.squeeze(0)?;
            let mut s = (qi.matmul(&ki.t()?)? * scale)?;
            if let Some(m) = mask {
                s = (s + m)?;
            }
            let p = candle_nn::ops::softmax(&s, 1)?;
            outs.push(p.matmul(&vi)?);
        }
        Tensor::stack(&outs, 0)?.unsqueeze(0)
    }

    /// Visibility of a materialised mask (`None`: all visible).
    fn vis(m: &AttnMask, w: Option<usize>, t: usize, kv: usize) -> Result<Vec<Vec<bool>>> {
        Ok(match m.materialize(w, t, kv, &Device::Cpu)? {
            None => vec![vec![true; kv]; t],
            Some(m) => m
                .to_vec2::<f32>()?
                .iter()
                .map(|r| r.iter().map(|x| x.is_finite()).collect())
                .collect(),
        })
    }

    /// Rows written as strings of `x` (visible) and `.` (hidden).
    fn rows(pattern: &[&str]) -> Vec<Vec<bool>> {
        pattern
            .iter()
            .map(|r| r.chars().map(|c| c == 'x').collect())
            .collect()
    }

    /// A draft-tree node verified among its siblings gets bit for bit what it gets over just the
    /// keys it sees; and the row-wise kernel agrees with the GEMM path.
    #[test]
    fn rowwise_rows_depend_only_on_their_visible_keys() -> Result<()> {
        let dev = Device::Cpu;
        let (h, kv_h, past, d) = (4, 2, 9, 16);
        // root ─ a, root ─ b: rows past, past + 1, past + 2.
        let tree = AttnMask::tree(vec![None, Some(0), Some(0)])?;
        let q = Tensor::randn(0f32, 1.0, (1, h, 3, d), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, kv_h, past + 3, d), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (1, kv_h, past + 3, d), &dev)?;
        let m = tree.materialize(None, 3, past + 3, &dev)?;
        let all = attention(&q, &k, &v, m.as_ref(), 0.25, Mode::Infer, false)?.out;
        let gemm = attention(&q, &k, &v, m.as_ref(), 0.25, Mode::Train, false)?.out;
        let diff: f32 = (&all - gemm)?.abs()?.max_all()?.to_scalar()?;
        assert!(diff < 1e-5, "{diff}");
        // Node b alone: keys = the past, the root, b.
        let idx: Vec<u32> = (0..past as u32)
            .chain([past as u32, past as u32 + 2])
            .collect();
        let idx = Tensor::new(idx.as_slice(), &dev)?;
        let (kb, vb) = (k.index_select(&idx, 2)?, v.index_select(&idx, 2)?);
        let alone = attention(
            &q.narrow(2, 2, 1)?,
            &kb,
            &vb,
            None,
            0.25,
            Mode::Infer,
            false,
        )?
        .out;
        let got = all.narrow(2, 2, 1)?;
        assert_eq!(
            alone.flatten_all()?.to_vec1::<f32>()?,
            got.flatten_all()?.to_vec1::<f32>()?
        );
        Ok(())
    }

    #[test]
    fn long_prompt_rows_equal_each_row_alone() -> Result<()> {
        // 38 prompt rows after 7 cached ones: bunches of `SHARED_ROWS` (the last of 6, whose
        // dots are laid out by key), each over the keys its rows see, and the register-held
        // sums of `weighted_sums_prefix` (d = 64).
        let dev = Device::Cpu;
        let (h, kv_h, past, t, d) = (4, 2, 7, 38, 64);
        let q = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, kv_h, past + t, d), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (1, kv_h, past + t, d), &dev)?;
        let m = AttnMask::causal().materialize(None, t, past + t, &dev)?;
        let all = attention(&q, &k, &v, m.as_ref(), 0.125, Mode::Infer, false)?.out;
        let gemm = attention(&q, &k, &v, m.as_ref(), 0.125, Mode::Train, false)?.out;
        let diff: f32 = (&all - gemm)?.abs()?.max_all()?.to_scalar()?;
        assert!(diff < 1e-5, "{diff}");
        for r in [0, 15, 16, 33, 37] {
            let seen = past + r + 1;
            let alone = attention(
                &q.narrow(2, r, 1)?,
                &k.narrow(2, 0, seen)?,
                &v.narrow(2, 0, seen)?,
                None,
                0.125,
                Mode::Infer,
                false,
            )?
            .out;
            assert_eq!(
                alone.flatten_all()?.to_vec1::<f32>()?,
                all.narrow(2, r, 1)?.flatten_all()?.to_vec1::<f32>()?,
                "row {r}"
            );
        }
        Ok(())
    }

    #[test]
    fn gqa_with_masks_matches_reference() -> Result<()> {
        let dev = Device::Cpu;
        let (h, kv_h, t, past, d) = (6, 2, 4, 3, 8);
        let q = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, kv_h, past + t, d), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (1, kv_h, past + t, d), &dev)?;
        for (mask, w) in [
            (AttnMask::Full, None),
            (AttnMask::causal(), None),
            (AttnMask::causal(), Some(3)),
            (AttnMask::block(2)?, Some(4)),
            (
                AttnMask::tree(vec![None, Some(0), Some(0), Some(2)])?,
                Some(3),
            ),
        ] {
            let m = mask.materialize(w, t, past + t, &dev)?;
            let got = attention(&q, &k, &v, m.as_ref(), 0.3, Mode::Infer, false)?.out;
            let want = reference(&q, &k, &v, m.as_ref(), 0.3)?;
            let diff: f32 = (got - want)?.abs()?.max_all()?.to_scalar()?;
            assert!(diff < 1e-5, "{mask:?}: {diff}");
        }
        Ok(())
    }

    #[test]
    fn causal_mask_shape_and_window() -> Result<()> {
        // query rows are cache rows 3 and 4; window 2.
        assert_eq!(
            vis(&AttnMask::causal(), Some(2), 2, 5)?,
            rows(&["..xx.", "...xx"])
        );
        let dev = Device::Cpu;
        // The plain decode step hides nothing: no tensor at all.
        assert!(AttnMask::causal().materialize(None, 1, 9, &dev)?.is_none());
        assert!(AttnMask::causal()
            .materialize(Some(9), 1, 9, &dev)?
            .is_none());
        assert!(AttnMask::causal()
            .materialize(Some(8), 1, 9, &dev)?
            .is_some());
        assert!(AttnMask::tree(vec![None])?
            .materialize(None, 1, 9, &dev)?
            .is_none());
        assert!(AttnMask::Full.materialize(None, 4, 9, &dev)?.is_none());
        assert!(AttnMask::block(4)?.materialize(None, 4, 9, &dev)?.is_none());
        assert!(AttnMask::causal().materialize(None, 2, 1, &dev).is_err());
        Ok(())
    }

    #[test]
    fn block_mask_sees_earlier_blocks_and_its_own() -> Result<()> {
        // 2 cached rows, 5 new rows in blocks {0,1}, {2,3}, {4}.
        let m = AttnMask::block(2)?;
        assert_eq!(
            vis(&m, None, 5, 7)?,
            rows(&[
                "xxxx...", //
                "xxxx...", "xxxxxx.", "xxxxxx.", "xxxxxxx",
            ])
        );
        // Window 3 on top: keys ≥ 3 rows behind the row's own cache row are hidden, keys ahead in
        // the block are not.
        assert_eq!(
            vis(&m, Some(3), 5, 7)?,
            rows(&[
                "xxxx...", //
                ".xxx...", "..xxxx.", "...xxx.", "....xxx",
            ])
        );
        // Size 1 is causal; size ≥ t is full.
        for w in [None, Some(2), Some(4)] {
            assert_eq!(
                vis(&AttnMask::block(1)?, w, 5, 7)?,
                vis(&AttnMask::causal(), w, 5, 7)?
            );
            assert_eq!(
                vis(&AttnMask::block(9)?, w, 5, 7)?,
                vis(&AttnMask::Full, w, 5, 7)?
            );
        }
        assert!(AttnMask::block(0).is_err());
        Ok(())
    }

    #[test]
    fn k_ary_trees_are_breadth_first() {
        let parents = |k, top_k| TreeMask::k_ary(k, top_k).parents().to_vec();
        assert_eq!(
            parents(6, 2),
            vec![None, Some(0), Some(0), Some(1), Some(1), Some(2)]
        );
        assert_eq!(parents(3, 1), TreeMask::chain(3).parents().to_vec());
        assert_eq!(
            TreeMask::k_ary(7, 3).positions(5),
            vec![5, 6, 6, 6, 7, 7, 7]
        );
        assert!(TreeMask::k_ary(0, 4).is_empty());
    }

    #[test]
    fn tree_mask_sees_ancestors_along_its_path() -> Result<()> {
        //      c1 ─ 0 ─ 1 ─ 3
        //            └─ 2 ─ 4
        //      c1 ─ 5            (a second root)
        let tree = TreeMask::new(vec![None, Some(0), Some(0), Some(1), Some(2), None])?;
        assert_eq!(tree.path(4), vec![0, 2, 4]);
        assert_eq!(tree.positions(10), vec![10, 11, 11, 12, 12, 10]);
        let m = AttnMask::Tree(tree);
        assert_eq!(
            vis(&m, None, 6, 8)?,
            rows(&[
                "xxx.....", //
                "xxxx....", "xxx.x...", "xxxx.x..", "xxx.x.x.", "xx.....x",
            ])
        );
        // Window 2 counts rows along the path: node 3 (path row 2 + 2 = 4) sees its parent 1 and
        // itself only; the roots see the last cached row and themselves.
        assert_eq!(
            vis(&m, Some(2), 6, 8)?,
            rows(&[
                ".xx.....", //
                "..xx....", "..x.x...", "...x.x..", "....x.x.", ".x.....x",
            ])
        );
        assert!(AttnMask::tree(vec![None, Some(1)]).is_err());
        assert!(m.materialize(None, 5, 8, &Device::Cpu).is_err());
        Ok(())
    }

    #[test]
    fn chain_tree_and_boolean_causal_equal_causal() -> Result<()> {
        for (t, past) in [(1, 0), (1, 6), (5, 0), (5, 3), (7, 9)] {
            let kv = past + t;
            let bool_causal: Vec<bool> = (0..t)
                .flat_map(|i| (0..kv).map(move |j| j <= past + i))
                .collect();
            let new_only: Vec<bool> = (0..t).flat_map(|i| (0..t).map(move |j| j <= i)).collect();
            for w in [None, Some(1), Some(2), Some(4), Some(30)] {
                let want = vis(&AttnMask::causal(), w, t, kv)?;
                let chain = AttnMask::Tree(TreeMask::chain(t));
                assert_eq!(
                    vis(&chain, w, t, kv)?,
                    want,
                    "chain t={t} past={past} w={w:?}"
                );
                let full = AttnMask::visible(t, kv, bool_causal.clone())?;
                assert_eq!(
                    vis(&full, w, t, kv)?,
                    want,
                    "bool t={t} past={past} w={w:?}"
                );
                let short = AttnMask::visible(t, t, new_only.clone())?;
                assert_eq!(vis(&short, w, t, kv)?, want, "bool (t, t) t={t} w={w:?}");
            }
        }
        // The (t, t) form hides only among the new rows; every cached row stays visible.
        let m = AttnMask::visible(2, 2, vec![true, false, false, true])?;
        assert_eq!(vis(&m, None, 2, 4)?, rows(&["xxx.", "xx.x"]));
        assert!(m.materialize(None, 2, 5, &Device::Cpu).is_ok());
        let wide = AttnMask::visible(2, 4, vec![true; 8])?;
        assert!(wide.materialize(None, 2, 4, &Device::Cpu)?.is_none());
        assert!(wide.materialize(None, 2, 5, &Device::Cpu).is_err());
        let blind = AttnMask::visible(1, 2, vec![false, false])?;
        assert!(blind.materialize(None, 1, 2, &Device::Cpu).is_err());
        assert!(AttnMask::visible(2, 1, vec![true; 2]).is_err());
        Ok(())
    }
}
