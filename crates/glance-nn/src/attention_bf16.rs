//! Full attention in bf16 for vision towers ([`attention_full_bf16`]), on Intel AMX or
//! AVX-512 BF16: every key visible, the heads side by side as the linear layers give them. The
//! masked and row-wise kernels are in [`crate::attention`].

use crate::quant::PanelMatrix;
use candle_core::{DType, Result, Tensor};

/// `softmax(q kᵀ · scale) v` over every key (no mask, no grouped heads; f32 on the CPU) with
/// bf16 products on Intel AMX (`tdpbf16ps`) or AVX-512 BF16 (`vdpbf16ps`, the keys and values
/// packed in panels: [`PanelMatrix`]): `q · scale`, `k`, the probabilities and `v` rounded to
/// bf16 (to nearest), every sum and the softmax in f32, as bf16 attention kernels on GPUs
/// compute it. `q` `(t, heads · d)`, `k` and `v` `(s, heads · d)`: the heads side by side, as
/// the linear layers give them, and so the result `(t, heads · d)` (no split into `(1, heads,
/// t, d)` and back, four copies of the activations). `None` where the CPU has neither or the
/// tensors are not of that kind: the caller then takes
/// [`attention`](crate::attention::attention).
///
/// For a vision tower whose linear layers are bf16 (which already take bf16-rounded inputs): its
/// attention over all of an image's patches ran at a third of the tower's time in f32
/// (docs/kernels.md, "Long prompts and the tower"). A row's result depends only on its query and
/// the keys, as in [`attention`](crate::attention::attention)'s row-wise kernel, but the values
/// differ from that kernel's (bf16 operands): a language model, whose prompt and verified rows
/// must equal its decode steps', keeps the row-wise kernel.
pub fn attention_full_bf16(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    scale: f64,
) -> Result<Option<Tensor>> {
    use crate::quant::half::{block_bf16_inputs, round_into, Bf16Rows};
    use crate::quant::Isa;
    use rayon::prelude::*;
    let isa = Isa::best();
    if !matches!(isa, Isa::Amx | Isa::Avx512Bf16)
        || !q.device().is_cpu()
        || [q, k, v]
            .iter()
            .any(|x| x.dtype() != DType::F32 || x.rank() != 2)
    {
        return Ok(None);
    }
    let (t, width) = q.dims2()?;
    let s = k.dim(0)?;
    if heads == 0 || !width.is_multiple_of(heads) || t == 0 || s == 0 || width == 0 {
        return Ok(None);
    }
    if k.dims2()? != (s, width) || v.dims2()? != (s, width) {
        return Ok(None);
    }
    let d = width / heads;
    let device = q.device().clone();
    // Read in place (each head's columns are gathered into its thread's scratch below).
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let guards = [&q, &k, &v].map(|x| x.storage_and_layout());
    let mut slices = Vec::with_capacity(3);
    for (storage, layout) in &guards {
        let (candle_core::Storage::Cpu(cpu), Some((a, b))) =
            (&**storage, layout.contiguous_offsets())
        else {
            return Ok(None);
        };
        slices.push(&cpu.as_slice::<f32>()?[a..b]);
    }
    let (q, k, v) = (slices[0], slices[1], slices[2]);
    let scale = scale as f32;
    // Keys padded to whole chunks of 32 (zero probabilities meet zero values there).
    let s_pad = s.div_ceil(32) * 32;
    // (t, heads · d): each head's output written into its columns by the thread computing it.
    let mut out = vec![0f32; t * width];
    struct Shared(*mut f32);
    // SAFETY: each head's columns of `out` are written by one task only.
    unsafe impl Sync for Shared {}
    let base = Shared(out.as_mut_ptr());
    let base = &base;
    // The heads in one group per thread, each group with its thread's scratch (kept between
    // calls: the tower's 23 layers reuse it instead of zeroing megabytes each), every value of
    // it written for each head: the head's (t, d) queries and (s, d) keys, (t, s) scores, a
    // row of probabilities, (d, s_pad) values transposed and its (t, d) output.
    let per_group = heads.div_ceil(rayon::current_num_threads().max(1));
    let sizes = [t * d, s * d, t * s, s, d * s_pad, t * d];
    let group = |g: usize| {
        SCRATCH.with_borrow_mut(|(buf, panels)| {
            let need: usize = sizes.iter().sum();
            if buf.len() < need {
                buf.resize(need, 0.0);
            }
            let (qh, rest) = buf.split_at_mut(sizes[0]);
            let (kh, rest) = rest.split_at_mut(sizes[1]);
            let (scores, rest) = rest.split_at_mut(sizes[2]);
            let (probs, rest) = rest.split_at_mut(sizes[3]);
            let (vt, rest) = rest.split_at_mut(sizes[4]);
            let oh = &mut rest[..sizes[5]];
            for head in g * per_group..((g + 1) * per_group).min(heads) {
                let cols = head * d..(head + 1) * d;
                for (dst, row) in qh.chunks_exact_mut(d).zip(q.chunks_exact(width)) {
                    for (o, &x) in dst.iter_mut().zip(&row[cols.clone()]) {
                        *o = x * scale;
                    }
                }
                for (dst, row) in kh.chunks_exact_mut(d).zip(k.chunks_exact(width)) {
                    dst.copy_from_slice(&row[cols.clone()]);
                }
                let (qb, kb) = (Bf16Rows::new(qh, t, d), Bf16Rows::new(kh, s, d));
                // Query row r against key i at r · s + i (rows padded alike: n = stride). On
                // AVX-512 BF16 the keys are packed in panels, each score in a lane of its own
                // (the dot-product tiles would end every score of 64 products in a sum across
                // 16 lanes).
                if isa == Isa::Amx {
                    block_bf16_inputs(qb.bits(), &kb, qb.stride(), s, scores, isa);
                } else {
                    panels.repack(kb.bits(), s, kb.stride());
                    panels.matmul_rows(&qb, scores);
                }
                // Each row's probabilities rounded as they are made.
                let pb = Bf16Rows::from_rows(t, s, |r, dst| {
                    crate::fused::softmax_row(&scores[r * s..(r + 1) * s], probs);
                    round_into(probs, dst);
                });
                // One row per output column, zero past the keys (zero probabilities meet them).
                for (i, row) in v.chunks_exact(width).enumerate() {
                    for (c, &x) in row[cols.clone()].iter().enumerate() {
                        vt[c * s_pad + i] = x;
                    }
                }
                for row in vt.chunks_exact_mut(s_pad) {
                    row[s..].fill(0.0);
                }
                let vb = Bf16Rows::new(vt, d, s_pad);
                // (t, d): query row r's output column c at r · d + c.
                if isa == Isa::Amx {
                    block_bf16_inputs(pb.bits(), &vb, s_pad, d, oh, isa);
                } else {
                    panels.repack(vb.bits(), d, s_pad);
                    panels.matmul_rows(&pb, oh);
                }
                for (r, src) in oh.chunks_exact(d).enumerate() {
                    // SAFETY: `r < t` and the head's columns are within `width`: inside
                    // `out`, in columns no other task writes.
                    unsafe {
                        let dst = base.0.add(r * width + head * d);
                        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, d);
                    }
                }
            }
            // A scratch grown for a long sequence is not kept.
            if buf.len() > KEPT_SCRATCH {
                *buf = Vec::new();
                *panels = PanelMatrix::from_bf16(&[], 0, 0);
            }
        })
    };
    (0..heads.div_ceil(per_group))
        .into_par_iter()
        .for_each(group);
    Ok(Some(Tensor::from_vec(out, (t, width), &device)?))
}

