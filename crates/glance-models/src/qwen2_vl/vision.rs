//! The native-resolution vision tower of Qwen2-VL and Qwen2.5-VL: patch rows → linear patch
//! embedding (the 3-D convolution with stride = kernel), blocks with 2-D rotary positions (the
//! first half of each head's frequencies at the patch's row, the second at its column), then the
//! merger: each 2×2 block of patches (adjacent rows of the input) normed, concatenated and put
//! through a two-layer GELU MLP into one text-width token.
//!
//! Qwen2-VL: LayerNorm, `fc1 → act → fc2` MLP, every block attends over the whole image.
//! Qwen2.5-VL: RMSNorm, SwiGLU MLP with biases, and windowed attention: the merged units are
//! reordered window by window (windows of `window_size / merge / patch` units per side, row-major;
//! the last row / column of windows may be smaller), blocks outside `fullatt_block_indexes`
//! attend within their window only, and the merger's outputs are put back in raster order.
//!
//! Reference: Wang et al., "Qwen2-VL" (2024); Bai et al., "Qwen2.5-VL Technical Report" (2025);
//! transformers `models/qwen2_vl/modeling_qwen2_vl.py`, `models/qwen2_5_vl/modeling_qwen2_5_vl.py`,
//! `vision_utils.py` (`get_vision_position_ids`, `get_vision_window_index`).

use super::config::{QwenVisionConfig, QwenVlVersion};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::weights::{layer_norm, linear_as, param, rms_norm};
use glance_nn::{attention, Activation, LayerNorm, Linear, Mode, RmsNorm, WeightLoad};

/// LayerNorm (Qwen2-VL) or RMSNorm (Qwen2.5-VL), eps 1e-6.
enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    fn load(vb: &VarBuilder, size: usize, version: QwenVlVersion, mode: Mode) -> Result<Self> {
        Ok(match version {
            QwenVlVersion::V2 => Norm::Layer(layer_norm(vb, size, 1e-6, mode)?),
            QwenVlVersion::V2_5 => Norm::Rms(rms_norm(vb, size, 1e-6, mode)?),
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }
}

enum Mlp {
    /// `fc2(act(fc1(x)))`
    Plain {
        fc1: Linear,
        fc2: Linear,
        act: Activation,
    },
    /// `down(act(gate(x)) * up(x))`
    Gated {
        gate: Linear,
        up: Linear,
        down: Linear,
        act: Activation,
    },
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Mlp::Plain { fc1, fc2, act } => fc2.forward(&act.forward(&fc1.forward(x)?)?),
            Mlp::Gated {
                gate,
                up,
                down,
                act,
            } => down.forward(&(act.forward(&gate.forward(x)?)? * up.forward(x)?)?),
        }
    }
}

struct Block {
    norm1: Norm,
    qkv: Linear,
    proj: Linear,
    norm2: Norm,
    mlp: Mlp,
    /// Attends over the whole image (always in Qwen2-VL).
    full: bool,
}

/// The Qwen2-VL / Qwen2.5-VL vision tower with its merger.
pub struct QwenVision {
    config: QwenVisionConfig,
    /// `(width, patch_dim)`: the convolution's weight, flattened.
    patch_weight: Tensor,
    blocks: Vec<Block>,
    ln_q: Norm,
    merge_fc1: Linear,
    merge_fc2: Linear,
    /// `(head_dim / 4,)` inverse frequencies of one axis.
    inv_freq: Vec<f32>,
    rope: glance_nn::RotaryEmbedding,
    mode: Mode,
    device: Device,
}

/// The tower's output for one image.
#[derive(Debug, Clone)]
pub struct QwenVisionOutput {
    /// Merged tokens `(grid_h / m · grid_w / m, out_width)`, row-major over the merged grid.
    pub features: Tensor,
    /// The last block's output `(grid_h · grid_w, width)`, in the patch-row order of the input.
    pub hidden: Tensor,
}

