//! Unit tests with tokenizers built here: a Llama-style SentencePiece BPE (byte fallback, `▁`,
//! `<s>` added by a `TemplateProcessing` post-processor) and a word-level one like glance-tiny's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value as Json};

use super::*;
use crate::processing::chat::{ChatMessage, ChatTemplate};

const LLAVA_15_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

/// A fresh, empty directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("glance-text-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn added(id: u32, content: &str) -> Json {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": true})
}

fn bos_post_processor() -> Json {
    json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})
}

/// Llama-2-style tokenizer.json: BPE with byte fallback over `▁`, ASCII letters and punctuation
/// (so `é`, `你`, `🎉` fall back to bytes), `<image>` as an added special token.
fn llama_tokenizer_json() -> (Json, u32) {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), json!(i));
    }
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(3 + b));
    }
    let mut next = 259u32;
    let mut push = |vocab: &mut serde_json::Map<String, Json>, t: String| {
        if !vocab.contains_key(&t) {
            vocab.insert(t, json!(next));
            next += 1;
        }
    };
    let base = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,?!':\n";
    for c in base.chars() {
        push(&mut vocab, c.to_string());
    }
    let merges = [
        ("▁", "t"),
        ("h", "e"),
        ("▁t", "he"),
        ("▁", "a"),
        ("i", "s"),
        ("▁", "is"),
        ("▁", "w"),
        ("o", "r"),
        ("▁w", "or"),
        ("l", "d"),
        ("▁wor", "ld"),
        ("▁", "W"),
        ("h", "a"),
        ("▁W", "ha"),
        ("▁Wha", "t"),
        ("▁", "c"),
        ("a", "t"),
        ("▁c", "at"),
        ("n", "'"),
        ("n'", "t"),
        ("▁", "U"),
        ("S", "E"),
        ("▁U", "SE"),
        ("▁USE", "R"),
        ("▁USER", ":"),
        ("▁", "H"),
        ("e", "l"),
        ("el", "l"),
        ("ell", "o"),
        ("▁H", "ello"),
    ];
    for (a, b) in merges {
        push(&mut vocab, format!("{a}{b}"));
    }
    let image_id = next;
    let merges: Vec<Json> = merges.iter().map(|(a, b)| json!([a, b])).collect();
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"), added(image_id, "<image>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": bos_post_processor(),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    (tok, image_id)
}

const WORDS: [&str; 20] = [
    "what",
    "is",
    "this",
    "?",
    ".",
    ",",
    "!",
    "'",
    "n't",
    "'m",
    "'s",
    "'ve",
    "'re",
    "the",
    "cat",
    "red",
    "USER",
    ":",
    "ASSISTANT",
    "n",
];

