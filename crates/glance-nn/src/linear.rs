//! A linear layer `y = x Wᵀ + b` over rows of any leading shape, its weight an f32 tensor
//! (training, and the f32 format) or a packed matrix (bf16 / f16 / q8 / q4, inference only: see
//! [`crate::quant`]).

use crate::quant::{PackedMatrix, WeightFormat};
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

    /// The f32 weight `(out, in)`; `None` for packed weights.
    pub fn weight(&self) -> Option<&Tensor> {
        match &self.weight {
            Weight::Dense(w) => Some(w),
            Weight::Packed(_) => None,
        }
    }

    /// The packed weights, if any.
    pub fn packed_weight(&self) -> Option<&PackedMatrix> {
        match &self.weight {
            Weight::Packed(p) => Some(p),
            Weight::Dense(_) => None,
        }
    }

    /// The format the weights are held in.
    pub fn format(&self) -> WeightFormat {
        self.packed_weight()
            .map_or(WeightFormat::F32, |p| p.format())
    }

    /// Bytes of the weight matrix in memory (bias not counted).
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::Packed(p) => p.storage_bytes(),
            Weight::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match &self.weight {
            Weight::Packed(p) => Ok(p.dims()),
            Weight::Dense(w) => w.dims2(),
        }
    }

    /// `xs`: `(..., in)` → `(..., out)`. Leading dims are flattened into one GEMM.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dims = xs.dims();
        let in_dim = dims[dims.len() - 1];
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let out_dim = self.dims()?.0;
        let x2 = xs.reshape((rows, in_dim))?;
        let w = match &self.weight {
            Weight::Dense(w) => w,
            Weight::Packed(p) => {
                // (rows, in) x (out, in)ᵀ -> (rows, out)
                let y = p.matmul(&x2)?;
                let y = match &self.bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                };
                let mut out_shape = dims[..dims.len() - 1].to_vec();
                out_shape.push(out_dim);
                return y.reshape(out_shape);
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
        let mut out_shape = dims[..dims.len() - 1].to_vec();
        out_shape.push(out_dim);
        y.reshape(out_shape)
    }

    /// `xs` `(n, in)` → `(n, out)` for rows of different sequences (continuous batching), any
    /// `n`: frozen f32 CPU weights are read once for all rows by the decode kernel
    /// ([`crate::matvec::matmul_rows`]), so each row's result equals [`Linear::forward`] of that
    /// row alone, bit for bit; otherwise the same as `forward`.
    pub fn forward_rows(&self, xs: &Tensor) -> Result<Tensor> {
        if let (Weight::Packed(p), 2) = (&self.weight, xs.rank()) {
            // (n, in) -> (n, out), each row alone through the format's kernel.
            let (n, in_dim) = xs.dims2()?;
            let xs_v = xs
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            if in_dim != p.dims().1 {
                candle_core::bail!("linear: rows of {in_dim} values for {:?}", p.dims())
            }
            let y = Tensor::from_vec(p.matmul_rows(&xs_v, n), (n, p.dims().0), xs.device())?;
            return match &self.bias {
                Some(b) => y.broadcast_add(b),
                None => Ok(y),
            };
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
