//! A KV cache with rollback: append, truncate to `n` rows, fork (deep copy) and compact to a subset
//! of rows. Speculative verification truncates rejected drafts or compacts to the accepted tree
//! path; diffusion decoding commits whole blocks.
//!
//! Each layer keeps one preallocated buffer per K and V, `(1, kv_heads, capacity, head_dim)`, and
//! writes new rows in place; reads are views of the first `len` rows.

use candle_core::{Result, Tensor};

/// One layer's keys and values.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
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
            let new_cap = needed.max(2 * capacity).max(MIN_CAPACITY);
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

    fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
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

/// The cache of a whole decoder: one [`LayerCache`] per layer, all of the same length.
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

    /// Keeps the first `n` rows (no-op if fewer are held).
    pub fn truncate(&mut self, n: usize) {
        self.layers.iter_mut().for_each(|l| l.truncate(n));
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
}