/// A word-level tokenizer like glance-tiny's: `<unk> <s> </s> <pad> <image>` then words; no
/// decoder (tokens are joined with spaces).
fn word_tokenizer_json() -> Json {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
        .iter()
        .chain(WORDS.iter())
        .enumerate()
    {
        vocab.insert(t.to_string(), json!(i));
    }
    json!({
        "version": "1.0", "truncation": {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
        "padding": null,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"), added(3, "<pad>"), added(4, "<image>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": bos_post_processor(),
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

fn llama_dir(tag: &str) -> (PathBuf, u32) {
    let dir = temp_dir(tag);
    let (tok, image_id) = llama_tokenizer_json();
    write(&dir, "tokenizer.json", &tok.to_string());
    write(
        &dir,
        "tokenizer_config.json",
        &json!({"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
                "eos_token": "</s>", "unk_token": "<unk>", "pad_token": null,
                "chat_template": LLAVA_15_TEMPLATE})
        .to_string(),
    );
    (dir, image_id)
}

fn word_dir(tag: &str, clean_up: bool) -> PathBuf {
    let dir = temp_dir(tag);
    write(&dir, "tokenizer.json", &word_tokenizer_json().to_string());
    write(
        &dir,
        "tokenizer_config.json",
        &json!({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                "clean_up_tokenization_spaces": clean_up})
        .to_string(),
    );
    dir
}

/// A small deterministic PRNG (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn stream_all(p: &TextProcessor, ids: &[u32]) -> (Vec<String>, String) {
    let mut s = p.stream_decoder();
    let mut pieces: Vec<String> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
    pieces.push(s.finish().unwrap());
    let joined = pieces.concat();
    (pieces, joined)
}

#[test]
fn encode_raw_adds_bos_encode_plain_does_not() {
    let (dir, _) = llama_dir("bos");
    let p = TextProcessor::from_dir(&dir).unwrap();
    let raw = p.encode_raw("What is the world").unwrap();
    let plain = p.encode_plain("What is the world").unwrap();
    assert_eq!(raw[0], 1);
    assert_eq!(&raw[1..], &plain[..]);
    assert_ne!(plain[0], 1);
    assert_eq!(p.decode(&raw, true).unwrap(), "What is the world");
    assert_eq!(p.decode(&raw, false).unwrap(), "<s> What is the world");

    let p = TextProcessor::from_dir(&word_dir("bos-w", false)).unwrap();
    assert_eq!(p.encode_raw("what is this ?").unwrap(), vec![1, 5, 6, 7, 8]);
    assert_eq!(p.encode_plain("what is this ?").unwrap(), vec![5, 6, 7, 8]);
}

#[test]
fn special_tokens_and_vocab() {
    let (dir, image_id) = llama_dir("special");
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert_eq!(p.bos_token(), Some("<s>"));
    assert_eq!(p.eos_token(), Some("</s>"));
    assert_eq!(p.unk_token(), Some("<unk>"));
    assert_eq!(p.pad_token(), None);
    assert_eq!(p.token_id("<image>"), Some(image_id));
    assert_eq!(p.token_id("<0x41>"), Some(3 + 0x41));
    assert_eq!(p.token_id("no-such-token"), None);
    assert_eq!(p.vocab_size(), image_id as usize + 1);
    assert_eq!(p.eos_token_ids(), &[2]);
    assert!(p.is_eos(2) && !p.is_eos(1));
}

#[test]
fn image_tokens_expand_to_one_id_each() {
    let (dir, image_id) = llama_dir("image");
    let p = TextProcessor::from_dir(&dir).unwrap();
    let prompt = p
        .apply_chat_template(&[ChatMessage::user("What is this?", 1)], true)
        .unwrap();
    assert_eq!(prompt, "USER: <image>\nWhat is this? ASSISTANT:");
    let expanded = expand_image_tokens(&prompt, "<image>", 576);
    let ids = p.encode_raw(&expanded).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == image_id).count(), 576);
    let first = ids.iter().position(|&i| i == image_id).unwrap();
    assert!(
        ids[first..first + 576].iter().all(|&i| i == image_id),
        "image ids are contiguous"
    );
    assert_eq!(ids[0], 1);
    // The llava-1.5 template writes no BOS, so the processor adds one.
    assert_eq!(p.encode_prompt(&expanded).unwrap(), ids);

    let p = TextProcessor::from_dir(&word_dir("image-w", false)).unwrap();
    let ids = p
        .encode_plain(&expand_image_tokens(
            "<image>\nwhat is this ?",
            "<image>",
            576,
        ))
        .unwrap();
    assert_eq!(ids.len(), 576 + 4);
    assert!(ids[..576].iter().all(|&i| i == 4));
}

#[test]
fn truncation_in_tokenizer_json_is_ignored() {
    // word_tokenizer_json has max_length 8; transformers' `tokenizer(text)` does not truncate.
    let p = TextProcessor::from_dir(&word_dir("trunc", false)).unwrap();
    assert_eq!(p.encode_raw(&"the cat ".repeat(20)).unwrap().len(), 41);
}

#[test]
fn template_writing_bos_is_not_doubled() {
    let (dir, _) = llama_dir("double-bos");
    write(
        &dir,
        "chat_template.jinja",
        "{{ bos_token }}{% for m in messages %}{{ m.content[0].text }}{% endfor %}",
    );
    let p = TextProcessor::from_dir(&dir).unwrap();
    let prompt = p
        .apply_chat_template(&[ChatMessage::user("Hello world", 0)], false)
        .unwrap();
    assert_eq!(prompt, "<s>Hello world");
    let ids = p.encode_prompt(&prompt).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1);
    assert_eq!(ids, p.encode_plain(&prompt).unwrap());
    // encode_raw would add a second BOS, as `tokenizer(prompt)` does.
    assert_eq!(&p.encode_raw(&prompt).unwrap()[..2], &[1, 1]);
}

