//! `--decode auto`: the engine's measured cost model ([`glance_decode::cost`]) and the choice of
//! strategy it drives.
//!
//! The cost model is measured at the first request that needs it (a few seconds at most) and
//! kept for the engine's life; with [`EngineOptions::cost_cache`] set it is also written to
//! `<dir>/<hash>.json` and read back by later processes whose key matches — the key names
//! everything the figures depend on: the model (its directory and `config.json`), the weight
//! format, the twin shape, the thread count, the CPU and glance's version.
//!
//! `auto` picks, per request, cost-aware speculation with the request's best draft head (ViSpec
//! for a prompt with images, EAGLE for text, whichever the model offers) when a draft accepted
//! as drafts usually are (the planner's prior) beats a decode step on this machine and, once a
//! few answers are remembered, its start does not cost more than it saves over answers like
//! them (on a cache-resident model such as glance-tiny the draft's prompt pass costs tens of
//! decode steps, and a round saves a little); on a model without heads that is converted for
//! block diffusion, linear self-speculation with cost-aware blocks under the same rule; else
//! `ar`. (The quadratic mode and thresholds are not among its choices: the threshold mode is
//! lossy, and the quadratic mode's pass layout is not planned yet.)
//!
//! [`EngineOptions::cost_cache`]: crate::EngineOptions::cost_cache

use super::Engine;
use crate::request::Request;
use glance_core::{Error, Result};
use glance_decode::diffusion::linear_pays_at_prior;
use glance_decode::speculative::plan::{Memory, Planner, AUTO_MARGIN, PRIOR_ACCEPTANCE};
use glance_decode::{CostModel, DecodeSpec, DiffusionMode, DraftCost};
use glance_nn::{CausalLm, DraftKind, DraftLm};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A draft head `auto` may choose, with its predicted speed-up over a decode step.
struct HeadOption {
    head: Arc<dyn DraftLm>,
    cost: CostModel,
    /// The head's figures in `cost`.
    draft: DraftCost,
    /// The first round's predicted speed-up at the head's prior acceptance (0: none pays).
    gain: f64,
    /// Whether that beats a decode step by [`AUTO_MARGIN`], and the draft's start pays for
    /// itself over the answers remembered ([`Planner::pays_for_remembered_answers`]).
    pays: bool,
    /// Where the remembered answers say the start never pays: how many, their mean steps, and
    /// the start's mean steps.
    short_answers: Option<(f64, f64, f64)>,
}

impl HeadOption {
    fn describe(&self) -> String {
        match self.short_answers {
            Some((answers, steps, start)) => format!(
                "predicted {:.2}× a round, but the draft's start ({start:.0} decode steps) \
                 would not pay for itself over answers like the last {answers:.0} (a mean of \
                 {steps:.0} steps)",
                self.gain
            ),
            None if self.gain > 0.0 => format!("predicted {:.2}×", self.gain),
            None => "predicted not to pay".to_string(),
        }
    }
}

/// What `auto` resolved a request to.
pub(crate) struct Choice {
    pub spec: DecodeSpec,
    /// The cost model with the chosen head's figures, for a speculative choice.
    pub cost: Option<CostModel>,
    pub reason: String,
}

impl Choice {
    /// `spec`, planned from `cost`, when it `pays`; else `ar`; with the reason for each.
    fn either(
        pays: bool,
        spec: DecodeSpec,
        cost: CostModel,
        chosen: String,
        plain: String,
    ) -> Self {
        if pays {
            Choice {
                spec,
                cost: Some(cost),
                reason: chosen,
            }
        } else {
            Choice {
                spec: DecodeSpec::Autoregressive,
                cost: None,
                reason: plain,
            }
        }
    }
}

impl Engine {
    /// The cost model of this engine, measured (or read from the cost cache) at first use, with
    /// the figures of `draft` if given.
    pub fn cost_model(&self, draft: Option<&dyn DraftLm>) -> Result<CostModel> {
        self.pool.install(|| {
            let mut slot = self.cost.lock().expect("not poisoned");
            let text = self.model.text();
            if slot.is_none() {
                let key = self.cost_key();
                *slot = Some(match self.read_cost(&key) {
                    Some(c) => c,
                    None => {
                        let c = CostModel::measure(text, key)?;
                        self.write_cost(&c);
                        c
                    }
                });
            }
            let cost = slot.as_mut().expect("set above");
            if let Some(d) = draft {
                if cost.draft(d).is_none() {
                    cost.measure_draft(text, d)?;
                    self.write_cost(cost);
                }
            }
            Ok(cost.clone())
        })
    }

