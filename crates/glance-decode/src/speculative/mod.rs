//! Speculative decoding with a draft head (EAGLE; ViSpec): each round the head proposes a tree
//! of tokens ([`tree`]), the target scores the whole tree in one forward pass under a tree
//! attention mask, and the longest accepted path plus the target's own next token are emitted
//! ([`verify`]). Lossless: under greedy sampling the tokens are exactly
//! [`crate::Autoregressive`]'s; at temperature > 0 each token follows the target's distribution.
//!
//! # The round
//!
//! State between rounds: the target's cache holds every emitted token but the last one, `x`;
//! `h` is the target's hidden state that predicted `x`. The draft's cache holds its rows for the
//! tokens before the *pending* ones (tokens emitted since the last round whose predecessors'
//! target hidden states are now known).
//!
//! 1. The pending rows (ending with `x`'s) run through the draft with the target's real hidden
//!    states and stay in its cache; the output of `x`'s row is the tree's root.
//! 2. The tree grows in speculative draft rows, rolled back afterwards (O(1)).
//! 3. The target runs `[x, tree…]` at positions `pos(x) + depth` under the tree mask.
//! 4. Verification picks the accepted path and the next token. The target's cache keeps `x`'s
//!    row and the accepted nodes' rows ([`glance_nn::KvCache::keep_speculative`]); the accepted
//!    tokens and the next token become the pending rows of the next round, each paired with the
//!    target hidden state (from this pass) that predicted it.
//!
//! Steps 1 and 2 are the state's draft passes ([`DecodeState::draft_pass`]): the pending rows,
//! then one pass per tree level ([`tree::Grower`]). A scheduler runs each of them for every
//! request sharing the head in one pass; alone, they run one by one.

pub mod acceptance;
pub mod plan;
pub mod tree;
pub mod verify;

use crate::autoregressive::{FinishReason, GenerateConfig, Generation, Prefilled};
use crate::cost::CostModel;
use crate::sampler::Sampler;
use crate::step::{DecodeState, DraftOutput, DraftPass, Load, Pass, PassOutput};
use crate::strategy::{DecodeStats, DecodeStrategy, StepLog, TokenSink};
use candle_core::Tensor;
use glance_core::{Error, Result, TokenId};
use glance_nn::{
    AttnMask, CacheMark, CausalLm, DraftContext, DraftLm, DraftPrompt, DraftStart, KvCache,
    TreeMask,
};
use plan::{Memory, Planner, Round};
use std::sync::{Arc, Mutex};
use std::time::Instant;
pub use tree::{DraftTree, Grower, TreeSettings};
pub use verify::{verify, Verdict};

/// Width in tokens of the response-position buckets of the position histograms.
pub const POSITION_BUCKET: usize = 16;

/// Speculative decoding with a draft head.
pub struct Speculative {
    draft: Arc<dyn DraftLm>,
    settings: TreeSettings,
    /// Plan rounds from measured costs ([`Speculative::cost_aware`]); `None`: every round grows
    /// the tree `settings` describe.
    cost: Option<CostModel>,
    /// What earlier greedy requests with this head met ([`Speculative::remembering`]).
    memory: Option<Arc<Mutex<Memory>>>,
}

impl Speculative {
    pub fn new(draft: Arc<dyn DraftLm>, settings: TreeSettings) -> Result<Self> {
        settings.validate()?;
        Ok(Self {
            draft,
            settings,
            cost: None,
            memory: None,
        })
    }

    /// Plans every round from `cost` ([`plan`]): how deep to draft, how many nodes to verify,
    /// and plain steps where drafting does not pay. `cost` must hold this head's draft costs
    /// ([`CostModel::measure_draft`]).
    pub fn cost_aware(mut self, cost: CostModel) -> Result<Self> {
        cost.check()?;
        if cost.draft(self.draft.as_ref()).is_none() {
            return Err(Error::Config(format!(
                "cost-aware speculation: the cost model has no figures for the {} head",
                self.draft.kind()
            )));
        }
        self.cost = Some(cost);
        Ok(self)
    }

    /// Greedy cost-aware requests start their acceptance estimates and the clock's correction
    /// from `memory` (what earlier ones accepted with this head, how their rounds ran by the
    /// clock) and add theirs to it when done, so a request plans its first rounds from
    /// experience rather than a fixed prior. Sampled requests neither read nor write it: their
    /// rounds, and so their answers for a seed, depend on the request alone.
    pub fn remembering(mut self, memory: Arc<Mutex<Memory>>) -> Self {
        self.memory = Some(memory);
        self
    }

