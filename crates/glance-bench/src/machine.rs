//! This machine's yardsticks, measured in the same run as the benchmark they judge: memory
//! bandwidth — copy (bytes read + bytes written per second, STREAM's convention) and read-only
//! (a reduction, which is what streaming weights through a matrix-vector product is) — and the
//! f32 GEMM rate of candle's kernel.

use crate::Result;
use candle_core::{Device, Tensor};
use rayon::prelude::*;
use std::time::Instant;

/// f32 elements of each probe buffer: 512 MiB, far beyond any cache.
const N: usize = 128 << 20;

/// Best wall time of `reps` runs of `work`, each run on a pool of `threads` threads.
fn best_seconds(threads: usize, reps: usize, mut work: impl FnMut() + Send) -> Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        pool.install(&mut work);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Copy bandwidth in bytes/s with `threads` threads, best of `reps` copies of a 512 MiB buffer.
pub fn copy_bandwidth(threads: usize, reps: usize) -> Result<f64> {
    let src: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut dst = vec![0f32; N];
    let chunk = N.div_ceil(threads);
    let best = best_seconds(threads, reps, || {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
    })?;
    Ok(2.0 * (N * 4) as f64 / best)
}

/// Read-only bandwidth in bytes/s: sums a 512 MiB buffer with `threads` threads, best of `reps`.
pub fn read_bandwidth(threads: usize, reps: usize) -> Result<f64> {
    let src: Vec<f32> = (0..N).map(|i| (i % 7) as f32).collect();
    let chunk = N.div_ceil(threads);
    let best = best_seconds(threads, reps, || {
        let total: f32 = src.par_chunks(chunk).map(sum_lanes).sum();
        std::hint::black_box(total);
    })?;
    Ok((N * 4) as f64 / best)
}

/// Reads every value once with the decode kernel's own vector loop (AVX2 + FMA where available),
/// so the yardstick is memory, not the arithmetic of a naive loop.
fn sum_lanes(xs: &[f32]) -> f32 {
    glance_nn::matvec::dot(xs, xs)
}

/// f32 GEMM rate of candle's matmul on an `m×k · k×n` product, FLOP/s, best of `reps`.
pub fn gemm_rate(m: usize, k: usize, n: usize, reps: usize) -> Result<f64> {
    let dev = Device::Cpu;
    let a = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let b = Tensor::randn(0f32, 1.0, (k, n), &dev)?;
    let _ = a.matmul(&b)?; // warm-up
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        let c = a.matmul(&b)?;
        std::hint::black_box(&c);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(2.0 * (m * k * n) as f64 / best)
}
