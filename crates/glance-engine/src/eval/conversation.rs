//! The conversation half of the world evaluation: each image's dialogue
//! ([`glance_world::Example::dialogue`]) asked turn by turn.
//!
//! Turn `t` is asked after turns `0..t` with their **true** answers as the assistant's messages, so
//! a turn is scored on what the model makes of a correct conversation, not on its own earlier
//! mistakes. The image belongs to the first user message, as in the world's dialogues. Follow-ups
//! ("Where is it?") only make sense in context and are scored on their own; every other turn is
//! also asked alone (turn 0 is its own alone question), so the cost of the earlier turns shows as
//! the gap between the two.

use super::{ask, family_index, score, EvalOptions, FamilyScore, Rate};
use crate::{Engine, ImageInput, Message};
use glance_core::Result;
use glance_prune::PruneSpec;
use glance_world::{Example, Family};
use serde::Serialize;

/// What the dialogues scored.
#[derive(Debug, Clone, Serialize)]
pub struct DialogueScore {
    pub dialogues: usize,
    /// Every short-answer turn in context, follow-ups included.
    pub turns: Rate,
    /// The short-answer turns that are not follow-ups, in context.
    pub in_context: Rate,
    /// The same questions asked alone.
    pub alone: Rate,
    /// The follow-up turns.
    pub follow_up: Rate,
    /// The short-answer turns by their place in the dialogue (first turn first), follow-ups
    /// included.
    pub by_turn: Vec<Rate>,
    /// The turns that are not follow-ups, in context, per family in [`Family::ALL`] order
    /// (descriptions: object F1).
    pub families: Vec<FamilyScore>,
}

/// Running sums: (score sum, questions).
#[derive(Default)]
pub(super) struct DialogueAcc {
    dialogues: usize,
    in_context: [(f64, usize); 6],
    alone: [(f64, usize); 6],
    follow_up: (f64, usize),
    by_turn: Vec<(f64, usize)>,
}

fn add(slot: &mut (f64, usize), score: f64) {
    slot.0 += score;
    slot.1 += 1;
}

/// Sum of the short-answer families' slots.
fn short(slots: &[(f64, usize); 6]) -> (f64, usize) {
    let d = family_index(Family::Description);
    slots
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != d)
        .fold((0.0, 0), |(s, n), (_, &(a, b))| (s + a, n + b))
}

impl DialogueAcc {
    pub(super) fn report(&self) -> DialogueScore {
        let in_context = short(&self.in_context);
        let turns = (
            in_context.0 + self.follow_up.0,
            in_context.1 + self.follow_up.1,
        );
        DialogueScore {
            dialogues: self.dialogues,
            turns: Rate::of(turns),
            in_context: Rate::of(in_context),
            alone: Rate::of(short(&self.alone)),
            follow_up: Rate::of(self.follow_up),
            by_turn: self.by_turn.iter().map(|&s| Rate::of(s)).collect(),
            families: Family::ALL
                .iter()
                .map(|&family| {
                    let r = Rate::of(self.in_context[family_index(family)]);
                    FamilyScore {
                        family,
                        questions: r.questions,
                        score: r.score,
                    }
                })
                .collect(),
        }
    }
}

/// Asks `ex`'s dialogue turn by turn under `spec` and adds the scores to `acc`; returns the
/// questions asked.
pub(super) fn ask_dialogue(
    engine: &Engine,
    options: &EvalOptions,
    spec: &PruneSpec,
    ex: &Example,
    image: &ImageInput,
    acc: &mut super::Acc,
) -> Result<usize> {
    let acc_d = &mut acc.dialogue;
    acc_d.dialogues += 1;
    let mut asked = 0;
    let mut history: Vec<Message> = Vec::new();
    for (t, qa) in ex.dialogue.turns.iter().enumerate() {
        let user = |images| Message::user(&qa.question, images);
        let mut messages = history.clone();
        messages.push(user(if t == 0 { vec![image.clone()] } else { vec![] }));
        let (text, _) = ask(engine, options, spec, qa, messages.clone())?;
        asked += 1;
        let s = score(qa, &text, ex).0;
        if qa.family != Family::Description {
            if acc_d.by_turn.len() <= t {
                acc_d.by_turn.resize(t + 1, (0.0, 0));
            }
            add(&mut acc_d.by_turn[t], s);
        }
        if qa.follow_up {
            add(&mut acc_d.follow_up, s);
        } else {
            add(&mut acc_d.in_context[family_index(qa.family)], s);
            let alone = if t == 0 {
                s
            } else {
                asked += 1;
                let messages = vec![user(vec![image.clone()])];
                let (text, _) = ask(engine, options, spec, qa, messages)?;
                score(qa, &text, ex).0
            };
            add(&mut acc_d.alone[family_index(qa.family)], alone);
        }
        history = messages;
        history.push(Message::assistant(&qa.answer));
    }
    Ok(asked)
}
