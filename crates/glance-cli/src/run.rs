//! `glance run`: answer a prompt about an image, streaming the answer.

use crate::pipeline::{prefill, InputArgs, PruneArgs};
use anyhow::{bail, Result};
use clap::Args;
use glance_core::SamplingParams;
use glance_decode::stop::StopStatus;
use glance_decode::{decode, GenerateConfig, Sampler, StopStrings};
use serde_json::json;
use std::io::Write;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub prune: PruneArgs,
    /// Threads for the tensor kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object (text, token ids, counts, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Generation options shared by every command that generates.
#[derive(Args, Clone)]
pub struct GenArgs {
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample from the smallest set of tokens with this much probability (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Seed of the sampler: the same seed gives the same answer.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the answer contains this text (repeatable); the text itself is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

impl GenArgs {
    pub fn sampling(&self) -> Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        };
        p.validate()?;
        if self.max_new_tokens == 0 {
            bail!("--max-new-tokens must be at least 1");
        }
        Ok(p)
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    let sampling = args.gen.sampling()?;
    let spec = args.prune.spec()?;
    let threads = crate::threads::init(args.threads)?;
    let (vlm, prep) = args.input.load_and_prepare()?;
    let config = GenerateConfig {
        max_new_tokens: args.gen.max_new_tokens,
        sampling,
        eos_token_ids: vlm.processor.text.eos_token_ids().to_vec(),
    };
    let mut stream = vlm.processor.text.stream_decoder();
    let mut stops = StopStrings::new(args.gen.stop.clone());
    let mut text = String::new();
    let stdout = std::io::stdout();
    let streaming = !args.json;
    let emit = |piece: &str, text: &mut String| -> std::io::Result<()> {
        text.push_str(piece);
        if streaming {
            let mut out = stdout.lock();
            out.write_all(piece.as_bytes())?;
            out.flush()?;
        }
        Ok(())
    };
    let mut stopped = false;
    let sampler = Sampler::new(config.sampling.clone())?;
    let pruned = prefill(&vlm, &prep, &spec)?;
    let stats = pruned.stats;
    let generation = decode(
        vlm.model.text(),
        pruned.state,
        sampler,
        &config,
        &mut |id| {
            let piece = stream.push(id)?;
            let (s, stop) = match stops.push(&piece) {
                StopStatus::Continue(s) => (s, false),
                StopStatus::Stopped(s) => (s, true),
            };
            emit(&s, &mut text).map_err(|e| glance_core::Error::io("stdout", e))?;
            stopped = stop;
            Ok(stop)
        },
    )?;
    if !stopped {
        // Release what the stream decoder and the stop matcher still hold.
        let tail = stream.finish()?;
        match stops.push(&tail) {
            StopStatus::Continue(s) => {
                emit(&s, &mut text)?;
                let rest = stops.finish();
                emit(&rest, &mut text)?;
            }
            StopStatus::Stopped(s) => emit(&s, &mut text)?,
        }
    }
    if streaming {
        println!();
        return Ok(());
    }
    let gen_tokens = generation.tokens.len();
    let report = json!({
        "text": text,
        "token_ids": generation.tokens,
        "finish_reason": generation.finish,
        "model": vlm.dir,
        "threads": threads,
        "prompt_tokens": prep.prompt.ids.len(),
        "image_tokens": prep.prompt.image_tokens,
        "generated_tokens": gen_tokens,
        "pruning": {
            "policy": spec.policy.name(),
            "keep": spec.budget.to_string(),
            "visual_tokens": stats.visual_tokens,
            "kept_visual_tokens": stats.kept_visual_tokens,
            "prompt_rows": stats.prompt_rows,
        },
        "timings": {
            "load_s": vlm.load_time.as_secs_f64(),
            "image_preprocess_s": prep.preprocess_time.as_secs_f64(),
            "vision_encode_s": prep.vision_time.as_secs_f64(),
            "prune_select_s": stats.select_time.as_secs_f64(),
            "prefill_s": generation.prefill.as_secs_f64(),
            "decode_s": generation.decode.as_secs_f64(),
            "time_to_first_token_s": (prep.preprocess_time + prep.vision_time + stats.select_time + generation.prefill).as_secs_f64(),
            "prefill_tokens_per_s": stats.prompt_rows as f64 / generation.prefill.as_secs_f64(),
            "decode_tokens_per_s": generation.decode_tokens_per_sec(),
        }
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
