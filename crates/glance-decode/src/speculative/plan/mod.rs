//! Cost-aware speculation: each round decides, from the measured [`CostModel`] and what this
//! request's drafts have accepted so far, whether drafting pays, how deep to draft, and how many
//! of the drafted nodes to verify (Sequoia's objective — accepted tokens per unit of measured
//! time — with EAGLE-2's confidence-ranked nodes).
//!
//! * **Plain rounds.** When no depth is predicted to beat a decode step, the round verifies an
//!   empty tree: one row, exactly a decode step, and no draft work at all (the emitted tokens
//!   wait as pending rows until the draft runs again). On a cache-resident model, where a pass
//!   over `k` rows costs `k` steps, no round ever drafts.
//! * **The draft's prompt pass** is paid only once the answer has run plainly for as long as
//!   that pass takes to pay for itself: with drafted rounds predicted `g` times as fast as
//!   plain steps, each token after the start saves `f = 1 - 1/g` of a step, so the pass of `S`
//!   seconds is bought after `S / f` seconds of plain steps (the ski-rental rule where buying
//!   saves a share `f` of the rent), and after at least [`WARM_UP_STEPS`] steps. An answer that
//!   ends sooner costs exactly what autoregressive decoding costs; one that ends just after the
//!   start costs at most `1 + f` times it; and where a draft only just pays (a cache-resident
//!   model, whose start is tens of decode steps), the start waits for an answer long enough to
//!   recover it. With remembered answer lengths ([`Planner::remembering`]) the start comes at
//!   the step that makes those answers cheapest, or never.
//! * **Depth** maximises `E[tokens] / (drafting + pass(rows))` with per-depth acceptance
//!   estimated from this request's rounds (smoothed towards a prior).
//! * **The clock corrects the model**: drafted rounds' measured / modelled time against plain
//!   rounds' scales what a drafted round is predicted to cost ([`Planner::slowdown`]), so a
//!   model timed at a shorter context, or a machine that got busier, does not keep a request
//!   speculating at a loss.
//! * **Verified nodes**: after drafting, the `B` best nodes by path probability (calibrated by
//!   the request's accepted / predicted ratio) that maximise the same rate, drafting time
//!   included; `B = 0` is a plain step.
//!
//! Planning only decides which tokens are proposed and verified; verification is unchanged, so
//! every plan is as lossless as any fixed tree.

pub use super::acceptance::{Acceptance, PRIOR_ACCEPTANCE};
use super::tree::{DraftTree, TreeSettings};
use crate::cost::{CostModel, DraftCost};
use crate::step::Load;
use glance_core::TokenId;
use std::collections::HashMap;

/// Weight of the calibration's prior (ratio 1), in tokens.
const PRIOR_TOKENS: f64 = 4.0;
/// Plain rounds in a row after which one round drafts anyway, to keep acceptance estimates
/// current when speculation could pay.
pub const EXPLORE_AFTER: u32 = 16;
/// How much faster than a decode step `auto`'s first round must be predicted to run for `auto`
/// to choose speculation at all.
pub const AUTO_MARGIN: f64 = 1.1;
/// Weight, in decode steps, of the cost model's own figures against the clock's.
const PRIOR_STEPS: f64 = 8.0;
/// Plain steps before the draft may start, unless remembered answers say otherwise
/// ([`Planner::remembering`]): short answers (a word or a number and the end of the sequence)
/// end before a draft's start and first round could pay for themselves.
pub const WARM_UP_STEPS: usize = 4;
/// Answers a memory must hold before their lengths set the warm-up.
const MIN_ANSWERS: f64 = 8.0;
/// Weight, in answers, of all remembered answers' lengths beside those that began with the
/// same token.
const PRIOR_ANSWERS: f64 = 2.0;
/// Answers a memory keeps: older ones fade, as its rounds do.
const MEMORY_ANSWERS: f64 = 200.0;
/// Answers longer than this many steps are remembered as this long (which undervalues a draft
/// only for answers longer still).
const LONGEST_REMEMBERED: usize = 256;
/// A plan must beat a plain step by this factor to be chosen (measurement noise).
const MARGIN: f64 = 1.02;

/// What a round does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Verify no draft: one decode step.
    Plain,
    /// Draft up to `depth` tokens deep (starting the draft first if it has not run yet).
    Draft { depth: usize },
}

