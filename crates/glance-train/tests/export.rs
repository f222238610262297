//! The exported directory is a standard HF LLaVA checkpoint that glance loads back unchanged.

mod common;

use candle_core::Device;
use glance_models::llava::{Llava, LlavaConfig, LlavaProcessor, PromptFormat};
use glance_nn::{AttnMask, CausalLm};
use glance_train::trainer::Silent;
use glance_train::Trainer;
use glance_world::{render, sample, Split};

#[test]
fn export_loads_with_llava_load_and_gives_the_same_logits() {
    common::setup();
    let mut config = common::tiny_config([3, 3, 0]);
    config.stages.truncate(2);
    config.eval_per_family = 2;
    let out = common::scratch("export");
    let mut t = Trainer::new(config, &out).unwrap();
    t.run(&mut Silent, None).unwrap();
    let dir = Trainer::model_dir(&out);

    let cfg = LlavaConfig::from_dir(&dir).unwrap();
    assert_eq!(cfg.image_tokens_per_image(), 16);
    let proc = LlavaProcessor::from_dir(&dir, &cfg).unwrap();
    let loaded = Llava::load(&dir, &Device::Cpu).unwrap();

    // Weight names: hub layout, post_layernorm shipped, training heads not.
    let names: Vec<String> = {
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.names().into_iter().map(|s| s.to_string()).collect()
    };
    assert!(names
        .iter()
        .any(|n| n == "vision_tower.vision_model.post_layernorm.weight"));
    assert!(names.iter().any(|n| n == "language_model.lm_head.weight"));
    assert!(!names.iter().any(|n| n.starts_with("train_heads")));
    assert_eq!(names.len(), t.model.export_params().len());

    // Same prompt through the processor, the loaded model and the in-memory one.
    let ex = sample(Split::Validation, 0).unwrap();
    let q = &ex.questions[0].question;
    let prompt = proc.prepare(q, 1, PromptFormat::Chat).unwrap();
    let img = image::DynamicImage::ImageRgb8(render(&ex.scene));
    let pixels = proc.image.preprocess_tensor(&img, &Device::Cpu).unwrap();
    let logits = |m: &Llava| -> Vec<f32> {
        let feats = m.encode_image(&pixels).unwrap().features;
        let xs = m.embed_prompt(&prompt.ids, &[&feats]).unwrap();
        let pos: Vec<u32> = (0..prompt.ids.len() as u32).collect();
        let mut cache = m.text().new_cache();
        let h = m
            .text()
            .forward(&xs, &pos, &AttnMask::causal(), &mut cache)
            .unwrap();
        m.text()
            .logits(&h)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (a, b) = (logits(&loaded), logits(&t.model.infer));
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    // The in-memory model's weights are trainable variables, which take the differentiable GEMM
    // path; the loaded model's frozen weights take the decode kernels on a short prompt: the
    // same numbers up to summation order.
    assert!(
        diff < 1e-5,
        "loaded model differs from the trained one by {diff}"
    );

    // Validation runs on the exported weights' view and scores every family.
    let r = t.evaluate().unwrap();
    assert_eq!(r.families.len(), 6);
    assert!(
        r.families.iter().all(|f| f.questions == 2),
        "{:?}",
        r.families
    );
}
