//! GGUF loading on the committed fixtures (fixtures/gguf, from scripts/make_gguf_fixtures.py)
//! and on copies rewritten here with candle's GGUF writer: the tokenizer against the
//! directory's, K-quants converted exactly as "dequantize, then quantize", and bad files refused
//! with errors that say what is wrong.

use super::*;
use crate::processing::chat::ChatMessage;
use crate::processing::tokenizer::TextProcessor;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn gguf(model: &str, file: &str) -> PathBuf {
    fixtures().join("gguf").join(model).join(file)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("glance-gguf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Metadata and tensors of a GGUF file, to edit and write again.
struct Parts {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, QTensor)>,
}

fn read_parts(path: &Path) -> Parts {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| (n.clone(), content.tensor(&mut f, n, &Device::Cpu).unwrap()))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut metadata: Vec<(String, Value)> = content.metadata.into_iter().collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    Parts { metadata, tensors }
}

fn write_parts(parts: &Parts, path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let metadata: Vec<(&str, &Value)> = parts
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &QTensor)> =
        parts.tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &metadata, &tensors).unwrap();
}

impl Parts {
    fn set(&mut self, key: &str, value: Value) {
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.push((key.to_string(), value));
    }
}

#[test]
fn the_tokenizer_from_metadata_matches_the_directory() {
    let texts = [
        "What is in the picture?",
        "  leading spaces and trailing  ",
        "één, ünïcode — and emoji 🦀 fall back to bytes",
        "<image>\nUSER: two <image><image> placeholders</s> and <s> specials",
        "tabs\tand\nnewlines\n\n",
        "",
    ];
    for model in ["llama-gqa", "mistral", "qwen2"] {
        let dir = TextProcessor::from_dir(&fixtures().join("models").join(model)).unwrap();
        let file = GgufFile::open(&gguf(model, "text-f16.gguf")).unwrap();
        let ours = tokenizer::text_processor(&file, None).unwrap();
        assert_eq!(dir.vocab_size(), ours.vocab_size(), "{model}");
        assert_eq!(dir.id_limit(), ours.id_limit());
        assert_eq!(dir.eos_token_ids(), ours.eos_token_ids());
        assert_eq!(
            (
                dir.bos_token(),
                dir.eos_token(),
                dir.pad_token(),
                dir.unk_token()
            ),
            (
                ours.bos_token(),
                ours.eos_token(),
                ours.pad_token(),
                ours.unk_token()
            )
        );
        for t in texts {
            let want = dir.encode_raw(t).unwrap();
            assert_eq!(want, ours.encode_raw(t).unwrap(), "{model}: {t:?}");
            assert_eq!(dir.encode_plain(t).unwrap(), ours.encode_plain(t).unwrap());
            assert_eq!(
                dir.decode(&want, true).unwrap(),
                ours.decode(&want, true).unwrap()
            );
            assert_eq!(
                dir.decode(&want, false).unwrap(),
                ours.decode(&want, false).unwrap()
            );
        }
        let chat = [ChatMessage::user("How many?", 1)];
        assert_eq!(
            dir.apply_chat_template(&chat, true).unwrap(),
            ours.apply_chat_template(&chat, true).unwrap()
        );
    }
}

#[test]
fn merges_follow_the_scores() {
    // "ab" outranks "bc": "abc" splits as ab + c; every split of a normal token is a merge.
    let tokens = ["a", "b", "c", "ab", "bc", "abc", "<s>"];
    let types = [1, 1, 1, 1, 1, 1, 3];
    let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, 0.0];
    let merges = tokenizer::merges_from_scores(&tokens, &types, &scores);
    let got: Vec<String> = merges
        .iter()
        .map(|m| format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()))
        .collect();
    assert_eq!(got, ["a b", "b c", "a bc", "ab c"]);
}

