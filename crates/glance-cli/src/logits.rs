//! `glance logits`: the f32 logits of every position of the expanded prompt, as `.npy`
//! `(seq_len, vocab)`. External parity checks call this; its behaviour is kept stable.

use crate::pipeline::InputArgs;
use anyhow::{Context, Result};
use clap::Args;
use glance_nn::{AttnMask, CausalLm};
use std::path::PathBuf;

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Output .npy file.
    #[arg(long)]
    pub out: PathBuf,
    /// Threads for the tensor kernels.
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: LogitsArgs) -> Result<()> {
    crate::threads::init(args.threads)?;
    let (vlm, prep) = args.input.load_and_prepare()?;
    let text = vlm.model.text();
    let n = prep.prompt.ids.len();
    let positions: Vec<u32> = (0..n as u32).collect();
    let mut cache = text.new_cache();
    let hidden = text.forward(
        &prep.embeddings,
        &positions,
        &AttnMask::causal(),
        &mut cache,
    )?;
    // (seq_len, vocab)
    let logits = text.logits(&hidden)?;
    logits
        .write_npy(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote logits {:?} to {}", logits.dims(), args.out.display());
    Ok(())
}