impl QwenVision {
    /// `vb` at the tower (`visual`); linear weights held as `load` says.
    pub fn load(
        vb: &VarBuilder,
        config: &QwenVisionConfig,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let c = config;
        let (w, v) = (c.width, c.version);
        let patch_weight = param(
            &vb.pp("patch_embed.proj"),
            (
                w,
                c.in_channels,
                c.temporal_patch_size,
                c.patch_size,
                c.patch_size,
            ),
            "weight",
        )?
        .reshape((w, c.patch_dim()))?;
        let blocks = (0..c.depth)
            .map(|i| {
                let b = vb.pp(format!("blocks.{i}"));
                let mlp = match v {
                    QwenVlVersion::V2 => Mlp::Plain {
                        fc1: linear_as(&b.pp("mlp.fc1"), w, c.mlp_width, true, load)?,
                        fc2: linear_as(&b.pp("mlp.fc2"), c.mlp_width, w, true, load)?,
                        act: c.hidden_act,
                    },
                    QwenVlVersion::V2_5 => Mlp::Gated {
                        gate: linear_as(&b.pp("mlp.gate_proj"), w, c.mlp_width, true, load)?,
                        up: linear_as(&b.pp("mlp.up_proj"), w, c.mlp_width, true, load)?,
                        down: linear_as(&b.pp("mlp.down_proj"), c.mlp_width, w, true, load)?,
                        act: c.hidden_act,
                    },
                };
                Ok(Block {
                    norm1: Norm::load(&b.pp("norm1"), w, v, mode)?,
                    qkv: linear_as(&b.pp("attn.qkv"), w, 3 * w, true, load)?,
                    proj: linear_as(&b.pp("attn.proj"), w, w, true, load)?,
                    norm2: Norm::load(&b.pp("norm2"), w, v, mode)?,
                    mlp,
                    full: v == QwenVlVersion::V2 || c.fullatt_block_indexes.contains(&i),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let merged = w * c.spatial_merge_size * c.spatial_merge_size;
        let m = vb.pp("merger");
        let quarter = c.head_dim() / 4;
        let half = c.head_dim() / 2;
        // As HF's axial init: 1 / theta^(2i / (head_dim / 2)) for i < head_dim / 4, in f32.
        let inv_freq = (0..quarter)
            .map(|i| 1.0 / (c.rope_theta as f32).powf((2 * i) as f32 / half as f32))
            .collect();
        Ok(Self {
            config: c.clone(),
            patch_weight,
            blocks,
            ln_q: Norm::load(&m.pp("ln_q"), w, v, mode)?,
            merge_fc1: linear_as(&m.pp("mlp.0"), merged, merged, true, load)?,
            merge_fc2: linear_as(&m.pp("mlp.2"), merged, c.out_width, true, load)?,
            inv_freq,
            rope: glance_nn::RotaryEmbedding::new(
                c.head_dim(),
                c.rope_theta,
                None,
                mode,
                vb.device(),
            )?,
            mode,
            device: vb.device().clone(),
        })
    }

    pub fn config(&self) -> &QwenVisionConfig {
        &self.config
    }

    /// Encodes one image: `patches` `(grid_h · grid_w, patch_dim)` as the processor orders them,
    /// `grid_thw` `[1, grid_h, grid_w]`.
    pub fn forward(&self, patches: &Tensor, grid_thw: [usize; 3]) -> Result<QwenVisionOutput> {
        let c = &self.config;
        let [t, gh, gw] = grid_thw;
        let m = c.spatial_merge_size;
        let n = gh * gw;
        if t != 1 {
            return Err(Error::Input(
                "video input is not supported: glance runs Qwen2-VL on images only".into(),
            ));
        }
        if gh == 0 || gw == 0 || !gh.is_multiple_of(m) || !gw.is_multiple_of(m) {
            return Err(Error::Input(format!(
                "image grid {gh}x{gw} is not a positive multiple of the merge size {m}"
            )));
        }
        if patches.dims() != [n, c.patch_dim()] {
            return Err(Error::Input(format!(
                "pixel patches are {:?}, grid {gh}x{gw} needs ({n}, {})",
                patches.dims(),
                c.patch_dim()
            )));
        }
        let unit = m * m;
        // Window order of the merged units (identity for Qwen2-VL), and each window's rows.
        let (order, windows) = match c.version {
            QwenVlVersion::V2 => ((0..n / unit).collect::<Vec<_>>(), vec![n]),
            QwenVlVersion::V2_5 => self.window_order(gh / m, gw / m),
        };
        let rows: Vec<u32> = order
            .iter()
            .flat_map(|&u| (0..unit).map(move |k| (u * unit + k) as u32))
            .collect();
        let rows = Tensor::new(rows.as_slice(), &self.device)?;
        // (n, patch_dim) x (patch_dim, width) -> (n, width), rows in window order
        let x = patches.matmul(&self.patch_weight.t()?)?;
        let mut x = x.index_select(&rows, 0)?;
        // (n, head_dim / 2) each, in window order
        let (cos, sin) = self.angles(gh, gw)?;
        let (cos, sin) = (cos.index_select(&rows, 0)?, sin.index_select(&rows, 0)?);
        for b in &self.blocks {
            let h = b.norm1.forward(&x)?;
            let att = if b.full {
                self.attend(b, &h, &cos, &sin, &[n])?
            } else {
                self.attend(b, &h, &cos, &sin, &windows)?
            };
            x = (x + att)?;
            let h = b.mlp.forward(&b.norm2.forward(&x)?)?;
            x = (x + h)?;
        }
        // Merger: (n, width) -> (n / unit, width · unit) -> (n / unit, out_width)
        let merged = self.ln_q.forward(&x)?.reshape((n / unit, c.width * unit))?;
        let merged = self
            .merge_fc2
            .forward(&self.merge_fc1.forward(&merged)?.gelu_erf()?)?;
        // Back to raster order: the j-th merged token is unit order[j].
        let mut inverse = vec![0u32; order.len()];
        for (j, &u) in order.iter().enumerate() {
            inverse[u] = j as u32;
        }
        let inverse = Tensor::new(inverse.as_slice(), &self.device)?;
        let features = merged.index_select(&inverse, 0)?;
        let mut row_inverse = vec![0u32; n];
        for (j, &u) in order.iter().enumerate() {
            for k in 0..unit {
                row_inverse[u * unit + k] = (j * unit + k) as u32;
            }
        }
        let row_inverse = Tensor::new(row_inverse.as_slice(), &self.device)?;
        Ok(QwenVisionOutput {
            features,
            hidden: x.index_select(&row_inverse, 0)?,
        })
    }

    /// Attention of rows `h` `(n, width)` within consecutive segments of `lens` rows each.
    fn attend(
        &self,
        b: &Block,
        h: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        lens: &[usize],
    ) -> Result<Tensor> {
        let c = &self.config;
        let (n, heads, hd) = (h.dim(0)?, c.num_heads, c.head_dim());
        // (n, 3·width) -> (3, 1, heads, n, hd)
        let qkv = b
            .qkv
            .forward(h)?
            .reshape((n, 3, heads, hd))?
            .permute((1, 2, 0, 3))?
            .unsqueeze(1)?;
        let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
        let (q, k) = self
            .rope
            .apply_cos_sin(&q.contiguous()?, &k.contiguous()?, cos, sin)?;
        let v = v.contiguous()?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut outs = Vec::with_capacity(lens.len());
        let mut at = 0;
        for &len in lens {
            let seg = |x: &Tensor| x.narrow(2, at, len);
            // (1, heads, len, hd)
            let o = attention(
                &seg(&q)?,
                &seg(&k)?,
                &seg(&v)?,
                None,
                scale,
                self.mode,
                false,
            )?
            .out;
            outs.push(o);
            at += len;
        }
        // (1, heads, n, hd) -> (n, width)
        let out = Tensor::cat(&outs, 2)?
            .squeeze(0)?
            .transpose(0, 1)?
            .reshape((n, c.width))?;
        Ok(b.proj.forward(&out)?)
    }

    /// 2-D rotary angles of the patch rows in raster-of-blocks order: `(cos, sin)`, each
    /// `(grid_h · grid_w, head_dim / 2)`, the first quarter of the head's frequencies at the
    /// patch's row, the second at its column.
    fn angles(&self, gh: usize, gw: usize) -> Result<(Tensor, Tensor)> {
        let m = self.config.spatial_merge_size;
        let q = self.inv_freq.len();
        let mut freqs = Vec::with_capacity(gh * gw * 2 * q);
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for ih in 0..m {
                    for iw in 0..m {
                        let (r, col) = ((bh * m + ih) as f32, (bw * m + iw) as f32);
                        freqs.extend(self.inv_freq.iter().map(|f| r * f));
                        freqs.extend(self.inv_freq.iter().map(|f| col * f));
                    }
                }
            }
        }
        let freqs =
            Tensor::from_vec(freqs, (gh * gw, 2 * q), &self.device)?.to_dtype(DType::F32)?;
        Ok((freqs.cos()?, freqs.sin()?))
    }

    /// Qwen2.5-VL's windows over a merged grid of `lh × lw` units: the units in window order, and
    /// the rows (units × merge²) of each window.
    fn window_order(&self, lh: usize, lw: usize) -> (Vec<usize>, Vec<usize>) {
        let c = &self.config;
        let side = c.window_size / c.spatial_merge_size / c.patch_size;
        let unit = c.spatial_merge_size * c.spatial_merge_size;
        let mut order = Vec::with_capacity(lh * lw);
        let mut lens = Vec::new();
        for wy in 0..lh.div_ceil(side) {
            for wx in 0..lw.div_ceil(side) {
                let before = order.len();
                for y in wy * side..((wy + 1) * side).min(lh) {
                    for x in wx * side..((wx + 1) * side).min(lw) {
                        order.push(y * lw + x);
                    }
                }
                lens.push((order.len() - before) * unit);
            }
        }
        (order, lens)
    }
}
