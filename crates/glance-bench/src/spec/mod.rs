//! Autoregressive decoding against speculative decoding with each draft head (ViSpec, EAGLE,
//! ablations), side by side on the questions `glance eval` asks (the world test split: each
//! image's independent questions, the model's chat template), at each temperature, short answers
//! and descriptions reported apart (`glance bench spec`).
//!
//! * **Interleaved:** for every question and temperature each strategy answers in turn (the
//!   order a row of a balanced Latin square, [`crate::column_order`]), so machine noise and
//!   cache warmth hit all alike; one untimed round of the first question warms every strategy
//!   up first.
//! * **Per strategy and group** (temperature × answer kind): tokens per target forward,
//!   acceptance rate by draft depth, tokens per round by position in the response, decode
//!   tokens/s and its ratio to autoregressive decoding's, under greedy decoding the answers that
//!   differ from autoregressive decoding's (the lossless contract: must be 0), and accuracy (the
//!   evaluation's scorer). At temperature > 0 every strategy samples with the same seed per
//!   question (its answers legitimately differ).
//! * **Memory-bound projection** ([`projection`]): at a ≥ 1B random shape, the cost of verifying
//!   k rows against decoding one, combined with the acceptance measured here.
//!
//! Heads: the model directory's `draft-vispec/` and `draft-eagle/` when present, then every
//! directory of [`SpecOptions::heads`]; each is a column named by its configuration. Heads of the
//! same kind take turns as the engine's head of that kind ([`Engine::set_draft`]).

pub mod projection;

use crate::tally::{Kind, Tally, TallyRow};
use crate::{bail_options, sampling, score, BenchError, Context, CostReport, Progress, Result};
use candle_core::Device;
use glance_core::SamplingParams;
use glance_decode::speculative::POSITION_BUCKET;
use glance_decode::TreeSettings;
use glance_engine::eval::SHORT_MAX_NEW_TOKENS;
use glance_engine::{DecodeSpec, Engine, Flow, ImageInput, Request, Response};
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::random::random_var_builder;
use glance_nn::{DraftLm, Mode};
use projection::Projection;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `glance bench spec` measures.
#[derive(Debug, Clone)]
pub struct SpecOptions {
    /// World test-split images; each brings one question per family.
    pub n: usize,
    /// Index of the first image in the test split.
    pub start: u64,
    /// Temperatures; 0 is greedy.
    pub temperature: Vec<f32>,
    /// Longest description in tokens (short answers stop earlier).
    pub max_new_tokens: usize,
    /// Draft head directories measured beside the model directory's (`--draft`, `--ablation`).
    pub heads: Vec<PathBuf>,
    pub tree: TreeSettings,
    /// Shape of the random-weight decoder of the memory-bound projection (`None`: skip it).
    pub random_shape: Option<String>,
    /// Timed repetitions per projection measurement.
    pub reps: usize,
    /// Untrained heads (a ViSpec and an EAGLE head with random weights) instead of the model
    /// directory's.
    pub random_heads: bool,
}

/// The most timed repetitions per projection measurement.
pub const MAX_REPS: usize = 100;
/// Adaptor queries of the untrained ViSpec head of `random_heads`.
const RANDOM_QUERIES: usize = 16;

impl SpecOptions {
    /// Checks every option before anything loads.
    pub fn validate(&self) -> Result<()> {
        crate::check_test_images(self.n, self.start)?;
        if self.max_new_tokens == 0 {
            bail_options!("--max-new-tokens must be at least 1");
        }
        if self.temperature.is_empty() {
            bail_options!("--temperature needs at least one value");
        }
        for (i, &t) in self.temperature.iter().enumerate() {
            sampling(t, 0).validate().context("--temperature")?;
            if self.temperature[..i].contains(&t) {
                bail_options!("--temperature {t} is given twice");
            }
        }
        if self.reps == 0 || self.reps > MAX_REPS {
            bail_options!("--reps must be between 1 and {MAX_REPS}");
        }
        if let Some(shape) = &self.random_shape {
            glance_models::presets::text_config(shape).context("--random-shape")?;
        }
        Ok(())
    }

