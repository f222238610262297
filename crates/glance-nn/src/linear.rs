//! A linear layer `y = x Wᵀ + b` over rows of any leading shape.

use candle_core::{Result, Tensor};

/// Weight `(out, in)` as in PyTorch, optional bias `(out,)`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `xs`: `(..., in)` → `(..., out)`. Leading dims are flattened into one GEMM.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dims = xs.dims();
        let in_dim = dims[dims.len() - 1];
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let out_dim = self.weight.dim(0)?;
        let x2 = xs.reshape((rows, in_dim))?;
        // A few rows of frozen f32 weights on CPU (decode, draft trees): the bandwidth-bound
        // kernels. Anything in an autograd graph (trainable weights or inputs) takes the
        // differentiable matmul.
        let fast = rows <= crate::matvec::MAX_SMALL_ROWS && self.kernel_applies(xs);
        // (rows, in) x (in, out) -> (rows, out)
        let y = if fast && rows == 1 {
            crate::matvec::matvec(&self.weight, &x2)?
        } else if fast {
            crate::matvec::matmul_rows(&self.weight, &x2)?
        } else {
            x2.matmul(&self.weight.t()?)?
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
        if xs.rank() != 2 || !self.kernel_applies(xs) {
            return self.forward(xs);
        }
        // (n, in) x (out, in)ᵀ -> (n, out)
        let y = crate::matvec::matmul_rows(&self.weight, xs)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// Frozen f32 weights and input on CPU, outside any autograd graph: the decode kernels of
    /// [`crate::matvec`] apply.
    fn kernel_applies(&self, xs: &Tensor) -> bool {
        self.weight.device().is_cpu()
            && self.weight.dtype() == candle_core::DType::F32
            && xs.dtype() == candle_core::DType::F32
            && self.weight.is_contiguous()
            && !self.weight.track_op()
            && !xs.track_op()
    }
}
