//! The tokenizer files load with the `tokenizers` crate, every generated text tokenises without
//! `<unk>` and decodes back, the chat template renders exactly like `chat_text` / `chat_prompt`,
//! and every vocabulary word is actually used.

use std::collections::HashSet;

use glance_world::score::normalize;
use glance_world::tokenizer::{
    chat_prompt, chat_text, tokenizer_config_json, tokenizer_json, CHAT_TEMPLATE,
};
use glance_world::vocab;
use glance_world::{sample, Split};
use tokenizers::Tokenizer;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_bytes(tokenizer_json().as_bytes()).expect("tokenizer.json loads")
}

#[test]
fn every_generated_text_tokenises_without_unk() {
    let tok = tokenizer();
    assert_eq!(tok.get_vocab_size(true), vocab::vocab_size());
    let unk = tok.token_to_id(vocab::UNK).unwrap();
    let mut used: HashSet<u32> = HashSet::new();
    for split in Split::ALL {
        for i in 0..1500 {
            let ex = sample(split, i).unwrap();
            let mut texts: Vec<String> = Vec::new();
            for qa in ex.questions.iter().chain(&ex.dialogue.turns) {
                texts.push(qa.question.clone());
                texts.push(qa.answer.clone());
            }
            texts.push(chat_text(&ex.dialogue.turns));
            for t in &texts {
                let enc = tok.encode(t.as_str(), true).unwrap();
                assert!(
                    !enc.get_ids().contains(&unk),
                    "<unk> in {t:?}: {:?}",
                    enc.get_tokens()
                );
                assert_eq!(enc.get_ids()[0], tok.token_to_id(vocab::BOS).unwrap());
                used.extend(enc.get_ids());
                let back = tok.decode(enc.get_ids(), true).unwrap();
                if !t.contains("USER") {
                    assert_eq!(back, t.to_lowercase(), "round trip of {t:?}");
                    assert_eq!(normalize(&back), normalize(t));
                }
            }
        }
    }
    let unused: Vec<String> = vocab::tokens()
        .into_iter()
        .enumerate()
        .filter(|(i, t)| !used.contains(&(*i as u32)) && !vocab::SPECIAL.contains(&t.as_str()))
        .map(|(_, t)| t)
        .collect();
    assert!(
        unused.is_empty(),
        "vocabulary words never produced: {unused:?}"
    );
}

#[test]
fn numbers_are_read_digit_by_digit() {
    let tok = tokenizer();
    let enc = tok.encode("42", false).unwrap();
    assert_eq!(enc.get_tokens(), &["4", "##2"]);
    assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), "42");
    let enc = tok
        .encode("USER: <image>\nWhat is it? ASSISTANT: red</s>", true)
        .unwrap();
    assert_eq!(
        enc.get_tokens(),
        &[
            "<s>",
            "user",
            ":",
            "<image>",
            "what",
            "is",
            "it",
            "?",
            "assistant",
            ":",
            "red",
            "</s>"
        ]
    );
    assert_eq!(
        tok.encode("Purple Zebra", false).unwrap().get_tokens(),
        &["purple", "<unk>"]
    );
}

/// serde_json → minijinja (minijinja's `serde` feature is not enabled in this workspace).
fn to_jinja(v: &serde_json::Value) -> minijinja::Value {
    use minijinja::Value;
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => Value::from(n.as_i64().unwrap_or_default()),
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(to_jinja).collect::<Vec<_>>()),
        serde_json::Value::Object(m) => Value::from(
            m.iter()
                .map(|(k, v)| (k.clone(), to_jinja(v)))
                .collect::<std::collections::BTreeMap<String, Value>>(),
        ),
    }
}

#[test]
fn chat_template_matches_chat_text() {
    let config: serde_json::Value = serde_json::from_str(&tokenizer_config_json()).unwrap();
    assert_eq!(config["chat_template"], CHAT_TEMPLATE);
    assert_eq!(config["bos_token"], "<s>");
    assert_eq!(config["eos_token"], "</s>");
    assert_eq!(config["pad_token"], "<pad>");
    let mut env = minijinja::Environment::new();
    env.add_template("chat", CHAT_TEMPLATE).unwrap();
    let tmpl = env.get_template("chat").unwrap();
    for i in 0..50 {
        let ex = sample(Split::Test, i).unwrap();
        let turns = &ex.dialogue.turns;
        let mut messages = Vec::new();
        for (k, t) in turns.iter().enumerate() {
            let user = if k == 0 {
                serde_json::json!({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t.question}]})
            } else {
                serde_json::json!({"role": "user", "content": t.question})
            };
            messages.push(user);
            messages.push(serde_json::json!({"role": "assistant", "content": t.answer}));
        }
        let full = tmpl.render(minijinja::context! { messages => to_jinja(&serde_json::Value::Array(messages.clone())), add_generation_prompt => false }).unwrap();
        assert_eq!(full, chat_text(turns));
        // Prompt for the last turn.
        let last = turns.last().unwrap();
        messages.pop();
        let prompt = tmpl.render(minijinja::context! { messages => to_jinja(&serde_json::Value::Array(messages.clone())), add_generation_prompt => true }).unwrap();
        assert_eq!(
            prompt,
            chat_prompt(&turns[..turns.len() - 1], &last.question)
        );
        assert!(prompt.starts_with("USER: <image>\n") && prompt.ends_with(" ASSISTANT:"));
    }
}

/// Loads the files in Python (`tokenizers` + `transformers`): run with `--ignored` where they are
/// installed.
#[test]
#[ignore = "needs python3 with tokenizers and transformers"]
fn python_loads_the_tokenizer() {
    let dir = std::env::temp_dir().join(format!("glance-world-tok-{}", std::process::id()));
    glance_world::tokenizer::write_tokenizer_files(&dir.join("tok")).unwrap();
    glance_world::write_sample(Split::Test, 64, &dir.join("sample")).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check_tokenizer.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(dir.join("tok"))
        .arg(dir.join("sample"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", String::from_utf8_lossy(&out.stdout));
}
