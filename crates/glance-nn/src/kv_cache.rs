//! A KV cache with rollback: append, mark / roll back, keep an accepted path of speculative rows,
//! fork (deep copy) and compact to a subset of rows.
//!
//! Each layer keeps one preallocated buffer per K and V, `(1, kv_heads, capacity, head_dim)`, and
//! writes new rows in place; reads are views of the first `len` rows. Layers may hold different
//! numbers of rows: FastV (Chen et al., "An Image is Worth 1/2 Tokens After Layer 2") drops
//! visual rows from the layers after its pruning layer only ([`KvCache::compact_layers`]). Every
//! forward appends the same `t` rows to every layer, so "the rows added since" is the same count
//! in every layer even when their lengths differ — which is what rollback relies on.
//!
//! # Speculative rows
//!
//! A forward whose keys and values may be thrown away (a draft tree verified in one pass, as in
//! EAGLE and ViSpec; a denoising step of a Fast-dVLM block) is bracketed by a [`CacheMark`]:
//!
//! ```ignore
//! let mark = cache.mark();                       // O(layers)
//! let h = model.forward(&rows, &pos, &AttnMask::Tree(tree), &mut cache)?;
//! // … verify …
//! cache.rollback(&mark)?;                         // discard all: O(layers), nothing copied
//! // or keep the accepted root-to-leaf path (indices into the t speculative rows):
//! cache.keep_speculative(t, &accepted)?;          // O(accepted × layers) row copies
//! ```
//!
//! Neither touches the rows before the speculative region, whatever the context length. Rolled
//! back rows stay in the buffers until the next append overwrites them.

use candle_core::{Result, Tensor};

/// One layer's keys and values.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
    /// Rows the buffers are sized for at once when they grow to no more ([`KvCache::reserve`]).
    reserve: usize,
}

const MIN_CAPACITY: usize = 128;

impl LayerCache {
    /// Rows currently held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k`, `v` `(1, kv_h, t, d)` and returns views of all rows `(1, kv_h, len, d)`.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        let needed = self.len + t;
        let capacity = self.k.as_ref().map_or(0, |b| b.dims()[2]);
        if needed > capacity {
            // Within the reservation, its size at once; past it, doubling.
            let new_cap = if needed <= self.reserve {
                self.reserve
            } else {
                needed.max(2 * capacity).max(MIN_CAPACITY)
            };
            self.k = Some(grow(self.k.as_ref(), k, self.len, new_cap)?);
            self.v = Some(grow(self.v.as_ref(), v, self.len, new_cap)?);
        }
        let (kb, vb) = (
            self.k.as_ref().expect("buffers allocated above"),
            self.v.as_ref().expect("buffers allocated above"),
        );
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len = needed;
        Ok((kb.narrow(2, 0, self.len)?, vb.narrow(2, 0, self.len)?))
    }

    /// Views of the rows held, or `None` when empty.
    pub fn get(&self) -> Result<Option<(Tensor, Tensor)>> {
        match (&self.k, &self.v) {
            (Some(k), Some(v)) if self.len > 0 => {
                Ok(Some((k.narrow(2, 0, self.len)?, v.narrow(2, 0, self.len)?)))
            }
            _ => Ok(None),
        }
    }

    /// Keeps rows `len - n + keep[m]` as rows `len - n + m` and drops the rest of the last `n`;
    /// `keep` strictly increasing and `< n ≤ len` (checked by the caller). Copies only the kept
    /// rows that move.
    fn keep_tail(&mut self, n: usize, keep: &[usize]) -> Result<()> {
        let base = self.len - n;
        // The leading rows already in place need no copy.
        let fixed = keep
            .iter()
            .enumerate()
            .take_while(|&(m, &r)| m == r)
            .count();
        if let (Some(k), Some(v)) = (&self.k, &self.v) {
            if fixed < keep.len() {
                let idx: Vec<u32> = keep[fixed..].iter().map(|&r| (base + r) as u32).collect();
                let idx = Tensor::from_vec(idx, keep.len() - fixed, k.device())?;
                // (1, kv_h, moved, d): fresh storage, so writing into the buffer cannot alias.
                let kk = k.index_select(&idx, 2)?;
                let vv = v.index_select(&idx, 2)?;
                k.slice_set(&kk, 2, base + fixed)?;
                v.slice_set(&vv, 2, base + fixed)?;
            }
        }
        self.len = base + keep.len();
        Ok(())
    }

    fn compact(&mut self, rows: &Tensor, n: usize) -> Result<()> {
        if let (Some(k), Some(v)) = (&self.k, &self.v) {
            let kk = k.index_select(rows, 2)?; // rows < len: reads only held rows
            let vv = v.index_select(rows, 2)?;
            k.slice_set(&kk, 2, 0)?;
            v.slice_set(&vv, 2, 0)?;
        }
        self.len = n;
        Ok(())
    }

    fn deep_copy(&self) -> Result<Self> {
        let copy = |b: &Option<Tensor>| -> Result<Option<Tensor>> {
            b.as_ref().map(|t| t.copy()).transpose()
        };
        Ok(Self {
            k: copy(&self.k)?,
            v: copy(&self.v)?,
            len: self.len,
            reserve: self.reserve,
        })
    }
}

