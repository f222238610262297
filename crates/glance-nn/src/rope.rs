//! Rotary position embeddings (the "rotate half" layout of Llama / Mistral / Qwen2 in HF), applied
//! at explicit position ids so pruned prefixes, draft trees and diffusion blocks can place rows
//! anywhere.

use crate::Mode;
use candle_core::{DType, Device, Result, Tensor};

/// Frequency scaling schemes (HF `rope_scaling` / `rope_parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (HF "linear").
    Linear { factor: f64 },
    /// Llama 3.1's piecewise scaling of low / medium / high frequencies.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Each inverse frequency divided by its own factor, `(head_dim / 2)` of them: how a GGUF
    /// file carries scaled RoPE (its `rope_freqs.weight` tensor; for Llama 3.1 the same
    /// frequencies as [`RopeScaling::Llama3`], written as divisors).
    Factors(Vec<f32>),
}

/// Inverse frequencies of one head dimension; cos / sin are made per call for the given positions.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    /// `(1, head_dim / 2)`
    inv_freq: Tensor,
    mode: Mode,
}

impl RotaryEmbedding {
    pub fn new(
        head_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
        mode: Mode,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        // As HF: inv_freq = 1 / theta^(2i / d), computed in f32.
        let mut inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => {
                for f in inv.iter_mut() {
                    *f /= *factor as f32;
                }
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = *original_max_position_embeddings as f32;
                let (factor, lo, hi) = (
                    *factor as f32,
                    *low_freq_factor as f32,
                    *high_freq_factor as f32,
                );
                let low_freq_wavelen = old / lo;
                let high_freq_wavelen = old / hi;
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    let scaled = if wavelen > low_freq_wavelen {
                        *f / factor
                    } else {
                        *f
                    };
                    let medium = (high_freq_wavelen..=low_freq_wavelen).contains(&wavelen);
                    *f = if medium {
                        let smooth = (old / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    };
                }
            }
            Some(RopeScaling::Factors(factors)) => {
                if factors.len() != half {
                    candle_core::bail!(
                        "rope frequency factors: {} given for head_dim {head_dim} ({half} needed)",
                        factors.len()
                    );
                }
                for (f, d) in inv.iter_mut().zip(factors) {
                    *f /= *d;
                }
            }
        }
        let inv_freq = Tensor::from_vec(inv, (1, half), device)?;
        Ok(Self { inv_freq, mode })
    }

    /// `positions`: `(t,)` u32 → `(cos, sin)`, each `(t, head_dim / 2)`.
    pub fn cos_sin(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = positions.dim(0)?;
        // (t, 1) x (1, d/2) -> (t, d/2)
        let freqs = positions
            .to_dtype(DType::F32)?
            .reshape((t, 1))?
            .broadcast_mul(&self.inv_freq)?;
        Ok((freqs.cos()?, freqs.sin()?))
    }

    /// Rotates `q` `(1, h, t, d)` and `k` `(1, kv_h, t, d)` at `positions` `(t,)`.
    pub fn apply(&self, q: &Tensor, k: &Tensor, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.cos_sin(positions)?;
        self.apply_cos_sin(q, k, &cos, &sin)
    }

    /// Multimodal RoPE (M-RoPE, Qwen2-VL): `positions` `(3, t)` u32 holds each row's temporal,
    /// height and width position; frequency `j` of the first `section[0]` turns at the temporal
    /// one, the next `section[1]` at the height one, the last `section[2]` at the width one
    /// (`section` sums to `head_dim / 2`). A row whose three positions are equal turns exactly
    /// as [`RotaryEmbedding::cos_sin`] at that position. Returns `(cos, sin)`, each
    /// `(t, head_dim / 2)`.
    pub fn cos_sin_mrope(&self, positions: &Tensor, section: &[usize]) -> Result<(Tensor, Tensor)> {
        let (three, t) = positions.dims2()?;
        let half = self.inv_freq.dim(1)?;
        if three != 3 || section.len() != 3 || section.iter().sum::<usize>() != half {
            candle_core::bail!(
                "M-RoPE needs (3, t) positions and a 3-part section summing to {half}, got \
                 {three} rows and {section:?}"
            );
        }
        // (3, t, 1) x (1, 1, d/2) -> (3, t, d/2)
        let freqs = positions
            .to_dtype(DType::F32)?
            .reshape((3, t, 1))?
            .broadcast_mul(&self.inv_freq.reshape((1, 1, half))?)?;
        // Frequency block i from component i: (t, d/2)
        let mut parts = Vec::with_capacity(3);
        let mut at = 0;
        for (i, &n) in section.iter().enumerate() {
            parts.push(freqs.get(i)?.narrow(1, at, n)?);
            at += n;
        }
        let freqs = Tensor::cat(&parts, 1)?.contiguous()?;
        Ok((freqs.cos()?, freqs.sin()?))
    }

    /// Rotates `q` `(1, h, t, d)` and `k` `(1, kv_h, t, d)` by given angles: `cos` and `sin`
    /// `(t, d / 2)` (from [`RotaryEmbedding::cos_sin`], [`RotaryEmbedding::cos_sin_mrope`] or a
    /// vision tower's 2-D positions), in the "rotate half" layout.
    pub fn apply_cos_sin(
        &self,
        q: &Tensor,
        k: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        Ok((
            rotate(q, cos, sin, self.mode)?,
            rotate(k, cos, sin, self.mode)?,
        ))
    }

    /// The inverse frequencies `(1, head_dim / 2)`.
    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }
}

