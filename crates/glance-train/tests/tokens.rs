//! Training sequences hold exactly the ids inference builds for the same turn.

mod common;

use glance_models::llava::PromptFormat;
use glance_models::processing::chat::{expand_image_tokens, ChatMessage};
use glance_world::{sample, Split};

#[test]
fn packed_segments_equal_the_inference_prompt_and_chat_template() {
    let (model, data, _dir) = common::tiny("tokens");
    let n_img = model.config.image_tokens_per_image();
    let proc = &data.processor;
    for index in 0..5 {
        let ex = sample(Split::Train, index).unwrap();
        for qa in data.turns(&ex.scene, ex.seed, 8) {
            // The prompt at inference: chat template with the generation prompt.
            let want = proc
                .prepare(&qa.question, 1, PromptFormat::Chat)
                .unwrap()
                .ids;
            let mut got = data.prefix().to_vec();
            got.extend(data.prompt_tail(&qa.question).unwrap());
            assert_eq!(got, want, "prompt of {:?}", qa.question);
            // The whole turn as the chat template renders it, answer and </s> included.
            let text = proc
                .text
                .apply_chat_template(
                    &[
                        ChatMessage::user(&qa.question, 1),
                        ChatMessage::assistant(&qa.answer),
                    ],
                    false,
                )
                .unwrap();
            let full = proc
                .text
                .encode_prompt(&expand_image_tokens(&text, proc.image_token(), n_img))
                .unwrap();
            got.extend(data.answer_ids(&qa.answer).unwrap());
            assert_eq!(got, full, "turn {:?} → {:?}", qa.question, qa.answer);
        }
    }
}

#[test]
fn turns_are_independent_and_varied() {
    let (_model, data, _dir) = common::tiny("turns");
    let mut families = std::collections::HashSet::new();
    for index in 0..20 {
        let ex = sample(Split::Train, index).unwrap();
        let turns = data.turns(&ex.scene, ex.seed, 8);
        assert!(turns.len() >= 4, "only {} turns", turns.len());
        assert!(turns.iter().all(|t| !t.follow_up));
        families.extend(turns.iter().map(|t| t.family));
    }
    assert_eq!(families.len(), 6, "{families:?}");
}
