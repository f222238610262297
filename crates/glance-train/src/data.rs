//! The training data stream over glance-world's train split.
//!
//! Pixels go through the model's own `ImageProcessor` (the one inference uses, built from the
//! exported `preprocessor_config.json`), so train-time and inference pixels are identical. Token
//! ids come from the exported tokenizer; a test checks that `prefix ++ segment` equals what
//! `LlavaProcessor::prepare` + the chat template produce for the same question and answer.
//!
//! Adapters over the world API (which has no knobs for these):
//! * **curriculum** by rejection — a scene is skipped while it has more objects than the stage
//!   allows at this step (`Scene::generate` is cheap; only accepted scenes are rendered);
//! * **turn mix** ([`TurnMix`]) — independent turns drawn with the world's `DIALOGUE_MIX` weights
//!   (sign turns only when there is a sign; spatial questions weighted up by
//!   [`TurnMix::spatial`]), no follow-ups, no repeated question, at most one description; with
//!   probability [`TurnMix::relation`] a relation question ("is A above B?") among them; and with
//!   probability [`TurnMix::dialogue`] the image's turns open with one of the world's dialogues
//!   (follow-ups included), packed as one causal conversation ([`crate::packing`]).
//!
//! The stream is a pure function of a cursor into the train split (saved in checkpoints).

use crate::align::{self, AlignVocab};
use crate::heads::{vision_targets, VisionTargets};
use crate::packing::{pack, Packed, Segment};
use crate::{Result, TrainError};
use candle_core::{Device, Tensor};
use glance_models::llava::{LlavaConfig, LlavaProcessor};
use glance_world::qa::DIALOGUE_MIX;
use glance_world::{render, Family, Qa, Scene, Split, WorldRng};
use image::DynamicImage;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Stream id of the QA draws of training turns (distinct from the world's own streams).
const TURN_STREAM: u64 = 0x7472_6169_6e00;
/// Stream id of the dialogue and relation draws of training turns.
const CONVERSATION_STREAM: u64 = 0x7472_6169_6e01;

/// How a QA stage draws an image's turns. The default (no dialogues, no extra relation
/// questions, spatial at its world weight) is glance-tiny v1's recipe.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TurnMix {
    /// Share of images whose turns open with a dialogue packed causally (0–1).
    pub dialogue: f64,
    /// Chance that an image's independent turns include a relation question (0–1).
    pub relation: f64,
    /// Factor on the spatial family's weight among the independent turns (> 0).
    pub spatial: f64,
}

impl Default for TurnMix {
    fn default() -> Self {
        Self {
            dialogue: 0.0,
            relation: 0.0,
            spatial: 1.0,
        }
    }
}

impl TurnMix {
    pub fn validate(&self) -> Result<()> {
        let share = |x: f64| (0.0..=1.0).contains(&x);
        if !share(self.dialogue) || !share(self.relation) {
            return Err(TrainError::Config(format!(
                "the dialogue and relation shares must be within 0–1, got {} and {}",
                self.dialogue, self.relation
            )));
        }
        if !(self.spatial > 0.0 && self.spatial.is_finite()) {
            return Err(TrainError::Config(format!(
                "the spatial weight must be > 0, got {}",
                self.spatial
            )));
        }
        Ok(())
    }
}

/// An image's training turns: an optional dialogue (one causal conversation), then independent
/// turns (a conversation each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Turns {
    pub dialogue: Vec<Qa>,
    pub singles: Vec<Qa>,
}

impl Turns {
    /// Independent turns only.
    pub fn singles(singles: Vec<Qa>) -> Self {
        Self {
            dialogue: Vec::new(),
            singles,
        }
    }

    /// The first question (what a text-guided pruning policy is given).
    pub fn first(&self) -> Option<&Qa> {
        self.dialogue.first().or(self.singles.first())
    }

