//! Text-side parity with transformers, against the golden fixtures of `scripts/make_fixtures.py`
//! (`fixtures/manifest.json`): chat-template rendering, prompt tokenisation with image-token
//! expansion, and decoding of the greedy outputs.
//!
//! The fixtures are committed: a missing `fixtures/manifest.json` is a failure, not a skip.

use std::path::{Path, PathBuf};

use glance_models::processing::chat::{expand_image_tokens, ChatMessage};
use glance_models::processing::tokenizer::TextProcessor;
use serde_json::Value as Json;

const IMAGE_TOKEN: &str = "<image>";

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn manifest() -> Json {
    let path = fixtures_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} (committed fixture): {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids_of(value: &Json) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect()
}

/// A 1-D (or `(1, n)`) i64 tensor of a safetensors file as u32 ids.
fn read_ids(path: &Path, name: &str) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor(name).unwrap();
    assert_eq!(
        view.dtype(),
        safetensors::Dtype::I64,
        "{name} in {}",
        path.display()
    );
    view.data()
        .chunks_exact(8)
        .map(|c| u32::try_from(i64::from_le_bytes(c.try_into().unwrap())).unwrap())
        .collect()
}

fn processor(model: &str) -> TextProcessor {
    TextProcessor::from_dir(&fixtures_dir().join(model)).unwrap()
}

#[test]
fn chat_templates_render_and_tokenize_like_transformers() {
    let manifest = manifest();
    let chats = manifest["chat"].as_array().unwrap();
    assert!(!chats.is_empty());
    for chat in chats {
        let model = chat["model"].as_str().unwrap();
        let p = processor(model);
        assert!(
            p.chat_template_file()
                .unwrap()
                .ends_with("chat_template.jinja"),
            "{model}: template read from {:?}",
            p.chat_template_file()
        );
        let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let agp = chat["add_generation_prompt"].as_bool().unwrap_or(true);
        let rendered = p.apply_chat_template(&messages, agp).unwrap();
        assert_eq!(
            rendered,
            chat["rendered"].as_str().unwrap(),
            "{model}: rendered prompt"
        );

        let add_special = chat["add_special_tokens"].as_bool().unwrap();
        let encode = |text: &str| {
            if add_special {
                p.encode_raw(text)
            } else {
                p.encode_plain(text)
            }
        };
        if let Some(text_ids) = chat.get("text_input_ids") {
            assert_eq!(
                encode(&rendered).unwrap(),
                ids_of(text_ids),
                "{model}: ids of the rendered prompt"
            );
        }

        let expected = ids_of(&chat["input_ids"]);
        let image_id = p.token_id(IMAGE_TOKEN).unwrap();
        let placeholders = rendered.matches(IMAGE_TOKEN).count();
        let image_ids = expected.iter().filter(|&&i| i == image_id).count();
        assert!(placeholders > 0 && image_ids % placeholders == 0, "{model}");
        let expanded = expand_image_tokens(&rendered, IMAGE_TOKEN, image_ids / placeholders);
        assert_eq!(
            encode(&expanded).unwrap(),
            expected,
            "{model}: processor input_ids"
        );
        // What glance's pipeline does without being told: the processor's BOS rule.
        assert_eq!(
            p.encode_prompt(&expanded).unwrap(),
            expected,
            "{model}: encode_prompt"
        );
        let bos = p.token_id(p.bos_token().unwrap()).unwrap();
        assert_eq!(
            expected.iter().filter(|&&i| i == bos).count(),
            1,
            "{model}: one BOS"
        );
    }
}

#[test]
fn prompts_tokenize_like_transformers() {
    let manifest = manifest();
    let cases = manifest["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let p = processor(case["model"].as_str().unwrap());
        let tensors = fixtures_dir().join(case["tensors"].as_str().unwrap());
        let expected = read_ids(&tensors, "input_ids");
        let image_id = p.token_id(IMAGE_TOKEN).unwrap();
        let n = expected.iter().filter(|&&i| i == image_id).count();
        if let Some(n_manifest) = case.get("n_image_tokens").and_then(Json::as_u64) {
            assert_eq!(n as u64, n_manifest, "{name}");
        }
        let prompt = case["prompt"].as_str().unwrap();
        let ids = p
            .encode_raw(&expand_image_tokens(prompt, IMAGE_TOKEN, n))
            .unwrap();
        assert_eq!(ids, expected, "{name}: input_ids");
        // The prompt text comes back from the ids (minus BOS and the expanded image tokens).
        let text_only: Vec<u32> = ids.iter().copied().filter(|&i| i != image_id).collect();
        let decoded = p.decode(&text_only, true).unwrap();
        assert_eq!(decoded, prompt.replace(IMAGE_TOKEN, ""), "{name}: decode");
    }
}

#[test]
fn greedy_outputs_decode_like_transformers() {
    let manifest = manifest();
    let mut checked = 0;
    for case in manifest["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let Some(greedy_text) = case.get("greedy_text").and_then(Json::as_str) else {
            continue;
        };
        checked += 1;
        let p = processor(case["model"].as_str().unwrap());
        let tensors = fixtures_dir().join(case["tensors"].as_str().unwrap());
        let greedy = read_ids(&tensors, "greedy_ids");
        // The fixture decodes with skip_special_tokens=False.
        assert_eq!(
            p.decode(&greedy, false).unwrap(),
            greedy_text,
            "{name}: decode"
        );
        // Streaming reproduces the full decode (skip_special_tokens=True), ids out of the
        // tokenizer's range (the LM head is wider) included.
        let mut stream = p.stream_decoder();
        let mut streamed = String::new();
        for &id in &greedy {
            streamed += &stream.push(id).unwrap();
        }
        streamed += &stream.finish().unwrap();
        assert_eq!(streamed, p.decode(&greedy, true).unwrap(), "{name}: stream");
        if let Some(eos) = case.get("eos_token_id").and_then(Json::as_u64) {
            assert!(
                p.eos_token_ids().contains(&(eos as u32)),
                "{name}: eos ids {:?}",
                p.eos_token_ids()
            );
        }
    }
    assert!(checked > 0, "no fixture case has a greedy_text");
}
