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
//!   that pass would take (the ski-rental rule), and for at least [`WARM_UP_STEPS`] steps: an
//!   answer that ends sooner costs exactly what autoregressive decoding costs, and a long one
//!   pays at most twice the pass.
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

use super::tree::{DraftTree, TreeSettings};
use crate::cost::{CostModel, DraftCost};
use crate::step::Load;

/// Acceptance assumed at a depth no round has reached yet.
pub const PRIOR_ACCEPTANCE: f64 = 0.8;
/// Weight of the prior, in rounds.
const PRIOR_ROUNDS: f64 = 2.0;
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
/// Plain steps before the draft may start: short answers (a word or a number and the end of
/// the sequence) end before a draft's start and first round could pay for themselves.
pub const WARM_UP_STEPS: usize = 4;
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
    plain_streak: u32,
    acceptance: Acceptance,
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
            plain_streak: 0,
            acceptance: Acceptance::default(),
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

    /// Whether a request's first drafted round is predicted to beat a decode step by
    /// [`AUTO_MARGIN`], with the prior's acceptance ([`PRIOR_ACCEPTANCE`] at every depth): what `auto` asks before
    /// choosing speculation, so that a model where only a near-perfect draft could pay — or
    /// where the measured figures only just favour drafting, which a noisy measurement can flip
    /// — decodes plainly.
    pub fn pays_at_prior(&self) -> bool {
        self.can_pay
            && self
                .predicted(usize::MAX)
                .is_some_and(|(_, gain)| gain >= AUTO_MARGIN)
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
    /// their drafts accepted, and the clock's correction ([`Planner::slowdown`]) from how their
    /// rounds ran against the cost model, as if they had been this request's. On a model whose
    /// drafted rounds run slower by the clock than its figures say (a cache-resident model
    /// whose draft evicts the target's weights, a cost model timed in a quiet moment), a
    /// request then plans plain rounds from its first one, not after a few drafted at a loss.
    /// A planner without the clock ([`Planner::without_clock`]) takes only the acceptance.
    pub fn remembering(mut self, memory: &Memory) -> Self {
        self.acceptance = Acceptance::remembered(&memory.acceptance);
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
        let best = self.predicted(room);
        let depth = match best {
            Some((d, _)) => d,
            None if self.plain_streak >= EXPLORE_AFTER => {
                // Re-measure acceptance: the depth that would pay with every draft accepted.
                match self.best_depth(room, 0, |_| 1.0) {
                    Some((d, _)) => d,
                    None => return self.plain(plain),
                }
            }
            None => return self.plain(plain),
        };
        if !self.started {
            // Rent before buying: plain steps for as long as the start would take, and at
            // least [`WARM_UP_STEPS`] (one-word answers end before a draft could pay).
            let start = self.draft.row_s * self.start_rows as f64;
            let rent = start.max(WARM_UP_STEPS as f64 * plain);
            if self.plain_before_start < rent {
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
        }
        self.plain_streak = self.plain_streak.saturating_add(1);
        Round::Plain
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

/// Per-depth acceptance of a request's drafts so far, smoothed towards a prior: what cost-aware
/// plans (speculative rounds, diffusion blocks) predict the next draft's tokens from.
#[derive(Debug, Clone, Default)]
pub struct Acceptance {
    /// Per depth `d` (index `d - 1`): rounds that offered a draft at depth `d` with depth
    /// `d - 1` accepted, and rounds that accepted depth `d`.
    offered: Vec<f64>,
    reached: Vec<f64>,
    /// What earlier requests accepted ([`Acceptance::remembered`]), the prior at every depth it
    /// has seen instead of [`PRIOR_ACCEPTANCE`].
    base: Option<Box<Acceptance>>,
}

/// Rounds of depth 1 a memory of earlier requests keeps: older rounds fade (their counts are
/// scaled down) so the memory follows the answers being asked for.
const MEMORY_ROUNDS: f64 = 200.0;
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
}

impl Memory {
    /// Adds a finished request's acceptance counts and timed rounds, fading the oldest.
    pub fn merge(&mut self, request: &Planner) {
        self.acceptance.merge(&request.acceptance);
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
}

impl Acceptance {
    /// A request's estimate that starts from what earlier requests accepted (`memory`, its
    /// counts as they stand).
    pub fn remembered(memory: &Acceptance) -> Self {
        let mut base = memory.clone();
        base.base = None;
        Self {
            base: (!base.offered.is_empty()).then(|| Box::new(base)),
            ..Self::default()
        }
    }

    /// Adds a finished request's counts into this memory, fading the oldest.
    pub fn merge(&mut self, request: &Acceptance) {
        for (mine, theirs) in [
            (&mut self.offered, &request.offered),
            (&mut self.reached, &request.reached),
        ] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0.0);
            }
            mine.iter_mut().zip(theirs).for_each(|(m, t)| *m += t);
        }
        let rounds = self.offered.first().copied().unwrap_or(0.0);
        if rounds > MEMORY_ROUNDS {
            let keep = MEMORY_ROUNDS / rounds;
            for v in self.offered.iter_mut().chain(self.reached.iter_mut()) {
                *v *= keep;
            }
        }
    }

    /// A round that offered drafts down to depth `deepest` and accepted the first `accepted`.
    pub fn record(&mut self, deepest: usize, accepted: usize) {
        for d in 1..=deepest.min(accepted + 1) {
            bump(&mut self.offered, d - 1);
        }
        for d in 1..=accepted {
            bump(&mut self.reached, d - 1);
        }
    }

    /// Conditional acceptance at depth `d ≥ 1`, smoothed towards a prior: what earlier requests
    /// accepted at `d` when remembered, else [`PRIOR_ACCEPTANCE`] at depth 1 and the estimate at
    /// depth `d - 1` below it. (A depth no round has reached
    /// is assumed as good as the one above it, so that a plan tries it once the one above
    /// pays: a pessimistic prior would never be corrected, as only drafted depths are seen.)
    pub fn at(&self, d: usize) -> f64 {
        let remembered = self
            .base
            .as_ref()
            .filter(|b| b.offered.get(d - 1).is_some_and(|&n| n > 0.0));
        let prior = match remembered {
            Some(b) => b.at(d),
            None if d <= 1 => PRIOR_ACCEPTANCE,
            None => self.at(d - 1),
        };
        let offered = self.offered.get(d - 1).copied().unwrap_or(0.0);
        let reached = self.reached.get(d - 1).copied().unwrap_or(0.0);
        (reached + PRIOR_ROUNDS * prior) / (offered + PRIOR_ROUNDS)
    }
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

fn bump(v: &mut Vec<f64>, i: usize) {
    if v.len() <= i {
        v.resize(i + 1, 0.0);
    }
    v[i] += 1.0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cost(pass_s: &[f64]) -> CostModel {
        CostModel {
            key: "test".into(),
            rows: (1..=pass_s.len()).collect(),
            pass_s: pass_s.to_vec(),
            drafts: BTreeMap::new(),
            measured_s: 0.0,
            clock_corrected: true,
        }
    }

    fn draft(step: f64, row: f64) -> DraftCost {
        DraftCost {
            step_s: vec![step; 4],
            row_s: row,
        }
    }

    fn chain(probs: &[f32]) -> DraftTree {
        DraftTree {
            tokens: (0..probs.len() as u32).collect(),
            parents: (0..probs.len())
                .map(|i| i.checked_sub(1))
                .collect::<Vec<_>>(),
            probs: probs.to_vec(),
            forwards: probs.len() as u64,
        }
    }

    /// Runs the plain warm-up steps of a planner whose start costs nothing.
    fn warm_up(p: &mut Planner) {
        for _ in 0..WARM_UP_STEPS {
            assert_eq!(p.next_round(6), Round::Plain);
        }
    }

    #[test]
    fn a_cache_resident_model_never_drafts() {
        // c(k) = k: no tree can beat a decode step, however well it is accepted.
        let linear: Vec<f64> = (1..=16).map(|k| k as f64).collect();
        let mut p = Planner::new(cost(&linear), draft(0.1, 0.01), TreeSettings::chain(6), 10);
        assert!(!p.can_pay());
        for _ in 0..100 {
            assert_eq!(p.next_round(6), Round::Plain);
        }
    }

    #[test]
    fn a_memory_bound_model_drafts_after_paying_for_the_start_plainly() {
        // A pass over up to 16 rows costs little more than one: drafting pays.
        let flat: Vec<f64> = (1..=16).map(|k| 1.0 + 0.05 * k as f64).collect();
        let mut p = Planner::new(cost(&flat), draft(0.05, 0.5), TreeSettings::chain(6), 30);
        assert!(p.can_pay());
        // The start costs 30 × 0.5 = 15 s: about fifteen plain steps of 1.05 s come first.
        let rounds: Vec<Round> = (0..16).map(|_| p.next_round(6)).collect();
        assert_eq!(&rounds[..15], &[Round::Plain; 15]);
        assert!(
            matches!(rounds[15], Round::Draft { depth } if depth >= 3),
            "{rounds:?}"
        );
        // A cheap start still waits out the warm-up.
        let mut p = Planner::new(cost(&flat), draft(0.05, 0.0), TreeSettings::chain(6), 30);
        let rounds: Vec<Round> = (0..=WARM_UP_STEPS).map(|_| p.next_round(6)).collect();
        assert!(rounds[..WARM_UP_STEPS].iter().all(|r| *r == Round::Plain));
        assert!(matches!(rounds[WARM_UP_STEPS], Round::Draft { .. }));
    }

    /// Target rows of other requests, none of them drafting.
    fn load(rows: usize, requests: usize) -> Load {
        Load {
            rows,
            requests,
            ..Load::default()
        }
    }

    #[test]
    fn drafting_in_a_shared_step_is_charged_for_what_it_adds_to_it() {
        // Memory-bound target (flat) and a draft step costing a third of a decode step.
        let flat: Vec<f64> = (1..=64).map(|k| 1.0 + 0.001 * k as f64).collect();
        let mut p = Planner::new(cost(&flat), draft(0.3, 0.0), TreeSettings::chain(6), 0);
        warm_up(&mut p);
        for _ in 0..20 {
            p.record(&chain(&[0.9; 4]), 2, 1);
        }
        assert!(matches!(p.next_round(6), Round::Draft { .. }), "alone");
        // Seven plain requests beside it: every draft step delays all eight.
        p.share(load(7, 7));
        assert_eq!(p.next_round(6), Round::Plain);
        // Seven drafting on the same head: its levels run anyway, its rows add nothing.
        p.share(Load {
            draft_rows: 7,
            draft_levels: 6,
            ..load(7, 7)
        });
        assert!(
            matches!(p.next_round(6), Round::Draft { .. }),
            "shared draft"
        );
    }

    #[test]
    fn a_shared_pass_that_is_compute_bound_turns_rounds_plain() {
        // Memory-bound up to 16 rows (flat), then every row costs a tenth of a step.
        let curve: Vec<f64> = (1..=64)
            .map(|k: usize| 1.0 + 0.01 * k as f64 + 0.1 * k.saturating_sub(16) as f64)
            .collect();
        let mut p = Planner::new(cost(&curve), draft(0.05, 0.0), TreeSettings::chain(6), 30);
        warm_up(&mut p);
        assert!(
            matches!(p.next_round(6), Round::Draft { .. }),
            "alone it drafts"
        );
        // Sharing a compute-bound pass (60 rows of 7 other requests): a tree's rows delay all
        // eight requests by more than the tokens they could bring.
        p.share(load(60, 7));
        assert_eq!(p.next_round(6), Round::Plain);
        // With a light load the batch is still memory-bound: it drafts again.
        p.share(load(4, 3));
        assert!(matches!(p.next_round(6), Round::Draft { .. }));
        // A sampled request's rounds do not depend on what runs beside it.
        let mut q = Planner::new(cost(&curve), draft(0.05, 0.0), TreeSettings::chain(6), 30)
            .without_clock();
        warm_up(&mut q);
        q.share(load(60, 7));
        assert!(matches!(q.next_round(6), Round::Draft { .. }));
    }

    #[test]
    fn an_unreached_depth_is_assumed_as_good_as_the_one_above() {
        let mut a = Acceptance::default();
        assert_eq!(a.at(1), PRIOR_ACCEPTANCE);
        for _ in 0..50 {
            a.record(1, 1);
        }
        assert!(a.at(1) > 0.95);
        assert!((a.at(2) - a.at(1)).abs() < 1e-12);
        for _ in 0..50 {
            a.record(2, 1);
        }
        assert!(a.at(2) < 0.1 && a.at(3) < 0.1);
    }

    #[test]
    fn rejected_drafts_turn_rounds_plain_and_accepted_ones_deepen_them() {
        let curve: Vec<f64> = (1..=16).map(|k| 1.0 + 0.25 * (k - 1) as f64).collect();
        let mut p = Planner::new(cost(&curve), draft(0.1, 0.0), TreeSettings::chain(6), 0);
        warm_up(&mut p);
        let first = p.next_round(6);
        assert!(matches!(first, Round::Draft { .. }), "{first:?}");
        for _ in 0..20 {
            p.record(&chain(&[0.9, 0.9, 0.9]), 0, 1);
        }
        assert_eq!(p.next_round(6), Round::Plain);
        let mut q = Planner::new(cost(&curve), draft(0.1, 0.0), TreeSettings::chain(6), 0);
        warm_up(&mut q);
        for _ in 0..20 {
            q.record(&chain(&[0.9; 6]), 6, 1);
        }
        let Round::Draft { depth } = q.next_round(6) else {
            panic!("all accepted, yet plain")
        };
        assert!(depth >= 5, "{depth}");
        // Room caps the depth.
        assert!(matches!(q.next_round(2), Round::Draft { depth: 1 | 2 }));
    }

    #[test]
    fn a_memory_of_earlier_requests_is_the_prior_and_fades() {
        let mut memory = Acceptance::default();
        for _ in 0..50 {
            memory.record(3, 3);
        }
        for _ in 0..50 {
            memory.record(3, 1);
        }
        // Depth 1 always, depth 2 half the time, depth 3 whenever depth 2 was.
        let mut a = Acceptance::remembered(&memory);
        assert!(a.at(1) > 0.95 && (a.at(2) - 0.5).abs() < 0.05 && a.at(3) > 0.9);
        // A depth the memory never saw falls back to the one above.
        assert!((a.at(4) - a.at(3)).abs() < 1e-12);
        // The request's own rounds move the estimate off the memory.
        for _ in 0..30 {
            a.record(1, 0);
        }
        assert!(a.at(1) < 0.2);
        // Merged, with the oldest rounds fading past the memory's size.
        for _ in 0..10 {
            memory.merge(&a);
        }
        assert!(memory.offered[0] <= MEMORY_ROUNDS + 1e-9);
        assert!(Acceptance::remembered(&memory).at(1) < 0.5);
    }

    #[test]
    fn drafted_rounds_slower_by_the_clock_than_modelled_turn_plain() {
        let curve: Vec<f64> = (1..=16).map(|k| 1.0 + 0.25 * (k - 1) as f64).collect();
        let mut p = Planner::new(cost(&curve), draft(0.1, 0.0), TreeSettings::chain(6), 0);
        for _ in 0..WARM_UP_STEPS {
            assert_eq!(p.next_round(6), Round::Plain);
            p.timed(false, 1.0);
        }
        assert!((p.slowdown() - 1.0).abs() < 1e-9);
        // Drafted rounds that take three times what the model says, well accepted.
        for _ in 0..30 {
            let t = chain(&[0.9, 0.9]);
            p.record(&t, 2, 1);
            let modelled = 0.1 + 0.1 + 1.5;
            p.timed(true, 3.0 * modelled);
        }
        assert!(p.slowdown() > 2.5, "{}", p.slowdown());
        assert_eq!(p.next_round(6), Round::Plain);
    }

    #[test]
    fn a_remembered_clock_turns_the_next_request_plain_from_its_start() {
        let curve: Vec<f64> = (1..=16).map(|k| 1.0 + 0.25 * (k - 1) as f64).collect();
        let plan = || Planner::new(cost(&curve), draft(0.1, 0.0), TreeSettings::chain(6), 0);
        // A request whose drafted rounds took three times what the model says.
        let mut first = plan();
        for _ in 0..WARM_UP_STEPS {
            assert_eq!(first.next_round(6), Round::Plain);
            first.timed(false, 1.0);
        }
        for _ in 0..30 {
            first.record(&chain(&[0.9, 0.9]), 2, 1);
            first.timed(true, 3.0 * (0.1 + 0.1 + 1.5));
        }
        let mut memory = Memory::default();
        memory.merge(&first);
        // Without the memory the figures say drafting pays; with it, not from the start.
        assert!(plan().pays_at_prior());
        let next = plan().remembering(&memory);
        assert!(next.slowdown() > 2.0, "{}", next.slowdown());
        assert!(!next.pays_at_prior());
        assert!(next.predicted(6).is_none());
        // A sampled request's planner (no clock) ignores it.
        let sampled = plan().without_clock().remembering(&memory);
        assert!((sampled.slowdown() - 1.0).abs() < 1e-9);
        assert!(sampled.pays_at_prior());
    }

    #[test]
    fn a_memory_clock_fades_past_its_steps_keeping_its_ratio() {
        let linear: Vec<f64> = (1..=16).map(|k| k as f64).collect();
        let mut p = Planner::new(cost(&linear), draft(0.1, 0.0), TreeSettings::chain(6), 0);
        for _ in 0..300 {
            assert_eq!(p.next_round(6), Round::Plain);
            p.timed(false, 2.0);
        }
        let mut memory = Memory::default();
        memory.merge(&p);
        memory.merge(&p);
        let (clock, model) = memory.clock.plain;
        assert!((model - MEMORY_STEPS).abs() < 1e-6, "{model}");
        assert!((clock / model - 2.0).abs() < 1e-9);
    }

    #[test]
    fn plain_streaks_explore_when_speculation_could_pay() {
        let curve: Vec<f64> = (1..=16).map(|k| 1.0 + 0.25 * (k - 1) as f64).collect();
        let mut p = Planner::new(cost(&curve), draft(0.1, 0.0), TreeSettings::chain(6), 0);
        for _ in 0..20 {
            p.record(&chain(&[0.9, 0.9]), 0, 1);
        }
        let rounds: Vec<Round> = (0..=EXPLORE_AFTER).map(|_| p.next_round(6)).collect();
        assert!(rounds[..EXPLORE_AFTER as usize]
            .iter()
            .all(|r| *r == Round::Plain));
        assert!(matches!(
            rounds[EXPLORE_AFTER as usize],
            Round::Draft { .. }
        ));
    }

    #[test]
    fn the_budget_keeps_the_nodes_whose_confidence_pays_for_their_rows() {
        let curve: Vec<f64> = (1..=16).map(|k| 1.0 + 0.25 * (k - 1) as f64).collect();
        let p = Planner::new(cost(&curve), draft(0.0, 0.0), TreeSettings::chain(6), 0);
        // Path probabilities 0.9, 0.81, 0.73, then 0.07, 0.007: the last two do not pay for a
        // quarter of a step each.
        let t = chain(&[0.9, 0.9, 0.9, 0.1, 0.1]);
        assert_eq!(p.budget(&t, 0), 3);
        // Unlikely nodes are not worth a row.
        assert_eq!(p.budget(&chain(&[0.01, 0.5]), 0), 0);
    }
}