#[test]
fn chat_template_precedence() {
    let (dir, _) = llama_dir("prec");
    // Only tokenizer_config: its template.
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert!(p
        .chat_template_file()
        .unwrap()
        .ends_with("tokenizer_config.json"));
    // chat_template.json beats tokenizer_config.json.
    write(
        &dir,
        "chat_template.json",
        &json!({"chat_template": "json"}).to_string(),
    );
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert_eq!(p.apply_chat_template(&[], false).unwrap(), "json");
    // chat_template.jinja beats both (a single trailing newline is dropped, as in Jinja2).
    write(&dir, "chat_template.jinja", "jinja\n");
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert_eq!(p.apply_chat_template(&[], false).unwrap(), "jinja");
    assert!(p
        .chat_template_file()
        .unwrap()
        .ends_with("chat_template.jinja"));

    // A list of named templates: "default" wins.
    let dir = word_dir("prec-list", false);
    write(
        &dir,
        "tokenizer_config.json",
        &json!({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]})
            .to_string(),
    );
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert_eq!(p.apply_chat_template(&[], false).unwrap(), "plain");
    assert_eq!(p.bos_token(), None);
    // No template at all.
    let p = TextProcessor::from_dir(&word_dir("prec-none", false)).unwrap();
    assert!(p.chat_template().is_none());
    assert!(matches!(
        p.apply_chat_template(&[], false),
        Err(Error::Template(_))
    ));
}

#[test]
fn eos_ids_from_config_and_generation_config() {
    let dir = word_dir("eos", false);
    write(
        &dir,
        "generation_config.json",
        r#"{"eos_token_id": [2, 7, 2], "bos_token_id": 1}"#,
    );
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert_eq!(p.eos_token_ids(), &[2, 7]);
    write(&dir, "generation_config.json", r#"{"eos_token_id": 3}"#);
    assert_eq!(
        TextProcessor::from_dir(&dir).unwrap().eos_token_ids(),
        &[2, 3]
    );
    write(&dir, "generation_config.json", r#"{"eos_token_id": "x"}"#);
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Tokenizer(_))
    ));
    // special_tokens_map.json fills what tokenizer_config.json lacks.
    write(&dir, "generation_config.json", "{}");
    write(&dir, "tokenizer_config.json", "{}");
    write(
        &dir,
        "special_tokens_map.json",
        r#"{"eos_token": {"content": "</s>"}, "bos_token": "<s>"}"#,
    );
    let p = TextProcessor::from_dir(&dir).unwrap();
    assert_eq!((p.bos_token(), p.eos_token()), (Some("<s>"), Some("</s>")));
    assert_eq!(p.eos_token_ids(), &[2]);
}

#[test]
fn loading_errors() {
    let dir = temp_dir("err-missing");
    match TextProcessor::from_dir(&dir) {
        Err(Error::MissingFile { what, .. }) => assert_eq!(what, "tokenizer.json"),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    write(&dir, "tokenizer.json", "{ not json");
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Tokenizer(_))
    ));
    write(
        &dir,
        "tokenizer.json",
        r#"{"model": {"type": "NoSuchModel"}}"#,
    );
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Tokenizer(_))
    ));
    write(&dir, "tokenizer.json", "");
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Tokenizer(_))
    ));

    let dir = word_dir("err-config", false);
    write(&dir, "tokenizer_config.json", "{\"bos_token\": ");
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Json { .. })
    ));

    let dir = word_dir("err-template", false);
    write(
        &dir,
        "chat_template.jinja",
        "{% for m in messages %}{{ m.role }",
    );
    match TextProcessor::from_dir(&dir) {
        Err(Error::Template(msg)) => assert!(msg.contains("chat_template.jinja"), "{msg}"),
        other => panic!("expected a template error, got {other:?}"),
    }
    let dir = word_dir("err-template-list", false);
    write(
        &dir,
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "default"}]}"#,
    );
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Template(_))
    ));
    write(&dir, "tokenizer_config.json", r#"{"chat_template": 3}"#);
    assert!(matches!(
        TextProcessor::from_dir(&dir),
        Err(Error::Template(_))
    ));
}

#[test]
fn decode_skips_unknown_ids_without_panicking() {
    let p = TextProcessor::from_dir(&word_dir("oob", false)).unwrap();
    assert_eq!(p.decode(&[5, 999_999, 6], true).unwrap(), "what is");
    let mut s = p.stream_decoder();
    assert_eq!(s.push(u32::MAX).unwrap(), "");
    assert_eq!(s.finish().unwrap(), "");
}

