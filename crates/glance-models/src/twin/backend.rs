//! The twin's weights, made one tensor at a time when the loader asks for it by name.
//!
//! [`TwinBackend`] is a candle `SimpleBackend` (as [`crate::random`]'s): the normal loaders read
//! a twin from a `VarBuilder` over it, and each request is answered by finding the tensor's
//! [`Site`] from its name, drawing the whole tensor at random (seeded by name), and overwriting
//! it with the small model's values and zeros as the site's [`Slot`] axes say. Nothing the size
//! of the twin exists at once: the loader packs each tensor (bf16, q8, q4) as it comes.

use super::map::{fill_matrix, fill_vector, identity, Slot, TwinMap};
use crate::random::draw;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;

/// Where a tensor sits in the model, as the embedding sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Site {
    /// Token embeddings `(vocab, hidden)`.
    Embed,
    /// An RMSNorm weight over the residual stream.
    Norm,
    /// `{leaf}` of decoder layer `layer` (`self_attn.q_proj.weight`, `mlp.down_proj.bias`, …).
    Layer { layer: usize, leaf: String },
    /// The LM head `(vocab, hidden)`.
    LmHead,
    /// The projector's first linear layer (`weight` or `bias`).
    Projector1 { bias: bool },
    /// The projector's second linear layer.
    Projector2 { bias: bool },
    /// A draft head's `(hidden, 2·hidden)` fusion (`fc`, `inject`): `[a ; b]` → residual.
    Concat { bias: bool },
    /// ViSpec adaptor queries `(n_q, hidden)`: rows of the residual stream.
    AdaptorQueries,
    /// ViSpec adaptor `q_proj` … `o_proj` weights (`leaf` is `q_proj` …).
    Adaptor { leaf: String },
    /// Anything else (the vision tower): the small model's tensor as it is.
    Same,
}

/// Names → sites: the weight-name prefixes of one kind of model.
pub(crate) type Resolve = Box<dyn Fn(&str) -> Site + Send + Sync>;

/// The site of a decoder-root-relative name (`embed_tokens.weight`, `layers.3.…`, `norm.weight`).
pub(crate) fn decoder_site(rel: &str) -> Option<Site> {
    match rel {
        "embed_tokens.weight" => Some(Site::Embed),
        "norm.weight" => Some(Site::Norm),
        _ => {
            let rest = rel.strip_prefix("layers.")?;
            let (layer, leaf) = rest.split_once('.')?;
            Some(Site::Layer {
                layer: layer.parse().ok()?,
                leaf: leaf.to_string(),
            })
        }
    }
}

pub(crate) struct TwinBackend {
    /// The small model's tensors (f32).
    pub small: VarBuilder<'static>,
    pub map: TwinMap,
    pub resolve: Resolve,
    pub seed: u64,
}

/// One axis pair (or one axis) and the scale of its real values.
struct Plan {
    rows: Vec<Slot>,
    cols: Option<Vec<Slot>>,
    scale: f32,
}

impl Plan {
    fn matrix(rows: Vec<Slot>, cols: Vec<Slot>) -> Self {
        Self {
            rows,
            cols: Some(cols),
            scale: 1.0,
        }
    }

    fn vector(slots: Vec<Slot>) -> Self {
        Self {
            rows: slots,
            cols: None,
            scale: 1.0,
        }
    }

    fn scaled(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    fn dims(&self) -> Vec<usize> {
        match &self.cols {
            Some(c) => vec![self.rows.len(), c.len()],
            None => vec![self.rows.len()],
        }
    }

    fn has_real(&self) -> bool {
        let real = |s: &Slot| matches!(s, Slot::Real(_));
        self.rows.iter().any(real) && self.cols.as_ref().is_none_or(|c| c.iter().any(real))
    }
}

impl TwinBackend {
    /// The plan of `site`, or an error for a name the embedding does not know.
    fn plan(&self, site: &Site, name: &str, dims: &[usize]) -> candle_core::Result<Plan> {
        let m = &self.map;
        let matrix_or_bias = |rows: Vec<Slot>, cols: Vec<Slot>, bias: bool| {
            if bias {
                Plan::vector(rows)
            } else {
                Plan::matrix(rows, cols)
            }
        };
        Ok(match site {
            Site::Embed => Plan::matrix(m.vocab(Slot::Random), m.residual_out()),
            Site::Norm => Plan::vector(m.residual_in()).scaled(m.norm_scale()),
            Site::LmHead => Plan::matrix(m.vocab(Slot::Free), m.residual_in()),
            Site::Projector1 { bias } => {
                let cols = identity(dims.get(1).copied().unwrap_or(0));
                matrix_or_bias(m.residual_in(), cols, *bias)
            }
            Site::Projector2 { bias } => matrix_or_bias(m.residual_out(), m.residual_out(), *bias),
            Site::Concat { bias } => {
                let mut cols = m.residual_in();
                let shifted = m.residual_in().into_iter().map(|s| match s {
                    Slot::Real(i) => Slot::Real(m.small.hidden + i),
                    s => s,
                });
                cols.extend(shifted);
                matrix_or_bias(m.residual_out(), cols, *bias)
            }
            Site::AdaptorQueries => Plan::matrix(
                identity(dims.first().copied().unwrap_or(0)),
                m.residual_out(),
            ),
            Site::Adaptor { leaf } => match leaf.as_str() {
                "q_proj.weight" => {
                    Plan::matrix(m.adaptor_rows(true), m.residual_in()).scaled(m.q_scale())
                }
                "k_proj.weight" => Plan::matrix(m.adaptor_rows(true), m.residual_in()),
                "v_proj.weight" => Plan::matrix(m.adaptor_rows(false), m.residual_in()),
                "o_proj.weight" => Plan::matrix(m.residual_out(), m.o_cols()),
                _ => return Err(unknown(name)),
            },
            Site::Layer { layer, leaf } => self.layer_plan(*layer, leaf, name)?,
            Site::Same => unreachable!("passed through before planning"),
        })
    }