/// `x` `(b, h, t, d)` rotated by `cos`, `sin` `(t, d / 2)` ("rotate half" layout), with the fused
/// kernel for inference and the differentiable form for training.
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, mode: Mode) -> Result<Tensor> {
    match mode {
        Mode::Infer => candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin),
        Mode::Train => candle_nn::rotary_emb::rope_slow(x, cos, sin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_modes_agree() -> Result<()> {
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1.0, (1, 4, 5, 16), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, 2, 5, 16), &dev)?;
        let pos = Tensor::new(&[0u32, 3, 4, 9, 100], &dev)?;
        let fast = RotaryEmbedding::new(16, 10000.0, None, Mode::Infer, &dev)?;
        let slow = RotaryEmbedding::new(16, 10000.0, None, Mode::Train, &dev)?;
        let (qf, kf) = fast.apply(&q, &k, &pos)?;
        let (qs, ks) = slow.apply(&q, &k, &pos)?;
        let diff =
            |a: &Tensor, b: &Tensor| -> Result<f32> { (a - b)?.abs()?.max_all()?.to_scalar() };
        assert!(diff(&qf, &qs)? < 1e-5 && diff(&kf, &ks)? < 1e-5);
        assert!(diff(&qf.narrow(2, 0, 1)?, &q.narrow(2, 0, 1)?)? < 1e-7);
        Ok(())
    }

    #[test]
    fn mrope_with_equal_components_is_plain_rope_and_sections_pick_components() -> Result<()> {
        let dev = Device::Cpu;
        let r = RotaryEmbedding::new(16, 10000.0, None, Mode::Infer, &dev)?;
        let pos = Tensor::new(&[0u32, 3, 7, 12], &dev)?;
        let same = Tensor::stack(&[&pos, &pos, &pos], 0)?;
        let (c1, s1) = r.cos_sin(&pos)?;
        let (c3, s3) = r.cos_sin_mrope(&same, &[2, 3, 3])?;
        let diff =
            |a: &Tensor, b: &Tensor| -> Result<f32> { (a - b)?.abs()?.max_all()?.to_scalar() };
        assert_eq!(diff(&c1, &c3)?, 0.0);
        assert_eq!(diff(&s1, &s3)?, 0.0);
        // Height positions differ from temporal ones: only frequencies 2..5 change.
        let h = Tensor::new(&[5u32, 5, 5, 5], &dev)?;
        let mixed = Tensor::stack(&[&pos, &h, &pos], 0)?;
        let (cm, _) = r.cos_sin_mrope(&mixed, &[2, 3, 3])?;
        let (ch, _) = r.cos_sin(&h)?;
        assert_eq!(diff(&cm.narrow(1, 0, 2)?, &c1.narrow(1, 0, 2)?)?, 0.0);
        assert_eq!(diff(&cm.narrow(1, 2, 3)?, &ch.narrow(1, 2, 3)?)?, 0.0);
        assert_eq!(diff(&cm.narrow(1, 5, 3)?, &c1.narrow(1, 5, 3)?)?, 0.0);
        assert!(r.cos_sin_mrope(&mixed, &[2, 3, 2]).is_err());
        Ok(())
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies() -> Result<()> {
        let dev = Device::Cpu;
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let base: Vec<f32> = RotaryEmbedding::new(32, 10000.0, None, Mode::Infer, &dev)?
            .inv_freq
            .flatten_all()?
            .to_vec1()?;
        let scaled: Vec<f32> = RotaryEmbedding::new(32, 10000.0, Some(&s), Mode::Infer, &dev)?
            .inv_freq
            .flatten_all()?
            .to_vec1()?;
        assert_eq!(base[0], scaled[0]); // wavelength 2π < 16: untouched
        let last = base.len() - 1;
        assert!((scaled[last] - base[last] / 8.0).abs() < 1e-9); // longest wavelength: divided by factor
        Ok(())
    }

    #[test]
    fn frequency_factors_reproduce_llama3_scaling() -> Result<()> {
        let dev = Device::Cpu;
        let (factor, lo, hi, old) = (8.0f32, 1.0f32, 4.0f32, 64.0f32);
        let inv = |s: Option<&RopeScaling>| -> Result<Vec<f32>> {
            RotaryEmbedding::new(32, 10000.0, s, Mode::Infer, &dev)?
                .inv_freq
                .flatten_all()?
                .to_vec1()
        };
        // The divisors llama.cpp's converter writes to `rope_freqs.weight` for Llama 3.1.
        let factors: Vec<f32> = inv(None)?
            .iter()
            .map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < old / hi {
                    1.0
                } else if wavelen > old / lo {
                    factor
                } else {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect();
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let a = inv(Some(&llama3))?;
        let b = inv(Some(&RopeScaling::Factors(factors)))?;
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= x.abs() * 1e-6, "{x} vs {y}");
        }
        assert_ne!(a, inv(None)?);
        let short = RopeScaling::Factors(vec![1.0; 3]);
        assert!(RotaryEmbedding::new(32, 10000.0, Some(&short), Mode::Infer, &dev).is_err());
        Ok(())
    }
}