    pub fn settings(&self) -> &TreeSettings {
        &self.settings
    }

    /// A planner for a request whose draft start runs `start_rows` rows and whose answer begins
    /// with `first`, when cost-aware.
    fn planner(&self, start_rows: usize, first: TokenId) -> Option<Planner> {
        let cost = self.cost.as_ref()?;
        let draft = cost.draft(self.draft.as_ref())?.clone();
        Some(
            Planner::new(cost.clone(), draft, self.settings.clone(), start_rows)
                .with_prior(self.draft.acceptance())
                .starting_with(first),
        )
    }
}

/// Counters of a run, turned into [`DecodeStats`] at the end.
#[derive(Default)]
struct Tally {
    rounds: u64,
    draft_tokens: u64,
    accepted: u64,
    draft_forwards: u64,
    recovered: u64,
    /// Rounds that verified no draft (cost-aware plain steps).
    plain_rounds: u64,
    /// The cost model's seconds for the planned rounds and for a decode step.
    modelled: Option<(f64, f64)>,
    /// Rounds whose tree reached depth `d` (index `d - 1`), and those that accepted it.
    offered_by_depth: Vec<u64>,
    accepted_by_depth: Vec<u64>,
    /// Per response-position bucket: rounds started there and tokens they emitted.
    rounds_by_position: Vec<u64>,
    emitted_by_position: Vec<u64>,
    /// Where each round's tokens begin.
    steps: StepLog,
    /// Where the time went: the draft's prompt rows, pending rows + tree growth, the target's
    /// verification pass (forward and logits), acceptance and bookkeeping.
    time: Phases,
}

#[derive(Default)]
struct Phases {
    start: std::time::Duration,
    draft: std::time::Duration,
    verify: std::time::Duration,
    accept: std::time::Duration,
}

fn bump(h: &mut Vec<u64>, i: usize, by: u64) {
    if h.len() <= i {
        h.resize(i + 1, 0);
    }
    h[i] += by;
}

impl DecodeStrategy for Speculative {
    fn name(&self) -> &'static str {
        self.draft.kind().name()
    }

    fn start(
        &self,
        model: &dyn CausalLm,
        state: Prefilled,
        mut sampler: Sampler,
        config: &GenerateConfig,
    ) -> Result<Box<dyn DecodeState>> {
        let start = Instant::now();
        let last_hidden = state.last_hidden()?;
        let x = crate::autoregressive::pick(model, &last_hidden, &mut sampler)?;
        let prefill = state.elapsed + start.elapsed();
        let (prompt_len, pos) = (state.prompt_len(), state.last_pos());
        let image_rows: Vec<Vec<usize>> = state.images.iter().map(|i| i.rows.clone()).collect();
        let image_counts: Vec<usize> = image_rows.iter().map(Vec::len).collect();
        let greedy = sampler.params().is_greedy();
        let planner = self
            .planner(self.draft.start_rows(prompt_len, &image_counts), x)
            .map(|p| {
                // Sampled rounds plan without the clock or the memory: the same seed, the same
                // answer.
                match &self.memory {
                    _ if !greedy => p.without_clock(),
                    Some(m) => p.remembering(&m.lock().expect("not poisoned")),
                    None => p,
                }
            });
        Ok(Box::new(SpecState {
            draft: self.draft.clone(),
            settings: self.settings.clone(),
            cost_aware: self.cost.is_some(),
            memory: self.memory.clone(),
            planner,
            greedy,
            sampler,
            config: config.clone(),
            max: model.max_positions(),
            draft_cache: self.draft.new_cache(),
            target_cache: state.cache,
            prompt: DraftPromptRows {
                inputs: state.inputs,
                hidden: state.hidden,
                positions: state.positions,
                images: image_rows,
            },
            started: None,
            drafting: None,
            pending: Pending {
                tokens: vec![x],
                prev: vec![last_hidden],
                positions: vec![pos + 1],
            },
            x,
            // x's position once emitted.
            pos,
            tokens: Vec::new(),
            tally: Tally::default(),
            forwards: 0,
            prompt_len,
            prefill,
            start: Instant::now(),
            first: true,
            round: None,
            ended: None,
        }))
    }
}

/// The prompt rows a draft head starts from (kept until the first drafting round).
struct DraftPromptRows {
    inputs: Tensor,
    hidden: Tensor,
    positions: Vec<u32>,
    images: Vec<Vec<usize>>,
}

