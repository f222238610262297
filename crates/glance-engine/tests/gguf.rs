//! GGUF copies of the random LLaVA fixtures (fixtures/gguf, written by
//! scripts/make_gguf_fixtures.py) against their safetensors directories (fixtures/models), in each
//! matching weight format: F16 GGUF ↔ `--weights f16`, Q8_0 ↔ q8, Q4_0 ↔ q4. The GGUF pair holds
//! the same values as glance's own load of the directory, so the prompt logits agree to float
//! noise (in Q8_0 / Q4_0 exactly, but for llama-gqa's RoPE divisors: see
//! [`ROPE_DIVISORS_TOLERANCE`]) and the greedy tokens are the same.

use glance_engine::{Engine, EngineOptions, Flow, ImageInput, Prompt, Request, WeightFormat};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn image(name: &str) -> ImageInput {
    ImageInput::decoded(
        glance_models::processing::image::load_image(&root().join("images").join(name)).unwrap(),
    )
}

fn requests() -> Vec<Request> {
    let mut out = Vec::new();
    for (prompt, img) in [
        ("What is in the picture?", "astronaut.png"),
        (
            "Describe the colours, then count them: één, two, 3!",
            "coffee_palette.png",
        ),
    ] {
        let mut r = Request::chat(prompt, vec![image(img)]);
        r.max_new_tokens = 12;
        out.push(r);
    }
    let mut raw = Request::new(Prompt::Raw {
        text: "<image>\nA raw prompt with\ttabs and ünïcode".into(),
        images: vec![image("astronaut.png")],
    });
    raw.max_new_tokens = 12;
    out.push(raw);
    out
}

/// Largest logit difference allowed (see the module docs).
const LOGIT_TOLERANCE: f32 = 1e-3;

fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn check(model: &str, text: &str, mmproj: &str, format: WeightFormat) {
    let dir = root().join("models").join(model);
    let gguf = root().join("gguf").join(model);
    let options = || EngineOptions::single_request().with_threads(Some(1));
    let reference = Engine::load(&dir, options().with_weights(format)).unwrap();
    let (engine, notes) =
        Engine::load_gguf(&gguf.join(text), Some(&gguf.join(mmproj)), options(), None).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(engine.options().weights, format, "{model} {text}");
    let (a, b) = (reference.processor(), engine.processor());
    assert_eq!(a.text.eos_token_ids(), b.text.eos_token_ids());
    assert_eq!(a.text.bos_token(), b.text.bos_token());
    for r in requests() {
        let want = reference.prompt_logits(&r.prompt).unwrap();
        let got = engine.prompt_logits(&r.prompt).unwrap();
        assert_eq!(want.dims(), got.dims());
        let d = max_diff(&want, &got);
        assert!(d < LOGIT_TOLERANCE, "{model} {text}: logits differ by {d}");
        let x = reference.generate(&r, &mut |_| Flow::Continue).unwrap();
        let y = engine.generate(&r, &mut |_| Flow::Continue).unwrap();
        assert!(!x.token_ids.is_empty());
        assert_eq!(x.token_ids, y.token_ids, "{model} {text}");
        assert_eq!(x.text, y.text);
    }
}

#[test]
fn f16_gguf_matches_the_directory_in_f16() {
    for model in ["llama-gqa", "mistral", "qwen2"] {
        check(model, "text-f16.gguf", "mmproj-f16.gguf", WeightFormat::F16);
    }
}

#[test]
fn q8_0_gguf_matches_the_directory_in_q8() {
    for model in ["llama-gqa", "mistral", "qwen2"] {
        check_in(model, "text-q8_0.gguf", WeightFormat::Q8);
    }
}

#[test]
fn q4_0_gguf_matches_the_directory_in_q4() {
    for model in ["llama-gqa", "mistral", "qwen2"] {
        check_in(model, "text-q4_0.gguf", WeightFormat::Q4);
    }
}

/// Largest logit difference allowed between a Q8_0 / Q4_0 GGUF and its directory where the file
/// writes Llama 3's RoPE schedule as llama.cpp does, as per-frequency divisors
/// (`rope_freqs.weight`, the llama-gqa fixture): a divisor turns some frequencies an ulp or two
/// off the directory's, and the int8 rows the q8 / q4 kernels quantize their inputs to let such
/// ulps flip a rounding (0.0144 measured on these prompts). Everything else in such a pair is the
/// same bit for bit: the files without divisors are held to 0, and
/// glance-models' `a_quantized_gguf_computes_what_its_directory_does` holds llama-gqa to 0 once
/// both turn alike.
const ROPE_DIVISORS_TOLERANCE: f32 = 0.05;