/// A request's planner.
pub struct Planner {
    cost: CostModel,
    draft: DraftCost,
    settings: TreeSettings,
    /// Rows of the draft's prompt pass, paid at its start.
    start_rows: usize,
    started: bool,
    /// Modelled seconds of plain rounds before the start (the ski-rental account).
    plain_before_start: f64,
    /// Plain rounds before the start.
    plain_steps_before_start: usize,
    plain_streak: u32,
    acceptance: Acceptance,
    /// How many remembered answers like this one needed each number of steps after their
    /// first token (index: steps, the last bucket holding every longer answer), if enough
    /// are remembered ([`Lengths::like`]).
    remembered_lengths: Option<Vec<f64>>,
    /// [`Planner::remembered_warm_up`], worked out at the first round that asks (it sums over
    /// every remembered length: not again at every plain step).
    warm_up: Option<Option<usize>>,
    /// The answer's first token ([`Planner::starting_with`]).
    first_token: Option<TokenId>,
    /// Tokens of the whole answer, once told ([`Planner::answered`]).
    answer_tokens: Option<usize>,
    accepted_tokens: f64,
    predicted_tokens: f64,
    /// Whether any plan can beat a plain step, even if every draft were accepted.
    can_pay: bool,
    /// What the cost model says this request's rounds so far cost, seconds.
    modelled_s: f64,
    /// The last round's modelled seconds, until [`Planner::timed`] pairs it with the clock.
    last_modelled: f64,
    /// This request's plain and drafted rounds: measured and modelled seconds (see
    /// [`Planner::slowdown`]).
    clock_sums: Clock,
    /// What earlier requests' rounds measured ([`Planner::remembering`]).
    remembered_clock: Clock,
    /// Whether [`Planner::slowdown`] corrects by the clock.
    clock: bool,
    /// What the other requests bring to the steps this request's rounds share
    /// ([`Planner::share`]).
    load: Load,
}

impl Planner {
    pub fn new(
        cost: CostModel,
        draft: DraftCost,
        settings: TreeSettings,
        start_rows: usize,
    ) -> Self {
        let mut p = Self {
            cost,
            draft,
            settings,
            start_rows,
            started: false,
            plain_before_start: 0.0,
            plain_steps_before_start: 0,
            plain_streak: 0,
            acceptance: Acceptance::default(),
            remembered_lengths: None,
            warm_up: None,
            first_token: None,
            answer_tokens: None,
            accepted_tokens: 0.0,
            predicted_tokens: 0.0,
            can_pay: false,
            modelled_s: 0.0,
            last_modelled: 0.0,
            clock_sums: Clock::default(),
            remembered_clock: Clock::default(),
            clock: true,
            load: Load::default(),
        };
        p.can_pay = p.best_depth(usize::MAX, 0, |_| 1.0).is_some();
        p
    }

    /// Whether speculation can beat a decode step at all here: with every draft accepted, some
    /// depth's round must cost less than its tokens' decode steps.
    pub fn can_pay(&self) -> bool {
        self.can_pay
    }

    /// Plans from `by_depth`, the head's measured acceptance at depths 1, 2, … (its
    /// [`glance_nn::DraftLm::acceptance`]), where this request's rounds and earlier requests
    /// have not yet said otherwise; without it the prior is [`PRIOR_ACCEPTANCE`].
    pub fn with_prior(mut self, by_depth: Option<&[f64]>) -> Self {
        self.acceptance = self.acceptance.with_prior(by_depth.unwrap_or_default());
        self
    }

    /// Whether a request's first drafted round is predicted to beat a decode step by
    /// [`AUTO_MARGIN`], with the prior's acceptance (the head's measured acceptance, else
    /// [`PRIOR_ACCEPTANCE`] at every depth): what `auto` asks before choosing speculation, so
    /// that a model where only a near-perfect draft could pay — or where the measured figures
    /// only just favour drafting, which a noisy measurement can flip — decodes plainly.
    pub fn pays_at_prior(&self) -> bool {
        self.can_pay
            && self
                .predicted(usize::MAX)
                .is_some_and(|(_, gain)| gain >= AUTO_MARGIN)
    }