/// A round between its pass and the pass's outputs.
struct Open {
    tree: DraftTree,
    depth: usize,
    /// Rows of the pass (`x` and the tree).
    rows: usize,
    /// Pending rows the draft ran this round.
    drafted_pending: usize,
    /// The round's clock (from after the draft's start, if it ran this round).
    round_clock: Instant,
    verify_clock: Instant,
}

/// A round's drafting, from its opening to its target pass: the draft's passes (steps 1 and 2)
/// are handed out one at a time ([`DecodeState::draft_pass`]), so a scheduler can run each of
/// them for many requests at once.
struct Drafting {
    depth: usize,
    settings: TreeSettings,
    /// Pending rows the draft runs this round.
    drafted_pending: usize,
    /// The round's clock (from after the draft's start, if it runs this round).
    round_clock: Instant,
    /// The drafting's clock, from its first pass (after the draft's start and prompt rows, in
    /// the round that runs them).
    clock: Instant,
    stage: Stage,
}

enum Stage {
    /// Step 1 is next: the pending rows (after the draft's prompt rows in the first round).
    CatchUp,
    /// Their pass is out; `prompt`: the draft's prompt rows are in it.
    CaughtUp { prompt: bool },
    /// Step 2: the tree grows level by level; its speculative rows go back to `mark` once grown.
    Tree { grower: Grower, mark: CacheMark },
    /// The tree for the target pass (empty: a plain round).
    Done(DraftTree),
}

/// Speculative decoding between target passes; see the module header for the round.
struct SpecState {
    draft: Arc<dyn DraftLm>,
    settings: TreeSettings,
    cost_aware: bool,
    memory: Option<Arc<Mutex<Memory>>>,
    planner: Option<Planner>,
    greedy: bool,
    sampler: Sampler,
    config: GenerateConfig,
    max: usize,
    target_cache: KvCache,
    draft_cache: KvCache,
    prompt: DraftPromptRows,
    /// The draft's context, once it has started (at the first drafting round), and its prompt
    /// rows until they have run.
    started: Option<(DraftContext, Option<DraftStart>)>,
    /// The open round's drafting, until its target pass.
    drafting: Option<Drafting>,
    /// The rows waiting for the draft: each emitted token with the target hidden state that
    /// predicted it, `x`'s last.
    pending: Pending,
    x: TokenId,
    pos: u32,
    tokens: Vec<TokenId>,
    tally: Tally,
    forwards: u64,
    prompt_len: usize,
    prefill: std::time::Duration,
    start: Instant,
    /// `x` is the prefill's token, not emitted yet.
    first: bool,
    round: Option<Open>,
    ended: Option<FinishReason>,
}

impl SpecState {
    fn emit(&mut self, t: TokenId, pos: u32, on_token: TokenSink<'_>) -> Result<bool> {
        let r = crate::autoregressive::emit(
            t,
            &mut self.tokens,
            pos,
            self.max,
            &self.config,
            on_token,
        )?;
        if r.is_some() {
            self.ended = r;
        }
        Ok(r.is_some())
    }

    /// Opens a round unless one is open: on the first, emits the prefill's token; plans how
    /// deep to draft. `false`: the generation has ended.
    fn open_round(&mut self, on_token: TokenSink<'_>) -> Result<bool> {
        if self.ended.is_some() {
            return Ok(false);
        }
        if self.drafting.is_some() {
            return Ok(true);
        }
        if self.round.is_some() {
            return Err(Error::Input(
                "speculative decoding: a new round before the last pass's outputs".into(),
            ));
        }
        if self.first {
            self.first = false;
            if self.config.max_new_tokens == 0 {
                self.ended = Some(FinishReason::Length);
                return Ok(false);
            }
            if self.emit(self.x, self.pos, on_token)? {
                return Ok(false);
            }
            self.pos += 1; // x's position
        }
        // The tree, as deep as the answer and the context leave room for.
        // (Beyond the answer's last token a draft cannot be used; the verified rows must fit
        // the context after the cached ones.)
        let room_answer = (self.config.max_new_tokens - self.tokens.len()).saturating_sub(1);
        let room_context = self.max.saturating_sub(self.pos as usize + 2);
        let mut settings = self.settings.clone();
        settings.budget = settings
            .budget
            .min(self.max.saturating_sub(self.target_cache.len() + 1));
        let room = settings
            .depth
            .min(room_answer)
            .min(room_context)
            .min(settings.budget);
        let depth = match self.planner.as_mut() {
            None => room,
            Some(p) => match p.next_round(room) {
                Round::Plain => 0,
                Round::Draft { depth } => depth.min(room),
            },
        };
        let stage = if depth > 0 {
            Stage::CatchUp
        } else {
            self.tally.plain_rounds += 1;
            Stage::Done(DraftTree::default())
        };
        let now = Instant::now();
        self.drafting = Some(Drafting {
            depth,
            settings,
            drafted_pending: self.pending.tokens.len(),
            round_clock: now,
            clock: now,
            stage,
        });
        Ok(true)
    }
}