/// The quantized files compared in `format`, given explicitly (their BF16-only variants have no
/// Q8_0 / Q4_0 tensor to name the format by).
fn check_in(model: &str, text: &str, format: WeightFormat) {
    let dir = root().join("models").join(model);
    let gguf = root().join("gguf").join(model);
    let options = || EngineOptions::single_request().with_threads(Some(1));
    let reference = Engine::load(&dir, options().with_weights(format)).unwrap();
    let (engine, notes) = Engine::load_gguf(
        &gguf.join(text),
        Some(&gguf.join("mmproj-f32.gguf")),
        options(),
        Some(format),
    )
    .unwrap();
    let tolerance = if model == "llama-gqa" {
        ROPE_DIVISORS_TOLERANCE
    } else {
        0.0
    };
    for r in requests() {
        let want = reference.prompt_logits(&r.prompt).unwrap();
        let got = engine.prompt_logits(&r.prompt).unwrap();
        let d = max_diff(&want, &got);
        assert!(
            d <= tolerance,
            "{model} {text}: logits differ by {d} ({notes:?})"
        );
        let x = reference.generate(&r, &mut |_| Flow::Continue).unwrap();
        let y = engine.generate(&r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(x.token_ids, y.token_ids, "{model} {text}");
    }
}

/// The mistral fixture is the one whose matrices are whole blocks of 32: its Q8_0 / Q4_0 files
/// name their format themselves, with no --weights.
#[test]
fn quantized_gguf_loads_in_its_own_format() {
    let gguf = root().join("gguf").join("mistral");
    for (text, format) in [
        ("text-q8_0.gguf", WeightFormat::Q8),
        ("text-q4_0.gguf", WeightFormat::Q4),
        ("text-f16.gguf", WeightFormat::F16),
    ] {
        let (engine, notes) = Engine::load_gguf(
            &gguf.join(text),
            Some(&gguf.join("mmproj-f32.gguf")),
            EngineOptions::single_request(),
            None,
        )
        .unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(engine.options().weights, format, "{text}");
    }
    // Asked for another format, the file's weights are converted, and the load says so.
    let (engine, notes) = Engine::load_gguf(
        &gguf.join("text-q8_0.gguf"),
        Some(&gguf.join("mmproj-f32.gguf")),
        EngineOptions::single_request(),
        Some(WeightFormat::F32),
    )
    .unwrap();
    assert_eq!(engine.options().weights, WeightFormat::F32);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("Q8_0") && n.contains("f32")),
        "{notes:?}"
    );
}

/// llama.cpp's conversions of the original LLaVA checkpoints have no `<image>` token: glance adds
/// one after the vocabulary (a zero row in the embeddings and LM head, masked), and the answers
/// are those of the directory, whose `<image>` is a real token.
#[test]
fn a_vocabulary_without_an_image_token_gets_one() {
    use candle_core::quantized::gguf_file::{self, Value};
    let gguf = root().join("gguf").join("mistral");
    let mut f = std::fs::File::open(gguf.join("text-q8_0.gguf")).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| {
            let t = content
                .tensor(&mut f, n, &candle_core::Device::Cpu)
                .unwrap();
            (n.clone(), t)
        })
        .collect();
    let mut metadata = content.metadata.clone();
    let Some(Value::Array(tokens)) = metadata.get_mut("tokenizer.ggml.tokens") else {
        panic!("no tokens")
    };
    let n = tokens.len();
    for t in tokens.iter_mut() {
        if matches!(t, Value::String(s) if s == "<image>") {
            *t = Value::String("<unused-image>".into());
        }
    }
    let dir = std::env::temp_dir().join(format!("glance-gguf-noimage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.gguf");
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&text).unwrap(), &meta, &ts).unwrap();

    let options = || EngineOptions::single_request().with_threads(Some(1));
    let reference = Engine::load(
        &root().join("models/mistral"),
        options().with_weights(WeightFormat::Q8),
    )
    .unwrap();
    let (engine, notes) =
        Engine::load_gguf(&text, Some(&gguf.join("mmproj-f32.gguf")), options(), None).unwrap();
    assert!(
        notes.iter().any(|m| m.contains(&format!("id {n}"))),
        "{notes:?}"
    );
    assert_eq!(engine.processor().text.token_id("<image>"), Some(n as u32));
    assert_eq!(engine.model().config().text.vocab_size, n + 1);
    assert_eq!(
        engine.model().text().decodable_vocab(),
        n,
        "the placeholder is never produced"
    );
    for r in requests() {
        let want = reference.prompt_logits(&r.prompt).unwrap();
        let got = engine.prompt_logits(&r.prompt).unwrap();
        let got = got.narrow(1, 0, want.dim(1).unwrap()).unwrap();
        let d = max_diff(&want, &got);
        assert!(d < LOGIT_TOLERANCE, "logits differ by {d}");
        let x = reference.generate(&r, &mut |_| Flow::Continue).unwrap();
        let y = engine.generate(&r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(x.token_ids, y.token_ids);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