#[test]
fn the_config_comes_from_the_metadata() {
    let model = open(
        &gguf("llama-gqa", "text-f16.gguf"),
        Some(&gguf("llama-gqa", "mmproj-f16.gguf")),
        &Device::Cpu,
        None,
    )
    .unwrap();
    let dir = LlavaConfig::from_dir(&fixtures().join("models/llama-gqa")).unwrap();
    let c = model.config();
    assert_eq!(model.format, WeightFormat::F16);
    assert_eq!(c.text.hidden_size, dir.text.hidden_size);
    assert_eq!((c.text.num_heads, c.text.num_kv_heads), (6, 2));
    assert_eq!(c.text.head_dim, 12);
    assert_eq!(c.text.rms_norm_eps, dir.text.rms_norm_eps);
    assert!(
        matches!(c.text.rope_scaling, Some(glance_nn::RopeScaling::Factors(ref f)) if f.len() == 6)
    );
    assert_eq!(c.image_token_id, dir.image_token_id);
    assert_eq!(c.image_tokens_per_image(), dir.image_tokens_per_image());
    // The mmproj stores the tower without its unused last layer (llama.cpp's LLaVA-1.5
    // layout); the feature layer is the same hidden state.
    assert_eq!(c.vision.num_hidden_layers, 2);
    assert_eq!(c.feature_layers, dir.feature_layers);
    assert_eq!(c.vision.hidden_act, dir.vision.hidden_act);
    let mistral = open(
        &gguf("mistral", "text-q8_0.gguf"),
        Some(&gguf("mistral", "mmproj-f16.gguf")),
        &Device::Cpu,
        None,
    )
    .unwrap();
    let dir = LlavaConfig::from_dir(&fixtures().join("models/mistral")).unwrap();
    assert_eq!(mistral.format, WeightFormat::Q8);
    assert_eq!(mistral.config().text.arch, dir.text.arch);
    assert_eq!(mistral.config().text.layer_windows, dir.text.layer_windows);
    assert_eq!(mistral.config().feature_select, dir.feature_select);
    assert_eq!(mistral.config().vision.hidden_act, dir.vision.hidden_act);
}

