//! Weight formats on the transformers golden fixtures: the logits of each packed format (bf16,
//! f16, q8, q4) against the f32 logits transformers recorded — largest absolute error and top-1
//! agreement over every prompt position — and a bf16 checkpoint loaded with bf16 weights uses
//! the mapped file in place.
//!
//! The fixtures' hidden sizes are 72 (llama-gqa), 64 (mistral) and 56 (qwen2): q8 / q4 need an
//! input size that is a multiple of 32, so on llama-gqa and qwen2 most matrices fall back to bf16
//! (`WeightFormat::for_in_dim`); mistral is quantized throughout its decoder.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{fixtures, max_abs};
use glance_models::llava::Llava;
use glance_nn::{AttnMask, CausalLm, WeightFormat};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap())
        .unwrap()
}

/// The prompt logits `(t, vocab)` of `model` on a fixture case.
fn prompt_logits(model: &Llava, t: &HashMap<String, Tensor>) -> Tensor {
    let enc = model.encode_image(&t["pixel_values"]).unwrap();
    let ids: Vec<u32> = common::ids(&t["input_ids"]);
    let emb = model.embed_prompt(&ids, &[&enc.features]).unwrap();
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    let text = model.text();
    let hidden = text
        .forward_uncached(&emb, &positions, &AttnMask::causal())
        .unwrap();
    text.logits(&hidden).unwrap()
}

fn argmax_rows(t: &Tensor) -> Vec<u32> {
    t.argmax(1).unwrap().to_vec1::<u32>().unwrap()
}

