//! Random-weight models at any shape, for benchmarks that need a real model's size but no
//! download (e.g. a LLaVA-1.5-7B-shaped vision tower, a 1B text backbone).
//!
//! Every tensor a model asks for is drawn on first request: norms' weights near 1, everything else
//! `N(0, 0.02²)` (HF's `initializer_range`), from a seeded [`glance_core::Rng`] stream so runs
//! are repeatable.

use candle_core::{DType, Device, Result, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Every tensor drawn so far, by name.
type Drawn = Arc<Mutex<HashMap<String, Tensor>>>;

struct RandomBackend {
    seed: u64,
    /// Where drawn tensors are recorded (for [`with_random_weights`]); `None`: not kept (a name
    /// asked for twice is drawn twice, identically — the stream is seeded by the name).
    made: Option<Drawn>,
}

impl SimpleBackend for RandomBackend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor> {
        if let Some(made) = &self.made {
            if let Some(t) = made.lock().expect("not poisoned").get(name) {
                return Ok(t.clone());
            }
        }
        let data = draw(self.seed, name, s.elem_count(), is_norm_weight(name));
        let t = Tensor::from_vec(data, s, dev)?.to_dtype(dtype)?;
        if let Some(made) = &self.made {
            let mut made = made.lock().expect("not poisoned");
            made.insert(name.to_string(), t.clone());
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        candle_core::bail!("random weights have no shape for `{name}` until first requested")
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        false
    }
}

/// Whether `name` is a normalisation layer's weight (drawn near 1).
pub(crate) fn is_norm_weight(name: &str) -> bool {
    name.ends_with("norm.weight") || name.contains("layernorm") || name.contains("layer_norm")
}

/// `n` seeded draws for the tensor `name`: near 1 (`1 + 0.02·z`) for a norm's weight, else
/// `0.02·z`, `z` approximately standard normal. The stream depends on `seed` and `name` only.
pub(crate) fn draw(seed: u64, name: &str, n: usize, norm_weight: bool) -> Vec<f32> {
    let mut rng = glance_core::Rng::for_name(seed, name);
    let mut data = Vec::with_capacity(n);
    for _ in 0..n {
        // Irwin–Hall(4) approximation of a normal from one 64-bit draw (four 16-bit uniforms):
        // fast — a 1B-parameter model is drawn in seconds — and good enough for timing.
        let r = rng.next_u64();
        let u: f32 = (0..4)
            .map(|i| ((r >> (16 * i)) & 0xffff) as f32 / 65536.0)
            .sum();
        let z = (u - 2.0) * 1.732;
        data.push(if norm_weight {
            1.0 + 0.02 * z
        } else {
            0.02 * z
        });
    }
    data
}

/// A `VarBuilder` that makes seeded random f32 weights of whatever shape is asked for. Nothing
/// is kept beyond what the model keeps, so a model loaded with packed weights
/// ([`glance_nn::WeightLoad`]) never holds all its weights in f32 at once.
pub fn random_var_builder(seed: u64, device: &Device) -> VarBuilder<'static> {
    let backend = RandomBackend { seed, made: None };
    VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone())
}

fn recording_var_builder(seed: u64, device: &Device) -> (VarBuilder<'static>, Drawn) {
    let made = Drawn::default();
    let backend = RandomBackend {
        seed,
        made: Some(made.clone()),
    };
    let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
    (vb, made)
}

/// Builds something from [`random_var_builder`] weights and returns it with every tensor it
/// asked for, by name (to write a random checkpoint of it).
pub fn with_random_weights<T>(
    seed: u64,
    device: &Device,
    build: impl FnOnce(&VarBuilder) -> glance_core::Result<T>,
) -> glance_core::Result<(T, HashMap<String, Tensor>)> {
    let (vb, made) = recording_var_builder(seed, device);
    let built = build(&vb)?;
    let tensors = std::mem::take(&mut *made.lock().expect("not poisoned"));
    Ok((built, tensors))
}
