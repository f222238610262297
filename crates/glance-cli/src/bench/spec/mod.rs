//! `glance bench spec`: autoregressive decoding against speculative decoding with each draft head
//! (ViSpec, EAGLE, ablations), side by side on the questions `glance eval` asks (the world test
//! split: each image's independent questions, the model's chat template), at each temperature,
//! short answers and descriptions reported apart.
//!
//! * **Interleaved:** for every question and temperature each strategy answers in turn (the
//!   order rotating from question to question), so machine noise and cache warmth hit all alike;
//!   one untimed round of the first question warms every strategy up first.
//! * **Per strategy and group** (temperature × answer kind): tokens per target forward, acceptance
//!   rate by draft depth, tokens per round by position in the response, decode tokens/s and its
//!   ratio to autoregressive decoding's, under greedy decoding the answers that differ from
//!   autoregressive decoding's (the lossless contract: must be 0), and accuracy (the evaluation's
//!   scorer), so a reader sees quality is unchanged. At temperature > 0 every strategy samples
//!   with the same seed per question (its answers legitimately differ).
//! * **Memory-bound projection** ([`projection`]): at a ≥ 1B random shape, the cost of verifying
//!   k rows against decoding one, combined with the acceptance measured here.
//!
//! Heads: the model directory's `draft-vispec/` and `draft-eagle/` when present, then every
//! `--draft` and `--ablation` directory; each is a column named by its configuration. Heads of
//! the same kind take turns as the engine's head of that kind ([`Engine::set_draft`]).

mod projection;
mod report;

use crate::args::{check_writable, ModelArgs, TreeArgs};
use crate::bench::tally::{Kind, Tally};
use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Args;
use glance_core::SamplingParams;
use glance_decode::TreeSettings;
use glance_engine::eval::{DESCRIPTION_MAX_NEW_TOKENS, SHORT_MAX_NEW_TOKENS};
use glance_engine::{DecodeSpec, Engine, EngineOptions, Flow, ImageInput, Request, Response};
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::random::random_var_builder;
use glance_nn::{DraftLm, Mode};
use glance_world::{description_prf, exact_match, Family};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The most timed repetitions per projection measurement.
const MAX_REPS: usize = 100;
/// Adaptor queries of the untrained ViSpec head of `--random-heads`.
const RANDOM_QUERIES: usize = 16;

/// One column: autoregressive decoding, speculative decoding with one head, or `auto`.
pub struct Column {
    pub name: String,
    pub spec: DecodeSpec,
    pub head: Option<Head>,
    /// For `auto`: the heads it chooses from (the first column's head of each kind).
    pub auto_heads: Vec<Arc<dyn DraftLm>>,
}

/// A draft head and where it came from.
pub struct Head {
    pub dir: Option<PathBuf>,
    pub config: DraftConfig,
    pub lm: Arc<dyn DraftLm>,
}

/// The name of a head's column: its kind, and which ViSpec part an ablation lacks.
fn label(c: &DraftConfig) -> &'static str {
    match (c.adaptor_queries.is_some(), c.global_injection) {
        (true, true) => "vispec",
        (false, true) => "vispec-noadaptor",
        (true, false) => "vispec-noinjection",
        (false, false) => "eagle",
    }
}

/// One group of answers: a temperature and an answer kind, a tally per column.
pub struct Group {
    pub temperature: f32,
    pub kind: Kind,
    pub tallies: Vec<Tally>,
}

/// What the run over the questions measured.
pub struct Measured {
    pub images: usize,
    /// Questions answered at each temperature.
    pub questions: usize,
    pub groups: Vec<Group>,
    pub seconds: f64,
}

fn validate(args: &SpecBenchArgs) -> Result<TreeSettings> {
    super::check_test_images(args.n, args.start)?;
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    if args.temperature.is_empty() {
        bail!("--temperature needs at least one value");
    }
    for (i, &t) in args.temperature.iter().enumerate() {
        sampling(t, 0).validate().context("--temperature")?;
        if args.temperature[..i].contains(&t) {
            bail!("--temperature {t} is given twice");
        }
    }
    if args.reps == 0 || args.reps > MAX_REPS {
        bail!("--reps must be between 1 and {MAX_REPS}");
    }
    if args.plot.len() != 2 {
        bail!("--plot takes two files: DEPTH.svg,POSITION.svg");
    }
    if !args.no_random {
        glance_models::presets::text_config(&args.random_shape).context("--random-shape")?;
    }
    check_writable(&args.json)?;
    args.tree.settings()
}

