//! [`Engine::load_gguf`]: an engine over a GGUF model (llama.cpp's LLaVA layout), loaded by
//! [`glance_models::gguf::open`].

use super::Engine;
use crate::options::{thread_pool, EngineOptions};
use candle_core::Device;
use glance_core::{Error, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Loads a GGUF model in llama.cpp's LLaVA layout: a text GGUF and its mmproj (`None`: found
    /// as [`glance_models::gguf::open`] says). The text decoder's weights are held in `format`,
    /// or (`None`) in the file's own format; `options.weights` is set to the one used. Returns
    /// the engine and the lines the load has for the user (weights converted, an mmproj found
    /// beside the model).
    pub fn load_gguf(
        text: &Path,
        mmproj: Option<&Path>,
        options: EngineOptions,
        format: Option<glance_nn::WeightFormat>,
    ) -> Result<(Self, Vec<String>)> {
        if options.twin.is_some() {
            return Err(Error::InvalidParam(
                "--twin builds from a model directory; it does not apply to a GGUF model".into(),
            ));
        }
        let threads = options.validate()?;
        let pool = thread_pool(threads)?;
        let start = Instant::now();
        let loaded =
            pool.install(|| glance_models::gguf::open(text, mmproj, &Device::Cpu, format))?;
        let glance_models::gguf::GgufModel {
            mut model,
            processor,
            format,
            notes,
            ..
        } = loaded;
        // Ids the tokenizer cannot decode are never produced, by any strategy.
        model.limit_vocab(processor.text.id_limit());
        let options = options.with_weights(format);
        let mut engine = Self::assemble(
            super::Model::Llava(Arc::new(model)),
            super::Processor::llava_processor(Arc::new(processor)),
            options,
            pool,
            threads,
        );
        engine.load_time = start.elapsed();
        Ok((engine, notes))
    }
}
