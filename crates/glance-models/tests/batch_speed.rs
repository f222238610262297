//! Timing probe for the batched decode step (ignored: tests never time anything by default).
//! `cargo test --release -p glance-models --test batch_speed -- --ignored --nocapture`

use candle_core::{Device, Tensor};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_models::text::TextModel;
use glance_nn::{AttnMask, CausalLm, Mode};
use std::time::Instant;

/// CPU seconds this process has used (user + system, all threads), from /proc.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

#[test]
#[ignore]
fn batched_step_cost() {
    let config = presets::text_config("llama-134m").unwrap();
    let vb = random_var_builder(0, &Device::Cpu);
    let m = TextModel::load(&vb.pp("model"), &vb.pp("lm_head"), &config, Mode::Infer).unwrap();
    let prompt: Vec<u32> = (0..64).map(|i| 100 + i).collect();
    let pos: Vec<u32> = (0..64).collect();
    let x = m.embed_tokens(&prompt).unwrap();
    let reps = 20;
    // The linear layers alone at the model's size (weights out of cache, as in decoding).
    let dev = Device::Cpu;
    let mats: Vec<Tensor> = (0..12)
        .flat_map(|_| {
            let mut v: Vec<Tensor> = (0..4)
                .map(|_| Tensor::randn(0f32, 1.0, (768, 768), &dev).unwrap())
                .collect();
            v.push(Tensor::randn(0f32, 1.0, (2048, 768), &dev).unwrap());
            v.push(Tensor::randn(0f32, 1.0, (2048, 768), &dev).unwrap());
            v
        })
        .collect();
    for n in [1usize, 2, 4, 8, 16] {
        let xs = Tensor::randn(0f32, 1.0, (n, 768), &dev).unwrap();
        let mut best = f64::INFINITY;
        let cpu = cpu_s();
        for _ in 0..20 {
            let start = Instant::now();
            for w in &mats {
                let _ = glance_nn::matvec::matvec_rows(w, &xs).unwrap();
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!(
            "n={n:2}: 12 layers of linear weights (out of cache): best {:.2} ms, cpu {:.1} ms",
            best * 1e3,
            (cpu_s() - cpu) / 20.0 * 1e3
        );
    }
    for n in [1usize, 2, 4, 8, 16] {
        let mut caches: Vec<_> = (0..n)
            .map(|_| {
                let mut c = m.new_cache();
                m.forward(&x, &pos, &AttnMask::causal(), &mut c).unwrap();
                c
            })
            .collect();
        let rows = m.embed_tokens(&vec![5; n]).unwrap();
        let start = Instant::now();
        for r in 0..reps {
            let p = vec![64 + r as u32; n];
            let mut refs: Vec<_> = caches.iter_mut().collect();
            let h = m.forward_batch(&rows, &p, &mut refs).unwrap();
            let _ = m.logits_rows(&h).unwrap();
        }
        let batched = start.elapsed().as_secs_f64() / reps as f64;
        let start = Instant::now();
        for r in 0..reps {
            let mut c = caches[0].fork().unwrap();
            let h = m
                .forward(
                    &rows.narrow(0, 0, 1).unwrap(),
                    &[80 + r as u32],
                    &AttnMask::causal(),
                    &mut c,
                )
                .unwrap();
            let _ = m.logits(&h).unwrap();
        }
        let single = start.elapsed().as_secs_f64() / reps as f64;
        // The linear layers alone: (n, 768) x (2048, 768)ᵀ, 100 times.
        let w = Tensor::randn(0f32, 1.0, (2048, 768), &Device::Cpu).unwrap();
        let xs = Tensor::randn(0f32, 1.0, (n, 768), &Device::Cpu).unwrap();
        let start = Instant::now();
        for _ in 0..100 {
            let _ = glance_nn::matvec::matvec_rows(&w, &xs).unwrap();
        }
        let mv = start.elapsed().as_secs_f64() / 100.0;
        let start = Instant::now();
        for _ in 0..100 {
            let _ = xs.matmul(&w.t().unwrap()).unwrap();
        }
        let gemm = start.elapsed().as_secs_f64() / 100.0;
        println!(
            "n={n:2}: batched step {:7.2} ms ({:5.2} ms/row), single step {:6.2} ms | \
             2048x768: matvec_rows {:6.3} ms, gemm {:6.3} ms",
            batched * 1e3,
            batched * 1e3 / n as f64,
            single * 1e3,
            mv * 1e3,
            gemm * 1e3
        );
    }
}