/// Greedy at 0, else plain sampling at `t` (no top-k / top-p) with `seed`.
pub(crate) fn sampling(t: f32, seed: u64) -> SamplingParams {
    if t == 0.0 {
        SamplingParams::greedy()
    } else {
        SamplingParams::sampled(t, seed)
    }
}

/// The model directory's default heads that exist, then `--draft` and `--ablation`; a directory
/// given twice is measured once.
fn head_dirs(args: &SpecBenchArgs, model_dir: &Path) -> Vec<PathBuf> {
    let defaults = ["draft-vispec", "draft-eagle"]
        .iter()
        .map(|d| model_dir.join(d))
        .filter(|d| d.join("config.json").is_file() && !args.random_heads);
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in defaults
        .chain(args.draft.iter().cloned())
        .chain(args.ablation.iter().cloned())
    {
        let key = std::fs::canonicalize(&d).unwrap_or_else(|_| d.clone());
        if !dirs
            .iter()
            .any(|x| std::fs::canonicalize(x).unwrap_or_else(|_| x.clone()) == key)
        {
            dirs.push(d);
        }
    }
    dirs
}

/// Loads every head and checks that it fits the model.
fn load_heads(args: &SpecBenchArgs, model_dir: &Path, engine: &Engine) -> Result<Vec<Head>> {
    let mut heads = Vec::new();
    for dir in head_dirs(args, model_dir) {
        let head = engine
            .read_draft(&dir)
            .with_context(|| format!("loading the draft head in {}", dir.display()))?;
        heads.push(Head {
            dir: Some(dir),
            config: head.config().clone(),
            lm: Arc::new(head),
        });
    }
    if args.random_heads {
        let mut config: serde_json::Value =
            glance_models::checkpoint::read_json(&model_dir.join("config.json"))?;
        if let Some(shape) = &engine.options().twin {
            config = glance_models::twin::twin_llava_value(&config, shape)?;
        }
        let target = config.get("text_config").unwrap_or(&config);
        for (seed, queries, injection) in [(1, Some(RANDOM_QUERIES), true), (2, None, false)] {
            let c = DraftConfig::for_target(target, queries, injection)?;
            let vb = random_var_builder(seed, &Device::Cpu);
            let head = DraftHead::from_var_builder(&vb, c.clone(), Mode::Infer)?;
            heads.push(Head {
                dir: None,
                config: c,
                lm: Arc::new(head),
            });
        }
    }
    Ok(heads)
}

/// Autoregressive decoding, then a column per head, each named by its configuration (a name
/// taken twice gets the head directory's name).
fn columns(heads: Vec<Head>) -> Result<Vec<Column>> {
    let mut cols = vec![Column {
        name: "ar".into(),
        spec: DecodeSpec::Autoregressive,
        head: None,
        auto_heads: Vec::new(),
    }];
    for head in heads {
        let mut name = label(&head.config).to_string();
        if head.dir.is_none() {
            name += " (random)";
        }
        if cols.iter().any(|c| c.name == name) {
            let dir = head.dir.as_deref().and_then(Path::file_name);
            name = format!(
                "{name} ({})",
                dir.map_or("?".into(), |d| d.to_string_lossy())
            );
        }
        let base = name.clone();
        let mut k = 2;
        while cols.iter().any(|c| c.name == name) {
            name = format!("{base} #{k}");
            k += 1;
        }
        cols.push(Column {
            name,
            spec: DecodeSpec::speculative(head.config.kind()),
            head: Some(head),
            auto_heads: Vec::new(),
        });
    }
    let mut auto_heads: Vec<Arc<dyn DraftLm>> = Vec::new();
    for c in &cols {
        if let Some(h) = &c.head {
            if !auto_heads.iter().any(|a| a.kind() == h.lm.kind()) {
                auto_heads.push(h.lm.clone());
            }
        }
    }
    cols.push(Column {
        name: "auto".into(),
        spec: DecodeSpec::auto(),
        head: None,
        auto_heads,
    });
    Ok(cols)
}

/// Answers one question with column `c`'s strategy.
fn answer(
    engine: &Engine,
    col: &Column,
    question: &str,
    image: &ImageInput,
    sampling: SamplingParams,
    max_new_tokens: usize,
    tree: &TreeSettings,
) -> Result<Response> {
    if let Some(h) = &col.head {
        engine.set_draft(h.lm.clone());
    }
    for h in &col.auto_heads {
        engine.set_draft(h.clone());
    }
    let request = Request {
        sampling,
        max_new_tokens,
        decode: match &col.spec {
            DecodeSpec::Speculative { kind, .. } => DecodeSpec::Speculative {
                kind: *kind,
                tree: Some(tree.clone()),
            },
            DecodeSpec::Auto { .. } => DecodeSpec::Auto {
                tree: Some(tree.clone()),
            },
            other => other.clone(),
        },
        ..Request::chat(question, vec![image.clone()])
    };
    engine
        .generate(&request, &mut |_| Flow::Continue)
        .with_context(|| format!("{} on `{question}`", col.name))
}

