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

/// A dialogue packs to exactly the ids the chat template gives the whole conversation (every
/// turn with its answer), and its positions run on across the turns.
#[test]
fn packed_dialogues_equal_the_chat_template() {
    use glance_train::{TurnMix, Turns};
    let (model, data, _dir) = common::tiny("dialogue");
    let n_img = model.config.image_tokens_per_image();
    let proc = &data.processor;
    let mix = TurnMix {
        dialogue: 1.0,
        relation: 1.0,
        spatial: 2.0,
    };
    let mut follow_ups = 0;
    for index in 0..8 {
        let ex = sample(Split::Train, index).unwrap();
        let turns = data.turns_with(&ex.scene, ex.seed, 6, &mix);
        assert!(turns.dialogue.len() >= 2, "{turns:?}");
        assert!(!turns.singles.is_empty());
        follow_ups += turns.dialogue.iter().filter(|t| t.follow_up).count();
        let mut messages = Vec::new();
        for (k, qa) in turns.dialogue.iter().enumerate() {
            messages.push(ChatMessage::user(&qa.question, usize::from(k == 0)));
            messages.push(ChatMessage::assistant(&qa.answer));
        }
        let text = proc.text.apply_chat_template(&messages, false).unwrap();
        let want = proc
            .text
            .encode_prompt(&expand_image_tokens(&text, proc.image_token(), n_img))
            .unwrap();
        let packed = data
            .pack(&Turns {
                dialogue: turns.dialogue.clone(),
                singles: Vec::new(),
            })
            .unwrap();
        assert_eq!(packed.ids, want, "dialogue {:?}", turns.dialogue);
        let positions: Vec<u32> = (0..want.len() as u32).collect();
        assert_eq!(packed.positions, positions);
        // Every answer token (with its </s>) is a target.
        let answers: usize = turns
            .dialogue
            .iter()
            .map(|qa| data.answer_ids(&qa.answer).unwrap().len())
            .sum();
        assert_eq!(packed.targets.len(), answers);
    }
    assert!(follow_ups > 0, "some dialogues have follow-ups");
}

/// With the default mix the turns are v1's independent turns, unchanged.
#[test]
fn the_default_mix_draws_the_v1_turns() {
    use glance_train::TurnMix;
    let (_model, data, _dir) = common::tiny("v1-mix");
    for index in 0..20 {
        let ex = sample(Split::Train, index).unwrap();
        let v1 = data.turns(&ex.scene, ex.seed, 6);
        let now = data.turns_with(&ex.scene, ex.seed, 6, &TurnMix::default());
        assert!(now.dialogue.is_empty());
        assert_eq!(now.singles, v1);
    }
}
