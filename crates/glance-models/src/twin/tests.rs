//! The twin construction step by step, on small random models at reduced shapes (each test runs
//! in well under a second): hidden states, logits, the weights' zero and random parts, draft
//! heads, and the shape checks.

use super::backend::{decoder_site, Site, TwinBackend};
use super::map::TwinMap;
use super::*;
use crate::random::with_random_weights;
use crate::text::TextModel;
use candle_core::Tensor;
use glance_nn::{AttnMask, CausalLm, DraftLm};
use serde_json::json;

fn text(
    hidden: usize,
    inter: usize,
    layers: usize,
    (heads, kv, hd): (usize, usize, usize),
    vocab: usize,
) -> Value {
    json!({"model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256})
}

/// A small random decoder with its tensors, and its twin at `big` with the twin's `VarBuilder`.
struct Pair {
    small: TextModel,
    twin: TextModel,
    twin_vb: VarBuilder<'static>,
    map: TwinMap,
    small_tensors: std::collections::HashMap<String, Tensor>,
}

fn text_sites(name: &str) -> Site {
    if name == "lm_head.weight" {
        Site::LmHead
    } else {
        decoder_site(name).unwrap_or(Site::Same)
    }
}

fn pair(small: &Value, big: &Value) -> Pair {
    let cpu = Device::Cpu;
    let small_config = TextConfig::from_value(small).unwrap();
    let (small_model, tensors) = with_random_weights(7, &cpu, |vb| {
        TextModel::load(vb, &vb.pp("lm_head"), &small_config, Mode::Infer)
    })
    .unwrap();
    let twin_config = TextConfig::from_value(
        &twin_text_value(small, &TextConfig::from_value(big).unwrap()).unwrap(),
    )
    .unwrap();
    let map = TwinMap::new(&small_config, &twin_config).unwrap();
    let backend = TwinBackend {
        small: VarBuilder::from_tensors(tensors.clone(), DType::F32, &cpu),
        map: map.clone(),
        resolve: Box::new(text_sites),
        seed: SEED,
    };
    let twin_vb = VarBuilder::from_backend(Box::new(backend), DType::F32, cpu);
    let mut twin =
        TextModel::load(&twin_vb, &twin_vb.pp("lm_head"), &twin_config, Mode::Infer).unwrap();
    twin.limit_vocab(small_config.vocab_size);
    Pair {
        small: small_model,
        twin,
        twin_vb,
        map,
        small_tensors: tensors,
    }
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

/// `big`'s first `small.dim(1)` columns equal `small` within `rel` of its largest value, and
/// its other columns are exactly 0.
fn assert_embedded(small: &Tensor, big: &Tensor, rel: f32, what: &str) {
    let d = small.dim(1).unwrap();
    let real = big.narrow(1, 0, d).unwrap();
    let diff = max_abs(&(&real - small).unwrap());
    let scale = max_abs(small);
    assert!(scale > 0.0, "{what}: all zero");
    assert!(
        diff <= rel * scale,
        "{what}: differ by {diff} (largest {scale})"
    );
    let pad = big.narrow(1, d, big.dim(1).unwrap() - d).unwrap();
    assert_eq!(max_abs(&pad), 0.0, "{what}: padded dims must be exactly 0");
}

/// Prefill of a few ids, then one decode step: the twin's hidden states and logits against the
/// small model's.
fn check_function(p: &Pair, rel: f32) {
    let ids = [3u32, 17, 1, 40, 8, 22, 5];
    let mut caches = (p.small.new_cache(), p.twin.new_cache());
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    let (es, eb) = (
        p.small.embed_tokens(&ids).unwrap(),
        p.twin.embed_tokens(&ids).unwrap(),
    );
    assert_embedded(&es, &eb, 0.0, "embeddings");
    let causal = AttnMask::causal();
    let hs = p.small.forward(&es, &pos, &causal, &mut caches.0).unwrap();
    let hb = p.twin.forward(&eb, &pos, &causal, &mut caches.1).unwrap();
    assert_embedded(&hs, &hb, rel, "prefill hidden states");
    let step = [9u32];
    let (es, eb) = (
        p.small.embed_tokens(&step).unwrap(),
        p.twin.embed_tokens(&step).unwrap(),
    );
    let at = [ids.len() as u32];
    let hs = p.small.forward(&es, &at, &causal, &mut caches.0).unwrap();
    let hb = p.twin.forward(&eb, &at, &causal, &mut caches.1).unwrap();
    assert_embedded(&hs, &hb, rel, "decode-step hidden states");
    // Logits: the small vocabulary's equal, the padded ids masked; the raw head computes them.
    let (ls, lb) = (p.small.logits(&hs).unwrap(), p.twin.logits(&hb).unwrap());
    let v = ls.dim(1).unwrap();
    let diff = max_abs(&(lb.narrow(1, 0, v).unwrap() - &ls).unwrap());
    assert!(
        diff <= rel * max_abs(&ls).max(1e-3),
        "logits differ by {diff}"
    );
    let padded: Vec<f32> = lb
        .narrow(1, v, lb.dim(1).unwrap() - v)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(padded.iter().all(|x| *x == f32::NEG_INFINITY));
    let raw = p.twin.raw_logits(&hb).unwrap();
    let raw_pad = raw.narrow(1, v, raw.dim(1).unwrap() - v).unwrap();
    assert!(max_abs(&raw_pad) > 0.0 && max_abs(&raw_pad).is_finite());
    // The batch-invariant pass and the row kernels agree too.
    let mut cache = p.twin.new_cache();
    let ex = p.twin.forward_batch_invariant(
        &p.twin.embed_tokens(&ids).unwrap(),
        &pos,
        &causal,
        &mut cache,
    );
    let hs_all = p
        .small
        .forward_uncached(&p.small.embed_tokens(&ids).unwrap(), &pos, &causal)
        .unwrap();
    assert_embedded(&hs_all, &ex.unwrap(), rel, "batch-invariant pass");
}

#[test]
fn a_twin_at_a_power_of_4_width_computes_the_small_model() {
    // d64 → d256 (ratio 4: the norm scale ½ is exact), 2 → 8 heads of 32, one extra layer.
    let p = pair(
        &text(64, 96, 2, (2, 2, 32), 50),
        &text(256, 160, 3, (8, 2, 32), 70),
    );
    check_function(&p, 1e-5);
}

#[test]
fn a_twin_with_doubled_head_dim_and_gqa_computes_the_small_model() {
    // d64 → d512 (ratio 8, as tinyllama's: the norm scale is rounded), 4 query / 2 KV heads of
    // 16 into 8 / 4 heads of 32 (rotary pair j at 2j, queries scaled by √2), two extra layers.
    let p = pair(
        &text(64, 96, 2, (4, 2, 16), 50),
        &text(512, 256, 4, (8, 4, 32), 90),
    );
    check_function(&p, 1e-5);
}

#[test]
fn padded_rows_are_random_and_their_outputs_zero() {
    let small = text(64, 96, 2, (4, 2, 16), 50);
    let p = pair(&small, &text(512, 256, 3, (8, 4, 32), 90));
    let get = |name: &str, dims: (usize, usize)| -> Vec<Vec<f32>> {
        p.twin_vb.get(dims, name).unwrap().to_vec2().unwrap()
    };
    let m = &p.map;
    let nonzero = |row: &[f32]| row.iter().any(|x| *x != 0.0);
    // Small query heads 0..4 (two per KV head) sit at big heads 0, 1, 4, 5 (KV heads 0 and 2):
    // heads 2, 3, 6, 7 are padded, with random rows and zero o_proj columns.
    assert_eq!(
        (0..4).map(|h| m.q_head(h)).collect::<Vec<_>>(),
        [0, 1, 4, 5]
    );
    let q = get("layers.0.self_attn.q_proj.weight", (8 * 32, 512));
    let o = get("layers.0.self_attn.o_proj.weight", (512, 8 * 32));
    for h in [2, 3, 6, 7] {
        for d in 0..32 {
            assert!(nonzero(&q[h * 32 + d]), "q row of padded head {h}");
            assert!(o.iter().all(|row| row[h * 32 + d] == 0.0));
        }
    }
    // Inside a real head: odd rotary pairs are zero rows; values use dims 0..16 only.
    assert!(!nonzero(&q[1]) && !nonzero(&q[17]) && nonzero(&q[2]) && nonzero(&q[16 + 2]));
    assert!(o.iter().all(|row| row[20] == 0.0) && o.iter().take(64).any(|row| row[5] != 0.0));
    // Padded residual rows of every output projection are zero; the rest of o_proj too.
    assert!(o[64..].iter().all(|row| !nonzero(row)));
    let down = get("layers.1.mlp.down_proj.weight", (512, 256));
    assert!(down[64..].iter().all(|row| !nonzero(row)));
    assert!(down[..64]
        .iter()
        .all(|row| row[96..].iter().all(|x| *x == 0.0)));
    let gate = get("layers.1.mlp.gate_proj.weight", (256, 512));
    assert!(
        gate[96..].iter().all(|row| nonzero(row)),
        "padded units are random"
    );
    // The extra layer: random inputs, zero outputs.
    let q2 = get("layers.2.self_attn.q_proj.weight", (256, 512));
    assert!(q2.iter().all(|row| nonzero(row)));
    let o2 = get("layers.2.self_attn.o_proj.weight", (512, 256));
    assert!(o2.iter().all(|row| !nonzero(row)));
    // Norms: real dims scaled by √(64/512), eps by 64/512.
    let small_norm: Vec<f32> = p.small_tensors["norm.weight"].to_vec1().unwrap();
    let norm: Vec<f32> = p
        .twin_vb
        .get(512, "norm.weight")
        .unwrap()
        .to_vec1()
        .unwrap();
    for i in 0..64 {
        assert_eq!(norm[i], small_norm[i] * m.norm_scale());
    }
    assert!(norm[64..].iter().all(|x| (x - 1.0).abs() < 0.2));
    assert_eq!(p.twin.config().rms_norm_eps, 1e-5 * 64.0 / 512.0);
    // Embedding rows of ids beyond the small vocabulary are random across every dim.
    let emb = get("embed_tokens.weight", (90, 512));
    assert!(emb[60][100..].iter().all(|x| *x != 0.0) && !nonzero(&emb[3][64..]));
    let head = get("lm_head.weight", (90, 512));
    assert!(head[60..].iter().all(|row| nonzero(row)));
}

#[test]
fn logits_beyond_a_limit_are_masked_in_every_path() {
    let p = pair(
        &text(64, 96, 1, (2, 2, 32), 50),
        &text(64, 96, 1, (2, 2, 32), 50),
    );
    let mut m = p.small;
    let h = Tensor::ones((2, 64), DType::F32, &Device::Cpu).unwrap();
    let full = m.logits(&h).unwrap();
    assert!(max_abs(&full).is_finite());
    m.limit_vocab(45);
    m.limit_vocab(48); // only ever lowered
    assert_eq!(m.decodable_vocab(), 45);
    for l in [m.logits(&h).unwrap(), m.logits_rows(&h).unwrap()] {
        let v: Vec<Vec<f32>> = l.to_vec2().unwrap();
        for row in &v {
            assert!(row[..45].iter().all(|x| x.is_finite()));
            assert!(row[45..].iter().all(|x| *x == f32::NEG_INFINITY));
        }
        let kept = l.narrow(1, 0, 45).unwrap();
        assert_eq!(
            max_abs(&(kept - full.narrow(1, 0, 45).unwrap()).unwrap()),
            0.0
        );
    }
    assert_eq!(
        m.raw_logits(&h).unwrap().to_vec2::<f32>().unwrap(),
        full.to_vec2::<f32>().unwrap()
    );
}

#[test]
fn a_draft_head_twin_predicts_what_the_small_head_predicts() {
    let small_text = text(64, 96, 2, (4, 2, 16), 50);
    let dir = std::env::temp_dir().join(format!("glance-twin-head-{}", std::process::id()));
    let config = DraftConfig::for_target(&small_text, Some(3), true).unwrap();
    let small = DraftHead::write_random(&dir, config, 11).unwrap();
    let shape = TwinShape::custom("test", text(512, 256, 4, (8, 4, 32), 90));
    let twin = load_draft(&dir, &Device::Cpu, WeightFormat::F32, &shape).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!((twin.hidden_size(), twin.vocab_size()), (512, 90));
    let cpu = Device::Cpu;
    let pad = |x: &Tensor| {
        let z = Tensor::zeros((x.dim(0).unwrap(), 512 - 64), DType::F32, &cpu).unwrap();
        Tensor::cat(&[x, &z], 1).unwrap()
    };
    let emb = Tensor::randn(0f32, 1.0, (5, 64), &cpu).unwrap();
    let prev = Tensor::randn(0f32, 1.0, (5, 64), &cpu).unwrap();
    let image = Tensor::randn(0f32, 1.0, (7, 64), &cpu).unwrap();
    // The adaptor and the global feature.
    let cs = small.compress_image(&image).unwrap().unwrap();
    let cb = twin.compress_image(&pad(&image)).unwrap().unwrap();
    assert_embedded(&cs, &cb, 1e-5, "adaptor tokens");
    let gs = small.global_feature(std::slice::from_ref(&image)).unwrap();
    let gb = twin.global_feature(&[pad(&image)]).unwrap();
    let rs = small.fuse_rows(&emb, &prev, gs.as_ref()).unwrap();
    let rb = twin
        .fuse_rows(&pad(&emb), &pad(&prev), gb.as_ref())
        .unwrap();
    assert_embedded(&rs, &rb, 1e-5, "fused rows");
    let pos = [4u32, 5, 6, 7, 8];
    let causal = AttnMask::causal();
    let hs = DraftLm::forward(&small, &rs, &pos, &causal, &mut small.new_cache()).unwrap();
    let hb = DraftLm::forward(&twin, &rb, &pos, &causal, &mut twin.new_cache()).unwrap();
    assert_embedded(&hs, &hb, 1e-5, "draft hidden states");
}

#[test]
fn named_shapes_and_memory_checks() {
    let e = "gpt-5".parse::<TwinShape>().unwrap_err().to_string();
    assert!(
        e.contains("tinyllama-1.1b") && e.contains("llava-7b"),
        "{e}"
    );
    let tiny = TwinShape::preset("tinyllama-1.1b")
        .unwrap()
        .sizes()
        .unwrap();
    assert_eq!(
        (
            tiny.num_layers,
            tiny.hidden_size,
            tiny.num_heads,
            tiny.num_kv_heads
        ),
        (22, 2048, 32, 4)
    );
    assert_eq!(
        (tiny.head_dim, tiny.intermediate_size, tiny.vocab_size),
        (64, 5632, 32000)
    );
    // The seeds' decoders: glance-tiny's 4 KV heads fit the 7B ones, not the 3B / 4B ones'
    // 2, and the refusal names the size.
    let tiny_text = crate::text::TextConfig::from_value(
        &serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../models/glance-tiny/config.json"),
            )
            .unwrap(),
        )
        .unwrap()["text_config"],
    )
    .unwrap();
    for (name, layers, hidden, kv, fits) in [
        ("llava-next-7b", 32, 4096, 8, true),
        ("qwen2.5-vl-7b", 28, 3584, 4, true),
        ("qwen2.5-vl-3b", 36, 2048, 2, false),
        ("internvl2.5-4b", 36, 2048, 2, false),
    ] {
        let big = TwinShape::preset(name).unwrap().sizes().unwrap();
        assert_eq!(
            (
                big.num_layers,
                big.hidden_size,
                big.num_kv_heads,
                big.head_dim
            ),
            (layers, hidden, kv, 128),
            "{name}"
        );
        match map::TwinMap::new(&tiny_text, &big) {
            Ok(_) => assert!(fits, "{name}"),
            Err(e) => {
                assert!(!fits, "{name}: {e}");
                assert!(e.to_string().contains("num_key_value_heads 2 < 4"), "{e}");
            }
        }
    }
    let big = TwinShape::preset("llava-7b").unwrap().sizes().unwrap();
    assert_eq!(
        (
            big.num_layers,
            big.hidden_size,
            big.head_dim,
            big.vocab_size
        ),
        (32, 4096, 128, 32064)
    );
    let small = json!({"model_type": "llava", "image_token_index": 4,
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        "text_config": text(256, 704, 4, (4, 4, 64), 141)});
    let shape = TwinShape::preset("llava-7b").unwrap();
    let config = LlavaConfig::from_value(&twin_llava_value(&small, &shape).unwrap()).unwrap();
    assert_eq!(config.text.rms_norm_eps, 1e-5 / 16.0);
    // ~6.7B parameters: ~27 GB in f32, ~3.8 GB in q4.
    let e = check_fits(&config, WeightFormat::F32, Some(24_000_000_000)).unwrap_err();
    assert!(
        e.to_string().contains("GB") && e.to_string().contains("f32"),
        "{e}"
    );
    check_fits(&config, WeightFormat::Q4, Some(24_000_000_000)).unwrap();
    check_fits(&config, WeightFormat::F32, None).unwrap();
}