impl DecodeState for SpecState {
    fn draft_pass(
        &mut self,
        model: &dyn CausalLm,
        on_token: TokenSink<'_>,
    ) -> Result<Option<DraftPass>> {
        if !self.open_round(on_token)? {
            return Ok(None);
        }
        let Some(round) = self.drafting.as_mut() else {
            unreachable!("the round was opened above")
        };
        match &mut round.stage {
            Stage::CatchUp => {
                let clock = Instant::now();
                (round.clock, round.round_clock) = (clock, clock);
                // The draft starts (its prompt rows) if it has not; the pending rows with real
                // hidden states are committed in its cache.
                if self.started.is_none() {
                    let p = &self.prompt;
                    let s = self.draft.start(&DraftPrompt {
                        inputs: &p.inputs,
                        hidden: &p.hidden,
                        positions: &p.positions,
                        images: &p.images,
                    })?;
                    // Timed with the prompt rows' pass, when its outputs come back.
                    self.started = Some((s.context.clone(), Some(s)));
                }
                let Some((context, prompt)) = self.started.as_mut() else {
                    unreachable!("the draft was started above")
                };
                // (n, hidden)
                let (mut rows, mut positions) =
                    self.pending.rows(model, self.draft.as_ref(), context)?;
                let first = prompt.take();
                if let Some(p) = &first {
                    rows = Tensor::cat(&[&p.rows, &rows], 0)?;
                    positions = [p.positions.as_slice(), &positions].concat();
                }
                round.stage = Stage::CaughtUp {
                    prompt: first.is_some(),
                };
                let n = positions.len();
                Ok(Some(DraftPass {
                    rows,
                    positions,
                    mask: AttnMask::causal(),
                    // x's row: the tree's root.
                    logits: n - 1..n,
                }))
            }
            Stage::CaughtUp { .. } => Err(Error::Input(
                "speculative decoding: a draft pass before the last one's outputs".into(),
            )),
            Stage::Tree { grower, mark } => {
                let Some((context, _)) = self.started.as_ref() else {
                    unreachable!("the tree grows after the draft's start")
                };
                if let Some(pass) = grower.next_pass(model, self.draft.as_ref(), context)? {
                    return Ok(Some(pass));
                }
                let mut tree = grower.tree();
                self.draft_cache.rollback(mark)?;
                if let Some(p) = self.planner.as_ref() {
                    tree.keep_best(p.budget(&tree, round.drafted_pending));
                }
                self.tally.time.draft += round.clock.elapsed();
                round.stage = Stage::Done(tree);
                Ok(None)
            }
            Stage::Done(_) => Ok(None),
        }
    }

    fn draft(&self) -> Option<&Arc<dyn DraftLm>> {
        Some(&self.draft)
    }

    fn draft_cache(&mut self) -> Option<&mut KvCache> {
        Some(&mut self.draft_cache)
    }

    fn absorb_draft(&mut self, _: &dyn CausalLm, out: DraftOutput) -> Result<()> {
        let Some(round) = self.drafting.as_mut() else {
            return Err(Error::Input(
                "speculative decoding: draft outputs outside a round".into(),
            ));
        };
        match &mut round.stage {
            Stage::CaughtUp { prompt } => {
                if *prompt {
                    // The draft's start and its prompt rows' pass are the start phase; the
                    // round (and its drafting) is timed from here.
                    let now = Instant::now();
                    self.tally.time.start += now - round.clock;
                    (round.clock, round.round_clock) = (now, now);
                }
                // x's row: the tree's root (1, hidden).
                let n = out.hidden.dim(0)?;
                let root = out.hidden.narrow(0, n.saturating_sub(1), 1)?;
                let mark = self.draft_cache.mark();
                let grower = Grower::new(
                    &root,
                    &out.logits,
                    self.pos,
                    self.draft_cache.len(),
                    &round.settings,
                    round.depth,
                    &self.config.eos_token_ids,
                )?;
                round.stage = Stage::Tree { grower, mark };
                Ok(())
            }
            Stage::Tree { grower, .. } => grower.absorb(&out.hidden, &out.logits),
            Stage::CatchUp | Stage::Done(_) => Err(Error::Input(
                "speculative decoding: draft outputs without a draft pass".into(),
            )),
        }
    }

