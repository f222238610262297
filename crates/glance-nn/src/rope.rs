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
        let rope = |x: &Tensor| match self.mode {
            Mode::Infer => candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin),
            Mode::Train => candle_nn::rotary_emb::rope_slow(x, &cos, &sin),
        };
        Ok((rope(q)?, rope(k)?))
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
