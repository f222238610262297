//! Train / validation / test splits with disjoint seeds, and [`sample`], which turns a split index
//! into a complete [`Example`] (scene, image, questions, dialogue).
//!
//! Construction (why the splits can never share a seed): the seed of index `i` in split `s` is
//! `mix64((i << 2) | tag(s))` with tags 1, 2, 3 and `i < 2^62`. The argument of `mix64` encodes
//! the pair (`i`, `s`) injectively (the two low bits are the tag, the rest is the index), and
//! `mix64` is a bijection on `u64`, so distinct (index, split) pairs give distinct seeds. The
//! inverse ([`Split::identify`]) recovers the split and index from any split seed.

use std::str::FromStr;

use image::RgbImage;
use serde::{Deserialize, Serialize};

use crate::qa::{dialogue, question_set, relation, Dialogue, Qa};
use crate::render::render;
use crate::rng::{mix64, WorldRng};
use crate::scene::Scene;
use crate::WorldError;

/// Indices must be below this (2^62).
pub const MAX_INDEX: u64 = 1 << 62;

/// A data split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    Validation,
    Test,
}

impl Split {
    /// All splits.
    pub const ALL: [Split; 3] = [Split::Train, Split::Validation, Split::Test];

    fn tag(self) -> u64 {
        match self {
            Split::Train => 1,
            Split::Validation => 2,
            Split::Test => 3,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }

    /// Scene seed of example `index` of this split.
    pub fn seed(self, index: u64) -> Result<u64, WorldError> {
        if index >= MAX_INDEX {
            return Err(WorldError::IndexOutOfRange {
                index,
                max: MAX_INDEX,
            });
        }
        Ok(mix64((index << 2) | self.tag()))
    }

    /// The (split, index) a seed belongs to, if it is a split seed at all.
    pub fn identify(seed: u64) -> Option<(Split, u64)> {
        let pre = unmix64(seed);
        let split = match pre & 3 {
            1 => Split::Train,
            2 => Split::Validation,
            3 => Split::Test,
            _ => return None,
        };
        Some((split, pre >> 2))
    }
}

fn unxorshift(y: u64, s: u32) -> u64 {
    let mut x = y;
    let mut covered = s;
    while covered < 64 {
        x = y ^ (x >> s);
        covered += s;
    }
    y ^ (x >> s)
}

/// Inverse of [`mix64`].
pub fn unmix64(z: u64) -> u64 {
    let z = unxorshift(z, 31).wrapping_mul(0x3196_42B2_D24D_8EC3);
    let z = unxorshift(z, 27).wrapping_mul(0x96DE_1B17_3F11_9089);
    unxorshift(z, 30)
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Split {
    type Err = WorldError;
    /// Accepts "train", "validation" / "val" / "valid", "test" (any case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "train" | "training" => Ok(Split::Train),
            "validation" | "val" | "valid" | "dev" => Ok(Split::Validation),
            "test" => Ok(Split::Test),
            _ => Err(WorldError::UnknownName {
                what: "split",
                name: s.to_string(),
            }),
        }
    }
}

/// Stream ids for the generators derived from a scene seed.
const QUESTIONS_STREAM: u64 = 1;
const DIALOGUE_STREAM: u64 = 2;
const RELATION_STREAM: u64 = 3;

/// One complete example.
#[derive(Debug, Clone)]
pub struct Example {
    pub split: Split,
    pub index: u64,
    pub seed: u64,
    pub scene: Scene,
    pub image: RgbImage,
    /// One independent question per applicable family (no follow-ups), for evaluation.
    pub questions: Vec<Qa>,
    /// A multi-turn conversation about the image.
    pub dialogue: Dialogue,
    /// A question about how two objects lie ([`relation`]); `None` when the scene has fewer than
    /// two objects that can be named without their position.
    pub relation: Option<Qa>,
}

/// The example `index` of `split`: deterministic, and never shared with another split.
pub fn sample(split: Split, index: u64) -> Result<Example, WorldError> {
    let seed = split.seed(index)?;
    Ok(example_from_seed(split, index, seed))
}

/// The scene, image and questions of a seed (the question streams are derived from the seed).
pub fn example_from_seed(split: Split, index: u64, seed: u64) -> Example {
    let scene = Scene::generate(seed);
    let image = render(&scene);
    let questions = question_set(&scene, &mut WorldRng::derive(seed, QUESTIONS_STREAM));
    let dialogue = dialogue(&scene, &mut WorldRng::derive(seed, DIALOGUE_STREAM));
    let relation = relation(&scene, &mut WorldRng::derive(seed, RELATION_STREAM));
    Example {
        split,
        index,
        seed,
        scene,
        image,
        questions,
        dialogue,
        relation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmix_inverts_mix() {
        let mut r = WorldRng::new(99);
        for _ in 0..10_000 {
            let x = r.next_u64();
            assert_eq!(unmix64(mix64(x)), x);
        }
    }

    #[test]
    fn identify_recovers_split_and_index() {
        for s in Split::ALL {
            for i in [0u64, 1, 17, 123_456, MAX_INDEX - 1] {
                assert_eq!(Split::identify(s.seed(i).unwrap()), Some((s, i)));
            }
        }
        assert!(Split::Train.seed(MAX_INDEX).is_err());
    }
}
