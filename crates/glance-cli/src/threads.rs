//! Thread-count control. candle sizes its GEMM parallelism from `RAYON_NUM_THREADS` at every
//! matmul; glance sets it once at start-up from `--threads`.
//!
//! Default: measured on the 2-vCPU build machine with `glance bench decode` — see the README's
//! performance section. Batch-1 decode of small models is fastest on one thread (rayon's
//! fork/join costs more than it saves on a matrix-vector product), prefill on all cores.

/// Applies `--threads` (or the default) and returns the count in effect.
pub fn init(requested: Option<usize>) -> anyhow::Result<usize> {
    let n = match requested {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    set(n);
    Ok(n)
}

/// Sets the thread count candle's matmuls use from now on. Called only from the main thread while
/// no other thread reads the environment.
pub fn set(n: usize) {
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
}
