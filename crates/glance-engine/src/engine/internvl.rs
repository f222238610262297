//! The InternVL parts of the request path: loading, and the pruning step of the families with
//! 1-D positions (LLaVA, InternVL). Prompts render through [`Engine::render_sized`] (an image's
//! token count depends on its tiling).

use super::model::{internvl_encodings, Model, Processor};
use super::{Encoded, Engine};
use crate::options::EngineOptions;
use candle_core::Device;
use glance_core::Result;
use glance_models::internvl::{InternVl, InternVlConfig, InternVlProcessor};
use glance_models::llava::PromptPlan;
use glance_prune::{PruneSpec, Pruned};
use std::path::Path;
use std::sync::Arc;

impl Engine {
    /// The model and processor of an InternVL checkpoint.
    pub(super) fn build_internvl(
        dir: &Path,
        options: &EngineOptions,
    ) -> Result<(Model, Processor)> {
        let config = InternVlConfig::from_dir(dir)?;
        let processor = InternVlProcessor::from_dir(dir, &config)?;
        let mut model = InternVl::load_as(dir, &Device::Cpu, options.weights)?;
        model.limit_vocab(processor.text.id_limit());
        Ok((
            Model::InternVl(Arc::new(model)),
            Processor::internvl_processor(Arc::new(processor)),
        ))
    }

    /// The pruning step of a 1-D-position plan (LLaVA, InternVL) and each image's token grid
    /// `(rows, cols)` for the kept-patch report (an InternVL image's tiles stacked top to bottom).
    pub(super) fn transform_1d(
        &self,
        plan: PromptPlan,
        encoded: &[Encoded],
        query: &[u32],
        spec: &PruneSpec,
    ) -> Result<(Pruned, Vec<(usize, usize)>)> {
        match &self.model {
            Model::Llava(llava) => {
                let encodings: Vec<_> = encoded
                    .iter()
                    .filter_map(|e| e.entry.encoding.llava())
                    .collect();
                let side = llava.config().vision.grid();
                let grids = vec![(side, side); encodings.len()];
                let pruned = glance_prune::transform(llava, plan, &encodings, query, spec)?;
                Ok((pruned, grids))
            }
            Model::InternVl(model) => {
                let all: Vec<_> = encoded.iter().map(|e| &e.entry.encoding).collect();
                let encodings = internvl_encodings(&all)?;
                let c = model.config();
                let side = c.vision.grid() / c.shuffle();
                let grids = encodings.iter().map(|e| (e.tiles * side, side)).collect();
                let pruned =
                    glance_prune::transform_internvl(model, plan, &encodings, query, spec)?;
                Ok((pruned, grids))
            }
            other => Err(other.only_llava()),
        }
    }
}