    /// Whether a draft is predicted not to make requests like the remembered ones (`memory`:
    /// their answers' lengths, and what the draft's start cost them) dearer, at this planner's
    /// figures: `false` where, at every warm-up, the start costs more than the drafted rounds
    /// would save over those answers (a cache-resident model, its draft running tens of decode
    /// steps' worth of prompt rows to save a little on each token). Answers that all ended
    /// within the warm-up are a tie, and keep the draft for a longer one. `true` with fewer
    /// than [`MIN_ANSWERS`] remembered: until then the request's own planner decides.
    pub fn pays_for_remembered_answers(&self, memory: &Memory) -> bool {
        if memory.lengths.answers() < MIN_ANSWERS {
            return true;
        }
        self.warm_up_for(&memory.lengths.all, memory.start_steps)
            .is_some_and(|(_, cost, plainly)| cost <= plainly)
    }

    /// The steps of this request's next rounds carry `load` (a scheduler's shared step). Every
    /// row a round adds to a shared pass delays every request in it, so a round's extra work is
    /// charged once per request sharing the step: alone, a tree is worth its rows while the model
    /// is memory-bound; in a batch, only while the whole batch is. A sampled request's rounds
    /// ignore the load (like the clock): the same seed, the same answer, whatever runs beside it.
    pub fn share(&mut self, load: Load) {
        if self.clock {
            self.load = load;
        }
    }

    /// What a round whose target pass holds `k` of this request's rows costs, in seconds: the
    /// measured pass alone; in a shared pass, a decode step plus the time its `k - 1` extra
    /// rows add to the pass, for each request that waits on it.
    fn pass(&self, k: usize) -> f64 {
        let Load { rows, requests, .. } = self.load;
        if requests == 0 {
            return self.cost.pass(k);
        }
        let extra = (self.cost.pass(rows + k) - self.cost.pass(rows + 1)).max(0.0);
        self.cost.pass(1) + (requests + 1) as f64 * extra
    }

    /// What a round's drafting costs, in seconds: `pending` rows and the root's step, then
    /// `forwards` steps over `width` rows each. Alone, what they take. In a shared step every
    /// request waits on them, so they are charged once per request in it, as the target's extra
    /// rows are ([`Planner::pass`]); but a level the other requests' drafts run anyway on the
    /// same head (one pass for all of them) costs only the rows this request adds to it.
    fn drafting(&self, pending: usize, forwards: usize, width: usize) -> f64 {
        let d = &self.draft;
        let alone = |first: bool, n: usize| {
            if first {
                d.row_s * pending as f64 + d.step(1)
            } else {
                d.step(n)
            }
        };
        let Load {
            requests,
            draft_rows,
            draft_levels,
            ..
        } = self.load;
        if requests == 0 {
            return alone(true, 1) + forwards as f64 * alone(false, width);
        }
        let level = |i: usize, n: usize| {
            if i < draft_levels {
                (d.step(draft_rows + n) - d.step(draft_rows)).max(0.0)
            } else {
                alone(i == 0, n)
            }
        };
        let own = level(0, pending + 1) + (1..=forwards).map(|i| level(i, width)).sum::<f64>();
        (requests + 1) as f64 * own
    }

    /// Starts from what earlier requests met (`memory`): the acceptance estimates from what
    /// their drafts accepted, the warm-up from how long their answers ran
    /// ([`Planner::remembered_warm_up`]), and the clock's correction ([`Planner::slowdown`])
    /// from how their rounds ran against the cost model, as if they had been this request's.
    /// On a model whose drafted rounds run slower by the clock than its figures say (a
    /// cache-resident model whose draft evicts the target's weights, a cost model timed in a
    /// quiet moment), a request then plans plain rounds from its first one, not after a few
    /// drafted at a loss. A planner without the clock ([`Planner::without_clock`]) takes only
    /// the acceptance and the answer lengths.
    pub fn remembering(mut self, memory: &Memory) -> Self {
        self.acceptance =
            Acceptance::remembered(&memory.acceptance).with_prior(self.acceptance.prior());
        self.remembered_lengths = memory.lengths.like(self.first_token);
        if self.clock {
            self.remembered_clock = memory.clock;
        }
        self
    }

    /// This request's acceptance counts.
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// Plans from the cost model alone, without the clock's correction: the rounds then depend
    /// only on the request (and the model's figures), so a seeded sampled answer is the same on
    /// every run — the speculative strategy samples through its rounds.
    pub fn without_clock(mut self) -> Self {
        self.clock = false;
        self
    }

    /// What the draft's start (its prompt rows' pass) costs, in seconds.
    fn start_s(&self) -> f64 {
        self.draft.row_s * self.start_rows as f64
    }