/// A new buffer of `cap` rows shaped like `like`, holding the first `len` rows of `old`.
fn grow(old: Option<&Tensor>, like: &Tensor, len: usize, cap: usize) -> Result<Tensor> {
    let (b, h, _, d) = like.dims4()?;
    let buf = Tensor::zeros((b, h, cap, d), like.dtype(), like.device())?;
    if let Some(old) = old {
        if len > 0 {
            buf.slice_set(&old.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
        }
    }
    Ok(buf)
}

/// Every layer's length at one moment ([`KvCache::mark`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheMark(Vec<usize>);

impl CacheMark {
    /// Rows each layer held.
    pub fn layer_lens(&self) -> &[usize] {
        &self.0
    }
}

/// The cache of a whole decoder: one [`LayerCache`] per layer (lengths may differ after FastV).
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![LayerCache::default(); num_layers],
        }
    }

    /// Rows held by the first layer (the sequence length seen so far; deeper layers may hold fewer
    /// after [`compact_layers`](Self::compact_layers)).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn layer_mut(&mut self, i: usize) -> &mut LayerCache {
        &mut self.layers[i]
    }

    pub fn layer(&self, i: usize) -> &LayerCache {
        &self.layers[i]
    }

    /// Rows held by each layer.
    pub fn layer_lens(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.len).collect()
    }

    /// Rolls back to the point where the first layer held `n` rows: every layer drops the
    /// `len() - n` rows appended since (no-op when `n ≥ len()`). Correct for layers of different
    /// lengths as long as no layer was compacted in between; [`mark`](Self::mark) /
    /// [`rollback`](Self::rollback) check that.
    pub fn truncate(&mut self, n: usize) {
        let drop = self.len().saturating_sub(n);
        self.layers
            .iter_mut()
            .for_each(|l| l.len = l.len.saturating_sub(drop));
    }

    /// Records every layer's length, for [`rollback`](Self::rollback). O(layers).
    pub fn mark(&self) -> CacheMark {
        CacheMark(self.layer_lens())
    }

    /// Restores the lengths recorded by `mark`, dropping every row appended since. O(layers); no
    /// row is touched. Fails (changing nothing) if a layer now holds fewer rows than it did.
    pub fn rollback(&mut self, mark: &CacheMark) -> Result<()> {
        let lens = &mark.0;
        if lens.len() != self.layers.len() || self.layers.iter().zip(lens).any(|(l, &n)| l.len < n)
        {
            candle_core::bail!(
                "rollback: mark {lens:?} is not behind the cache {:?}",
                self.layer_lens()
            )
        }
        self.layers
            .iter_mut()
            .zip(lens)
            .for_each(|(l, &n)| l.len = n);
        Ok(())
    }

    /// The last `n` rows of every layer are speculative: keeps rows `keep` of them (indices into
    /// the speculative region, strictly increasing, `< n`) in that order and drops the rest —
    /// e.g. the accepted root-to-leaf path of a verified draft tree. Costs O(moved rows × layers);
    /// the rows before the region are never read or written. Layers may hold different lengths.
    pub fn keep_speculative(&mut self, n: usize, keep: &[usize]) -> Result<()> {
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&r| r >= n) {
            candle_core::bail!(
                "keep_speculative: rows must be strictly increasing and < {n}, got {keep:?}"
            )
        }
        if let Some(short) = self.layers.iter().position(|l| l.len < n) {
            candle_core::bail!(
                "keep_speculative: layer {short} holds {} rows, fewer than the {n} speculative ones",
                self.layers[short].len
            )
        }
        self.layers
            .iter_mut()
            .try_for_each(|l| l.keep_tail(n, keep))
    }

    /// Sizes every layer's buffers for `rows` rows the first time they grow (and any later time
    /// they grow to no more): a request that knows its prompt and token limit allocates its cache
    /// once, instead of doubling it (copying every row each time) up to twice what it needs.
    /// Past `rows` the buffers double as before.
    pub fn reserve(&mut self, rows: usize) {
        for l in &mut self.layers {
            l.reserve = rows;
        }
    }

    /// An independent copy: appending to one never affects the other.
    pub fn fork(&self) -> Result<Self> {
        Ok(Self {
            layers: self
                .layers
                .iter()
                .map(|l| l.deep_copy())
                .collect::<Result<_>>()?,
        })
    }

    /// Keeps only `rows` (indices into the rows held, strictly increasing), in that order.
    pub fn compact(&mut self, rows: &[usize]) -> Result<()> {
        self.compact_layers(0..self.layers.len(), rows)
    }

    /// [`compact`](Self::compact) for the layers in `layers` only (FastV drops visual rows from
    /// the layers after its pruning layer; the earlier layers keep them). All those layers must
    /// hold the same number of rows.
    pub fn compact_layers(&mut self, layers: std::ops::Range<usize>, rows: &[usize]) -> Result<()> {
        let Some(len) = self.layers.get(layers.start).map(|l| l.len) else {
            return Ok(());
        };
        if self.layers[layers.clone()].iter().any(|l| l.len != len) {
            candle_core::bail!("compact_layers: layers {layers:?} hold different numbers of rows")
        }
        if rows.windows(2).any(|w| w[0] >= w[1]) || rows.last().is_some_and(|&r| r >= len) {
            candle_core::bail!(
                "compact: rows must be strictly increasing and < {len}, got {rows:?}"
            )
        }
        let Some(device) = self
            .layers
            .iter()
            .find_map(|l| l.k.as_ref().map(|k| k.device().clone()))
        else {
            return Ok(());
        };
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &device)?;
        self.layers[layers]
            .iter_mut()
            .try_for_each(|l| l.compact(&idx, rows.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn rows(t: usize, start: f32) -> Result<Tensor> {
        // (1, 2, t, 3) whose row r holds the value start + r everywhere.
        let v: Vec<f32> = (0..2 * t * 3)
            .map(|i| start + ((i / 3) % t) as f32)
            .collect();
        Tensor::from_vec(v, (1, 2, t, 3), &Device::Cpu)
    }

    fn row_values(c: &KvCache) -> Result<Vec<f32>> {
        let (k, _) = c.layer(0).get()?.unwrap();
        k.narrow(1, 0, 1)?.narrow(3, 0, 1)?.flatten_all()?.to_vec1()
    }

    #[test]
    fn a_reservation_allocates_once_then_doubling_resumes() -> Result<()> {
        let capacity = |c: &KvCache| c.layer(0).k.as_ref().map_or(0, |b| b.dims()[2]);
        let mut c = KvCache::new(1);
        c.reserve(300);
        c.layer_mut(0).append(&rows(3, 0.0)?, &rows(3, 0.0)?)?;
        assert_eq!(capacity(&c), 300);
        c.layer_mut(0).append(&rows(297, 3.0)?, &rows(297, 3.0)?)?;
        assert_eq!((c.len(), capacity(&c)), (300, 300));
        c.layer_mut(0).append(&rows(1, 300.0)?, &rows(1, 300.0)?)?;
        assert_eq!(capacity(&c), 600);
        assert_eq!(
            row_values(&c)?,
            (0..301).map(|x| x as f32).collect::<Vec<_>>()
        );
        // Without one, the first append allocates the minimum.
        let mut plain = KvCache::new(1);
        plain.layer_mut(0).append(&rows(3, 0.0)?, &rows(3, 0.0)?)?;
        assert_eq!(capacity(&plain), MIN_CAPACITY);
        Ok(())
    }

    #[test]
    fn append_truncate_fork_compact() -> Result<()> {
        let mut c = KvCache::new(2);
        for l in 0..2 {
            c.layer_mut(l).append(&rows(3, 0.0)?, &rows(3, 0.0)?)?;
        }
        // Grow past the initial capacity to exercise reallocation.
        for l in 0..2 {
            c.layer_mut(l).append(&rows(200, 3.0)?, &rows(200, 3.0)?)?;
        }
        assert_eq!(c.len(), 203);
        assert_eq!(
            row_values(&c)?,
            (0..203).map(|x| x as f32).collect::<Vec<_>>()
        );

        let fork = c.fork()?;
        c.truncate(5);
        assert_eq!(row_values(&c)?, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
        for l in 0..2 {
            c.layer_mut(l).append(&rows(1, 100.0)?, &rows(1, 100.0)?)?;
        }
        assert_eq!(row_values(&c)?, vec![0.0, 1.0, 2.0, 3.0, 4.0, 100.0]);
        // The fork did not see the overwrite of row 5.
        assert_eq!(row_values(&fork)?[5], 5.0);

        // FastV-style: compact only the deeper layer of a fork.
        let mut f2 = c.fork()?;
        f2.compact_layers(1..2, &[1, 3])?;
        assert_eq!((f2.layer(0).len(), f2.layer(1).len()), (6, 2));
        assert!(f2.compact(&[0]).is_err()); // the layers now differ in length

        c.compact(&[0, 2, 5])?;
        assert_eq!(row_values(&c)?, vec![0.0, 2.0, 100.0]);
        assert!(c.compact(&[2, 1]).is_err());
        assert!(c.compact(&[7]).is_err());
        Ok(())
    }

    /// Values of row 0 of head 0 in every row of layer `l`.
    fn layer_values(c: &KvCache, l: usize) -> Result<Vec<f32>> {
        let (k, v) = c.layer(l).get()?.unwrap();
        let kv: Vec<f32> = k
            .narrow(1, 1, 1)?
            .narrow(3, 2, 1)?
            .flatten_all()?
            .to_vec1()?;
        let vv: Vec<f32> = v
            .narrow(1, 1, 1)?
            .narrow(3, 2, 1)?
            .flatten_all()?
            .to_vec1()?;
        assert_eq!(kv, vv, "K and V move together");
        Ok(kv)
    }

    fn append_all(c: &mut KvCache, t: usize, start: f32) -> Result<()> {
        for l in 0..c.layers.len() {
            c.layer_mut(l).append(&rows(t, start)?, &rows(t, start)?)?;
        }
        Ok(())
    }

    /// A 3-layer cache after FastV-style pruning: layer 0 holds rows 0..10, layers 1 and 2 only
    /// rows 0, 4, 9.
    fn fastv_cache() -> Result<KvCache> {
        let mut c = KvCache::new(3);
        append_all(&mut c, 10, 0.0)?;
        c.compact_layers(1..3, &[0, 4, 9])?;
        assert_eq!(c.layer_lens(), vec![10, 3, 3]);
        Ok(c)
    }

    #[test]
    fn rollback_with_differing_layer_lengths() -> Result<()> {
        let mut c = fastv_cache()?;
        let mark = c.mark();
        assert_eq!(mark.layer_lens(), &[10, 3, 3]);
        append_all(&mut c, 4, 50.0)?;
        assert_eq!(c.layer_lens(), vec![14, 7, 7]);
        c.rollback(&mark)?;
        assert_eq!(c.layer_lens(), vec![10, 3, 3]);
        assert_eq!(
            layer_values(&c, 0)?,
            (0..10).map(|x| x as f32).collect::<Vec<_>>()
        );
        assert_eq!(layer_values(&c, 2)?, vec![0.0, 4.0, 9.0]);
        // Growing past the buffer's capacity between mark and rollback changes nothing.
        append_all(&mut c, 300, 50.0)?;
        c.rollback(&mark)?;
        assert_eq!(layer_values(&c, 1)?, vec![0.0, 4.0, 9.0]);
        // The context appended after a rollback lands right after the marked rows in every layer.
        append_all(&mut c, 1, 70.0)?;
        assert_eq!(layer_values(&c, 1)?, vec![0.0, 4.0, 9.0, 70.0]);
        assert_eq!(layer_values(&c, 0)?[10], 70.0);
        // truncate counts new rows on the first layer: the same rollback.
        c.truncate(10);
        assert_eq!(c.layer_lens(), vec![10, 3, 3]);
        // A mark ahead of the cache (or of another cache) is refused and changes nothing.
        append_all(&mut c, 2, 80.0)?;
        let ahead = c.mark();
        c.rollback(&mark)?;
        assert!(c.rollback(&ahead).is_err());
        assert!(c.rollback(&KvCache::new(2).mark()).is_err());
        assert_eq!(c.layer_lens(), vec![10, 3, 3]);
        Ok(())
    }

    #[test]
    fn keep_speculative_keeps_the_accepted_path_only() -> Result<()> {
        let mut c = fastv_cache()?;
        // 6 speculative rows valued 100..106 in every layer.
        append_all(&mut c, 6, 100.0)?;
        c.keep_speculative(6, &[0, 2, 5])?;
        assert_eq!(c.layer_lens(), vec![13, 6, 6]);
        let mut want0: Vec<f32> = (0..10).map(|x| x as f32).collect();
        want0.extend([100.0, 102.0, 105.0]);
        assert_eq!(layer_values(&c, 0)?, want0);
        for l in 1..3 {
            assert_eq!(
                layer_values(&c, l)?,
                vec![0.0, 4.0, 9.0, 100.0, 102.0, 105.0]
            );
        }
        // Keeping nothing drops the region; keeping a prefix moves nothing.
        append_all(&mut c, 3, 200.0)?;
        c.keep_speculative(3, &[])?;
        assert_eq!(c.layer_lens(), vec![13, 6, 6]);
        append_all(&mut c, 3, 200.0)?;
        c.keep_speculative(3, &[0, 1])?;
        assert_eq!(layer_values(&c, 2)?[6..], [200.0, 201.0]);
        // Bad requests are refused before anything changes.
        assert!(c.keep_speculative(3, &[1, 1]).is_err());
        assert!(c.keep_speculative(3, &[3]).is_err());
        assert!(c.keep_speculative(9, &[0]).is_err()); // layers 1, 2 hold only 8 rows
        assert_eq!(c.layer_lens(), vec![15, 8, 8]);
        Ok(())
    }

    /// The context before the speculative region keeps its values when kept rows move down.
    #[test]
    fn keep_speculative_leaves_the_context_alone() -> Result<()> {
        let mut c = KvCache::new(1);
        append_all(&mut c, 5, 0.0)?;
        let before = layer_values(&c, 0)?;
        append_all(&mut c, 4, 10.0)?;
        c.keep_speculative(4, &[1, 3])?;
        let after = layer_values(&c, 0)?;
        assert_eq!(&after[..5], &before[..]);
        assert_eq!(&after[5..], &[11.0, 13.0]);
        Ok(())
    }
}
