//! Engine settings and the thread pool the engine owns.
//!
//! Every tensor kernel of a request runs on the engine's own rayon pool (`pool.install`): candle's
//! GEMM and glance's matrix-vector kernel split their work over the pool they run in, so no
//! process-wide environment variable is needed and two engines in one process do not fight over
//! one. (candle's element-wise kernels keep their own small spin pool, sized once per process.)

use glance_core::{Error, Result};
use glance_decode::{DiffusionSettings, TreeSettings};
use glance_models::processing::image::DEFAULT_MAX_PIXELS;
pub use glance_models::twin::TwinShape;
pub use glance_nn::WeightFormat;
use std::path::PathBuf;

/// Most images one request may hold unless [`EngineOptions::max_images`] says otherwise.
pub const DEFAULT_MAX_IMAGES: usize = 16;
/// The highest [`EngineOptions::max_images`] accepted.
pub const MAX_IMAGES_LIMIT: usize = 256;

/// Settings of an [`crate::Engine`].
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Threads of the engine's pool (`None`: one per core).
    pub threads: Option<usize>,
    /// Bytes of projected image encodings kept for reuse, keyed by a hash of the image's content
    /// (0 turns the cache off).
    pub image_cache_bytes: usize,
    /// Bytes of prompt-prefix KV caches kept for reuse (0 turns the cache off). With the cache
    /// on, a prompt with images is prefilled in two passes — through its last image token, then
    /// the rest — so that the first part can serve later prompts that share it (the same image
    /// asked several questions).
    pub prefix_cache_bytes: usize,
    /// Largest image accepted, in pixels (checked from the header before decoding), at most
    /// [`DEFAULT_MAX_PIXELS`].
    pub max_image_pixels: u64,
    /// Most images in one request (counted before any is read: [`crate::messages`]), at most
    /// [`MAX_IMAGES_LIMIT`].
    pub max_images: usize,
    /// Draft head directories for speculative decoding, each serving the kind its config names
    /// (`vispec` or `eagle`); a kind not given here is looked for in the model directory's
    /// `draft-vispec/` or `draft-eagle/`.
    pub drafts: Vec<PathBuf>,
    /// How speculative decoding grows its draft tree unless a request says otherwise.
    pub tree: TreeSettings,
    /// Block-diffusion settings unless a request says otherwise (`None`: the defaults with the
    /// block size of the model's `block_diffusion` config).
    pub diffusion: Option<DiffusionSettings>,
    /// How the text decoder's linear weights are held (the vision tower and projector in
    /// [`WeightFormat::companion`]): f32, bf16 / f16 as stored, or quantized to q8 / q4 as they
    /// load.
    pub weights: WeightFormat,
    /// Load the model as its real-shape twin ([`glance_models::twin`]): the same answers, at the
    /// cost of the named shape's decoder (`tinyllama-1.1b`, `llava-7b`); draft heads load as
    /// twins too. Built at load time, in `weights`.
    pub twin: Option<TwinShape>,
    /// Directory of cached cost models (`--decode auto`, [`glance_decode::cost`]); `None`: the
    /// cost model is measured once per engine and kept in memory only.
    pub cost_cache: Option<PathBuf>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: None,
            image_cache_bytes: 256 << 20,
            prefix_cache_bytes: 256 << 20,
            max_image_pixels: DEFAULT_MAX_PIXELS,
            max_images: DEFAULT_MAX_IMAGES,
            drafts: Vec::new(),
            tree: TreeSettings::default(),
            diffusion: None,
            weights: WeightFormat::F32,
            twin: None,
            cost_cache: None,
        }
    }
}

impl EngineOptions {
    /// For one request (a CLI run): no caches, so the prefill is one pass as it always was.
    pub fn single_request() -> Self {
        Self {
            image_cache_bytes: 0,
            prefix_cache_bytes: 0,
            ..Self::default()
        }
    }

    pub fn with_threads(mut self, threads: Option<usize>) -> Self {
        self.threads = threads;
        self
    }

    pub fn with_weights(mut self, weights: WeightFormat) -> Self {
        self.weights = weights;
        self
    }

    pub fn with_twin(mut self, twin: Option<TwinShape>) -> Self {
        self.twin = twin;
        self
    }

    /// Checks the settings (each refusal names the setting, the `glance serve` flag that sets
    /// it and the allowed range); returns the thread count to use.
    pub fn validate(&self) -> Result<usize> {
        if !(1..=DEFAULT_MAX_PIXELS).contains(&self.max_image_pixels) {
            return Err(Error::InvalidParam(format!(
                "max_image_pixels (--max-image-pixels) must be in 1..={DEFAULT_MAX_PIXELS}, got {}",
                self.max_image_pixels
            )));
        }
        if !(1..=MAX_IMAGES_LIMIT).contains(&self.max_images) {
            return Err(Error::InvalidParam(format!(
                "max_images (--max-images-per-request) must be in 1..={MAX_IMAGES_LIMIT}, got {}",
                self.max_images
            )));
        }
        self.tree.validate()?;
        if let Some(d) = &self.diffusion {
            d.validate()?;
        }
        resolve_threads(self.threads)
    }
}

/// This machine's cores.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most threads a pool may have: four per core (at least 4). More only adds contention, and
/// a typo such as `--threads 10000` would otherwise spawn ten thousand spinning threads.
pub fn max_threads() -> usize {
    (4 * cores()).max(4)
}

/// `requested` checked against `1..=max_threads()`, or one per core.
pub fn resolve_threads(requested: Option<usize>) -> Result<usize> {
    let max = max_threads();
    match requested {
        None => Ok(cores()),
        Some(0) => Err(Error::InvalidParam("threads must be at least 1".into())),
        Some(n) if n > max => Err(Error::InvalidParam(format!(
            "{n} threads is more than this machine can use: at most {max} (4 per core, {} \
             core(s))",
            cores()
        ))),
        Some(n) => Ok(n),
    }
}

/// A rayon pool of exactly `threads` threads (validated with [`resolve_threads`]); a failure to
/// start them is an error, not a panic.
pub fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    let n = resolve_threads(Some(threads))?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("glance-{i}"))
        .build()
        .map_err(|e| Error::InvalidParam(format!("cannot start {n} threads: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_their_setting_and_range() {
        for (options, want) in [
            (
                EngineOptions {
                    max_images: 0,
                    ..EngineOptions::default()
                },
                "--max-images-per-request",
            ),
            (
                EngineOptions {
                    max_images: usize::MAX,
                    ..EngineOptions::default()
                },
                "1..=256",
            ),
            (
                EngineOptions {
                    max_image_pixels: u64::MAX,
                    ..EngineOptions::default()
                },
                "--max-image-pixels",
            ),
        ] {
            let e = options.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        assert!(EngineOptions::default().validate().is_ok());
    }

    #[test]
    fn thread_counts_are_bounded() {
        assert_eq!(resolve_threads(None).unwrap(), cores());
        assert_eq!(resolve_threads(Some(1)).unwrap(), 1);
        assert!(resolve_threads(Some(0)).is_err());
        let e = resolve_threads(Some(10_000)).unwrap_err().to_string();
        assert!(e.contains("10000") && e.contains("at most"), "{e}");
        assert_eq!(thread_pool(2).unwrap().current_num_threads(), 2);
        assert!(thread_pool(max_threads() + 1).is_err());
    }
}
