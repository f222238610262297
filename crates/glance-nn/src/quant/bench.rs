//! Manual kernel benchmarks (`cargo test --release -p glance-nn quant::bench -- --ignored
//! --nocapture`): bytes per second of each format's matrix-vector kernel, the cost of `m` input
//! rows relative to one over matrices beyond the caches, and multiply-adds per CPU second
//! (which a shared machine's other load does not distort). The model-level figure is
//! `glance bench decode --rows`.

/// The manual benches' numeric setting `k` from the environment, else `d`.
fn env_setting(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(d)
}

/// The yardstick printed beside a format's figures: this CPU's rate (GMAC/s, one thread) for
/// the instruction the format's kernel uses.
fn peak_label(f: super::WeightFormat) -> String {
    crate::peak::macs_per_second(f)
        .map_or("peak unknown".into(), |r| format!("peak {:.1}", r / 1e9))
}

/// Best wall time of 5 runs of `f` on `pool`, in seconds.
fn best_seconds(pool: &rayon::ThreadPool, f: &(dyn Fn() + Sync)) -> f64 {
    (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            pool.install(f);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

mod throughput {
    use super::super::*;
    use super::best_seconds;

    /// Manual: `cargo test --release -p glance-nn throughput -- --ignored --nocapture`. Weight
    /// bytes streamed per second by each format's matrix-vector kernel on one thread, beside
    /// the f32 kernel, on a matrix far beyond the caches.
    #[test]
    #[ignore]
    fn kernel_throughput() {
        let (rows, cols) = (8192, 8192);
        let w = super::super::tests::values(rows * cols, 3);
        let x = super::super::tests::values(cols, 5);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let wt = candle_core::Tensor::from_vec(w.clone(), (rows, cols), &candle_core::Device::Cpu)
            .unwrap();
        let xt =
            candle_core::Tensor::from_vec(x.clone(), (1, cols), &candle_core::Device::Cpu).unwrap();
        let best = |f: &(dyn Fn() + Sync)| best_seconds(&pool, f);
        let s = best(&|| {
            std::hint::black_box(crate::matvec::matvec(&wt, &xt).unwrap());
        });
        println!("f32: {:.1} GB/s", (rows * cols * 4) as f64 / s / 1e9);
        for f in [
            WeightFormat::Bf16,
            WeightFormat::F16,
            WeightFormat::Q8,
            WeightFormat::Q4,
        ] {
            let p = PackedMatrix::pack(f, &w, rows, cols).unwrap();
            for isa in Isa::available() {
                let s = best(&|| {
                    std::hint::black_box(p.matmul_rows_with(&x, 1, isa));
                });
                println!(
                    "{f} {isa:?}: {:.1} GB/s ({:.2} ms)",
                    p.storage_bytes() as f64 / s / 1e9,
                    s * 1e3
                );
            }
        }
    }
}

mod rows_cost {
    use super::super::*;
    use super::{best_seconds, env_setting};

    /// Manual: `T=2 cargo test --release -p glance-nn rows_cost -- --ignored --nocapture`. The
    /// cost of `m` input rows relative to one, per format, over 8 TinyLlama MLP-shaped matrices
    /// (beyond the caches, as in a decode step).
    #[test]
    #[ignore]
    fn rows_cost() {
        let (rows, cols, layers) = (env_setting("R", 5632), 2048, env_setting("L", 8));
        let w = super::super::tests::values(rows * cols, 3);
        let threads: usize = std::env::var("T")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let best = |f: &(dyn Fn() + Sync)| best_seconds(&pool, f);
        let ms = [1usize, 2, 4, 8, 16, 32, 64];
        let formats: Vec<WeightFormat> = std::env::var("F")
            .map(|s| s.split(',').map(|f| f.parse().unwrap()).collect())
            .unwrap_or(vec![WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4]);
        for f in formats {
            let ps: Vec<PackedMatrix> = (0..layers)
                .map(|_| PackedMatrix::pack(f, &w, rows, cols).unwrap())
                .collect();
            let mut line = format!("{f} ({}) ", super::peak_label(f));
            let mut t1 = 0.0;
            for &m in &ms {
                let x = super::super::tests::values(m * cols, 5);
                let s = best(&|| {
                    for p in &ps {
                        std::hint::black_box(p.matmul_rows(&x, m));
                    }
                });
                if m == 1 {
                    t1 = s;
                    let gb = ps.iter().map(|p| p.storage_bytes()).sum::<usize>() as f64 / s / 1e9;
                    line += &format!("t1 {:.2} ms ({gb:.1} GB/s): ", s * 1e3);
                }
                let gop = 2.0 * (layers * m * rows * cols) as f64 / s / 1e9;
                line += &format!("{m}:{:.2} ({gop:.0}) ", s / t1);
            }
            println!("{line}");
        }
    }
}

mod kernel_rate {
    use super::super::*;
    use super::env_setting;

    /// CPU seconds of this process so far (user + system), from /proc.
    fn cpu_seconds() -> f64 {
        let s = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    }

    /// Manual: `cargo test --release -p glance-nn kernel_rate -- --ignored --nocapture`. Multiply-
    /// adds per CPU second of each format's kernel on one thread, cache-resident (a shared
    /// machine's other load does not count against it). `R`, `C` set the matrix (256 × 2048),
    /// `L` how many copies the products cycle over (`L=8 R=5632`: beyond the caches, as in a
    /// decode step), `F` the formats, `M` the input-row counts (comma-separated) and `I` the
    /// q8 / q4 kernels' instruction set (`avx512`, `avx2`, `portable`, or `amx`, which runs them
    /// as `avx512`; default, and always for bf16 / f16, this CPU's best).
    #[test]
    #[ignore]
    fn kernel_rate() {
        let isa = match std::env::var("I").as_deref() {
            Ok("amx") => Isa::Amx,
            Ok("avx512") => Isa::Avx512,
            Ok("avx2") => Isa::Avx2,
            Ok("portable") => Isa::Portable,
            _ => Isa::best(),
        };
        let (rows, cols, layers) = (
            env_setting("R", 256),
            env_setting("C", 2048),
            env_setting("L", 1),
        );
        let w = super::super::tests::values(rows * cols, 3);
        let formats: Vec<WeightFormat> = std::env::var("F")
            .map(|s| s.split(',').map(|f| f.parse().unwrap()).collect())
            .unwrap_or(vec![WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4]);
        for f in formats {
            let ps: Vec<PackedMatrix> = (0..layers)
                .map(|_| PackedMatrix::pack(f, &w, rows, cols).unwrap())
                .collect();
            let mut line = format!("{f} {isa:?} ({}) ", super::peak_label(f));
            let ms: Vec<usize> = std::env::var("M")
                .map(|s| s.split(',').map(|m| m.parse().unwrap()).collect())
                .unwrap_or(vec![1, 2, 3, 4, 8, 16, 64]);
            for &m in &ms {
                let x = super::super::tests::values(m * cols, 5);
                let xq = act::QuantRows::new(&x, m, cols);
                let mut out = vec![0f32; rows * m];
                let (start, mut reps) = (cpu_seconds(), 0usize);
                while cpu_seconds() - start < 0.5 {
                    for p in ps.iter().cycle().take(20) {
                        match p {
                            PackedMatrix::Half(h) => h.block(0, rows, &x, m, &mut out),
                            PackedMatrix::Q8(q) => q.block(0, rows, &xq, &mut out, isa),
                            PackedMatrix::Q4(q) => q.block(0, rows, &xq, &mut out, isa),
                        }
                    }
                    reps += 20;
                }
                let s = cpu_seconds() - start;
                line += &format!(
                    "m{m}: {:.1} GMAC/cpu-s  ",
                    (reps * m * rows * cols) as f64 / s / 1e9
                );
            }
            println!("{line}");
        }
    }
}
