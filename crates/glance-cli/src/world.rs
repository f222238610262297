//! `glance world …`: the synthetic world glance's own model is trained and evaluated on.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use glance_world::Split;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum WorldCommand {
    /// Render N images of a split and write them as PNGs with a JSONL of questions and answers.
    Sample(SampleArgs),
}

#[derive(Args)]
pub struct SampleArgs {
    /// train, val or test (the splits never share an image seed).
    #[arg(long, default_value = "test")]
    pub split: Split,
    /// Number of images.
    #[arg(long, default_value_t = 16)]
    pub n: u64,
    /// Index of the first image in the split.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Output directory (created if missing).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(cmd: WorldCommand) -> Result<()> {
    match cmd {
        WorldCommand::Sample(a) => {
            let summary = glance_world::write_sample_range(a.split, a.start, a.n, &a.out)
                .with_context(|| format!("writing the sample to {}", a.out.display()))?;
            println!(
                "wrote {} images and {} questions to {} (questions.jsonl, scenes.jsonl)",
                summary.images,
                summary.questions,
                summary.dir.display()
            );
            Ok(())
        }
    }
}
