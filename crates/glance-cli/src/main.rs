//! `glance`: fast vision-language inference on CPU.
//!
//! One binary, one subcommand per job. Argument parsing and validation live here; the work lives
//! in the library crates.

mod args;
mod bench;
mod curve;
mod demo;
mod eval;
mod logits;
mod models;
mod plot;
mod progress;
mod quantize;
mod run;
mod serve;
mod signals;
mod threads;
mod train;
mod train_all;
mod train_diffusion;
mod train_draft;
mod train_flags;
mod train_vocab;
mod world;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Fast vision-language inference: LLaVA-family checkpoints on CPU, with numbers for every
/// accelerator.
#[derive(Parser)]
#[command(name = "glance", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer a prompt about images (or a whole conversation), streaming the answer.
    Run(run::RunArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat completions with images,
    /// streaming, metrics).
    Serve(serve::ServeArgs),
    /// Accuracy on the glance world per question family (and description precision / recall /
    /// F1), optionally with visual-token pruning.
    Eval(eval::EvalArgs),
    /// Show the model at work: a world test image (saved as PNG), one question per family, the
    /// answers beside the ground truth, with timings.
    Demo(demo::DemoArgs),
    /// List the models --model can name (shipped, glance home, Hugging Face cache) and where
    /// they are.
    Models(models::ModelsArgs),
    /// Write the logits of every prompt position to a .npy file (for parity checks).
    Logits(logits::LogitsArgs),
    /// Write a model directory with its weights packed (bf16, f16, q8 or q4), its draft heads and
    /// settings; loading it reads the packed weights as they are (no --weights needed).
    Quantize(quantize::QuantizeArgs),
    /// Measure speed: prints a table and writes JSON.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The synthetic world: sample images with questions and answers.
    #[command(subcommand)]
    World(world::WorldCommand),
    /// Train a model (the glance world VLM) from scratch; exports an HF checkpoint.
    #[command(subcommand)]
    Train(train::TrainCommand),
}

fn main() {
    let cli = Cli::parse();
    glance_nn::runtime::tune_allocator();
    let result: Result<()> = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Models(a) => models::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Bench(b) => bench::run(b),
        Command::World(w) => world::run(w),
        Command::Train(t) => train::run(t),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