    fn next_pass(&mut self, model: &dyn CausalLm, on_token: TokenSink<'_>) -> Result<Option<Pass>> {
        // Steps 1 and 2, where the caller has not run them.
        crate::step::draft_alone(model, self, on_token)?;
        if self.ended.is_some() {
            return Ok(None);
        }
        let Some(Drafting {
            depth,
            drafted_pending,
            round_clock,
            stage: Stage::Done(tree),
            ..
        }) = self.drafting.take()
        else {
            return Err(Error::Input(
                "speculative decoding: the target pass before the draft's".into(),
            ));
        };
        // Step 3: one target pass over [x, tree…] (a decode step when the tree is empty).
        let mut ids = Vec::with_capacity(tree.len() + 1);
        ids.push(self.x);
        ids.extend(&tree.tokens);
        let mask = TreeMask::new(tree.verify_parents())?;
        let positions = mask.positions(self.pos);
        // A plain round is a decode step: one row sees every cached row, as under the causal
        // mask (cheaper than materialising a tree mask per layer).
        let mask = if tree.is_empty() {
            AttnMask::causal()
        } else {
            AttnMask::Tree(mask)
        };
        let rows = ids.len();
        self.round = Some(Open {
            tree,
            depth,
            rows,
            drafted_pending,
            round_clock,
            verify_clock: Instant::now(),
        });
        Ok(Some(Pass {
            ids,
            positions,
            mask,
            invariant: false,
            logits: 0..rows,
        }))
    }

    fn cache(&mut self) -> &mut KvCache {
        &mut self.target_cache
    }

    fn share(&mut self, load: Load) {
        if let Some(p) = self.planner.as_mut() {
            p.share(load);
        }
    }

    fn absorb(&mut self, _: &dyn CausalLm, out: PassOutput, on_token: TokenSink<'_>) -> Result<()> {
        let Some(open) = self.round.take() else {
            return Err(Error::Input(
                "speculative decoding: outputs without a pass".into(),
            ));
        };
        let Open {
            tree,
            depth,
            rows,
            drafted_pending,
            round_clock,
            verify_clock,
        } = open;
        self.forwards += 1;
        self.tally.time.verify += verify_clock.elapsed();
        let clock = Instant::now();
        // 4. Accept, emit, keep the accepted rows.
        let verdict = verify(&tree, &out.logits, &mut self.sampler)?;
        match self.planner.as_mut() {
            None => record(&mut self.tally, &tree, &verdict, self.tokens.len()),
            Some(_) if tree.is_empty() => {}
            Some(p) => {
                record(&mut self.tally, &tree, &verdict, self.tokens.len());
                p.record(&tree, verdict.accepted.len(), drafted_pending);
            }
        }
        if let Some(p) = self.planner.as_mut() {
            // (The accept phase's bookkeeping is the same for both kinds of round.)
            p.timed(!tree.is_empty(), round_clock.elapsed().as_secs_f64());
            self.tally.modelled = Some(p.modelled());
        }
        let mut keep = vec![0];
        keep.extend(verdict.accepted.iter().map(|&i| i + 1));
        self.target_cache.keep_speculative(rows, &keep)?;
        let mut emitted = Vec::new();
        self.tally.steps.begin(self.tokens.len());
        for t in verdict
            .accepted
            .iter()
            .map(|&i| tree.tokens[i])
            .chain(std::iter::once(verdict.next))
        {
            self.pos += 1;
            emitted.push(t);
            if self.emit(t, self.pos - 1, on_token)? {
                self.tally.time.accept += clock.elapsed();
                return Ok(());
            }
        }
        // The next round's pending rows: each emitted token with the hidden state before it
        // (after this round's if the draft did not run).
        if depth > 0 {
            self.pending.clear();
        }
        for (k, (&t, &row)) in emitted.iter().zip(&keep).enumerate() {
            self.pending.tokens.push(t);
            self.pending.prev.push(out.hidden.narrow(0, row, 1)?);
            self.pending
                .positions
                .push(self.pos - emitted.len() as u32 + 1 + k as u32);
        }
        self.x = verdict.next;
        self.tally.time.accept += clock.elapsed();
        Ok(())
    }