    pub fn len(&self) -> usize {
        self.dialogue.len() + self.singles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Tokenizer, image processor and the shared prompt prefix of a model directory.
pub struct WorldData {
    pub processor: std::sync::Arc<LlavaProcessor>,
    patch: usize,
    /// `<s> USER : <image>×N`.
    prefix: Vec<u32>,
    eos: u32,
    max_rows: usize,
    device: Device,
    align: AlignVocab,
}

/// One image with what every stage needs.
pub struct ImageSample {
    pub index: u64,
    pub seed: u64,
    pub scene: Scene,
    /// `(3, 224, 224)`.
    pub pixels: Tensor,
}

impl WorldData {
    /// `dir` holds the model files written by [`crate::export::write_model_files`].
    pub fn new(dir: &Path, config: &LlavaConfig, device: &Device) -> Result<Self> {
        let processor = LlavaProcessor::from_dir(dir, config)?;
        // Every world image has the same size, so one count holds (LLaVA-NeXT's depends on it).
        let side = glance_world::IMAGE_SIZE as usize;
        let probe = processor.prepare_sized(
            "x",
            &[processor.tokens_for(side, side)],
            glance_models::llava::PromptFormat::Chat,
        )?;
        let image_id = config.image_token_id;
        let last_image = probe
            .ids
            .iter()
            .rposition(|&i| i == image_id)
            .ok_or_else(|| TrainError::Config("the chat prompt has no image tokens".into()))?;
        let prefix = probe.ids[..=last_image].to_vec();
        let eos = *processor
            .text
            .eos_token_ids()
            .first()
            .ok_or_else(|| TrainError::Config("the tokenizer has no EOS token".into()))?;
        let align = AlignVocab::new(&processor)?;
        Ok(Self {
            align,
            processor: std::sync::Arc::new(processor),
            patch: config.vision.patch_size,
            prefix,
            eos,
            max_rows: config.text.max_position_embeddings,
            device: device.clone(),
        })
    }

    pub fn prefix(&self) -> &[u32] {
        &self.prefix
    }

    /// The scene of train index `index`.
    pub fn scene(&self, split: Split, index: u64) -> Result<(u64, Scene)> {
        let seed = split.seed(index)?;
        Ok((seed, Scene::generate(seed)))
    }

    /// Renders a scene and encodes it with `model` (this data's model): tiled for LLaVA-NeXT.
    pub fn encode(
        &self,
        model: &glance_models::llava::Llava,
        scene: &Scene,
    ) -> Result<glance_models::llava::ImageEncoding> {
        let img = DynamicImage::ImageRgb8(render(scene));
        Ok(model.encode_picture(&self.processor, &img)?)
    }

    /// Renders and pre-processes a scene.
    pub fn pixels(&self, scene: &Scene) -> Result<Tensor> {
        let img = DynamicImage::ImageRgb8(render(scene));
        Ok(self.processor.image.preprocess_tensor(&img, &self.device)?)
    }

    /// The next `n` accepted train images from `cursor` (advanced past them), each with at most
    /// `max_objects` objects.
    pub fn next_images(
        &self,
        cursor: &mut u64,
        n: usize,
        max_objects: usize,
    ) -> Result<Vec<ImageSample>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let index = *cursor;
            *cursor += 1;
            let (seed, scene) = self.scene(Split::Train, index)?;
            if scene.objects.len() > max_objects {
                continue;
            }
            let pixels = self.pixels(&scene)?;
            out.push(ImageSample {
                index,
                seed,
                scene,
                pixels,
            });
        }
        Ok(out)
    }

    /// Per-patch and [CLS] targets of a scene.
    pub fn vision_targets(&self, scene: &Scene) -> Result<VisionTargets> {
        vision_targets(scene, self.patch)
    }

    /// Token ids of the words the alignment term ranges over ([`crate::align`]).
    pub fn align_words(&self) -> &[u32] {
        &self.align.ids
    }

    /// Word–patch alignment targets of a scene, `(patches, words)`.
    pub fn align_targets(&self, scene: &Scene) -> Result<Tensor> {
        let y = self.align.targets(scene, self.patch)?;
        align::targets_tensor(y, self.align.ids.len(), &self.device)
    }

    /// Up to `k` independent training turns about a scene (deterministic in `seed`), v1's mix.
    pub fn turns(&self, scene: &Scene, seed: u64, k: usize) -> Vec<Qa> {
        self.independent_turns(scene, seed, k, &TurnMix::default(), &[])
    }

