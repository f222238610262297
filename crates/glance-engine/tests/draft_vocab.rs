//! A draft head with a reduced vocabulary (FR-Spec): the shipped glance-tiny heads given the
//! tokens of the target's own answers (or fewer) still decode exactly as autoregressive decoding
//! does, accept drafts, and never propose a token outside their vocabulary.

mod common;

use common::{head_with_vocab, shipped, world_image};
use glance_engine::{DecodeSpec, DraftKind, Engine, EngineOptions, Flow, Request};
use glance_models::draft::DraftHead;
use glance_models::llava::Llava;
use glance_nn::{CausalLm, DraftLm};

fn requests() -> Vec<Request> {
    [
        ("Describe the image in detail.", 0, 96),
        ("What colour is the largest object?", 1, 16),
        ("How many objects are there?", 2, 16),
        ("Describe the image in detail.", 3, 96),
    ]
    .into_iter()
    .map(|(text, image, n)| Request {
        max_new_tokens: n,
        ..Request::chat(text, vec![world_image(image)])
    })
    .collect()
}

fn run(e: &Engine, r: &Request) -> glance_engine::Response {
    e.generate(r, &mut |_| Flow::Continue).unwrap()
}

#[test]
fn reduced_vocabulary_heads_stay_lossless_and_accept_drafts() {
    let plain = Engine::load(&shipped("glance-tiny"), EngineOptions::single_request()).unwrap();
    let asked = requests();
    let want: Vec<_> = asked.iter().map(|r| run(&plain, r)).collect();
    // The tokens of the answers (EOS included): what FR-Spec's counting would keep.
    let mut answer_tokens: Vec<u32> = want.iter().flat_map(|r| r.token_ids.clone()).collect();
    answer_tokens.sort_unstable();
    answer_tokens.dedup();
    // Without the most frequent answer token, every draft of it is impossible: verification
    // must still emit it.
    let mut counts = std::collections::HashMap::<u32, usize>::new();
    want.iter()
        .flat_map(|r| &r.token_ids)
        .for_each(|&t| *counts.entry(t).or_default() += 1);
    let (&common, _) = counts.iter().max_by_key(|(t, n)| (**n, **t)).unwrap();
    let without: Vec<u32> = answer_tokens
        .iter()
        .copied()
        .filter(|&t| t != common)
        .collect();
    for kind in ["vispec", "eagle"] {
        for (name, vocab) in [
            ("answers", answer_tokens.clone()),
            ("without", without.clone()),
        ] {
            let dir = head_with_vocab(kind, &format!("{kind}-{name}"), Some(vocab));
            let e = Engine::load(
                &shipped("glance-tiny"),
                EngineOptions {
                    drafts: vec![dir],
                    ..EngineOptions::single_request()
                },
            )
            .unwrap();
            let spec = DecodeSpec::speculative(kind.parse::<DraftKind>().unwrap());
            let mut accepted = 0;
            for (r, want) in asked.iter().zip(&want) {
                let got = run(
                    &e,
                    &Request {
                        decode: spec.clone(),
                        ..r.clone()
                    },
                );
                assert_eq!(
                    got.token_ids, want.token_ids,
                    "{kind} {name}: {:?}",
                    r.prompt
                );
                accepted += got.decode.counters["accepted_tokens"];
            }
            assert!(accepted > 0, "{kind} {name}: no draft accepted");
        }
    }
}

#[test]
fn reduced_vocabulary_logits_are_the_target_heads_own_columns() {
    let target = Llava::load(&shipped("glance-tiny"), &candle_core::Device::Cpu).unwrap();
    let vocab = vec![5, 0, 77, 13];
    let dir = head_with_vocab("eagle", "columns", Some(vocab.clone()));
    let full = DraftHead::load(
        &head_with_vocab("eagle", "whole", None),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let reduced = DraftHead::load(&dir, &candle_core::Device::Cpu).unwrap();
    assert_eq!(full.vocab(), None);
    assert_eq!(reduced.vocab(), Some(&vocab[..]));
    // Their draft steps cost differently: the cost model keeps them apart.
    assert_eq!(glance_decode::cost::draft_key(&full), "eagle");
    assert_eq!(glance_decode::cost::draft_key(&reduced), "eagle vocab 4");
    let text: &dyn CausalLm = target.text();
    // (2, hidden)
    let hidden = text.embed_tokens(&[3, 9]).unwrap();
    let a = full.logits(text, &hidden).unwrap();
    let b = reduced.logits(text, &hidden).unwrap();
    assert!(a.ids.is_none());
    let a: Vec<Vec<f32>> = a.logits.to_vec2().unwrap();
    let (ids, b_rows): (Vec<u32>, Vec<Vec<f32>>) = (
        (0..vocab.len()).map(|j| b.token(j)).collect(),
        b.logits.to_vec2().unwrap(),
    );
    assert_eq!(ids, vocab);
    for (row_a, row_b) in a.iter().zip(&b_rows) {
        let want: Vec<f32> = vocab.iter().map(|&t| row_a[t as usize]).collect();
        assert_eq!(row_b, &want);
    }
}