    /// [`Planner::start_s`] in decode steps.
    fn start_steps(&self) -> f64 {
        self.start_s() / self.cost.pass(1)
    }

    /// The best depth for a round and its predicted speed-up over plain decoding, if one beats a
    /// decode step: `room` caps the depth.
    pub fn predicted(&self, room: usize) -> Option<(usize, f64)> {
        self.best_depth(room, 0, |d| self.acceptance.at(d))
    }

    /// What the next round does, with room for `room` draft tokens. (Rows waiting for the draft
    /// after plain rounds are a catch-up paid once, like the start, not a cost of every round:
    /// they do not enter the choice.)
    pub fn next_round(&mut self, room: usize) -> Round {
        let plain = self.pass(1);
        if !self.can_pay || room == 0 {
            return self.plain(plain);
        }
        let (depth, gain) = match self.predicted(room) {
            Some(best) => best,
            // Exploring re-measures a started draft; it never pays for the start.
            None if self.started && self.plain_streak >= EXPLORE_AFTER => {
                // Re-measure acceptance: the depth that would pay with every draft accepted.
                match self.best_depth(room, 0, |_| 1.0) {
                    Some(best) => best,
                    None => return self.plain(plain),
                }
            }
            None => return self.plain(plain),
        };
        if !self.started {
            let start = self.start_s();
            if self.warm_up.is_none() {
                self.warm_up = Some(self.remembered_warm_up());
            }
            let waited = match self.warm_up.flatten() {
                Some(steps) => self.plain_steps_before_start >= steps,
                // Rent before buying: plain steps until the start would pay for itself, each
                // token after it saving `1 - 1/gain` of a step, and at least [`WARM_UP_STEPS`]
                // (one-word answers end before a draft could pay).
                None => {
                    let saved = 1.0 - 1.0 / gain;
                    self.plain_before_start >= (start / saved).max(WARM_UP_STEPS as f64 * plain)
                }
            };
            if !waited {
                return self.plain(plain);
            }
            self.started = true;
            self.modelled_s += start;
        }
        self.plain_streak = 0;
        Round::Draft { depth }
    }

    fn plain(&mut self, plain: f64) -> Round {
        self.modelled_s += plain;
        self.last_modelled = plain;
        if !self.started {
            self.plain_before_start += plain;
            self.plain_steps_before_start += 1;
        }
        self.plain_streak = self.plain_streak.saturating_add(1);
        Round::Plain
    }

    /// The plain steps before the draft starts that make the remembered answers
    /// ([`Planner::remembering`]) cheapest by the cost model: an answer of `s` steps after its
    /// first token costs `s` steps if it ends within the warm-up `w`, else `w` steps, the
    /// draft's start, and the drafted rounds (each at the best depth's predicted seconds) its
    /// other `s - w` tokens are expected to take. Between 0 and [`WARM_UP_STEPS`], the longer
    /// one on a tie, or `usize::MAX` (never) where plain steps alone make them cheaper; `None`
    /// (the default rule) where no remembered answers are like this one ([`Lengths::like`]) or
    /// no drafted round is predicted to pay.
    fn remembered_warm_up(&self) -> Option<usize> {
        let lengths = self.remembered_lengths.as_ref()?;
        let (best, cost, plainly) = self.warm_up_for(lengths, self.start_steps())?;
        // A tie (every remembered answer ended within the warm-up) keeps the warm-up: an answer
        // that runs on past all of them may still pay for a draft.
        Some(if cost <= plainly { best } else { usize::MAX })
    }