/// The evaluation's score of an answer: exact match, or the description's object F1.
pub(crate) fn score(ex: &glance_world::Example, qa: &glance_world::Qa, text: &str) -> f64 {
    if qa.family == Family::Description {
        description_prf(text, &ex.scene.objects).f1
    } else {
        f64::from(u8::from(exact_match(text, &qa.answer)))
    }
}

/// Runs every question at every temperature with every column, interleaved.
fn measure(
    engine: &Engine,
    args: &SpecBenchArgs,
    cols: &[Column],
    tree: &TreeSettings,
) -> Result<Measured> {
    let temps = &args.temperature;
    let mut groups: Vec<Group> = temps
        .iter()
        .flat_map(|&temperature| {
            Kind::ALL.iter().map(move |&kind| Group {
                temperature,
                kind,
                tallies: cols
                    .iter()
                    .map(|c| Tally {
                        mismatches: (temperature == 0.0 && c.spec != DecodeSpec::Autoregressive)
                            .then_some(0),
                        ..Tally::default()
                    })
                    .collect(),
            })
        })
        .collect();
    let max_tokens = |f: Family| {
        if f == Family::Description {
            args.max_new_tokens
        } else {
            SHORT_MAX_NEW_TOKENS.min(args.max_new_tokens)
        }
    };
    // Warm-up: every strategy answers the first question once, untimed.
    if let Some((qa, image)) = crate::bench::warm_up_question(args.start)? {
        for col in cols {
            let s = sampling(temps[0], 0);
            answer(
                engine,
                col,
                &qa.question,
                &image,
                s,
                max_tokens(qa.family),
                tree,
            )?;
        }
    }
    let mut serial = 0usize;
    let seconds = crate::bench::for_each_question("spec", args.n, args.start, |ex, qa, image| {
        let kind = Kind::of(qa.family);
        for (ti, &t) in temps.iter().enumerate() {
            let group = &mut groups[ti * Kind::ALL.len() + kind as usize];
            let s = sampling(t, serial as u64);
            let mut ids: Vec<Vec<u32>> = vec![Vec::new(); cols.len()];
            for k in 0..cols.len() {
                let c = (k + serial) % cols.len();
                let r = answer(
                    engine,
                    &cols[c],
                    &qa.question,
                    image,
                    s.clone(),
                    max_tokens(qa.family),
                    tree,
                )?;
                let text = engine.processor().text.decode(&r.token_ids, true)?;
                group.tallies[c].add(&r, qa.family, score(ex, qa, &text));
                ids[c] = r.token_ids;
            }
            for (c, tally) in group.tallies.iter_mut().enumerate() {
                if let Some(m) = tally.mismatches.as_mut() {
                    *m += usize::from(ids[c] != ids[0]);
                }
            }
            serial += 1;
        }
        Ok(())
    })?;
    Ok(Measured {
        images: args.n,
        questions: serial / temps.len(),
        groups,
        seconds,
    })
}

pub fn run(args: SpecBenchArgs) -> Result<()> {
    let tree = validate(&args)?;
    let (dir, engine) = args.model.engine(EngineOptions::default())?;
    let heads = load_heads(&args, &dir, &engine)?;
    if heads.is_empty() {
        bail!(
            "no draft head to measure: {} has no draft-vispec/ or draft-eagle/; train them with \
             `glance train draft` or pass --draft DIR",
            dir.display()
        );
    }
    let cols = columns(heads)?;
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
    let measured = measure(&engine, &args, &cols, &tree)?;
    let mut json = report::report(&dir, &engine, &args, &tree, &cols, &measured)?;
    if let Some(cost) = engine.measured_cost() {
        json["cost_model"] = crate::bench::cost_report(&cost);
    }
    if !args.no_random {
        json["projection"] = projection::project(&args, &tree, &cols, &measured, engine.threads())?;
    }
    report::plots(&args.plot, &cols, &measured)?;
    super::write_json(&args.json, &json)?;
    println!(
        "\nwrote {}, {} and {}",
        args.json.display(),
        args.plot[0].display(),
        args.plot[1].display()
    );
    let mismatches: usize = measured
        .groups
        .iter()
        .flat_map(|g| &g.tallies)
        .filter_map(|t| t.mismatches)
        .sum();
    if mismatches > 0 {
        bail!(
            "{mismatches} greedy speculative answers differ from autoregressive decoding's: the \
             lossless contract is broken"
        );
    }
    Ok(())
}
