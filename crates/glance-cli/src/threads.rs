//! Thread count of training. Training splits each batch over worker threads and runs candle's
//! GEMMs on `RAYON_NUM_THREADS` threads each, so it sets that variable once at start-up, from the
//! main thread, before any tensor work. (Inference does not: every request runs on its engine's
//! own thread pool.)

/// Validates `--threads` (1 … 4 per core; default one per core) and returns the count.
pub fn init(requested: Option<usize>) -> anyhow::Result<usize> {
    use anyhow::Context;
    glance_engine::resolve_threads(requested).context("--threads")
}

/// Sets the thread count candle's matmuls use from now on. Called only from the main thread while
/// no other thread reads the environment.
pub fn set(n: usize) {
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
}
