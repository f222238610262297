//! Products of packed matrices with rows of inputs, in passes of rows that stay in cache: one
//! matrix, or a group of them over the same rows (a layer's query, key and value projections)
//! with the rows rounded or quantized once and every matrix's tasks in one parallel region.

use super::{act, half, Isa, PackedMatrix, AMX_ROWS_PER_PASS, ROWS_PER_PASS};
use candle_core::{DType, Tensor};

/// The inputs a matrix's kernels read ([`PackedMatrix::inputs`]): matrices that read the same
/// kind share one preparation of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    /// The f32 rows as given.
    F32,
    /// Rounded to bf16 once ([`half::Bf16Rows`]).
    Bf16,
    /// Quantized to 8 bits a block once ([`act::QuantRows`]).
    Quantized,
}

/// One matrix's task in a pass: `(first, rows, ys)` makes the outputs `ys` `(rows, m)` of weight
/// rows `first..first + rows`.
type TaskKernel<'a> = Box<dyn Fn(usize, usize, &mut [f32]) + Sync + 'a>;

/// Input rows as one [`Inputs`] kind needs them.
enum Prepared {
    F32,
    Bf16(half::Bf16Rows),
    Quantized(act::QuantRows),
}

impl PackedMatrix {
    /// The products of several matrices `(matrix, bias)` with the same input rows `x` `(m, in)`
    /// (a layer's query, key and value projections; its gate and up projections), each
    /// `(m, out)` as [`PackedMatrix::rows_with_bias`] makes it, bit for bit: the inputs are
    /// rounded or quantized once for all of them and every matrix's tasks share one parallel
    /// region.
    ///
    /// # Panics
    /// If a matrix's inputs are not `in` values long, or a bias not `out`.
    pub(super) fn group_rows(
        mats: &[(&PackedMatrix, Option<&[f32]>)],
        x: &[f32],
        m: usize,
        isa: Isa,
    ) -> Vec<Vec<f32>> {
        for (w, bias) in mats {
            let (out_dim, n) = w.dims();
            assert_eq!(x.len(), m * n, "packed matmul: ({m}, {n}) inputs expected");
            if let Some(b) = bias {
                assert_eq!(
                    b.len(),
                    out_dim,
                    "packed matmul: bias of {} for {out_dim}",
                    b.len()
                );
            }
        }
        let shared = mats.windows(2).all(|p| {
            p[0].0.dims().1 == p[1].0.dims().1 && p[0].0.inputs(isa) == p[1].0.inputs(isa)
        });
        let amx = |w: &PackedMatrix| {
            isa == Isa::Amx && matches!(w, Self::Half(h) if half::uses_bf16_inputs(h.kind(), isa))
        };
        if !shared || (mats.len() > 1 && mats.iter().any(|(w, _)| amx(w))) {
            // Inputs of different kinds, or AMX's own passes: one matrix at a time.
            return mats
                .iter()
                .map(|&(w, b)| Self::group_rows(&[(w, b)], x, m, isa).remove(0))
                .collect();
        }
        let n = mats.first().map_or(0, |(w, _)| w.dims().1);
        let mut ys: Vec<Vec<f32>> = mats
            .iter()
            .map(|(w, _)| Vec::with_capacity(m * w.dims().0))
            .collect();
        if m == 0 || n == 0 {
            // No rows, or sums over nothing.
            for (y, (w, bias)) in ys.iter_mut().zip(mats) {
                let out_dim = w.dims().0;
                y.resize(m * out_dim, 0.0);
                for row in y.chunks_exact_mut(out_dim.max(1)) {
                    add_bias(row, *bias);
                }
            }
            return ys;
        }
        // Input rows in passes that stay in cache while the weights stream past, each written
        // straight into its rows of the results (each row's result is independent of the
        // others). On AMX the passes are as even as whole tiles of 16 rows allow (94 rows: one
        // pass, not 64 and 30).
        let per_pass = if amx(mats[0].0) {
            let passes = m.div_ceil(AMX_ROWS_PER_PASS);
            m.div_ceil(passes).next_multiple_of(16)
        } else {
            ROWS_PER_PASS
        };
        for xs in x.chunks(per_pass * n) {
            let rows = xs.len() / n;
            // Each pass's rows zeroed just before the pass writes them (while they fit in
            // cache), not the whole result first.
            let mut dests: Vec<&mut [f32]> = ys
                .iter_mut()
                .zip(mats)
                .map(|(y, (w, _))| {
                    y.resize(y.len() + rows * w.dims().0, 0.0);
                    let at = y.len() - rows * w.dims().0;
                    &mut y[at..]
                })
                .collect();
            Self::pass(mats, xs, rows, isa, &mut dests);
        }
        ys
    }

    /// The kind of inputs this matrix's kernels read on `isa`.
    fn inputs(&self, isa: Isa) -> Inputs {
        match self {
            Self::Half(h) if half::uses_bf16_inputs(h.kind(), isa) => Inputs::Bf16,
            Self::Half(_) => Inputs::F32,
            Self::Q8(_) | Self::Q4(_) => Inputs::Quantized,
        }
    }

