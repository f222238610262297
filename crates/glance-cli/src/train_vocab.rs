//! `glance train draft-vocab --head DIR --target MODEL`: keeps with a draft head the tokens its
//! target emits on the head's training data (FR-Spec's reduced draft vocabulary), so its draft
//! steps compute logits for those tokens only.

use crate::progress::TrainBar;
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_models::draft::DraftConfig;
use glance_train::draft::vocab::{count_answers, VocabSettings};
use glance_train::draft::{DraftTrainConfig, SampleSource};
use glance_train::Budget;
use std::path::PathBuf;

#[derive(Args)]
pub struct VocabArgs {
    /// The draft head directory (its config.json gets `draft_vocab`).
    #[arg(long, value_name = "DIR")]
    pub head: PathBuf,
    /// The head's target: a directory or a name as --model takes it (e.g. glance-tiny).
    #[arg(long, value_name = "MODEL")]
    pub target: PathBuf,
    /// Training samples of each answer length (short, description) whose answers are counted,
    /// drawn as `glance train draft` draws them (same seed; the target answers each).
    #[arg(long, default_value_t = 200)]
    pub samples: u64,
    /// Most tokens kept, most frequent first [default: every token the answers hold].
    #[arg(long, value_name = "N")]
    pub size: Option<usize>,
    /// Remove the head's reduced vocabulary instead (it drafts over every token again).
    #[arg(long, conflicts_with_all = ["samples", "size"])]
    pub clear: bool,
}

pub fn run(a: VocabArgs) -> Result<()> {
    let mut config = DraftConfig::load(&a.head)
        .with_context(|| format!("reading the draft head in {}", a.head.display()))?;
    if a.clear {
        config.draft_vocab = None;
        return Ok(config.save(&a.head)?);
    }
    if a.samples == 0 {
        bail!("--samples must be at least 1");
    }
    if a.size == Some(0) {
        bail!("--size must be at least 1");
    }
    let target = crate::args::model_dir(Some(&a.target))?;
    // The sample settings of `glance train draft` (seed, answer caps), so the counted answers
    // are the ones the head was trained on.
    let defaults = DraftTrainConfig::eagle(target.clone(), Budget::Steps(1));
    let device = candle_core::Device::Cpu;
    let mut source = SampleSource::new(
        &target,
        defaults.seed,
        (defaults.max_new_short, defaults.max_new_long),
        defaults.cache_mib,
        &device,
    )
    .with_context(|| format!("loading the target in {}", target.display()))?;
    let (hidden, vocab) = {
        let text = source.target.text_config();
        (text.hidden_size, text.vocab_size)
    };
    config
        .check_target(hidden, vocab)
        .with_context(|| format!("{} does not fit {}", a.head.display(), target.display()))?;
    let settings = VocabSettings {
        samples: a.samples,
        size: a.size,
    };
    let mut bar = TrainBar::default();
    bar.start("vocab", 0, Some(2 * a.samples));
    let counts = count_answers(&mut source, &settings, &mut |done, total| {
        bar.update("vocab", done, Some(total), String::new())
    })?;
    bar.finish();
    let ids = counts.ranked(settings.size, source.eos());
    let coverage = counts.coverage(&ids);
    let kept = ids.len();
    config
        .set_draft_vocab(ids)
        .context("the counted vocabulary")?;
    config.save(&a.head)?;
    let share = match settings.size {
        Some(_) => format!("{:.2}% of", 100.0 * coverage),
        None => "every token of".into(),
    };
    println!(
        "{}: {kept} of the target's {vocab} tokens kept ({share} the {} answer tokens counted on \
         {} samples)",
        a.head.display(),
        counts.total,
        2 * a.samples
    );
    Ok(())
}