    /// For answers of `lengths` (count by steps after the first token) and a draft start of
    /// `start` decode steps: the warm-up that makes them cheapest by the cost model
    /// ([`Planner::remembered_warm_up`]), their cost with it, and without any draft, in decode
    /// steps.
    fn warm_up_for(&self, lengths: &[f64], start: f64) -> Option<(usize, f64, f64)> {
        let (depth, gain) = self.predicted(usize::MAX)?;
        // A round at that depth emits `1 + j` tokens when it accepts `j` drafts.
        let mut emits = Vec::with_capacity(depth + 1);
        let mut reach = 1.0;
        for d in 1..=depth {
            let a = self.acceptance.at(d);
            emits.push(reach * (1.0 - a));
            reach *= a;
        }
        emits.push(reach);
        let tokens: f64 = emits
            .iter()
            .enumerate()
            .map(|(j, p)| p * (j + 1) as f64)
            .sum();
        // Its cost in decode steps, and the expected rounds to emit `n` tokens.
        let round = tokens / gain;
        let mut rounds = vec![0.0; lengths.len()];
        for n in 1..rounds.len() {
            rounds[n] = 1.0
                + emits
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j + 1 < n)
                    .map(|(j, p)| p * rounds[n - j - 1])
                    .sum::<f64>();
        }
        let cost = |w: usize| -> f64 {
            let each = |s: usize| match s.checked_sub(w) {
                Some(rest) if rest > 0 => w as f64 + start + rounds[rest] * round,
                _ => s as f64,
            };
            lengths.iter().enumerate().map(|(s, n)| n * each(s)).sum()
        };
        let plainly = total_steps(lengths);
        let best = (0..=WARM_UP_STEPS)
            .rev()
            .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))?;
        Some((best, cost(best), plainly))
    }

    /// The answer begins with `token` (picked from the prompt's pass): its warm-up follows the
    /// remembered answers that began with it ([`Lengths::like`]). Call before
    /// [`Planner::remembering`].
    pub fn starting_with(mut self, token: TokenId) -> Self {
        self.first_token = Some(token);
        self
    }

    /// The request's answer ran `tokens` tokens: what [`Memory::merge`] remembers of its
    /// length.
    pub fn answered(&mut self, tokens: usize) {
        self.answer_tokens = Some(tokens);
    }

    /// How many of `tree`'s nodes to verify once drafted (with `pending` rows run through the
    /// draft first): the count, best nodes first ([`DraftTree::keep_best`]), maximising predicted
    /// tokens per second, drafting time included; 0 verifies none.
    pub fn budget(&self, tree: &DraftTree, pending: usize) -> usize {
        let order = tree.best_first();
        let path = tree.path_probs();
        let kappa = self.calibration();
        // The pending rows, the root's probabilities, then one step per draft forward.
        let spent = self.round_seconds(tree, pending) - self.pass(tree.len() + 1);
        let (mut best, mut best_rate) = (0, 1.0 / (spent + self.pass(1)));
        let mut value = 1.0;
        for (b, &i) in order.iter().enumerate() {
            value += kappa * path[i] as f64;
            let rate = value / (spent + self.pass(b + 2));
            if rate > best_rate {
                (best, best_rate) = (b + 1, rate);
            }
        }
        best
    }

    /// Seconds of a drafted round by the cost model: `pending` rows through the draft, the
    /// tree's draft steps, and the verification pass over the tree as verified.
    fn round_seconds(&self, tree: &DraftTree, pending: usize) -> f64 {
        self.drafting(pending, tree.forwards as usize, self.settings.top_k)
            + self.pass(tree.len() + 1)
    }

    /// What the cost model says the rounds so far cost, and a decode step: the speed-up it
    /// predicts for the tokens they emitted is `tokens × step / modelled`.
    pub fn modelled(&self) -> (f64, f64) {
        (self.modelled_s, self.pass(1))
    }

    /// Records a verified round: the tree as verified and the accepted path's length.
    pub fn record(&mut self, tree: &DraftTree, accepted: usize, pending: usize) {
        self.last_modelled = self.round_seconds(tree, pending);
        self.modelled_s += self.last_modelled;
        let deepest = (0..tree.len()).map(|i| tree.depth(i)).max().unwrap_or(0);
        self.acceptance.record(deepest, accepted);
        self.accepted_tokens += accepted as f64;
        self.predicted_tokens += tree.path_probs().iter().map(|&p| p as f64).sum::<f64>();
    }

    /// The last round took `seconds` by the clock (`drafted`: it drafted and verified a tree).
    pub fn timed(&mut self, drafted: bool, seconds: f64) {
        // A shared pass's clock times the other requests' rows too: no measure of this
        // request's rounds against its model.
        if self.load.requests > 0 {
            return;
        }
        let side = if drafted {
            &mut self.clock_sums.drafted
        } else {
            &mut self.clock_sums.plain
        };
        side.0 += seconds;
        side.1 += self.last_modelled;
    }

    /// How much slower drafted rounds run by the clock, relative to the cost model, than plain
    /// ones do: the model's figures were timed at one context length and one moment, the
    /// request runs at another (a longer prompt's attention, other work on the machine). Each
    /// side's measured / modelled ratio, over this request's rounds and the remembered ones
    /// ([`Planner::remembering`]), is smoothed with [`PRIOR_STEPS`] decode steps' weight
    /// (plain rounds towards 1, drafted ones towards the plain ratio); the quotient is bounded
    /// to [0.5, 3]. 1 when the cost model is not clock-corrected.
    pub fn slowdown(&self) -> f64 {
        if !(self.clock && self.cost.clock_corrected) {
            return 1.0;
        }
        let prior = PRIOR_STEPS * self.pass(1);
        let sum =
            |own: (f64, f64), remembered: (f64, f64)| (own.0 + remembered.0, own.1 + remembered.1);
        let (clock, model) = sum(self.clock_sums.plain, self.remembered_clock.plain);
        let plain = (clock + prior) / (model + prior);
        // Drafted rounds not yet timed run as the plain ones do, relative to the model.
        let (clock, model) = sum(self.clock_sums.drafted, self.remembered_clock.drafted);
        let drafted = (clock + prior * plain) / (model + prior);
        (drafted / plain).clamp(0.5, 3.0)
    }

    /// Accepted / draft-predicted tokens so far, smoothed towards 1.
    fn calibration(&self) -> f64 {
        ((self.accepted_tokens + PRIOR_TOKENS) / (self.predicted_tokens + PRIOR_TOKENS))
            .clamp(0.25, 2.0)
    }

    /// The depth (≤ `room`, ≤ the settings' depth) whose round is predicted fastest per token
    /// with per-depth acceptance `accept`, and its speed-up over a plain step, if above
    /// [`MARGIN`].
    fn best_depth(
        &self,
        room: usize,
        pending: usize,
        accept: impl Fn(usize) -> f64,
    ) -> Option<(usize, f64)> {
        let width = self.settings.top_k.max(1);
        let max_depth = self.settings.depth.min(room).min(self.settings.budget);
        // The root's probabilities, then a step per further depth; the best path's rows (what
        // else the tree offers is verified only where its confidence pays for its rows:
        // `budget`).
        let slowdown = self.slowdown();
        best_chain(max_depth, self.pass(1), accept, |d| {
            (self.drafting(pending, d - 1, width) + self.pass(d + 1)) * slowdown
        })
    }
}

