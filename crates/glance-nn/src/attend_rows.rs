//! Decode attention for a batch of sequences (continuous batching): one new query row per
//! sequence, each attending over its own KV cache of its own length. A plain CPU kernel: at a
//! single query row per sequence, candle's per-call overhead (GEMM set-up, softmax, reshapes)
//! costs far more than the arithmetic, and it would be paid once per sequence and layer.
//!
//! Causal by construction (the new row is the last cached one and sees every cached row), with an
//! optional sliding window of `w` rows (it sees the last `w`). Grouped-query heads: query head `h`
//! reads key/value head `h / (heads / kv_heads)`.

use crate::matvec::dot;
use crate::row_softmax::{softmax_values, RowScores};
use candle_core::{Result, Storage, Tensor};
use rayon::prelude::*;

/// One sequence's keys or values: `(1, kv_heads, s, head_dim)` views of a cache buffer.
struct Rows<'a> {
    data: &'a [f32],
    /// Offset of `[0, 0, 0, 0]` and the strides of the kv-head and row dimensions.
    start: usize,
    head_stride: usize,
    row_stride: usize,
    len: usize,
}

impl Rows<'_> {
    fn row(&self, g: usize, j: usize, d: usize) -> &[f32] {
        let o = self.start + g * self.head_stride + j * self.row_stride;
        &self.data[o..o + d]
    }
}

