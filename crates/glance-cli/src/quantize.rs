//! `glance quantize --weights q4 DIR OUT`: a copy of a model directory with its weights packed
//! (the layout of `glance_nn::quant::store`, which records the format), with its draft heads and
//! settings; `glance run --model OUT` then loads the packed values without quantizing again.

use anyhow::{bail, Context, Result};
use clap::Args;
use glance_engine::WeightFormat;
use std::path::PathBuf;

#[derive(Args)]
pub struct QuantizeArgs {
    /// Format to write: bf16, f16, q8 or q4 (the text decoder's linear weights; the vision tower
    /// and projector in bf16, or f16 with f16).
    #[arg(long, value_parser = crate::args::parse_weights)]
    pub weights: WeightFormat,
    /// The model to read: a directory (Hugging Face LLaVA layout) or a name as --model takes it.
    pub dir: PathBuf,
    /// The directory to write (must not exist).
    pub out: PathBuf,
}

pub fn run(args: QuantizeArgs) -> Result<()> {
    if args.weights == WeightFormat::F32 {
        bail!("--weights f32 is what checkpoints already are: choose bf16, f16, q8 or q4");
    }
    let start = std::time::Instant::now();
    let dir = crate::args::model_dir(Some(&args.dir))?;
    let s = glance_models::quantize::quantize_dir(&dir, &args.out, args.weights)
        .with_context(|| format!("quantizing {}", dir.display()))?;
    // What was written, format by format: q8 / q4 fall back to bf16 for a matrix whose input
    // dimension is not a multiple of 32, and the vision tower is in a 16-bit float.
    let formats: Vec<String> = s
        .by_format
        .iter()
        .map(|(f, n)| format!("{n} in {f}"))
        .collect();
    println!(
        "wrote {} ({} matrices packed: {}; {} tensors copied; {:.1} MB) in {:.1} s",
        args.out.display(),
        s.packed,
        if formats.is_empty() {
            "none".to_string()
        } else {
            formats.join(", ")
        },
        s.copied,
        s.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    let wanted = s
        .by_format
        .iter()
        .find(|(f, _)| *f == args.weights)
        .map_or(0, |(_, n)| *n);
    if wanted == 0 {
        eprintln!(
            "warning: no matrix was packed in {}: every text-decoder matrix has an input \
             dimension that is not a multiple of 32 and fell back to bf16 (the vision tower and \
             projector are always in a 16-bit float)",
            args.weights
        );
    }
    Ok(())
}