    fn finish(self: Box<Self>) -> Generation {
        let mut s = *self;
        if let (Some(m), Some(p), true) = (&s.memory, &mut s.planner, s.greedy) {
            p.answered(s.tokens.len());
            m.lock().expect("not poisoned").merge(p);
        }
        let name = s.draft.kind().name();
        finish(
            name,
            s.cost_aware,
            s.tokens,
            s.ended.unwrap_or(FinishReason::Stop),
            s.prompt_len,
            s.prefill,
            s.start,
            s.forwards,
            s.tally,
        )
    }
}

/// Emitted tokens whose rows have not run through the draft yet.
struct Pending {
    tokens: Vec<TokenId>,
    /// Per token, the target's hidden state that predicted it `(1, hidden)`.
    prev: Vec<Tensor>,
    positions: Vec<u32>,
}

impl Pending {
    /// The draft rows `(n, hidden)` and their positions.
    fn rows(
        &self,
        model: &dyn CausalLm,
        draft: &dyn DraftLm,
        context: &DraftContext,
    ) -> Result<(Tensor, Vec<u32>)> {
        let prev = Tensor::cat(&self.prev, 0)?;
        let rows = draft.fuse(&model.embed_tokens(&self.tokens)?, &prev, context)?;
        Ok((rows, self.positions.clone()))
    }

    fn clear(&mut self) {
        self.tokens.clear();
        self.prev.clear();
        self.positions.clear();
    }
}

fn record(tally: &mut Tally, tree: &DraftTree, verdict: &Verdict, emitted_before: usize) {
    tally.rounds += 1;
    tally.draft_tokens += tree.len() as u64;
    tally.accepted += verdict.accepted.len() as u64;
    tally.draft_forwards += tree.forwards;
    tally.recovered += u64::from(verdict.recovered);
    let deepest = (0..tree.len()).map(|i| tree.depth(i)).max().unwrap_or(0);
    for d in 0..deepest {
        bump(&mut tally.offered_by_depth, d, 1);
    }
    for d in 0..verdict.accepted.len() {
        bump(&mut tally.accepted_by_depth, d, 1);
    }
    let bucket = emitted_before / POSITION_BUCKET;
    bump(&mut tally.rounds_by_position, bucket, 1);
    bump(
        &mut tally.emitted_by_position,
        bucket,
        verdict.accepted.len() as u64 + 1,
    );
}

#[allow(clippy::too_many_arguments)]
fn finish(
    name: &str,
    cost_aware: bool,
    tokens: Vec<TokenId>,
    finish: FinishReason,
    prompt_len: usize,
    prefill: std::time::Duration,
    start: Instant,
    forwards: u64,
    tally: Tally,
) -> Generation {
    let mut stats = DecodeStats {
        tokens_per_step: tally.steps.counts(tokens.len()),
        ..DecodeStats::new(name, forwards)
    };
    let c = &mut stats.counters;
    c.insert("drafts".into(), tally.rounds);
    c.insert("draft_tokens".into(), tally.draft_tokens);
    c.insert("accepted_tokens".into(), tally.accepted);
    c.insert("draft_forwards".into(), tally.draft_forwards);
    c.insert("recovered_tokens".into(), tally.recovered);
    if cost_aware {
        c.insert("plain_rounds".into(), tally.plain_rounds);
        let (modelled, step) = tally.modelled.unwrap_or_default();
        c.insert("modelled_us".into(), (modelled * 1e6) as u64);
        c.insert("modelled_step_us".into(), (step * 1e6) as u64);
    }
    let us = |d: std::time::Duration| d.as_micros() as u64;
    c.insert("time_start_us".into(), us(tally.time.start));
    c.insert("time_draft_us".into(), us(tally.time.draft));
    c.insert("time_verify_us".into(), us(tally.time.verify));
    c.insert("time_accept_us".into(), us(tally.time.accept));
    let h = &mut stats.histograms;
    h.insert("accepted_by_depth".into(), tally.accepted_by_depth);
    h.insert("offered_by_depth".into(), tally.offered_by_depth);
    h.insert("rounds_by_position".into(), tally.rounds_by_position);
    h.insert("emitted_by_position".into(), tally.emitted_by_position);
    Generation {
        tokens,
        finish,
        prompt_len,
        prefill,
        decode: start.elapsed(),
        stats,
    }
}
