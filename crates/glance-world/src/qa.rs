//! Question families, question/answer pairs and multi-turn dialogues.
//!
//! [`generate`] draws one question of a family for a scene; [`question_set`] draws one independent
//! question per applicable family (for evaluation); [`dialogue`] draws a multi-turn conversation
//! mixing independent questions with follow-ups that refer back to an earlier turn ("Where is
//! it?"). Follow-up turns are flagged with `follow_up: true`: they are only answerable in context.
//! Answers are short canonical strings ("red", "3", "yes", "top left", "42", "a large red circle")
//! except descriptions, which are several sentences.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::families;
use crate::rng::WorldRng;
use crate::scene::Scene;
use crate::WorldError;

/// Question family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Colour, shape or size of one referred object.
    Attribute,
    /// How many objects (in total, or of a colour / shape / size / colour+shape).
    Counting,
    /// Where an object is, what is in a cell, above / below / left / right of.
    Spatial,
    /// Yes / no: is there an X (half the questions are about absent things).
    Existence,
    /// Read the two-digit number on the sign (only asked when there is a sign).
    Sign,
    /// Long description listing every object with size, colour, shape and position.
    Description,
}

impl Family {
    /// All families.
    pub const ALL: [Family; 6] = [
        Family::Attribute,
        Family::Counting,
        Family::Spatial,
        Family::Existence,
        Family::Sign,
        Family::Description,
    ];

    /// Lower-case name ("attribute", …).
    pub fn name(self) -> &'static str {
        match self {
            Family::Attribute => "attribute",
            Family::Counting => "counting",
            Family::Spatial => "spatial",
            Family::Existence => "existence",
            Family::Sign => "sign",
            Family::Description => "description",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Family {
    type Err = WorldError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        Family::ALL
            .iter()
            .copied()
            .find(|f| f.name() == t)
            .ok_or_else(|| WorldError::UnknownName {
                what: "question family",
                name: s.to_string(),
            })
    }
}

/// One question with its ground-truth answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qa {
    pub family: Family,
    pub question: String,
    pub answer: String,
    /// True when the question refers to an earlier turn ("Where is it?") and is meaningless alone.
    #[serde(default)]
    pub follow_up: bool,
}

impl Qa {
    pub(crate) fn new(
        family: Family,
        question: impl Into<String>,
        answer: impl Into<String>,
    ) -> Qa {
        Qa {
            family,
            question: question.into(),
            answer: answer.into(),
            follow_up: false,
        }
    }
    pub(crate) fn follow(
        family: Family,
        question: impl Into<String>,
        answer: impl Into<String>,
    ) -> Qa {
        Qa {
            follow_up: true,
            ..Qa::new(family, question, answer)
        }
    }
}

/// A multi-turn conversation about one image; the image belongs to the first user turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dialogue {
    pub turns: Vec<Qa>,
}

/// Relative frequency of families among the independent turns of a [`dialogue`] (the sign family
/// is skipped when the scene has no sign). Training can of course draw its own mix via [`generate`].
pub const DIALOGUE_MIX: [(Family, f64); 6] = [
    (Family::Attribute, 0.20),
    (Family::Counting, 0.18),
    (Family::Spatial, 0.20),
    (Family::Existence, 0.17),
    (Family::Sign, 0.10),
    (Family::Description, 0.15),
];

/// One question of `family` about `scene`; `None` only for [`Family::Sign`] without a sign.
pub fn generate(scene: &Scene, family: Family, rng: &mut WorldRng) -> Option<Qa> {
    if scene.objects.is_empty() && family != Family::Sign {
        return None;
    }
    match family {
        Family::Attribute => families::attribute(scene, rng),
        Family::Counting => Some(families::counting(scene, rng)),
        Family::Spatial => families::spatial(scene, rng),
        Family::Existence => Some(families::existence(scene, rng)),
        Family::Sign => families::sign(scene, rng),
        Family::Description => Some(families::description_qa(scene, rng)),
    }
}

/// A yes / no question about where two objects lie relative to each other ("Is the red circle
/// above the blue square?"), yes and no by a fair coin: the spatial family's relation questions
/// on their own. `None` when fewer than two objects can be named without their position.
pub fn relation(scene: &Scene, rng: &mut WorldRng) -> Option<Qa> {
    families::relation(scene, rng)
}

/// One independent question per applicable family, in [`Family::ALL`] order.
pub fn question_set(scene: &Scene, rng: &mut WorldRng) -> Vec<Qa> {
    Family::ALL
        .iter()
        .filter_map(|f| generate(scene, *f, rng))
        .collect()
}

/// [`DIALOGUE_MIX`]'s weights for `scene`: sign reading gets weight 0 when there is no sign.
pub fn family_weights(scene: &Scene) -> Vec<f64> {
    DIALOGUE_MIX
        .iter()
        .map(|(f, w)| {
            if *f == Family::Sign && scene.sign.is_none() {
                0.0
            } else {
                *w
            }
        })
        .collect()
}

/// A dialogue of 2–6 turns: independent questions drawn with [`DIALOGUE_MIX`] and, in about half
/// the dialogues, a chain of follow-ups about one object. Any family (descriptions included) can
/// open the dialogue. Questions are not repeated within a dialogue.
pub fn dialogue(scene: &Scene, rng: &mut WorldRng) -> Dialogue {
    let mut turns: Vec<Qa> = Vec::new();
    let singles = 2 + rng.below(3);
    let weights = family_weights(scene);
    let mut attempts = 0;
    while turns.len() < singles && attempts < 20 {
        attempts += 1;
        let Some(i) = rng.weighted(&weights) else {
            break;
        };
        if let Some(qa) = generate(scene, DIALOGUE_MIX[i].0, rng) {
            if !turns.iter().any(|t| t.question == qa.question) {
                turns.push(qa);
            }
        }
    }
    if rng.chance(0.5) {
        let chain = families::follow_up_chain(scene, rng);
        if !chain.is_empty() && !turns.iter().any(|t| t.question == chain[0].question) {
            let at = rng.below(turns.len() + 1);
            for (k, qa) in chain.into_iter().enumerate() {
                turns.insert(at + k, qa);
            }
        }
    }
    Dialogue { turns }
}