fn open_err(text: &Path, mmproj: Option<&Path>) -> String {
    match open(text, mmproj, &Device::Cpu, None) {
        Ok(_) => panic!("{} loaded", text.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_files_are_refused_naming_a_tensor() {
    let d = scratch("truncated");
    let bytes = std::fs::read(gguf("mistral", "text-f16.gguf")).unwrap();
    let mm = gguf("mistral", "mmproj-f16.gguf");
    let cut = d.join("text.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let e = open_err(&cut, Some(&mm));
    assert!(e.contains("truncated") && e.contains("tensor `"), "{e}");
    std::fs::write(&cut, &bytes[..200]).unwrap();
    let e = open_err(&cut, Some(&mm));
    assert!(e.contains("not a readable GGUF file"), "{e}");
    std::fs::write(&cut, b"not a gguf at all").unwrap();
    assert!(open_err(&cut, Some(&mm)).contains("text.gguf"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_missing_tensor_is_named_as_the_file_names_it() {
    let d = scratch("missing");
    let mut parts = read_parts(&gguf("mistral", "text-q8_0.gguf"));
    parts.tensors.retain(|(n, _)| n != "blk.1.ffn_up.weight");
    let text = d.join("text.gguf");
    write_parts(&parts, &text);
    let e = open_err(&text, Some(&gguf("mistral", "mmproj-f32.gguf")));
    assert!(
        e.contains("blk.1.ffn_up.weight") && e.contains("text.gguf"),
        "{e}"
    );
    let mut parts = read_parts(&gguf("mistral", "mmproj-f16.gguf"));
    parts.tensors.retain(|(n, _)| n != "mm.2.weight");
    let mm = d.join("mmproj.gguf");
    write_parts(&parts, &mm);
    let e = open_err(&gguf("mistral", "text-f16.gguf"), Some(&mm));
    assert!(
        e.contains("mm.2.weight") && e.contains("mmproj.gguf"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn unknown_architectures_and_wrong_files_are_refused() {
    let d = scratch("arch");
    let mm = gguf("qwen2", "mmproj-f16.gguf");
    let mut parts = read_parts(&gguf("qwen2", "text-f16.gguf"));
    parts.set("general.architecture", Value::String("gemma3".into()));
    let text = d.join("text.gguf");
    write_parts(&parts, &text);
    let e = open_err(&text, Some(&mm));
    assert!(
        e.contains("unknown architecture `gemma3`") && e.contains("llama, qwen2"),
        "{e}"
    );
    // The two files swapped.
    let e = open_err(&mm, Some(&gguf("qwen2", "text-f16.gguf")));
    assert!(e.contains("--mmproj"), "{e}");
    // A text model given as the mmproj.
    let e = open_err(
        &gguf("qwen2", "text-f16.gguf"),
        Some(&gguf("mistral", "text-f16.gguf")),
    );
    assert!(e.contains("not an mmproj"), "{e}");
    // Another model's mmproj: the projector does not fit the text model.
    let e = open_err(
        &gguf("qwen2", "text-f16.gguf"),
        Some(&gguf("mistral", "mmproj-f16.gguf")),
    );
    assert!(
        e.contains("multi_modal_projector") || e.contains("mm."),
        "{e}"
    );
    // No tokenizer.
    let mut parts = read_parts(&gguf("qwen2", "text-f16.gguf"));
    parts.metadata.retain(|(k, _)| !k.starts_with("tokenizer."));
    write_parts(&parts, &text);
    let e = open_err(&text, Some(&mm));
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_mmproj_is_found_beside_the_text_model_or_asked_for() {
    let d = scratch("beside");
    let text = d.join("model-f16.gguf");
    std::fs::copy(gguf("qwen2", "text-f16.gguf"), &text).unwrap();
    let e = open_err(&text, None);
    assert!(e.contains("mmproj") && e.contains("--mmproj FILE"), "{e}");
    std::fs::copy(
        gguf("qwen2", "mmproj-f16.gguf"),
        d.join("mmproj-model-f16.gguf"),
    )
    .unwrap();
    let model = open(&text, None, &Device::Cpu, None).unwrap();
    assert!(
        model
            .notes
            .iter()
            .any(|n| n.contains("mmproj-model-f16.gguf")),
        "{:?}",
        model.notes
    );
    std::fs::copy(
        gguf("qwen2", "mmproj-f32.gguf"),
        d.join("mmproj-model-f32.gguf"),
    )
    .unwrap();
    let e = open_err(&text, None);
    assert!(e.contains("several mmproj files"), "{e}");
    let e = open_err(&text, Some(&d.join("absent-mmproj.gguf")));
    assert!(e.contains("absent-mmproj.gguf"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A random text GGUF at hidden 256 (K-quant blocks are 256 wide; the committed fixtures are
/// narrower) with the llama-gqa fixture's tokenizer, and an mmproj whose projector fits it.
/// `dtype`: the type of its linear weights, from the same random values.
fn k_quant_pair(d: &Path, dtype: GgmlDType) -> (PathBuf, PathBuf) {
    let (hidden, inter) = (256usize, 512usize);
    let src = read_parts(&gguf("llama-gqa", "text-f16.gguf"));
    let vocab = src
        .tensors
        .iter()
        .find(|(n, _)| n == "token_embd.weight")
        .map(|(_, t)| t.shape().dims()[0])
        .unwrap();
    let mut metadata: Vec<(String, Value)> = src
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer.") || k == "general.architecture")
        .collect();
    for (k, v) in [
        ("llama.embedding_length", hidden),
        ("llama.feed_forward_length", inter),
        ("llama.block_count", 1),
        ("llama.attention.head_count", 4),
        ("llama.attention.head_count_kv", 2),
        ("llama.context_length", 256),
    ] {
        metadata.push((k.to_string(), Value::U32(v as u32)));
    }
    let mut rng = glance_core::Rng::new(5);
    let mut random = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| (rng.next_f64() as f32 - 0.5) * scale)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    let mut tensors = Vec::new();
    let mut put = |name: &str, t: Tensor, dtype: GgmlDType| {
        tensors.push((name.to_string(), QTensor::quantize(&t, dtype).unwrap()));
    };
    put(
        "token_embd.weight",
        random(&[vocab, hidden], 1.0),
        GgmlDType::F32,
    );
    put(
        "output_norm.weight",
        (random(&[hidden], 0.2) + 1.0).unwrap(),
        GgmlDType::F32,
    );
    put("output.weight", random(&[vocab, hidden], 0.2), dtype);
    put(
        "blk.0.attn_norm.weight",
        (random(&[hidden], 0.2) + 1.0).unwrap(),
        GgmlDType::F32,
    );
    put(
        "blk.0.ffn_norm.weight",
        (random(&[hidden], 0.2) + 1.0).unwrap(),
        GgmlDType::F32,
    );
    for (name, rows, cols) in [
        ("attn_q", hidden, hidden),
        ("attn_k", hidden / 2, hidden),
        ("attn_v", hidden / 2, hidden),
        ("attn_output", hidden, hidden),
        ("ffn_gate", inter, hidden),
        ("ffn_up", inter, hidden),
        ("ffn_down", hidden, inter),
    ] {
        put(
            &format!("blk.0.{name}.weight"),
            random(&[rows, cols], 0.2),
            dtype,
        );
    }
    let text = d.join(format!("text-{dtype:?}.gguf"));
    write_parts(&Parts { metadata, tensors }, &text);
    let mut mm = read_parts(&gguf("llama-gqa", "mmproj-f32.gguf"));
    let vision = mm
        .tensors
        .iter()
        .find(|(n, _)| n == "mm.0.weight")
        .map(|(_, t)| t.shape().dims()[1])
        .unwrap();
    mm.tensors.retain(|(n, _)| !n.starts_with("mm."));
    for (name, shape) in [
        ("mm.0.weight", vec![hidden, vision]),
        ("mm.0.bias", vec![hidden]),
        ("mm.2.weight", vec![hidden, hidden]),
        ("mm.2.bias", vec![hidden]),
    ] {
        let t = QTensor::quantize(&random(&shape, 0.2), GgmlDType::F32).unwrap();
        mm.tensors.push((name.to_string(), t));
    }
    let mmproj = d.join("mmproj.gguf");
    write_parts(&mm, &mmproj);
    (text, mmproj)
}

#[test]
fn k_quants_are_dequantized_then_quantized_with_a_note() {
    let d = scratch("kquant");
    let (q4k, mm) = k_quant_pair(&d, GgmlDType::Q4K);
    let model = open(&q4k, Some(&mm), &Device::Cpu, None).unwrap();
    assert_eq!(model.format, WeightFormat::Q4);
    assert!(
        model
            .notes
            .iter()
            .any(|n| n.contains("Q4K") && n.contains("q4")),
        "{:?}",
        model.notes
    );
    // The same values stored dequantized (F32), quantized by glance at load: identical.
    let mut parts = read_parts(&q4k);
    for (_, t) in parts.tensors.iter_mut() {
        if t.dtype() == GgmlDType::Q4K {
            *t = QTensor::quantize(&t.dequantize(&Device::Cpu).unwrap(), GgmlDType::F32).unwrap();
        }
    }
    let plain = d.join("text-dequantized.gguf");
    write_parts(&parts, &plain);
    let reference = open(&plain, Some(&mm), &Device::Cpu, Some(WeightFormat::Q4)).unwrap();
    let ids: Vec<u32> = (1..40).collect();
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    // (t, vocab) logits of the whole sequence.
    let rows = |m: &GgufModel| {
        let t = m.model.text();
        let x = glance_nn::CausalLm::embed_tokens(t, &ids).unwrap();
        let h = t
            .forward_uncached(&x, &positions, &glance_nn::AttnMask::Causal)
            .unwrap();
        t.logits_rows(&h).unwrap()
    };
    let (a, b) = (rows(&model), rows(&reference));
    let diff: f32 = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert_eq!(diff, 0.0);
    // Q6_K goes to q8.
    let (q6k, mm) = k_quant_pair(&d, GgmlDType::Q6K);
    let model = open(&q6k, Some(&mm), &Device::Cpu, None).unwrap();
    assert_eq!(model.format, WeightFormat::Q8);
    assert!(
        model.notes.iter().any(|n| n.contains("Q6K")),
        "{:?}",
        model.notes
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// GPT-2's byte → character map (printable bytes stand for themselves, the rest are moved to
/// U+0100 and up), as byte-level BPE vocabularies spell their tokens.
fn byte_chars() -> Vec<char> {
    let keep =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if keep(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

#[test]
fn a_gpt2_vocabulary_tokenizes_byte_level() {
    let d = scratch("gpt2");
    let mut tokens: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
    for t in ["hi", "Ġh", "Ġhi", "<|endoftext|>"] {
        tokens.push(t.to_string());
    }
    let mut types = vec![1i32; tokens.len()];
    *types.last_mut().unwrap() = 3;
    let strings = |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
    let merges: Vec<String> = ["Ġ h", "h i", "Ġh i"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let eos = tokens.len() as u32 - 1;
    for pre in ["qwen2", "default"] {
        let parts = Parts {
            metadata: vec![
                ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
                ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
                ("tokenizer.ggml.tokens".into(), strings(&tokens)),
                (
                    "tokenizer.ggml.token_type".into(),
                    Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
                ),
                ("tokenizer.ggml.merges".into(), strings(&merges)),
                ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
            ],
            tensors: vec![],
        };
        let path = d.join(format!("{pre}.gguf"));
        write_parts(&parts, &path);
        let t = tokenizer::text_processor(&GgufFile::open(&path).unwrap(), None).unwrap();
        let ids = t.encode_raw("hi hi<|endoftext|>").unwrap();
        let id = |s: &str| tokens.iter().position(|t| t == s).unwrap() as u32;
        assert_eq!(ids, [id("hi"), id("Ġhi"), eos], "{pre}");
        assert_eq!(t.decode(&ids, true).unwrap(), "hi hi");
        assert!(t.is_eos(eos));
        // Bytes outside ASCII travel as their byte-level characters.
        let e = t.encode_plain("é").unwrap();
        assert_eq!(t.decode(&e, false).unwrap(), "é");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Newer mmproj converters name CLIP's fc1 `ffn_up` and fc2 `ffn_down` (the legacy converter
/// the other way round): both load to the same tower.
#[test]
fn either_mlp_naming_of_the_mmproj_loads_the_same_tower() {
    let d = scratch("fc-names");
    let mut parts = read_parts(&gguf("llama-gqa", "mmproj-f32.gguf"));
    for (name, _) in parts.tensors.iter_mut() {
        *name = if name.contains(".ffn_down.") {
            name.replace(".ffn_down.", ".ffn_up.")
        } else {
            name.replace(".ffn_up.", ".ffn_down.")
        };
    }
    let swapped = d.join("mmproj.gguf");
    write_parts(&parts, &swapped);
    let text = gguf("llama-gqa", "text-f16.gguf");
    let a = open(
        &text,
        Some(&gguf("llama-gqa", "mmproj-f32.gguf")),
        &Device::Cpu,
        None,
    )
    .unwrap();
    let b = open(&text, Some(&swapped), &Device::Cpu, None).unwrap();
    let s = a.config().vision.image_size;
    let pixels = Tensor::randn(0f32, 1.0, (3, s, s), &Device::Cpu).unwrap();
    let fa = a.model.encode_image(&pixels).unwrap().features;
    let fb = b.model.encode_image(&pixels).unwrap().features;
    let diff: f32 = (fa - fb)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert_eq!(diff, 0.0);
    std::fs::remove_dir_all(&d).unwrap();
}

/// `(rows, cols)` of values in [-1, 1) that follow no pattern a model could fit, and are the
/// same on every run.
fn scrambled(rows: usize, cols: usize) -> Tensor {
    let mut state = 0x9e37_79b9_u32;
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// A quantized GGUF computes, bit for bit, what glance's own load of its directory in that
/// format computes — tower, projector, decoder and LM head, over a few hundred positions —
/// once both turn RoPE alike. They do not quite: llama.cpp writes Llama 3's frequency schedule
/// as per-frequency divisors (`rope_freqs.weight`), and `inv_freq / divisor` is an ulp or two
/// off Hugging Face's `(1 - s) · inv_freq / factor + s · inv_freq` in the band between the two
/// wavelengths. Here the directory's model takes the file's divisors; the engine's test
/// (glance-engine/tests/gguf.rs) compares the two as users load them.
#[test]
fn a_quantized_gguf_computes_what_its_directory_does() {
    for model in ["llama-gqa", "mistral", "qwen2"] {
        for (file, format) in [
            ("text-q8_0.gguf", WeightFormat::Q8),
            ("text-q4_0.gguf", WeightFormat::Q4),
        ] {
            let g = open(
                &gguf(model, file),
                Some(&gguf(model, "mmproj-f32.gguf")),
                &Device::Cpu,
                Some(format),
            )
            .unwrap();
            let dir = fixtures().join("models").join(model);
            let mut config = LlavaConfig::from_dir(&dir).unwrap();
            if model == "llama-gqa" {
                assert!(matches!(
                    g.config().text.rope_scaling,
                    Some(glance_nn::RopeScaling::Factors(_))
                ));
                config.text.rope_scaling = g.config().text.rope_scaling.clone();
            }
            let vb = crate::checkpoint::var_builder(&dir, DType::F32, &Device::Cpu).unwrap();
            let load = WeightLoad::new(format).with_source(Arc::new(
                crate::checkpoint::MappedTensors::open(&dir).unwrap(),
            ));
            let d = Llava::from_var_builder_as(
                &vb,
                config,
                &WeightLayout::detect(&vb),
                Mode::Infer,
                &load,
            )
            .unwrap();
            let what = format!("{model} {file}");
            let s = d.config().vision.image_size;
            let pixels = scrambled(3 * s, s).reshape((3, s, s)).unwrap();
            let (a, b) = (
                d.encode_image(&pixels).unwrap(),
                g.model.encode_image(&pixels).unwrap(),
            );
            assert_eq!(
                max_diff(&a.features, &b.features),
                0.0,
                "{what}: image features"
            );
            let t = 300;
            let xs = scrambled(t, d.config().text.hidden_size);
            let positions: Vec<u32> = (0..t as u32).collect();
            let mask = glance_nn::AttnMask::causal();
            let logits = |m: &Llava| {
                let h = m.text().forward_uncached(&xs, &positions, &mask).unwrap();
                m.text().raw_logits(&h).unwrap()
            };
            assert_eq!(
                max_diff(&logits(&d), &logits(&g.model)),
                0.0,
                "{what}: logits"
            );
        }
    }
}