    /// A decoder layer's tensor: real layers embed the small layer, the layers beyond the small
    /// model's are random with zero output projections (identity blocks).
    fn layer_plan(&self, layer: usize, leaf: &str, name: &str) -> candle_core::Result<Plan> {
        let m = &self.map;
        let (part, kind) = leaf.rsplit_once('.').ok_or_else(|| unknown(name))?;
        let bias = match kind {
            "weight" => false,
            "bias" => true,
            _ => return Err(unknown(name)),
        };
        let real = layer < m.small.layers;
        let norm = || {
            let slots = if real {
                m.residual_in()
            } else {
                vec![Slot::Free; m.big.hidden]
            };
            Plan::vector(slots).scaled(m.norm_scale())
        };
        // (rows, cols, scale) of the weight; a bias takes the rows.
        let (rows, cols, scale) = match part {
            "input_layernorm" | "post_attention_layernorm" if !bias => return Ok(norm()),
            "self_attn.q_proj" => (m.q_rows(), m.residual_in(), m.q_scale()),
            "self_attn.k_proj" => (m.k_rows(), m.residual_in(), 1.0),
            "self_attn.v_proj" => (m.v_rows(), m.residual_in(), 1.0),
            "self_attn.o_proj" => (m.residual_out(), m.o_cols(), 1.0),
            "mlp.gate_proj" | "mlp.up_proj" => (m.units_out(), m.residual_in(), 1.0),
            "mlp.down_proj" => (m.residual_out(), m.units_in(), 1.0),
            _ => return Err(unknown(name)),
        };
        let (rows, cols) = if real {
            (rows, cols)
        } else if part == "self_attn.o_proj" || part == "mlp.down_proj" {
            // An extra layer adds exactly nothing to the residual stream.
            (vec![Slot::Zero; rows.len()], vec![Slot::Zero; cols.len()])
        } else {
            (vec![Slot::Free; rows.len()], vec![Slot::Free; cols.len()])
        };
        let plan = if bias {
            Plan::vector(rows)
        } else {
            Plan::matrix(rows, cols)
        };
        Ok(plan.scaled(scale))
    }

    fn small_values(&self, name: &str, want: &[usize]) -> candle_core::Result<Vec<f32>> {
        let t = self.small.get_unchecked(name)?;
        if t.dims() != want {
            candle_core::bail!(
                "twin: the model's `{name}` is {:?}, the twin's map expects {want:?}",
                t.dims()
            );
        }
        t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
    }
}

fn unknown(name: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "twin: `{name}` is not a tensor the twin embedding knows"
    ))
}

impl SimpleBackend for TwinBackend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let site = (self.resolve)(name);
        if site == Site::Same {
            let t = self.small.get_unchecked(name)?;
            if t.shape() != &s {
                candle_core::bail!(
                    "twin: `{name}` is {:?} in the model, {:?} was asked for",
                    t.dims(),
                    s.dims()
                );
            }
            return t.to_dtype(dtype);
        }
        let plan = self.plan(&site, name, s.dims())?;
        if plan.dims() != s.dims() {
            candle_core::bail!(
                "twin: `{name}` of shape {:?} was asked for, the twin's map makes {:?}",
                s.dims(),
                plan.dims()
            );
        }
        let norm = matches!(site, Site::Norm)
            || matches!(&site, Site::Layer { leaf, .. } if leaf.ends_with("layernorm.weight"));
        let mut data = draw(self.seed, name, s.elem_count(), norm);
        if plan.has_real() {
            let small_dims = small_dims(&plan);
            let small = self.small_values(name, &small_dims)?;
            match &plan.cols {
                Some(cols) => {
                    let small_cols = small_dims[1];
                    fill_matrix(&mut data, &plan.rows, cols, &small, small_cols, plan.scale)
                }
                None => fill_vector(&mut data, &plan.rows, &small, plan.scale),
            }
        } else {
            // No small value lands here, but zeros may (an extra layer's output projection).
            let empty = [];
            match &plan.cols {
                Some(cols) => fill_matrix(&mut data, &plan.rows, cols, &empty, 0, 1.0),
                None => fill_vector(&mut data, &plan.rows, &empty, 1.0),
            }
        }
        Tensor::from_vec(data, s, dev)?.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, _: &Device) -> candle_core::Result<Tensor> {
        match (self.resolve)(name) {
            Site::Same => self.small.get_unchecked(name)?.to_dtype(dtype),
            _ => candle_core::bail!("twin weights have no shape for `{name}` until requested"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        match (self.resolve)(name) {
            Site::Layer { layer, .. } => layer < self.map.big.layers,
            Site::Same => self.small.contains_tensor(name),
            _ => true,
        }
    }
}

/// The small tensor's shape: one more than the largest real index per axis.
fn small_dims(plan: &Plan) -> Vec<usize> {
    let extent = |slots: &[Slot]| {
        slots
            .iter()
            .filter_map(|s| match s {
                Slot::Real(i) => Some(i + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    };
    let mut dims = vec![extent(&plan.rows)];
    if let Some(c) = &plan.cols {
        dims.push(extent(c));
    }
    dims
}