/// Decode steps of modelled time a memory's clock keeps on each side (plain, drafted): older
/// rounds fade the same way, so the correction follows the machine's load.
const MEMORY_STEPS: f64 = 400.0;

/// Plain and drafted rounds' summed (clock, model) seconds.
#[derive(Debug, Clone, Copy, Default)]
struct Clock {
    plain: (f64, f64),
    drafted: (f64, f64),
}

/// What earlier greedy requests with one draft head met ([`Planner::remembering`]): what their
/// drafts accepted, and how their rounds ran by the clock against the cost model.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    acceptance: Acceptance,
    clock: Clock,
    /// How long their answers ran ([`Planner::remembered_warm_up`]).
    lengths: Lengths,
    /// What their draft's start cost, in decode steps (a mean over the last answers), and over
    /// how many.
    start_steps: f64,
    starts: f64,
    /// Requests `auto` decoded without the draft on the answers' account ([`Memory::decline`]).
    declined: u32,
}

impl Memory {
    /// Adds a finished request's acceptance counts, answer length ([`Planner::answered`]) and
    /// timed rounds, fading the oldest.
    pub fn merge(&mut self, request: &Planner) {
        self.acceptance.merge(&request.acceptance);
        if let Some(tokens) = request.answer_tokens {
            self.lengths.add(request.first_token, tokens);
            // What its draft's start cost (or would have), in decode steps, averaged over the
            // answers the lengths keep.
            let n = self.starts.min(MEMORY_ANSWERS - 1.0);
            self.start_steps = (self.start_steps * n + request.start_steps()) / (n + 1.0);
            self.starts = n + 1.0;
        }
        // A decode step alone, whatever load the request's last step shared.
        let keep = MEMORY_STEPS * request.cost.pass(1);
        for (mine, theirs) in [
            (&mut self.clock.plain, request.clock_sums.plain),
            (&mut self.clock.drafted, request.clock_sums.drafted),
        ] {
            mine.0 += theirs.0;
            mine.1 += theirs.1;
            if mine.1 > keep {
                let fade = keep / mine.1;
                mine.0 *= fade;
                mine.1 *= fade;
            }
        }
    }