    /// What `auto`'s greedy requests with `head` met so far (shared, created empty).
    pub(crate) fn plan_memory(&self, head: &Arc<dyn DraftLm>) -> Arc<Mutex<Memory>> {
        let key = head_key(head);
        self.plan_memory
            .lock()
            .expect("not poisoned")
            .entry(key)
            .or_default()
            .clone()
    }

    /// Uses `cost` as this engine's cost model (figures measured elsewhere, or made up by a
    /// test), replacing any measured before. Draft kinds it lacks are measured when needed.
    pub fn set_cost_model(&self, cost: CostModel) -> Result<()> {
        cost.check()?;
        *self.cost.lock().expect("not poisoned") = Some(cost);
        Ok(())
    }

    /// The cost model, if a request has measured (or read) it.
    pub fn measured_cost(&self) -> Option<CostModel> {
        self.cost.lock().expect("not poisoned").clone()
    }

    /// The concrete strategy `request` runs: itself, or `auto`'s choice.
    pub(crate) fn choose(&self, request: &Request) -> Result<Option<Choice>> {
        if !request.decode.is_auto() {
            return Ok(None);
        }
        let with_images = !request.prompt.images().is_empty();
        // Preference on a tie: ViSpec for a prompt with images, EAGLE for text.
        let kinds = if with_images {
            [DraftKind::Vispec, DraftKind::Eagle]
        } else {
            [DraftKind::Eagle, DraftKind::Vispec]
        };
        // Heads named by `--draft` must load (a broken one is an error, as with `--decode
        // vispec`); the model directory's are used where present.
        let named = self.named_draft_kinds()?;
        let mut heads = Vec::new();
        for kind in kinds {
            if named.is_empty() {
                if let Ok(h) = self.draft(kind) {
                    heads.push(h);
                }
            } else if named.contains(&kind) {
                heads.push(self.draft(kind)?);
            }
        }
        if heads.is_empty() {
            return self.choose_diffusion(request).map(Some);
        }
        // The tree is the request's (`Engine::tree`), as for a named speculative strategy.
        let tree = self.tree(request);
        let mut options = Vec::with_capacity(heads.len());
        for head in heads {
            let cost = self.cost_model(Some(head.as_ref()))?;
            let draft = cost
                .draft(head.as_ref())
                .cloned()
                .ok_or_else(|| Error::Config("the cost model lacks the draft's figures".into()))?;
            let planner = Planner::new(cost.clone(), draft.clone(), tree.clone(), 0)
                .with_prior(head.acceptance());
            // How long this head's earlier requests' answers ran, and what its start cost them.
            let shared = self.plan_memory(&head);
            let mut memory = shared.lock().expect("not poisoned");
            let gain = planner.predicted(usize::MAX).map_or(0.0, |(_, g)| g);
            let pays = planner.pays_at_prior();
            // (One declined request in a few drafts anyway, to keep the answers remembered.)
            let answers_pay = planner.pays_for_remembered_answers(&memory) || !memory.decline();
            let short_answers = (pays && !answers_pay).then(|| {
                let (answers, steps) = memory.answers();
                (answers, steps, memory.start_steps())
            });
            options.push(HeadOption {
                head,
                cost,
                draft,
                gain,
                pays: pays && answers_pay,
                short_answers,
            });
        }
        // The head predicted fastest; the preferred one on a tie.
        let best =
            options.iter().enumerate().fold(
                0,
                |best, (i, o)| if o.gain > options[best].gain { i } else { best },
            );
        let others: Vec<String> = options
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != best)
            .map(|(_, o)| format!("{} {}", o.head.kind().name(), o.describe()))
            .collect();
        let verdict = options[best].describe();
        let HeadOption {
            head,
            cost,
            draft,
            pays,
            ..
        } = options.swap_remove(best);
        let spec = DecodeSpec::speculative(head.kind());
        let step_ms = cost.pass(1) * 1e3;
        let accepted = match head.acceptance() {
            Some(a) => format!(
                "its drafts accepted {} by depth (measured)",
                a.iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join("/")
            ),
            None => format!("its drafts accepted {PRIOR_ACCEPTANCE} a token (unmeasured)"),
        };
        let mut summary = format!(
            "a decode step {step_ms:.1} ms, c(2) {:.2}, c(8) {:.2}, a draft step {:.2} of a \
             decode step, {accepted}: {verdict}",
            cost.c(2),
            cost.c(8),
            draft.step(1) / cost.pass(1),
        );
        if !others.is_empty() {
            summary.push_str(&format!("; {}", others.join("; ")));
        }
        let name = spec.name();
        Ok(Some(Choice::either(
            pays,
            spec,
            cost,
            format!("{name} (cost-aware): {summary}"),
            format!(
                "ar: no draft head is predicted to beat a decode step by {:.0}% here ({name} \
                 {summary})",
                (AUTO_MARGIN - 1.0) * 100.0
            ),
        )))
    }

    /// The kinds of the heads `--draft` names ([`EngineOptions::drafts`]), read from their
    /// configs once (an unreadable one is an error each time it is asked for).
    ///
    /// [`EngineOptions::drafts`]: crate::EngineOptions::drafts
    fn named_draft_kinds(&self) -> Result<&[DraftKind]> {
        if let Some(kinds) = self.named_kinds.get() {
            return Ok(kinds);
        }
        let kinds = self
            .options
            .drafts
            .iter()
            .map(|dir| Ok(glance_models::draft::DraftConfig::load(dir)?.kind()))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.named_kinds.get_or_init(|| kinds))
    }

    /// `auto` on a model without draft heads: cost-aware linear self-speculation on a model
    /// converted for block diffusion where a block can pay, else `ar`.
    fn choose_diffusion(&self, request: &Request) -> Result<Choice> {
        if self.model.config().block_diffusion.is_none() {
            return Ok(Choice {
                spec: DecodeSpec::Autoregressive,
                cost: None,
                reason: "ar: the model has no draft head and is not converted for block \
                         diffusion"
                    .into(),
            });
        }
        let (settings, _) = self.diffusion_settings(request)?;
        let largest = settings.largest_block();
        let cost = self.cost_model(None)?;
        let summary = format!(
            "a decode step {:.1} ms, c(2) {:.2}, c({largest}) {:.2}",
            cost.pass(1) * 1e3,
            cost.c(2),
            cost.c(largest)
        );
        Ok(Choice::either(
            linear_pays_at_prior(&cost, largest),
            DecodeSpec::diffusion(DiffusionMode::Linear),
            cost,
            format!("diffusion-linear (cost-aware blocks ≤ {largest}): {summary}"),
            format!(
                "ar: no block of diffusion-linear accepted as drafts usually are \
                 ({PRIOR_ACCEPTANCE} a token) can beat a decode step here ({summary})"
            ),
        ))
    }

    /// What the cost model depends on.
    fn cost_key(&self) -> String {
        let model = match &self.dir {
            Some(dir) => {
                let config = std::fs::read(dir.join("config.json")).unwrap_or_default();
                let dir = dir.canonicalize().unwrap_or_else(|_| dir.clone());
                format!("{} config {:016x}", dir.display(), fnv1a(&config))
            }
            None => {
                let t = self.model.text();
                format!(
                    "in-memory hidden {} layers {} vocab {}",
                    t.hidden_size(),
                    t.num_layers(),
                    t.vocab_size()
                )
            }
        };
        let twin = self
            .options
            .twin
            .as_ref()
            .map_or("none".to_string(), |t| format!("{t:?}"));
        format!(
            "{model} | weights {} | twin {twin} | threads {} | cpu {} | glance {}",
            self.options.weights,
            self.threads,
            cpu_name(),
            env!("CARGO_PKG_VERSION")
        )
    }

    fn cost_file(&self, key: &str) -> Option<std::path::PathBuf> {
        let dir = self.options.cost_cache.as_ref()?;
        Some(dir.join(format!("{:016x}.json", fnv1a(key.as_bytes()))))
    }

    /// The cached figures for `key`, if a file holds them (anything unreadable is measured anew).
    fn read_cost(&self, key: &str) -> Option<CostModel> {
        let bytes = std::fs::read(self.cost_file(key)?).ok()?;
        let cost: CostModel = serde_json::from_slice(&bytes).ok()?;
        (cost.key == key && cost.check().is_ok()).then_some(cost)
    }

    /// Writes the figures to the cost cache; a cache that cannot be written is skipped (the
    /// figures stay in memory).
    fn write_cost(&self, cost: &CostModel) {
        let Some(path) = self.cost_file(&cost.key) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(cost)?)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            eprintln!(
                "glance: the cost model was not cached at {}: {e}",
                path.display()
            );
        }
    }
}

/// A draft head's key in the engine's acceptance memory: its address.
pub(crate) fn head_key(head: &Arc<dyn DraftLm>) -> usize {
    Arc::as_ptr(head) as *const () as usize
}

/// The CPU's model name (Linux: `/proc/cpuinfo`), else the architecture.
fn cpu_name() -> String {
    let from_proc = std::fs::read_to_string(Path::new("/proc/cpuinfo"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_string())
        });
    from_proc.unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// FNV-1a, 64 bits: a stable name for a cache file (the key inside decides).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
