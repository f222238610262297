//! `glance logits`: the f32 logits of every position of the expanded prompt, as `.npy`
//! `(seq_len, vocab)`. External parity checks call this; its behaviour is kept stable.

use crate::args::{ModelArgs, PromptArgs};
use anyhow::{Context, Result};
use clap::Args;
use glance_engine::EngineOptions;
use std::path::PathBuf;

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: PromptArgs,
    /// Output .npy file.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: LogitsArgs) -> Result<()> {
    let prompt = args.input.prompt()?;
    crate::args::check_writable(&args.out)?;
    let (_, engine) = args.model.engine(EngineOptions::single_request())?;
    // (seq_len, vocab)
    let logits = engine.prompt_logits(&prompt)?;
    logits
        .write_npy(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote logits {:?} to {}", logits.dims(), args.out.display());
    Ok(())
}
