//! Candle side of the candle-vs-PyTorch comparison (`scripts/train_torch_reference.py`).
//!
//! `cargo run --release -p glance-train --example bench_batch -- <preset> <vision|llava|e2e> <images> <turns> <steps> <outdir> [none|alloc|threads|both] [workers]`
//!
//! Writes `outdir/model/` (an HF LLaVA directory with the seed-0 initial weights),
//! `outdir/batch.safetensors` (one batch: pixels, packed sequences / patch targets, the vision
//! heads' weights) and `outdir/rust.json`, then trains `steps` steps on that one batch with a
//! constant learning rate and records the loss of every step and the step times. The PyTorch
//! script loads the same directory and batch, so both sides do identical work from identical
//! weights: their loss trajectories must agree, and their step times are comparable.

use candle_core::{Device, Tensor};
use glance_train::data::WorldData;
use glance_train::export::{write_model_files, write_weights};
use glance_train::optim::AdamW;
use glance_train::step::{batch_grads, Batch};
use glance_train::{OptimSpec, Stage, TrainConfig, TrainModel};
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

fn main() -> glance_train::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        eprintln!(
            "usage: bench_batch <preset> <vision|llava|e2e> <images> <turns> <steps> <outdir>"
        );
        std::process::exit(2);
    }
    // Optional 7th argument: which CPU settings to apply (default both; see glance_train::runtime).
    let setup = match a.get(7).map(|s| s.as_str()) {
        Some("none") => "none".to_string(),
        Some("alloc") => format!("alloc only: {}", glance_train::runtime::tune_allocator()),
        Some("threads") => {
            std::env::set_var("CANDLE_NUM_THREADS", "1");
            "CANDLE_NUM_THREADS=1 only".to_string()
        }
        _ => format!("{:?}", glance_train::runtime::prepare_cpu_for_training()),
    };
    let stage = match a[2].as_str() {
        "vision" => Stage::Vision,
        "e2e" => Stage::EndToEnd,
        _ => Stage::Llava,
    };
    let (images, turns, steps): (usize, usize, usize) = (
        a[3].parse().unwrap(),
        a[4].parse().unwrap(),
        a[5].parse().unwrap(),
    );
    let out = PathBuf::from(&a[6]);
    let cfg = TrainConfig::preset(&a[1])?;
    let dir = out.join("model");
    write_model_files(&dir, &cfg.model)?;
    let model = TrainModel::new(&cfg.model, 0, &Device::Cpu)?;
    write_weights(&dir, &model.export_params())?;
    let data = WorldData::new(&dir, &model.config, &Device::Cpu)?;
    let mut cursor = 0;
    let ims = data.next_images(&mut cursor, images, 6)?;
    let dev = Device::Cpu;

    let mut t: HashMap<String, Tensor> = HashMap::new();
    let px: Vec<Tensor> = ims.iter().map(|im| im.pixels.clone()).collect();
    t.insert("pixels".into(), Tensor::stack(&px, 0)?);
    let packed: Vec<_> = if stage == Stage::Vision {
        Vec::new()
    } else {
        ims.iter()
            .map(|im| data.pack_turns(&data.turns(&im.scene, im.seed, turns)))
            .collect::<Result<_, _>>()?
    };
    let targets: Vec<_> = ims
        .iter()
        .map(|im| data.vision_targets(&im.scene))
        .collect::<Result<_, _>>()?;
    if stage == Stage::Vision {
        let p = targets[0].patches.len();
        let ids: Vec<i64> = targets
            .iter()
            .flat_map(|tg| {
                tg.patches
                    .iter()
                    .flat_map(|q| [q.kind, q.colour, q.shape, q.size, q.digit].map(|v| v as i64))
            })
            .collect();
        t.insert(
            "patch_targets".into(),
            Tensor::from_vec(ids, (images, p, 5), &dev)?,
        );
        let set: Vec<f32> = targets.iter().flat_map(|tg| tg.set.clone()).collect();
        t.insert(
            "set_targets".into(),
            Tensor::from_vec(set, (images, targets[0].set.len()), &dev)?,
        );
        for p in model
            .all_params()
            .into_iter()
            .filter(|p| p.name.starts_with("train_heads"))
        {
            t.insert(p.name.clone(), p.var.as_tensor().copy()?);
        }
    } else {
        let tmax = packed.iter().map(|p| p.len()).max().unwrap_or(0);
        let nmax = packed.iter().map(|p| p.targets.len()).max().unwrap_or(0);
        let (mut ids, mut pos, mut mask) = (
            vec![0i64; images * tmax],
            vec![0i64; images * tmax],
            vec![f32::NEG_INFINITY; images * tmax * tmax],
        );
        let (mut rows, mut tgt, mut lens) = (
            vec![-1i64; images * nmax],
            vec![-100i64; images * nmax],
            vec![0i64; images],
        );
        for (b, p) in packed.iter().enumerate() {
            let n = p.len();
            lens[b] = n as i64;
            for i in 0..tmax {
                if i < n {
                    ids[b * tmax + i] = p.ids[i] as i64;
                    pos[b * tmax + i] = p.positions[i] as i64;
                    for j in 0..n {
                        mask[(b * tmax + i) * tmax + j] = p.mask[i * n + j];
                    }
                } else {
                    mask[(b * tmax + i) * tmax + i] = 0.0; // padding rows see themselves
                }
            }
            for (k, (&r, &y)) in p.target_rows.iter().zip(&p.targets).enumerate() {
                rows[b * nmax + k] = r as i64;
                tgt[b * nmax + k] = y as i64;
            }
        }
        t.insert(
            "input_ids".into(),
            Tensor::from_vec(ids, (images, tmax), &dev)?,
        );
        t.insert(
            "position_ids".into(),
            Tensor::from_vec(pos, (images, tmax), &dev)?,
        );
        t.insert(
            "mask".into(),
            Tensor::from_vec(mask, (images, 1, tmax, tmax), &dev)?,
        );
        t.insert(
            "target_rows".into(),
            Tensor::from_vec(rows, (images, nmax), &dev)?,
        );
        t.insert(
            "targets".into(),
            Tensor::from_vec(tgt, (images, nmax), &dev)?,
        );
        t.insert("lengths".into(), Tensor::from_vec(lens, images, &dev)?);
    }
    candle_core::safetensors::save(&t, out.join("batch.safetensors"))?;

    let spec = OptimSpec {
        lr: 1e-3,
        warmup: 0,
        min_lr_ratio: 1.0,
        ..OptimSpec::with_lr(1e-3, 0)
    };
    let mut opt = AdamW::new(model.stage_params(stage), spec, steps as u64);
    // Optional 8th argument: worker threads (GEMMs then run single-threaded inside each).
    let workers: usize = a.get(8).and_then(|s| s.parse().ok()).unwrap_or(1);
    if workers > 1 {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let (mut losses, mut times) = (Vec::new(), Vec::new());
    for s in 0..steps {
        let t0 = Instant::now();
        let pixels: Vec<&Tensor> = ims.iter().map(|im| &im.pixels).collect();
        let input = match stage {
            Stage::Vision => Batch::Vision {
                pixels,
                targets: &targets,
            },
            _ => Batch::Qa {
                items: pixels.into_iter().zip(&packed).collect(),
                drops: &[],
                align: None,
            },
        };
        let b = batch_grads(&model, stage, &input, workers)?;
        let loss = b.loss;
        opt.step(&b.stores)?;
        times.push(t0.elapsed().as_secs_f64());
        losses.push(loss);
        println!("step {s}: loss {loss:.6} ({:.3} s)", times[s]);
    }
    // Median of the steps after the first two (warm-up, allocator growth): robust to load spikes.
    let mut tail = times[2.min(times.len())..].to_vec();
    if tail.is_empty() {
        tail = times.clone();
    }
    tail.sort_by(|a, b| a.total_cmp(b));
    let mean = tail[tail.len() / 2];
    let rows: usize = packed.iter().map(|p| p.len()).sum();
    println!(
        "candle {} {stage}: {mean:.3} s/step (median), {:.2} images/s ({setup}, {workers} workers)",
        a[1],
        images as f64 / mean
    );
    let report = json!({"preset": a[1], "stage": stage, "images": images, "turns": turns, "rows": rows,
        "losses": losses, "step_seconds": times, "mean_step_seconds": mean,
        "threads": std::env::var("RAYON_NUM_THREADS").ok(), "candle_num_threads": std::env::var("CANDLE_NUM_THREADS").ok(), "cpu_setup": setup, "workers": workers});
    std::fs::write(
        out.join("rust.json"),
        serde_json::to_string_pretty(&report)?,
    )
    .map_err(|e| glance_train::TrainError::io(out.join("rust.json"), e))?;
    Ok(())
}