    /// What the remembered requests' drafts accepted.
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// Answers remembered, and the mean steps they ran after their first token.
    pub fn answers(&self) -> (f64, f64) {
        let total = self.lengths.answers();
        let steps = total_steps(&self.lengths.all);
        (total, if total > 0.0 { steps / total } else { 0.0 })
    }

    /// The mean start of the remembered requests' drafts, in decode steps.
    pub fn start_steps(&self) -> f64 {
        self.start_steps
    }

    /// `auto` declines the draft for a request because the remembered answers say it does not
    /// pay ([`Planner::pays_for_remembered_answers`]): `true` if it should, `false` for one
    /// request in [`EXPLORE_AFTER`], which drafts anyway so that the answers remembered keep
    /// following what is asked (a request decoded without the draft adds none).
    pub fn decline(&mut self) -> bool {
        self.declined = self.declined.wrapping_add(1);
        !self.declined.is_multiple_of(EXPLORE_AFTER)
    }
}

/// Remembered answers by the steps they ran after their first token (index: steps; the last
/// bucket, [`LONGEST_REMEMBERED`], holds every longer answer): all of them, and those that
/// began with each token.
#[derive(Debug, Clone, Default)]
struct Lengths {
    all: Vec<f64>,
    by_first: HashMap<TokenId, Vec<f64>>,
}

impl Lengths {
    /// Answers remembered (faded ones count in part).
    fn answers(&self) -> f64 {
        self.all.iter().sum()
    }

    /// An answer of `tokens` tokens that began with `first`; the oldest fade past
    /// [`MEMORY_ANSWERS`].
    fn add(&mut self, first: Option<TokenId>, tokens: usize) {
        let steps = tokens.saturating_sub(1).min(LONGEST_REMEMBERED);
        let count = |h: &mut Vec<f64>| {
            if h.len() <= steps {
                h.resize(steps + 1, 0.0);
            }
            h[steps] += 1.0;
        };
        count(&mut self.all);
        if let Some(t) = first {
            count(self.by_first.entry(t).or_default());
        }
        let answers = self.answers();
        if answers > MEMORY_ANSWERS {
            let keep = MEMORY_ANSWERS / answers;
            self.all.iter_mut().for_each(|n| *n *= keep);
            self.by_first.retain(|_, h| {
                h.iter_mut().for_each(|n| *n *= keep);
                h.iter().sum::<f64>() >= 0.01
            });
        }
    }

    /// The lengths an answer that began with `first` is expected to run: the remembered
    /// answers that began with it, beside all of them weighing [`PRIOR_ANSWERS`] answers.
    /// `None` (no guess) with fewer than [`MIN_ANSWERS`] remembered, or none that began with
    /// `first`: an answer unlike any seen keeps the default warm-up, so a one-word answer
    /// cannot be charged a draft because other answers ran long.
    fn like(&self, first: Option<TokenId>) -> Option<Vec<f64>> {
        let total = self.answers();
        let own = self.by_first.get(&first?)?;
        if total < MIN_ANSWERS {
            return None;
        }
        let mut h = self
            .all
            .iter()
            .map(|n| n * PRIOR_ANSWERS / total)
            .collect::<Vec<_>>();
        h.iter_mut().zip(own).for_each(|(m, n)| *m += n);
        Some(h)
    }
}

/// Decode steps after their first token of all the answers in `lengths` (count by steps).
fn total_steps(lengths: &[f64]) -> f64 {
    lengths.iter().enumerate().map(|(s, n)| n * s as f64).sum()
}

/// The draft depth `d` in `1..=max_depth` whose round — expected tokens `1 + Σ_{i ≤ d} Π_{j ≤ i}
/// accept(j)` for `seconds(d)` — is fastest per token, and its speed-up over a plain step of
/// `plain` seconds, if that beats [`MARGIN`].
pub fn best_chain(
    max_depth: usize,
    plain: f64,
    accept: impl Fn(usize) -> f64,
    seconds: impl Fn(usize) -> f64,
) -> Option<(usize, f64)> {
    let (mut tokens, mut reach) = (1.0, 1.0);
    let mut best: Option<(usize, f64)> = None;
    for d in 1..=max_depth {
        reach *= accept(d);
        tokens += reach;
        let gain = tokens / seconds(d) * plain;
        if gain > MARGIN && best.is_none_or(|(_, g)| gain > g) {
            best = Some((d, gain));
        }
    }
    best
}

#[cfg(test)]
mod tests;
