//! `LlavaMultiModalProjector`: linear → activation → linear, vision features into the text space.

use glance_core::Result;
use glance_nn::weights::linear_as;
use glance_nn::{Activation, Linear, WeightLoad};

use candle_core::Tensor;
use candle_nn::VarBuilder;

pub struct Projector {
    linear_1: Linear,
    act: Activation,
    linear_2: Linear,
}

impl Projector {
    pub fn load(
        vb: &VarBuilder,
        in_dim: usize,
        out_dim: usize,
        act: Activation,
        bias: bool,
        load: &WeightLoad,
    ) -> Result<Self> {
        Ok(Self {
            linear_1: linear_as(&vb.pp("linear_1"), in_dim, out_dim, bias, load)?,
            act,
            linear_2: linear_as(&vb.pp("linear_2"), out_dim, out_dim, bias, load)?,
        })
    }

    /// `(n, vision_hidden · n_layers)` → `(n, text_hidden)`.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let h = self.act.forward(&self.linear_1.forward(xs)?)?;
        Ok(self.linear_2.forward(&h)?)
    }
}