    /// The most tokens an answer of `family` gets.
    fn max_tokens(&self, family: glance_world::Family) -> usize {
        crate::max_tokens(family, self.max_new_tokens)
    }
}

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
pub(crate) fn label(c: &DraftConfig) -> &'static str {
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

/// The model directory's default heads that exist, then `heads`; a directory given twice is
/// measured once.
fn head_dirs(o: &SpecOptions, model_dir: &Path) -> Vec<PathBuf> {
    let defaults = ["draft-vispec", "draft-eagle"]
        .iter()
        .map(|d| model_dir.join(d))
        .filter(|d| d.join("config.json").is_file() && !o.random_heads);
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in defaults.chain(o.heads.iter().cloned()) {
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
fn load_heads(o: &SpecOptions, model_dir: &Path, engine: &Engine) -> Result<Vec<Head>> {
    let mut heads = Vec::new();
    for dir in head_dirs(o, model_dir) {
        let head = engine
            .read_draft(&dir)
            .with_context(|| format!("loading the draft head in {}", dir.display()))?;
        heads.push(Head {
            dir: Some(dir),
            config: head.config().clone(),
            lm: Arc::new(head),
        });
    }
    if o.random_heads {
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
/// taken twice gets the head directory's name), then `auto`.
fn columns(heads: Vec<Head>) -> Result<Vec<Column>> {
    let mut cols = vec![Column {
        name: "ar".into(),
        spec: DecodeSpec::Autoregressive,
        head: None,
        auto_heads: Vec::new(),
    }];
    for head in heads {
        let mut name = label(&head.config).to_string();
        if let Some(ids) = &head.config.draft_vocab {
            // A reduced vocabulary (FR-Spec) beside the same head without one.
            name += &format!(" vocab {}", ids.len());
        }
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

/// Answers one question with column `col`'s strategy.
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

/// Runs every question at every temperature with every column, interleaved.
fn measure(
    engine: &Engine,
    o: &SpecOptions,
    cols: &[Column],
    progress: &mut dyn Progress,
) -> Result<Measured> {
    let temps = &o.temperature;
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
    // Warm-up: every strategy answers the first question once, untimed.
    if let Some((qa, image)) = crate::warm_up_question(o.start)? {
        for col in cols {
            let s = sampling(temps[0], 0);
            let max = o.max_tokens(qa.family);
            answer(engine, col, &qa.question, &image, s, max, &o.tree)?;
        }
    }
    let mut serial = 0usize;
    let seconds = crate::for_each_question(progress, "spec", o.n, o.start, |ex, qa, image| {
        let kind = Kind::of(qa.family);
        for (ti, &t) in temps.iter().enumerate() {
            let group = &mut groups[ti * Kind::ALL.len() + kind as usize];
            let s = sampling(t, serial as u64);
            let mut ids: Vec<Vec<u32>> = vec![Vec::new(); cols.len()];
            for c in crate::column_order(cols.len(), serial) {
                let max = o.max_tokens(qa.family);
                let r = answer(
                    engine,
                    &cols[c],
                    &qa.question,
                    image,
                    s.clone(),
                    max,
                    &o.tree,
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
        images: o.n,
        questions: serial / temps.len(),
        groups,
        seconds,
    })
}

/// A draft head as the report names it.
#[derive(Debug, Clone, Serialize)]
pub struct HeadInfo {
    /// Its directory (`None`: untrained, random weights).
    pub head: Option<PathBuf>,
    pub adaptor_queries: Option<usize>,
    pub global_injection: bool,
}

/// A column of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Strategy {
    pub name: String,
    pub decode: &'static str,
    #[serde(flatten)]
    pub head: Option<HeadInfo>,
}

/// One group's rows: a temperature and an answer kind.
#[derive(Debug, Clone, Serialize)]
pub struct SpecGroup {
    pub temperature: f32,
    /// The answer kind's name.
    pub answers: &'static str,
    pub questions: usize,
    /// A row per column, autoregressive decoding first.
    pub strategies: Vec<TallyRow>,
    #[serde(skip)]
    pub kind: Kind,
}

/// What `glance bench spec` reports (the JSON it writes).
#[derive(Debug, Clone, Serialize)]
pub struct SpecReport {
    pub bench: &'static str,
    pub model: PathBuf,
    pub threads: usize,
    pub split: &'static str,
    pub start: u64,
    pub images: usize,
    /// Questions answered at each temperature.
    pub questions: usize,
    pub temperatures: Vec<f32>,
    pub max_new_tokens: usize,
    pub short_max_new_tokens: usize,
    pub tree: TreeSettings,
    pub position_bucket: usize,
    pub strategies: Vec<Strategy>,
    pub groups: Vec<SpecGroup>,
    pub seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projection: Option<Projection>,
}

impl SpecReport {
    /// Greedy speculative answers that differ from autoregressive decoding's.
    pub fn mismatches(&self) -> usize {
        self.groups
            .iter()
            .flat_map(|g| &g.strategies)
            .filter_map(|t| t.greedy_mismatches)
            .sum()
    }
}

/// The columns a run on `engine` (loaded from `model_dir`) would measure: loads every head.
/// Refuses a model without any head to measure.
pub fn strategies(o: &SpecOptions, model_dir: &Path, engine: &Engine) -> Result<Vec<Column>> {
    let heads = load_heads(o, model_dir, engine)?;
    if heads.is_empty() {
        return Err(BenchError::Options(format!(
            "no draft head to measure: {} has no draft-vispec/ or draft-eagle/; train them with \
             `glance train draft` or pass --draft DIR",
            model_dir.display()
        )));
    }
    columns(heads)
}

/// Measures every column of `cols` (from [`strategies`]) on `engine`, loaded from `model_dir`,
/// then the projection (unless `o.random_shape` is `None`). The report says whether the
/// lossless contract held ([`SpecReport::mismatches`]).
pub fn run(
    engine: &Engine,
    model_dir: &Path,
    o: &SpecOptions,
    cols: &[Column],
    progress: &mut dyn Progress,
) -> Result<SpecReport> {
    let m = measure(engine, o, cols, progress)?;
    let groups = m
        .groups
        .iter()
        .map(|g| {
            let ar_rate = g.tallies[0].tokens_per_s();
            SpecGroup {
                temperature: g.temperature,
                answers: g.kind.name(),
                questions: g.tallies[0].questions,
                strategies: cols
                    .iter()
                    .zip(&g.tallies)
                    .map(|(c, x)| x.row(&c.name, ar_rate))
                    .collect(),
                kind: g.kind,
            }
        })
        .collect();
    let strategies = cols
        .iter()
        .map(|c| Strategy {
            name: c.name.clone(),
            decode: c.spec.name(),
            head: c.head.as_ref().map(|h| HeadInfo {
                head: h.dir.clone(),
                adaptor_queries: h.config.adaptor_queries,
                global_injection: h.config.global_injection,
            }),
        })
        .collect();
    let projection = match &o.random_shape {
        Some(shape) => Some(projection::project(
            shape,
            o,
            cols,
            &m,
            engine.threads(),
            progress,
        )?),
        None => None,
    };
    Ok(SpecReport {
        bench: "spec",
        model: model_dir.to_path_buf(),
        threads: engine.threads(),
        split: "test",
        start: o.start,
        images: m.images,
        questions: m.questions,
        temperatures: o.temperature.clone(),
        max_new_tokens: o.max_new_tokens,
        short_max_new_tokens: SHORT_MAX_NEW_TOKENS.min(o.max_new_tokens),
        tree: o.tree.clone(),
        position_bucket: POSITION_BUCKET,
        strategies,
        groups,
        seconds: m.seconds,
        cost_model: engine.measured_cost().as_ref().map(CostReport::from),
        projection,
    })
}