    /// One pass of [`PackedMatrix::group_rows`]: `x` `(m, in)` → `ys[j]` `(m, out_j)`, plus the
    /// biases; every matrix reads the same kind of inputs ([`PackedMatrix::inputs`]).
    fn pass(
        mats: &[(&PackedMatrix, Option<&[f32]>)],
        x: &[f32],
        m: usize,
        isa: Isa,
        ys: &mut [&mut [f32]],
    ) {
        let Some(&(first, _)) = mats.first() else {
            return;
        };
        let n = first.dims().1;
        // Rounded or quantized once, shared by every task of every matrix.
        let prepared = match first.inputs(isa) {
            Inputs::F32 => Prepared::F32,
            Inputs::Bf16 => Prepared::Bf16(half::Bf16Rows::new(x, m, n)),
            Inputs::Quantized => Prepared::Quantized(act::QuantRows::new(x, m, n)),
        };
        // On AMX each task writes its columns of the result itself, through a register
        // transpose of each result tile, and adds the bias (a group of AMX matrices runs one
        // at a time: `group_rows`).
        #[cfg(target_arch = "x86_64")]
        if let ([(Self::Half(h), bias)], Prepared::Bf16(xb), [y]) = (mats, &prepared, &mut *ys) {
            if isa == Isa::Amx && m > 1 && super::amx::available() {
                crate::matvec::columns_parallel_into(
                    h.dims().0,
                    m,
                    |first, cols| {
                        let w = &h.bits()[first * n..(first + cols.cols()) * n];
                        let b = bias.map(|b| &b[first..first + cols.cols()]);
                        let done = half::block_bf16_amx_into(w, xb, n, cols, b);
                        debug_assert!(done, "AMX checked available");
                    },
                    y,
                );
                return;
            }
        }
        let kernels: Vec<TaskKernel<'_>> = mats
            .iter()
            .map(|&(w, _)| -> TaskKernel<'_> {
                let prepared = &prepared;
                match (w, prepared) {
                    (Self::Half(h), Prepared::Bf16(xb)) => Box::new(move |first, rows, ys| {
                        let w = &h.bits()[first * n..(first + rows) * n];
                        half::block_bf16_inputs(w, xb, n, m, ys, isa)
                    }),
                    (Self::Half(h), _) => Box::new(move |first, rows, ys| {
                        let w = &h.bits()[first * n..(first + rows) * n];
                        half::block(h.kind(), w, x, n, m, ys, isa)
                    }),
                    (Self::Q8(q), Prepared::Quantized(xq)) => {
                        Box::new(move |first, rows, ys| q.block(first, rows, xq, ys, isa))
                    }
                    (Self::Q4(q), Prepared::Quantized(xq)) => {
                        Box::new(move |first, rows, ys| q.block(first, rows, xq, ys, isa))
                    }
                    (Self::Q8(_) | Self::Q4(_), _) => unreachable!("quantized inputs prepared"),
                }
            })
            .collect();
        let mut parts: Vec<crate::matvec::RowsPart<'_>> = ys
            .iter_mut()
            .zip(mats)
            .zip(&kernels)
            .map(|((y, (w, _)), kernel)| crate::matvec::RowsPart {
                out_dim: w.dims().0,
                kernel: kernel.as_ref(),
                y,
            })
            .collect();
        crate::matvec::rows_parallel_parts(m, &mut parts);
        for (y, (w, bias)) in ys.iter_mut().zip(mats) {
            for row in y.chunks_exact_mut(w.dims().0.max(1)) {
                add_bias(row, *bias);
            }
        }
    }

    /// [`PackedMatrix::matmul_bias`] of several matrices with the same inputs `x` `(m, in)` (a
    /// layer's query, key and value projections): each result bit for bit what `matmul_bias`
    /// gives, the inputs rounded or quantized once for all, every matrix's tasks in one parallel
    /// region.
    pub fn matmul_group(
        mats: &[(&PackedMatrix, Option<&Tensor>)],
        x: &Tensor,
    ) -> candle_core::Result<Vec<Tensor>> {
        group_tensors(mats, x, PackedMatrix::dims, |group, xs, m| {
            Self::group_rows(group, xs, m, Isa::best())
        })
    }
}

/// The tensors' side of a group product: checks `x` `(m, in)` and each bias against its
/// matrix's `(out, in)` (`dims`), reads them as f32 (in place where `x` is a contiguous f32
/// CPU tensor), runs `run(group, x, m)` and makes its `(m, out)` results tensors.
pub(super) fn group_tensors<W>(
    mats: &[(&W, Option<&Tensor>)],
    x: &Tensor,
    dims: impl Fn(&W) -> (usize, usize),
    run: impl FnOnce(&[(&W, Option<&[f32]>)], &[f32], usize) -> Vec<Vec<f32>>,
) -> candle_core::Result<Vec<Tensor>> {
    let (m, xn) = x.dims2()?;
    let mut biases = Vec::with_capacity(mats.len());
    for (w, bias) in mats {
        let (out_dim, n) = dims(w);
        if xn != n {
            candle_core::bail!("packed matmul: x is ({m}, {xn}) for a ({out_dim}, {n}) matrix")
        }
        biases.push(match bias {
            Some(b) if b.dims1()? != out_dim => {
                candle_core::bail!(
                    "packed matmul: a bias of {:?} for {out_dim} outputs",
                    b.dims()
                )
            }
            Some(b) => Some(b.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        });
    }
    let group: Vec<(&W, Option<&[f32]>)> = mats
        .iter()
        .zip(&biases)
        .map(|((w, _), b)| (*w, b.as_deref()))
        .collect();
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let ys = {
        let (storage, layout) = x.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (candle_core::Storage::Cpu(cpu), Some((a, b))) => {
                run(&group, &cpu.as_slice::<f32>()?[a..b], m)
            }
            _ => {
                drop(storage);
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                run(&group, &xs, m)
            }
        }
    };
    ys.into_iter()
        .zip(mats)
        .map(|(y, (w, _))| Tensor::from_vec(y, (m, dims(w).0), x.device()))
        .collect()
}

/// `row += bias`, where a bias is given.
pub(super) fn add_bias(row: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for (v, b) in row.iter_mut().zip(b) {
            *v += b;
        }
    }
}
