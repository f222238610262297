//! `glance eval`: accuracy on the glance world per question family, through the one evaluation
//! runner ([`glance_engine::eval`]): the split's images, each image's independent questions in the
//! model's chat template, greedy decoding, glance-world's scorers. Prints a table (accuracy and
//! question count per family, the mean over the short-answer families, description object
//! precision / recall / F1, speed); `--json` writes the same report as JSON.

use crate::args::{check_writable, DecodeArgs, ModelArgs, PruneArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_engine::eval::{
    evaluate_specs, DialogueScore, EvalOptions, EvalReport, DESCRIPTION_MAX_NEW_TOKENS,
    SHORT_FAMILIES, SHORT_MAX_NEW_TOKENS,
};
use glance_engine::{Engine, EngineOptions, PruneSpec};
use glance_world::Split;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::path::PathBuf;

/// The most images one evaluation takes (the test split has far more; this bounds a typo).
pub const MAX_EVAL_IMAGES: usize = 100_000;

#[derive(Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// World split: train, validation or test.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Images to evaluate; each brings one question per family (sign reading only when the image
    /// has a sign).
    #[arg(long, default_value_t = 100)]
    pub n: usize,
    /// Index of the first image in the split.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Longest generated description in tokens (short answers stop after 24).
    #[arg(long, default_value_t = DESCRIPTION_MAX_NEW_TOKENS)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub prune: PruneArgs,
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Skip the dialogues (each image's conversation asked turn by turn, with the earlier turns'
    /// true answers in context, and its non-follow-up turns asked alone too).
    #[arg(long)]
    pub no_dialogue: bool,
    /// Keep every answer in the --json report (to compare two runs answer by answer, e.g. a
    /// model and its --twin).
    #[arg(long, requires = "json")]
    pub answers: bool,
}

/// Runs the evaluation runner with a progress bar (images) on stderr.
pub fn evaluate_with_progress(
    engine: &Engine,
    options: &EvalOptions,
    specs: &[PruneSpec],
) -> Result<Vec<EvalReport>> {
    let bar = ProgressBar::new(options.images as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "eval [{elapsed_precise}] {bar:30} {pos}/{len} images, {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let reports = evaluate_specs(engine, options, specs, &mut |p| {
        bar.set_position(p.images_done as u64);
        bar.set_message(format!("{} questions", p.questions_done));
    });
    bar.finish_and_clear();
    Ok(reports?)
}