/// `q` `(1, heads, n, head_dim)` (RoPE applied): row `r` of every head is sequence `r`'s new
/// query; `kv[r]` its keys and values `(1, kv_heads, s_r, head_dim)` with the new row last.
/// Returns `(n, heads * head_dim)`, the rows ready for the output projection.
pub fn attend_rows(
    q: &Tensor,
    kv: &[(Tensor, Tensor)],
    window: Option<usize>,
    scale: f64,
) -> Result<Tensor> {
    let (_, heads, n, d) = q.dims4()?;
    if kv.len() != n {
        candle_core::bail!("attend_rows: {n} query rows but {} caches", kv.len())
    }
    if window == Some(0) {
        candle_core::bail!("attend_rows: a sliding window must be at least 1")
    }
    let q = q.contiguous()?;
    let q_guard = q.storage_and_layout();
    let Storage::Cpu(qs) = &*q_guard.0 else {
        candle_core::bail!("attend_rows: CPU tensors only")
    };
    let Some((qa, qb)) = q_guard.1.contiguous_offsets() else {
        candle_core::bail!("attend_rows: q must be contiguous")
    };
    let q_data = &qs.as_slice::<f32>()?[qa..qb];
    let guards: Vec<_> = kv
        .iter()
        .map(|(k, v)| (k.storage_and_layout(), v.storage_and_layout()))
        .collect();
    let mut caches = Vec::with_capacity(n);
    let mut kv_heads = 0;
    for (kg, vg) in &guards {
        let mut pair = Vec::with_capacity(2);
        for g in [kg, vg] {
            let Storage::Cpu(s) = &*g.0 else {
                candle_core::bail!("attend_rows: CPU tensors only")
            };
            let dims = g.1.dims();
            let st = g.1.stride();
            if dims.len() != 4 || dims[3] != d || st[3] != 1 {
                candle_core::bail!("attend_rows: keys and values must be (1, kv_heads, s, {d})")
            }
            kv_heads = dims[1];
            pair.push(Rows {
                data: s.as_slice::<f32>()?,
                start: g.1.start_offset(),
                head_stride: st[1],
                row_stride: st[2],
                len: dims[2],
            });
        }
        let v = pair.pop().expect("two");
        let k = pair.pop().expect("two");
        if k.len == 0 || k.len != v.len {
            candle_core::bail!("attend_rows: a cache without the new row")
        }
        caches.push((k, v));
    }
    if kv_heads == 0 || heads % kv_heads != 0 {
        candle_core::bail!("attend_rows: {heads} heads over {kv_heads} kv heads")
    }
    let rep = heads / kv_heads;
    let scale = scale as f32;
    // (n, heads * d)
    let mut out = vec![0f32; n * heads * d];
    out.par_chunks_mut(heads * d)
        .zip(caches.par_iter())
        .enumerate()
        .for_each(|(r, (o, (k, v)))| {
            let lo = window.map_or(0, |w| k.len.saturating_sub(w));
            let keys = k.len - lo;
            let mut heads_of_g: Vec<RowScores> = (0..rep).map(|_| RowScores::default()).collect();
            // (rep, d): the query rows of one KV head's heads, then (keys, rep) their dots.
            let (mut qg, mut dots) = (vec![0f32; rep * d], vec![0f32; keys * rep]);
            for g in 0..kv_heads {
                for (i, qi) in qg.chunks_exact_mut(d).enumerate() {
                    let h = g * rep + i;
                    qi.copy_from_slice(&q_data[(h * n + r) * d..(h * n + r + 1) * d]);
                }
                // Exactly the single-sequence kernel's steps: canonical-order dots (one pass over
                // the keys for the KV head's query heads when its rows are contiguous), then the
                // shared softmax and weighted sums, so a batched row equals the row decoded alone.
                if k.row_stride == d {
                    let at = k.start + g * k.head_stride + lo * d;
                    crate::matvec::block(&k.data[at..at + keys * d], &qg, d, rep, &mut dots);
                } else {
                    for j in 0..keys {
                        for (i, qi) in qg.chunks_exact(d).enumerate() {
                            dots[j * rep + i] = dot(qi, k.row(g, lo + j, d));
                        }
                    }
                }
                for (i, rs) in heads_of_g.iter_mut().enumerate() {
                    rs.clear();
                    for j in 0..keys {
                        rs.push(lo + j, dots[j * rep + i] * scale + 0.0);
                    }
                }
                // The KV head's query heads are adjacent in the output row.
                let o_g = &mut o[g * rep * d..(g + 1) * rep * d];
                softmax_values(&mut heads_of_g, |j| v.row(g, j, d), o_g);
            }
        });
    drop(caches);
    drop(guards);
    drop(q_guard);
    Tensor::from_vec(out, (n, heads * d), q.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attention, AttnMask, KvCache, Mode};
    use candle_core::Device;

    /// Against the general attention, each row alone, bit for bit, with GQA, windows and buffer
    /// views.
    #[test]
    fn matches_attention_row_by_row() -> Result<()> {
        let dev = Device::Cpu;
        let (heads, kv_heads, d) = (6, 2, 8);
        for window in [None, Some(3)] {
            let lens = [1usize, 5, 9];
            let mut caches: Vec<KvCache> = Vec::new();
            let mut kv = Vec::new();
            for &s in &lens {
                let mut c = KvCache::new(1);
                let k = Tensor::randn(0f32, 1.0, (1, kv_heads, s, d), &dev)?;
                let v = Tensor::randn(0f32, 1.0, (1, kv_heads, s, d), &dev)?;
                kv.push(c.layer_mut(0).append(&k, &v)?);
                caches.push(c);
            }
            let n = lens.len();
            let q = Tensor::randn(0f32, 1.0, (1, heads, n, d), &dev)?;
            let got = attend_rows(&q, &kv, window, 0.3)?;
            for (r, (k, v)) in kv.iter().enumerate() {
                let qr = q.narrow(2, r, 1)?.contiguous()?;
                let s = k.dim(2)?;
                let m = AttnMask::causal().materialize(window, 1, s, &dev)?;
                let want = attention(&qr, k, v, m.as_ref(), 0.3, Mode::Infer, false)?
                    .out
                    .reshape((1, heads * d))?;
                let diff: f32 = (got.narrow(0, r, 1)? - want)?
                    .abs()?
                    .max_all()?
                    .to_scalar()?;
                assert!(diff == 0.0, "row {r}, window {window:?}: {diff}");
            }
        }
        Ok(())
    }
}