/// Per format: (largest |logit error| over all cases, top-1 agreement over all prompt rows).
#[test]
fn packed_formats_keep_the_fixture_logits() {
    let m = manifest();
    let mut models: HashMap<String, HashMap<WeightFormat, Llava>> = HashMap::new();
    let formats = [
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::Q8,
        WeightFormat::Q4,
    ];
    // format -> (max error, agreeing rows, rows)
    let mut stats: HashMap<WeightFormat, (f32, usize, usize)> = HashMap::new();
    for c in m["cases"].as_array().unwrap() {
        let name = c["model"].as_str().unwrap();
        let dir = fixtures().join(name);
        let per_model = models.entry(name.to_string()).or_insert_with(|| {
            formats
                .iter()
                .map(|&f| (f, Llava::load_as(&dir, &Device::Cpu, f).unwrap()))
                .collect()
        });
        let t = candle_core::safetensors::load(
            fixtures().join(c["tensors"].as_str().unwrap()),
            &Device::Cpu,
        )
        .unwrap();
        let want = &t["logits"];
        let want_top = argmax_rows(want);
        for f in formats {
            let got = prompt_logits(&per_model[&f], &t);
            let err = max_abs(&got, want);
            let agree = argmax_rows(&got)
                .iter()
                .zip(&want_top)
                .filter(|(a, b)| a == b)
                .count();
            let s = stats.entry(f).or_insert((0.0, 0, 0));
            s.0 = s.0.max(err);
            s.1 += agree;
            s.2 += want_top.len();
            println!(
                "{} {f}: logits max-abs error {err:.2e}, top-1 {agree}/{}",
                c["name"].as_str().unwrap(),
                want_top.len()
            );
        }
    }
    let mut failures = Vec::new();
    for f in formats {
        let (err, agree, rows) = stats[&f];
        let top1 = agree as f64 / rows as f64;
        println!("{f}: max-abs {err:.2e}, top-1 agreement {top1:.4} ({agree}/{rows})");
        // Regression bounds at the levels measured when the formats were added. The fixtures
        // are random-weight models whose next-token distributions are nearly flat (close
        // runners-up), so a small weight error flips some argmaxes: bf16 (8-bit mantissa) flips
        // ~2% of rows here, q4 (random Gaussian weights at 4 bits: ~8% noise per weight) half of
        // mistral's. On llama-gqa and qwen2 q8 / q4 fall back to bf16 (hidden 72 / 56).
        // glance-tiny's trained logits are the meaningful check (glance-engine's weight tests).
        // q8's vision tower is bf16 and attends in bf16 on AMX: mistral-rgba's largest q8 error
        // was 0.274 before that attention and 0.301 with it (bf16's own moved 0.125 -> 0.111).
        let (max_err, min_top1) = match f {
            WeightFormat::F16 => (0.02, 0.99),
            WeightFormat::Bf16 => (0.15, 0.96),
            WeightFormat::Q8 => (0.35, 0.95),
            _ => (5.0, 0.75),
        };
        if err > max_err || top1 < min_top1 {
            failures.push(format!(
                "{f}: logits differ by {err}, top-1 agreement {top1}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Copies the fixture model `name` into a scratch directory with every float tensor stored as
/// bf16.
fn bf16_copy(name: &str, scratch: &Path) -> PathBuf {
    let src = fixtures().join("models").join(name);
    let dst = scratch.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
    let tensors = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            let v = if v.dtype() == DType::F32 {
                v.to_dtype(DType::BF16).unwrap()
            } else {
                v
            };
            (k, v)
        })
        .collect::<HashMap<_, _>>();
    candle_core::safetensors::save(&tensors, dst.join("model.safetensors")).unwrap();
    dst
}

/// A bf16 checkpoint loaded with `--weights bf16`: every decoder matrix is the mapped file's
/// bytes (not a copy), and the logits equal, bit for bit, those of the f32 checkpoint rounded to
/// bf16 as it loads.
#[test]
fn bf16_checkpoint_is_used_in_place() {
    let scratch = std::env::temp_dir().join(format!("glance-bf16-{}", std::process::id()));
    let dir = bf16_copy("llama-gqa", &scratch);
    let mapped = Llava::load_as(&dir, &Device::Cpu, WeightFormat::Bf16).unwrap();
    let linears = mapped.text().linears();
    assert!(!linears.is_empty());
    for l in &linears {
        let p = l.packed_weight().expect("packed");
        assert_eq!(p.format(), WeightFormat::Bf16);
        assert!(p.is_shared(), "a decoder matrix was copied: {p:?}");
    }
    // The same checkpoint without the mapped source: each matrix read (as f32) and packed.
    let config = glance_models::llava::LlavaConfig::from_dir(&dir).unwrap();
    let vb = glance_models::checkpoint::var_builder(&dir, DType::F32, &Device::Cpu).unwrap();
    let layout = glance_models::llava::WeightLayout::detect(&vb);
    let load = glance_nn::WeightLoad::new(WeightFormat::Bf16);
    let packed =
        Llava::from_var_builder_as(&vb, config, &layout, glance_nn::Mode::Infer, &load).unwrap();
    assert!(packed
        .text()
        .linears()
        .iter()
        .all(|l| !l.packed_weight().unwrap().is_shared()));
    let m = manifest();
    let case = m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"].as_str().unwrap().ends_with("llama-gqa"))
        .unwrap();
    let t = candle_core::safetensors::load(
        fixtures().join(case["tensors"].as_str().unwrap()),
        &Device::Cpu,
    )
    .unwrap();
    let a = prompt_logits(&mapped, &t).to_vec2::<f32>().unwrap();
    let b = prompt_logits(&packed, &t).to_vec2::<f32>().unwrap();
    assert_eq!(a, b);
    drop(mapped);
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// `glance quantize` → load: every packed matrix is bit for bit the one packed at load time from
/// the f32 checkpoint, and so are the logits; loading it in another format names the one it
/// holds.
#[test]
fn quantize_save_load_round_trip_is_bit_identical() {
    let scratch = std::env::temp_dir().join(format!("glance-quantize-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let src = fixtures().join("models/mistral");
    let m = manifest();
    let case = m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"].as_str().unwrap().ends_with("mistral"))
        .unwrap();
    let t = candle_core::safetensors::load(
        fixtures().join(case["tensors"].as_str().unwrap()),
        &Device::Cpu,
    )
    .unwrap();
    for f in [WeightFormat::Q4, WeightFormat::Q8, WeightFormat::Bf16] {
        let out = scratch.join(f.name());
        let summary = glance_models::quantize::quantize_dir(&src, &out, f).unwrap();
        assert!(summary.packed > 0);
        let direct = Llava::load_as(&src, &Device::Cpu, f).unwrap();
        let loaded = Llava::load_as(&out, &Device::Cpu, f).unwrap();
        let (a, b) = (direct.text().linears(), loaded.text().linears());
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!(
                x.packed_weight() == y.packed_weight(),
                "{f}: a matrix differs"
            );
        }
        let la = prompt_logits(&direct, &t).to_vec2::<f32>().unwrap();
        let lb = prompt_logits(&loaded, &t).to_vec2::<f32>().unwrap();
        assert_eq!(la, lb, "{f}");
        if f.is_quantized() {
            // The stored format is the only one it loads in, with an error that says so.
            let other = if f == WeightFormat::Q4 {
                WeightFormat::Q8
            } else {
                WeightFormat::Q4
            };
            let e = Llava::load_as(&out, &Device::Cpu, other)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(&format!("--weights {f}")), "{e}");
        }
        // With no format asked for, the one the directory records.
        let recorded = Llava::load(&out, &Device::Cpu).unwrap();
        let lc = prompt_logits(&recorded, &t).to_vec2::<f32>().unwrap();
        assert_eq!(lb, lc, "{f}");
    }
    // An existing output directory is refused.
    assert!(
        glance_models::quantize::quantize_dir(&src, &scratch.join("q4"), WeightFormat::Q4).is_err()
    );
    std::fs::remove_dir_all(&scratch).unwrap();
}