pub fn run(args: EvalArgs) -> Result<()> {
    let split: Split = args.split.parse().with_context(|| {
        format!(
            "--split must be train, validation or test, got `{}`",
            args.split
        )
    })?;
    if args.n == 0 || args.n > MAX_EVAL_IMAGES {
        bail!(
            "--n must be between 1 and {MAX_EVAL_IMAGES} (the number of world images to evaluate)"
        );
    }
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let last = args.start.checked_add(args.n as u64 - 1);
    if last.is_none_or(|l| split.seed(l).is_err()) {
        bail!(
            "--start {} with --n {} runs past the end of the split",
            args.start,
            args.n
        );
    }
    let spec = args.prune.spec()?;
    let decode = args.decode.spec()?;
    if let Some(path) = &args.json {
        check_writable(path)?;
    }
    let (dir, engine) = args
        .model
        .engine(args.decode.engine_options(EngineOptions::default())?)?;
    let options = EvalOptions {
        start: args.start,
        max_new_tokens: args.max_new_tokens,
        short_max_new_tokens: SHORT_MAX_NEW_TOKENS.min(args.max_new_tokens),
        decode: decode.clone(),
        record_answers: args.answers,
        relations: true,
        dialogues: !args.no_dialogue,
        ..EvalOptions::new(split, args.n)
    };
    let report = evaluate_with_progress(&engine, &options, std::slice::from_ref(&spec))?
        .pop()
        .context("the runner returned no report")?;
    let label = match &engine.options().twin {
        Some(shape) => format!("{} (twin {shape})", dir.display()),
        None => dir.display().to_string(),
    };
    print_report(&label, &report);
    if let Some(path) = &args.json {
        let mut v = serde_json::to_value(&report)?;
        v["model"] = json!(dir);
        v["threads"] = json!(engine.threads());
        v["weights"] = json!(engine.options().weights.name());
        v["twin"] = json!(engine.options().twin.as_ref().map(|t| t.name()));
        v["decode"] = json!(decode.name());
        v["start"] = json!(args.start);
        crate::bench::write_json(path, &v)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Short-answer accuracy and description F1 by the scene's object count.
fn print_by_objects(r: &EvalReport) {
    let rows: Vec<_> = r
        .by_objects
        .iter()
        .filter(|o| o.short.questions + o.description_f1.questions > 0)
        .collect();
    let head: Vec<String> = rows.iter().map(|o| format!("{:>6}", o.objects)).collect();
    let short: Vec<String> = rows
        .iter()
        .map(|o| format!("{:>6}", pct(o.short.score)))
        .collect();
    let f1: Vec<String> = rows
        .iter()
        .map(|o| format!("{:>6}", pct(o.description_f1.score)))
        .collect();
    println!("{:<22} {}", "objects in the scene", head.join(""));
    println!("{:<22} {}", "  short answers", short.join(""));
    println!("{:<22} {}", "  description F1", f1.join(""));
}

/// The dialogue rows: in context against alone, follow-ups, by turn.
fn print_dialogue(d: &DialogueScore) {
    println!(
        "dialogues ({}, earlier turns' true answers in context):",
        d.dialogues
    );
    for (name, rate) in [
        ("  turns in context", &d.turns),
        ("  non-follow-up", &d.in_context),
        ("  same asked alone", &d.alone),
        ("  follow-up", &d.follow_up),
    ] {
        println!("{:<22} {:>9} {:>9}", name, rate.questions, pct(rate.score));
    }
    let by_turn: Vec<String> = d
        .by_turn
        .iter()
        .map(|t| format!("{:>6}", pct(t.score)))
        .collect();
    println!("{:<22} {}", "  by turn (1, 2, …)", by_turn.join(""));
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".to_string(), |v| format!("{v:.3}"))
}

/// The table `glance eval` prints.
fn print_report(model: &str, r: &EvalReport) {
    let p = &r.prune;
    println!(
        "{model} on the world {} split: {} images, {} questions; greedy; pruning {} ({:.1} of {} visual tokens kept)",
        r.split.name(),
        r.images,
        r.questions,
        if p.policy == "none" {
            "none".to_string()
        } else {
            format!("{} {}", p.policy, p.keep)
        },
        p.mean_kept_visual_tokens,
        p.visual_tokens
    );
    println!("{:<22} {:>9} {:>9}", "family", "questions", "accuracy");
    for f in r
        .families
        .iter()
        .filter(|f| SHORT_FAMILIES.contains(&f.family))
    {
        println!(
            "{:<22} {:>9} {:>9}",
            f.family.name(),
            f.questions,
            pct(f.score)
        );
    }
    println!("{:<22} {:>9} {:>9.3}", "mean (short answers)", "", r.mean);
    match &r.description {
        Some(d) => println!(
            "{:<22} {:>9}  precision {:.3}  recall {:.3}  F1 {:.3}",
            "description (objects)", d.questions, d.precision, d.recall, d.f1
        ),
        None => println!("{:<22} {:>9}", "description (objects)", 0),
    }
    if let Some(rel) = &r.relation {
        println!(
            "{:<22} {:>9} {:>9}",
            "relation (is A above B)",
            rel.questions,
            pct(rel.score)
        );
    }
    print_by_objects(r);
    if let Some(d) = &r.dialogue {
        print_dialogue(d);
    }
    println!(
        "speed: mean time to first token {:.1} ms, decode {:.0} tokens/s, {} tokens generated, \
         {:.2} tokens per forward pass, {:.1} s",
        r.timing.mean_ttft_s * 1e3,
        r.timing.decode_tokens_per_s,
        r.timing.generated_tokens,
        r.timing.tokens_per_forward,
        r.seconds
    );
}
