//! `glance demo`: one glance-world test image, saved as PNG, and the model's answers to one
//! question of each family about it (a description included), beside the ground truth, with time
//! to first token and decode speed. The questions go through the evaluation runner
//! ([`glance_engine::eval`]), so the demo answers exactly as `glance eval` scores.

use crate::args::{DecodeArgs, ModelArgs, PruneArgs};
use anyhow::{Context, Result};
use clap::Args;
use glance_engine::eval::{evaluate, EvalOptions};
use glance_engine::EngineOptions;
use glance_world::{Family, Split};
use std::path::PathBuf;

#[derive(Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Which world test image: its index in the test split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Directory the image is written to (created if missing).
    #[arg(long, default_value = "glance-demo")]
    pub out: PathBuf,
    #[command(flatten)]
    pub prune: PruneArgs,
    #[command(flatten)]
    pub decode: DecodeArgs,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let spec = args.prune.spec()?;
    let decode = args.decode.spec()?;
    let ex = glance_world::sample(Split::Test, args.seed)
        .with_context(|| format!("--seed {} is not a test-split image", args.seed))?;
    let (dir, engine) = args
        .model
        .engine(args.decode.engine_options(EngineOptions::default())?)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let png = args.out.join(format!("world-test-{}.png", args.seed));
    ex.image
        .save(&png)
        .with_context(|| format!("writing {}", png.display()))?;
    let sign = if ex.scene.sign.is_some() {
        "a sign"
    } else {
        "no sign"
    };
    println!(
        "world test image {} ({} object(s), {sign}) → {}",
        args.seed,
        ex.scene.objects.len(),
        png.display()
    );
    println!(
        "model {} (loaded in {:.0} ms); greedy, {} decoding; pruning {}",
        dir.display(),
        engine.load_time().as_secs_f64() * 1e3,
        decode,
        if spec.is_noop() {
            "none".to_string()
        } else {
            format!("{} {}", spec.policy.name(), spec.budget)
        }
    );
    let options = EvalOptions {
        start: args.seed,
        record_answers: true,
        decode,
        ..EvalOptions::new(Split::Test, 1)
    };
    let report = evaluate(&engine, &options, Some(&spec), &mut |_| {})?;
    for a in &report.answers {
        println!("\n[{}] {}", a.family, a.question);
        println!("  model: {}", a.answer.trim());
        println!("  truth: {}", a.reference);
        let verdict = match a.precision_recall {
            Some((p, r)) => format!(
                "objects: precision {p:.2}, recall {r:.2}, F1 {:.2}",
                a.score
            ),
            None if a.score >= 1.0 => "right".to_string(),
            None => "wrong".to_string(),
        };
        println!(
            "  {verdict} | time to first token {:.1} ms, decode {:.0} tokens/s ({} tokens)",
            a.ttft_s * 1e3,
            a.decode_tokens_per_s,
            a.generated_tokens
        );
    }
    let short: Vec<_> = report
        .answers
        .iter()
        .filter(|a| a.family != Family::Description)
        .collect();
    let right = short.iter().filter(|a| a.score >= 1.0).count();
    println!(
        "\n{right}/{} short answers right{}",
        short.len(),
        report
            .description
            .map_or(String::new(), |d| format!(", description F1 {:.2}", d.f1))
    );
    Ok(())
}