    /// An image's turns under `mix` (deterministic in `seed`): a dialogue first with probability
    /// `mix.dialogue`, then independent turns up to `k` in all (at least one).
    pub fn turns_with(&self, scene: &Scene, seed: u64, k: usize, mix: &TurnMix) -> Turns {
        let mut rng = WorldRng::derive(seed, CONVERSATION_STREAM);
        let dialogue = if rng.chance(mix.dialogue) {
            glance_world::dialogue(scene, &mut rng).turns
        } else {
            Vec::new()
        };
        let want = k.saturating_sub(dialogue.len()).max(1);
        let mut singles: Vec<Qa> = Vec::new();
        if rng.chance(mix.relation) {
            singles.extend(glance_world::relation(scene, &mut rng));
        }
        singles.truncate(want);
        let asked: Vec<Qa> = dialogue.iter().chain(&singles).cloned().collect();
        let rest = want - singles.len();
        singles.extend(self.independent_turns(scene, seed, rest, mix, &asked));
        Turns { dialogue, singles }
    }

    /// Up to `k` independent turns not among `asked`, spatial weighted by `mix.spatial`.
    fn independent_turns(
        &self,
        scene: &Scene,
        seed: u64,
        k: usize,
        mix: &TurnMix,
        asked: &[Qa],
    ) -> Vec<Qa> {
        let mut rng = WorldRng::derive(seed, TURN_STREAM);
        let weights: Vec<f64> = glance_world::qa::family_weights(scene)
            .iter()
            .zip(DIALOGUE_MIX)
            .map(|(w, (f, _))| {
                if f == Family::Spatial {
                    w * mix.spatial
                } else {
                    *w
                }
            })
            .collect();
        let mut turns: Vec<Qa> = Vec::with_capacity(k);
        let described = asked.iter().any(|t| t.family == Family::Description);
        let mut attempts = 0;
        while turns.len() < k && attempts < 8 * k {
            attempts += 1;
            let Some(i) = rng.weighted(&weights) else {
                break;
            };
            let family = DIALOGUE_MIX[i].0;
            if family == Family::Description
                && (described || turns.iter().any(|t| t.family == Family::Description))
            {
                continue;
            }
            if let Some(qa) = glance_world::generate(scene, family, &mut rng) {
                let seen = |t: &Qa| t.question == qa.question;
                if !qa.follow_up && !turns.iter().any(seen) && !asked.iter().any(seen) {
                    turns.push(qa);
                }
            }
        }
        turns
    }

    /// The question tokens after the prefix: `question ASSISTANT :`.
    pub fn prompt_tail(&self, question: &str) -> Result<Vec<u32>> {
        Ok(self
            .processor
            .text
            .encode_plain(&format!("{question} ASSISTANT:"))?)
    }

    /// The answer tokens followed by `</s>`.
    pub fn answer_ids(&self, answer: &str) -> Result<Vec<u32>> {
        let mut ids = self.processor.text.encode_plain(&format!(" {answer}"))?;
        ids.push(self.eos);
        Ok(ids)
    }

    /// The tokens of a dialogue's later turn: `USER : question ASSISTANT :`.
    pub fn later_prompt(&self, question: &str) -> Result<Vec<u32>> {
        Ok(self
            .processor
            .text
            .encode_plain(&format!("USER: {question} ASSISTANT:"))?)
    }

    /// One packed training sequence of independent `turns` about an image.
    pub fn pack_turns(&self, turns: &[Qa]) -> Result<Packed> {
        self.pack(&Turns::singles(turns.to_vec()))
    }

    /// One packed training sequence of an image's turns: the dialogue as one causal
    /// conversation, then each independent turn on its own.
    pub fn pack(&self, turns: &Turns) -> Result<Packed> {
        let segment = |qa: &Qa, later: bool| -> Result<Segment> {
            Ok(Segment {
                prompt: if later {
                    self.later_prompt(&qa.question)?
                } else {
                    self.prompt_tail(&qa.question)?
                },
                answer: self.answer_ids(&qa.answer)?,
            })
        };
        let mut conversations = Vec::with_capacity(turns.singles.len() + 1);
        if !turns.dialogue.is_empty() {
            let chain = turns
                .dialogue
                .iter()
                .enumerate()
                .map(|(k, qa)| segment(qa, k > 0))
                .collect::<Result<Vec<_>>>()?;
            conversations.push(chain);
        }
        for qa in &turns.singles {
            conversations.push(vec![segment(qa, false)?]);
        }
        if conversations.is_empty() {
            return Err(TrainError::Config("an image has no training turns".into()));
        }
        Ok(pack(&self.prefix, &conversations, self.max_rows))
    }
}