/// Values of [`attention_full_bf16`]'s scratch a thread keeps between calls (16 MiB: a CLIP
/// ViT-L/14-336 layer's 577 rows need 1.9 MiB).
const KEPT_SCRATCH: usize = 4 << 20;

thread_local! {
    /// [`attention_full_bf16`]'s scratch, one per thread of the pool.
    /// With the keys or values of a head packed in panels (AVX-512 BF16).
    static SCRATCH: std::cell::RefCell<(Vec<f32>, PanelMatrix)> =
        std::cell::RefCell::new((Vec::new(), PanelMatrix::from_bf16(&[], 0, 0)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::tests::reference;
    use candle_core::Device;

    #[test]
    fn bf16_full_attention_is_the_f32_attention_to_bf16_precision() -> Result<()> {
        // A tower's shape, small: every key visible, key counts off the chunk of 32 (37, 70),
        // head sizes a whole chunk or not (64, 40).
        let dev = Device::Cpu;
        // (1, h, n, d) -> (n, h · d), the heads side by side as the linear layers give them.
        let merge = |x: &Tensor| -> Result<Tensor> {
            let (_, h, n, d) = x.dims4()?;
            x.squeeze(0)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((n, h * d))
        };
        for (h, t, d) in [(3, 37, 64), (2, 70, 40), (1, 16, 64)] {
            let q = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev)?;
            let k = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev)?;
            let v = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev)?;
            let scale = 1.0 / (d as f64).sqrt();
            let Some(got) = attention_full_bf16(&merge(&q)?, &merge(&k)?, &merge(&v)?, h, scale)?
            else {
                use crate::quant::Isa;
                assert!(!matches!(Isa::best(), Isa::Amx | Isa::Avx512Bf16));
                return Ok(());
            };
            let want = merge(&reference(&q, &k, &v, None, scale)?)?;
            assert_eq!(got.dims2()?, (t, h * d));
            // bf16 keeps 8 bits of mantissa: about 0.4% per rounded operand.
            let diff: f32 = (&got - &want)?.abs()?.max_all()?.to_scalar()?;
            let size: f32 = want.abs()?.max_all()?.to_scalar()?;
            assert!(diff < 0.03 * size, "({h}, {t}, {d}): {diff} of {size}");
            // Not a coincidence of the tolerance: a wrong key or value layout is far off.
            let other = merge(&reference(&q, &v, &k, None, scale)?)?;
            let far: f32 = (&got - &other)?.abs()?.max_all()?.to_scalar()?;
            assert!(far > 0.1 * size, "({h}, {t}, {d}): {far}");
        }
        // Widths the heads do not divide are not its kind: the caller takes `attention`.
        let x = Tensor::randn(0f32, 1.0, (5, 30), &dev)?;
        assert!(attention_full_bf16(&x, &x, &x, 4, 0.1)?.is_none());
        Ok(())
    }
}
