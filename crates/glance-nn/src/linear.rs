//! A linear layer `y = x Wᵀ + b` over rows of any leading shape, its weight an f32 tensor
//! (training, and the f32 format) or a packed matrix (bf16 / f16 / q8 / q4, inference only: see
//! [`crate::quant`]).

use crate::quant::{HalfKind, Isa, PackedMatrix, PanelMatrix, WeightFormat};
use candle_core::{Result, Tensor};
use std::sync::Arc;

/// Weight `(out, in)` as in PyTorch, optional bias `(out,)`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

/// The weight matrix as held.
#[derive(Debug, Clone)]
enum Weight {
    /// An f32 tensor (trainable or frozen).
    Dense(Tensor),
    /// Packed for inference (bf16 / f16 / q8 / q4).
    Packed(Arc<PackedMatrix>),
    /// bf16 packed in panels for products over many rows ([`Linear::for_many_rows`]).
    Panels(Arc<PanelMatrix>),
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self {
            weight: Weight::Dense(weight),
            bias,
        }
    }

    /// A layer over packed weights (f32 CPU bias).
    pub fn packed(weight: impl Into<Arc<PackedMatrix>>, bias: Option<Tensor>) -> Self {
        Self {
            weight: Weight::Packed(weight.into()),
            bias,
        }
    }

    /// This layer for products over many rows at once, never a row alone (a vision tower's,
    /// which meets every patch of an image together): bf16 weights on a CPU with AVX-512 BF16
    /// and no AMX are packed in panels ([`PanelMatrix`]: each output summed in a lane of its
    /// own, not in [`PackedMatrix`]'s order, at about twice the speed over hundreds of rows);
    /// any other layer is returned as it is.
    pub fn for_many_rows(self) -> Self {
        let bits = match &self.weight {
            Weight::Packed(p) if PanelMatrix::available() && Isa::best() == Isa::Avx512Bf16 => {
                match p.as_ref() {
                    PackedMatrix::Half(h) if h.kind() == HalfKind::Bf16 => Some(h),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(h) = bits else {
            return self;
        };
        let (rows, cols) = h.dims();
        let panels = PanelMatrix::from_bf16(h.bits(), rows, cols);
        Self {
            weight: Weight::Panels(Arc::new(panels)),
            bias: self.bias,
        }
    }

    /// The f32 weight `(out, in)`; `None` for packed weights.
    pub fn weight(&self) -> Option<&Tensor> {
        match &self.weight {
            Weight::Dense(w) => Some(w),
            Weight::Packed(_) | Weight::Panels(_) => None,
        }
    }

    /// The packed weights, if any (not those packed in panels).
    pub fn packed_weight(&self) -> Option<&PackedMatrix> {
        match &self.weight {
            Weight::Packed(p) => Some(p),
            Weight::Dense(_) | Weight::Panels(_) => None,
        }
    }

    /// The format the weights are held in.
    pub fn format(&self) -> WeightFormat {
        match &self.weight {
            Weight::Packed(p) => p.format(),
            Weight::Panels(_) => WeightFormat::Bf16,
            Weight::Dense(_) => WeightFormat::F32,
        }
    }

    /// Bytes of the weight matrix in memory (bias not counted).
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::Packed(p) => p.storage_bytes(),
            Weight::Panels(p) => p.storage_bytes(),
            Weight::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match &self.weight {
            Weight::Packed(p) => Ok(p.dims()),
            Weight::Panels(p) => Ok(p.dims()),
            Weight::Dense(w) => w.dims2(),
        }
    }

    /// A layer of output rows `rows` of this one, in that order (`(rows.len(), in)`), in the same
    /// format: output `j` is computed as this layer's output `rows[j]` (FR-Spec's reduced draft
    /// LM head is the target's head restricted to the tokens it may propose).
    pub fn select_rows(&self, rows: &[u32]) -> Result<Linear> {
        let out = self.dims()?.0;
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= out) {
            candle_core::bail!("linear: row {r} of a layer with {out} outputs")
        }
        let bias = match &self.bias {
            Some(b) => {
                let ids = Tensor::new(rows, b.device())?;
                Some(b.index_select(&ids, 0)?)
            }
            None => None,
        };
        let weight = match &self.weight {
            Weight::Dense(w) => {
                let ids = Tensor::new(rows, w.device())?;
                // (rows, in), frozen: a copy, not a view into a trainable weight.
                Weight::Dense(w.index_select(&ids, 0)?.detach().contiguous()?)
            }
            Weight::Packed(p) => {
                let rows: Vec<usize> = rows.iter().map(|&r| r as usize).collect();
                Weight::Packed(Arc::new(p.select_rows(&rows)))
            }
            Weight::Panels(_) => {
                candle_core::bail!("linear: rows of a layer packed in panels cannot be selected")
            }
        };
        Ok(Linear { weight, bias })
    }

    /// `xs`: `(..., in)` → `(..., out)`. Leading dims are flattened into one GEMM.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dims = xs.dims();
        let in_dim = dims[dims.len() - 1];
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let out_dim = self.dims()?.0;
        let x2 = xs.reshape((rows, in_dim))?;
        let mut out_shape = dims[..dims.len() - 1].to_vec();
        out_shape.push(out_dim);
        let w = match &self.weight {
            Weight::Dense(w) => w,
            // (rows, in) x (out, in)ᵀ + bias -> (rows, out)
            Weight::Packed(p) => return p.matmul_bias(&x2, self.bias.as_ref())?.reshape(out_shape),
            Weight::Panels(p) => {
                let y = PanelMatrix::matmul_tensors(&[(p, self.bias.as_ref())], &x2)?;
                return y[0].reshape(out_shape);
            }
        };
        // A few rows of frozen f32 weights on CPU (decode, draft trees): the bandwidth-bound
        // kernels. Anything in an autograd graph (trainable weights or inputs) takes the
        // differentiable matmul.
        let fast = rows <= crate::matvec::MAX_SMALL_ROWS && kernel_applies(w, xs);
        // (rows, in) x (in, out) -> (rows, out)
        let y = if fast && rows == 1 {
            crate::matvec::matvec(w, &x2)?
        } else if fast {
            crate::matvec::matmul_rows(w, &x2)?
        } else {
            x2.matmul(&w.t()?)?
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        y.reshape(out_shape)
    }

    /// `xs` `(n, in)` → `(n, out)` for rows of different sequences (continuous batching), any
    /// `n`: frozen f32 CPU weights are read once for all rows by the decode kernel
    /// ([`crate::matvec::matmul_rows`]), so each row's result equals [`Linear::forward`] of that
    /// row alone, bit for bit; otherwise the same as `forward` (whose packed kernels, panels
    /// included, give each row its own result whatever the others).
    pub fn forward_rows(&self, xs: &Tensor) -> Result<Tensor> {
        if let (Weight::Packed(p), 2) = (&self.weight, xs.rank()) {
            // (n, in) -> (n, out), each row alone through the format's kernel.
            let in_dim = xs.dim(1)?;
            if in_dim != p.dims().1 {
                candle_core::bail!("linear: rows of {in_dim} values for {:?}", p.dims())
            }
            return p.matmul_bias(xs, self.bias.as_ref());
        }
        let w = match &self.weight {
            Weight::Dense(w) if xs.rank() == 2 && kernel_applies(w, xs) => w,
            _ => return self.forward(xs),
        };
        // (n, in) x (out, in)ᵀ -> (n, out)
        let y = crate::matvec::matmul_rows(w, xs)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// Several layers over the same rows `xs` `(n, in)` (a block's query, key and value
    /// projections): when every layer is packed, in one pass of the format's kernels — the rows
    /// rounded or quantized once, every layer's tasks in one parallel region — and when every
    /// layer is frozen f32 and the rows are few, in one parallel region of the decode kernel;
    /// each result bit for bit what `each` (`Linear::forward` or `Linear::forward_rows`) gives
    /// it alone, which is what any other group gets.
    pub fn forward_group(
        layers: &[&Linear],
        xs: &Tensor,
        each: fn(&Linear, &Tensor) -> Result<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let packed: Option<Vec<_>> = layers
            .iter()
            .map(|l| match &l.weight {
                Weight::Packed(p) => Some((p.as_ref(), l.bias.as_ref())),
                Weight::Dense(_) | Weight::Panels(_) => None,
            })
            .collect();
        if let (Some(group), 2) = (&packed, xs.rank()) {
            return PackedMatrix::matmul_group(group, xs);
        }
        let panels: Option<Vec<_>> = layers
            .iter()
            .map(|l| match &l.weight {
                Weight::Panels(p) => Some((p.as_ref(), l.bias.as_ref())),
                _ => None,
            })
            .collect();
        if let (Some(group), 2) = (&panels, xs.rank()) {
            return PanelMatrix::matmul_tensors(group, xs);
        }
        // Frozen f32 weights and a few rows: the decode kernel for all of them at once, as
        // `forward` and `forward_rows` both run it on such rows.
        let dense: Option<Vec<&Tensor>> = layers
            .iter()
            .map(|l| match &l.weight {
                Weight::Dense(w) if kernel_applies(w, xs) => Some(w),
                _ => None,
            })
            .collect();
        match dense {
            Some(ws) if xs.rank() == 2 && xs.dim(0)? <= crate::matvec::MAX_SMALL_ROWS => {
                let ys = crate::matvec::matmul_rows_group(&ws, xs)?;
                ys.into_iter()
                    .zip(layers)
                    .map(|(y, l)| match &l.bias {
                        Some(b) => y.broadcast_add(b),
                        None => Ok(y),
                    })
                    .collect()
            }
            _ => layers.iter().map(|l| each(l, xs)).collect(),
        }
    }
}

/// Frozen f32 weights and input on CPU, outside any autograd graph: the decode kernels of
/// [`crate::matvec`] apply.
fn kernel_applies(w: &Tensor, xs: &Tensor) -> bool {
    w.device().is_cpu()
        && w.dtype() == candle_core::DType::F32
        && xs.dtype() == candle_core::DType::F32
        && w.is_contiguous()
        && !w.track_op()
        && !xs.track_op()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::PackedMatrix;
    use candle_core::Device;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(2_654_435_761).rotate_left(13);
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn selected_rows_compute_exactly_what_the_whole_layer_does_for_them() {
        let (out, inp) = (40, 64);
        let w = values(out * inp, 1);
        let b = Tensor::from_vec(values(out, 2), out, &Device::Cpu).unwrap();
        let rows: [u32; 5] = [7, 0, 39, 7, 12];
        for format in WeightFormat::ALL {
            let layer = match format {
                WeightFormat::F32 => Linear::new(
                    Tensor::from_vec(w.clone(), (out, inp), &Device::Cpu).unwrap(),
                    Some(b.clone()),
                ),
                f => Linear::packed(
                    PackedMatrix::pack(f, &w, out, inp).unwrap(),
                    Some(b.clone()),
                ),
            };
            let sub = layer.select_rows(&rows).unwrap();
            assert_eq!(sub.dims().unwrap(), (rows.len(), inp));
            assert_eq!(sub.format(), format);
            for n in [1, 3] {
                // (n, in)
                let x = Tensor::from_vec(values(n * inp, 3 + n as u32), (n, inp), &Device::Cpu)
                    .unwrap();
                let full: Vec<Vec<f32>> = layer.forward(&x).unwrap().to_vec2().unwrap();
                let got: Vec<Vec<f32>> = sub.forward(&x).unwrap().to_vec2().unwrap();
                for (f, g) in full.iter().zip(&got) {
                    let want: Vec<f32> = rows.iter().map(|&r| f[r as usize]).collect();
                    assert_eq!(g, &want, "{format:?}, {n} rows");
                }
            }
        }
        assert!(
            Linear::new(Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap(), None)
                .select_rows(&[40])
                .is_err()
        );
    }

    /// A group pass gives each layer what `forward` and `forward_rows` give it alone, bit for
    /// bit, in every format (f32 through the decode kernel up to 64 rows, candle's product
    /// beyond), with and without biases.
    #[test]
    fn a_group_computes_what_each_layer_does_alone() {
        let inp = 96;
        let dev = Device::Cpu;
        for format in WeightFormat::ALL {
            let layers: Vec<Linear> = [(70, true), (16, false), (130, true)]
                .iter()
                .enumerate()
                .map(|(j, &(out, bias))| {
                    let w = values(out * inp, j as u32);
                    let b = bias.then(|| Tensor::from_vec(values(out, 9), out, &dev).unwrap());
                    match format {
                        WeightFormat::F32 => {
                            Linear::new(Tensor::from_vec(w, (out, inp), &dev).unwrap(), b)
                        }
                        f => Linear::packed(PackedMatrix::pack(f, &w, out, inp).unwrap(), b),
                    }
                })
                .collect();
            let group: Vec<&Linear> = layers.iter().collect();
            for n in [1, 5, 64, 70] {
                let x = Tensor::from_vec(values(n * inp, 4), (n, inp), &dev).unwrap();
                for each in [Linear::forward, Linear::forward_rows] {
                    let got = Linear::forward_group(&group, &x, each).unwrap();
                    for (l, y) in layers.iter().zip(&got) {
                        let want: Vec<Vec<f32>> = each(l, &x).unwrap().to_vec2().unwrap();
                        let y: Vec<Vec<f32>> = y.to_vec2().unwrap();
                        let mut same = want.iter().flatten().zip(y.iter().flatten());
                        assert!(
                            same.all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{format:?}, {n} rows"
                        );
                    }
                }
            }
        }
    }
}
