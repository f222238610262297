//! `glance bench spec`: autoregressive decoding against speculative decoding with each draft
//! head, side by side on the world test split at each temperature, and the memory-bound
//! projection ([`glance_bench::spec`]). This module reads the flags, prints the tables
//! ([`report`], [`projection`]) and writes the JSON and the two plots.

mod projection;
mod report;

use crate::args::{check_writable, ModelArgs, TreeArgs};
use anyhow::{bail, Result};
use clap::Args;
use glance_bench::spec::{SpecOptions, SpecReport};
use glance_engine::eval::DESCRIPTION_MAX_NEW_TOKENS;
use glance_engine::EngineOptions;
use std::path::PathBuf;

#[derive(Args)]
pub struct SpecBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// World test-split images; each brings one question per family (sign reading only when the
    /// image has a sign), as `glance eval --n` does.
    #[arg(long, default_value_t = 60)]
    pub n: usize,
    /// Index of the first image in the test split.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Temperatures, comma-separated; 0 is greedy.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,1",
        allow_negative_numbers = true
    )]
    pub temperature: Vec<f32>,
    /// Longest description in tokens (short answers stop after 24).
    #[arg(long, default_value_t = DESCRIPTION_MAX_NEW_TOKENS)]
    pub max_new_tokens: usize,
    /// A draft head directory (repeatable), measured beside the model directory's draft-vispec/
    /// and draft-eagle/; each head is a column named by its configuration (vispec, eagle,
    /// vispec-noadaptor, vispec-noinjection).
    #[arg(long, value_name = "DIR")]
    pub draft: Vec<PathBuf>,
    /// Ablation head directories (e.g. ViSpec without the adaptor or without the global
    /// injection); the same as more --draft.
    #[arg(long, value_name = "DIR", num_args = 1..)]
    pub ablation: Vec<PathBuf>,
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Shape of the random-weight text decoder of the memory-bound projection: tinyllama-1.1b
    /// (22 layers, d2048, GQA 32/4), sheared-llama-2.7b or llama-134m.
    #[arg(long, default_value = "tinyllama-1.1b")]
    pub random_shape: String,
    /// Skip the memory-bound projection.
    #[arg(long)]
    pub no_random: bool,
    /// Timed repetitions per projection measurement (the best is kept).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/spec.json")]
    pub json: PathBuf,
    /// The two plots: acceptance by draft depth, and tokens per round by position in the
    /// description (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "DEPTH.svg,POSITION.svg",
        default_value = "bench-results/spec-depth.svg,bench-results/spec-position.svg"
    )]
    pub plot: Vec<PathBuf>,
    /// Untrained heads (a ViSpec and an EAGLE head with random weights) instead of the model
    /// directory's: for developing without trained heads.
    #[arg(long, hide = true)]
    pub random_heads: bool,
}

impl SpecBenchArgs {
    /// The library's options (`--draft` and `--ablation` are both heads to measure).
    fn options(&self) -> Result<SpecOptions> {
        Ok(SpecOptions {
            n: self.n,
            start: self.start,
            temperature: self.temperature.clone(),
            max_new_tokens: self.max_new_tokens,
            heads: self.draft.iter().chain(&self.ablation).cloned().collect(),
            tree: self.tree.settings()?,
            random_shape: (!self.no_random).then(|| self.random_shape.clone()),
            reps: self.reps,
            random_heads: self.random_heads,
        })
    }
}

pub fn run(args: SpecBenchArgs) -> Result<()> {
    let options = args.options()?;
    options.validate()?;
    if args.plot.len() != 2 {
        bail!("--plot takes two files: DEPTH.svg,POSITION.svg");
    }
    check_writable(&args.json)?;
    let (dir, engine) = args.model.engine(EngineOptions::default())?;
    let cols = glance_bench::spec::strategies(&options, &dir, &engine)?;
    let tree = &options.tree;
    println!(
        "{} on the world test split, images {}..{}; {} threads; tree depth {}, top-k {}, budget {}",
        dir.display(),
        args.start,
        args.start + args.n as u64,
        engine.threads(),
        tree.depth,
        tree.top_k,
        tree.budget
    );
    for c in cols.iter().skip(1) {
        let Some(h) = c.head.as_ref() else {
            println!(
                "  {:<20} chosen per request from the measured cost model",
                c.name
            );
            continue;
        };
        println!(
            "  {:<20} {}",
            c.name,
            h.dir
                .as_ref()
                .map_or("untrained, random weights".into(), |d| d
                    .display()
                    .to_string())
        );
    }
    let report: SpecReport =
        glance_bench::spec::run(&engine, &dir, &options, &cols, &mut super::Bars::default())?;
    report::print(&report);
    if let Some(p) = &report.projection {
        projection::print(p);
    }
    report::plots(&args.plot, &report)?;
    super::write_report(&args.json, &report)?;
    println!(
        "\nwrote {}, {} and {}",
        args.json.display(),
        args.plot[0].display(),
        args.plot[1].display()
    );
    let mismatches = report.mismatches();
    if mismatches > 0 {
        bail!(
            "{mismatches} greedy speculative answers differ from autoregressive decoding's: the \
             lossless contract is broken"
        );
    }
    Ok(())
}
