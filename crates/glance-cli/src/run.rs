//! `glance run`: answer a prompt about images (or a whole conversation), streaming the answer.

use crate::args::{GenArgs, ModelArgs, PromptArgs, PruneArgs};
use anyhow::Result;
use clap::Args;
use glance_engine::{EngineOptions, Event, Flow};
use serde_json::json;
use std::io::Write;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: PromptArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub prune: PruneArgs,
    /// Print one JSON object (text, token ids, finish reason, usage, timings, decoding
    /// statistics) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: RunArgs) -> Result<()> {
    let spec = args.prune.spec()?;
    let request = args
        .gen
        .request(args.input.prompt()?, args.prune.request_spec()?)?;
    let (dir, engine) = args.model.engine(
        args.gen
            .decode
            .engine_options(EngineOptions::single_request())?,
    )?;
    let streaming = !args.json;
    let stdout = std::io::stdout();
    let response = engine.generate(&request, &mut |event| match event {
        Event::Text(piece) if streaming => {
            let mut out = stdout.lock();
            // A closed stdout (`glance run … | head`) ends the generation.
            match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                Ok(()) => Flow::Continue,
                Err(_) => Flow::Cancel,
            }
        }
        Event::Text(_) | Event::Logprob(_) => Flow::Continue,
    })?;
    if streaming {
        println!();
        return Ok(());
    }
    let mut report = serde_json::to_value(&response)?;
    report["model"] = json!(dir);
    report["threads"] = json!(engine.threads());
    report["weights"] = json!(engine.options().weights.name());
    report["timings"]["load_s"] = json!(engine.load_time().as_secs_f64());
    report["pruning"] = json!({"policy": spec.policy.name(), "keep": spec.budget.to_string()});
    if let Some(cost) = engine.measured_cost() {
        report["cost_model"] = serde_json::to_value(glance_bench::CostReport::from(&cost))?;
    }
    // Tokens after the first (which the prefill gives) per forward pass after the prefill.
    let passes = response.decode.forward_passes;
    if passes > 0 {
        let decoded = response.token_ids.len().saturating_sub(1) as f64;
        report["decode"]["tokens_per_forward"] = json!(decoded / passes as f64);
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