#[test]
fn stream_pieces_for_sentencepiece_text() {
    let (dir, _) = llama_dir("stream-sp");
    let p = TextProcessor::from_dir(&dir).unwrap();
    let text = "Hello world, what is the cat? héllo 你好 🎉 isn't it";
    let ids = p.encode_plain(text).unwrap();
    assert!(ids.contains(&(3 + 0xE4)), "你 falls back to bytes");
    let (pieces, joined) = stream_all(&p, &ids);
    assert_eq!(joined, text);
    assert_eq!(joined, p.decode(&ids, true).unwrap());
    assert!(pieces.iter().all(|s| !s.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(
        pieces[0], "Hello",
        "the leading ▁ of the first token is stripped, as in decode"
    );
    assert!(pieces.contains(&" world".to_string()), "{pieces:?}");
    assert!(pieces.iter().any(|s| s.contains('你')));
}

#[test]
fn stream_equals_decode_on_random_ids() {
    let (dir, image_id) = llama_dir("stream-rand");
    let p = TextProcessor::from_dir(&dir).unwrap();
    let vocab = p.vocab_size();
    assert_eq!(vocab, image_id as usize + 1);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..600 {
        let len = rng.below(40);
        let ids: Vec<u32> = (0..len)
            .map(|_| match rng.below(4) {
                // Bias towards byte tokens (multi-byte UTF-8 split across tokens, valid or not).
                0 => 3 + 0x80 + rng.below(0x80) as u32,
                1 => 3 + rng.below(0x80) as u32,
                _ => rng.below(vocab) as u32,
            })
            .collect();
        let (_, joined) = stream_all(&p, &ids);
        assert_eq!(
            joined,
            p.decode(&ids, true).unwrap(),
            "round {round}: {ids:?}"
        );
    }
}

#[test]
fn stream_never_emits_partial_utf8() {
    let (dir, _) = llama_dir("stream-utf8");
    let p = TextProcessor::from_dir(&dir).unwrap();
    let mut rng = Rng(42);
    let alphabet = ["a", "▁the", "é", "你", "🎉", "▁", "?", "ß", "▁world", "n't"];
    for round in 0..300 {
        let text: String = (0..rng.below(12))
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
        let ids = p.encode_plain(&text.replace('▁', " ")).unwrap();
        let (pieces, joined) = stream_all(&p, &ids);
        let full = p.decode(&ids, true).unwrap();
        assert!(!full.contains('\u{FFFD}'));
        assert_eq!(joined, full, "round {round}");
        assert!(
            pieces.iter().all(|s| !s.contains('\u{FFFD}')),
            "round {round}: {pieces:?}"
        );
    }
}

#[test]
fn stream_with_clean_up_tokenization_spaces() {
    let p = TextProcessor::from_dir(&word_dir("stream-clean", true)).unwrap();
    assert!(p.clean_up_tokenization_spaces());
    let ids = p
        .encode_plain("what is this ? the cat n't ' the , red 'm .")
        .unwrap();
    assert_eq!(
        p.decode(&ids, true).unwrap(),
        "what is this? the catn't'the, red'm."
    );
    let (_, joined) = stream_all(&p, &ids);
    assert_eq!(joined, p.decode(&ids, true).unwrap());
    let mut rng = Rng(7);
    let vocab = p.vocab_size();
    for round in 0..600 {
        let ids: Vec<u32> = (0..rng.below(30))
            .map(|_| rng.below(vocab) as u32)
            .collect();
        let (_, joined) = stream_all(&p, &ids);
        assert_eq!(
            joined,
            p.decode(&ids, true).unwrap(),
            "round {round}: {ids:?}"
        );
    }
    // Without clean-up the spaces stay.
    let p = TextProcessor::from_dir(&word_dir("stream-noclean", false)).unwrap();
    assert_eq!(
        p.decode(&p.encode_plain("this ?").unwrap(), true).unwrap(),
        "this ?"
    );
}

#[test]
fn stream_skips_special_tokens_and_continues_after_finish() {
    let (dir, image_id) = llama_dir("stream-special");
    let p = TextProcessor::from_dir(&dir).unwrap();
    let mut ids = p.encode_plain("Hello").unwrap();
    ids.push(image_id);
    ids.extend(p.encode_plain("world").unwrap());
    ids.push(2);
    let (_, joined) = stream_all(&p, &ids);
    assert_eq!(joined, "Hello world");
    assert_eq!(joined, p.decode(&ids, true).unwrap());

    let mut s = p.stream_decoder();
    let mut out = String::new();
    for &id in &p.encode_plain("the cat").unwrap() {
        out += &s.push(id).unwrap();
    }
    out += &s.finish().unwrap();
    for &id in &p.encode_plain("is").unwrap() {
        out += &s.push(id).unwrap();
    }
    // A finish right after a skipped special token, then more text.
    out += &s.push(image_id).unwrap();
    out += &s.finish().unwrap();
    for &id in &p.encode_plain("world").unwrap() {
        out += &s.push(id).unwrap();
    }
    out += &s.finish().unwrap();
    assert_eq!(out, p.decode(s.ids(), true).unwrap());
    assert_eq!(out, "the cat is world");
}

#[test]
fn processor_and_template_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TextProcessor>();
    assert_send_sync::<ChatTemplate>();
}
