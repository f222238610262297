//! What one strategy did on one group of answers (a temperature × an answer kind), summed over
//! the questions, and the rates derived from the sums. Every rate is total / total, so a long
//! answer weighs by its tokens, not as one question.

use glance_engine::Response;
use glance_world::Family;
use serde::Serialize;
use std::collections::BTreeMap;

/// The answer kinds reported apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Every family but descriptions: a few tokens each.
    Short,
    /// Descriptions: the long answers, where a draft may forget the image.
    Description,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Short, Kind::Description];

    pub fn of(family: Family) -> Self {
        if family == Family::Description {
            Kind::Description
        } else {
            Kind::Short
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Short => "short",
            Kind::Description => "description",
        }
    }
}

/// Sums over the answers of one strategy in one group.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub questions: usize,
    /// Completion tokens.
    pub tokens: u64,
    /// Target forward passes after the prefill.
    pub forwards: u64,
    /// Decode wall time (after the first token), seconds.
    pub decode_s: f64,
    /// Speculative rounds (one target forward each) and their draft tokens, accepted tokens,
    /// draft forwards and recovered tokens.
    pub rounds: u64,
    pub draft_tokens: u64,
    pub accepted: u64,
    pub draft_forwards: u64,
    pub recovered: u64,
    pub accepted_by_depth: Vec<u64>,
    pub offered_by_depth: Vec<u64>,
    pub rounds_by_position: Vec<u64>,
    pub emitted_by_position: Vec<u64>,
    /// Block diffusion ([`glance_decode::BlockDiffusion`]): steps, tokens of the blocks,
    /// denoising passes (threshold), microseconds in forward passes, steps by accepted drafts
    /// (threshold: passes by tokens decided).
    pub steps: u64,
    pub block_tokens: u64,
    pub iterations: u64,
    pub forward_us: u64,
    pub accepted_length: Vec<u64>,
    /// Cost-aware speculation: what the cost model says the decode cost, and what the same
    /// tokens cost as decode steps by it (microseconds).
    pub modelled_us: u64,
    pub modelled_plain_us: u64,
    /// Microseconds of decode time by phase, as [`PHASES`] names them.
    pub phase_us: [u64; 4],
    /// (sum of scores, questions) per family, in [`Family::ALL`] order.
    pub scores: [(f64, usize); 6],
    /// Greedy answers that differ from autoregressive decoding's (`None`: not compared).
    pub mismatches: Option<usize>,
}

/// The phases of a speculative decode ([`glance_decode::Speculative`]'s `time_*_us` counters):
/// the draft's start (building its prompt rows — `fc`, adaptor, global feature — and the draft
/// layer's pass over them, with the first round's pending rows), drafting (the draft layer over
/// the pending rows, and the tree), the target's verification pass (forward and logits),
/// acceptance and bookkeeping. Disjoint: their sum is at most the decode time.
pub const PHASES: [&str; 4] = ["start", "draft", "verify", "accept"];

/// Adds `from` into `into` element-wise, growing it as needed.
fn add_into(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    into.iter_mut().zip(from).for_each(|(a, b)| *a += b);
}

/// `a / b`, NaN when `b` is not positive.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// `num[i] / den[i]` for every `i` with `den[i] > 0`, else NaN.
fn rates(num: &[u64], den: &[u64]) -> Vec<f64> {
    den.iter()
        .enumerate()
        .map(|(i, &d)| ratio(num.get(i).copied().unwrap_or(0) as f64, d as f64))
        .collect()
}

impl Tally {
    /// Adds one answer of `family` that scored `score`.
    pub fn add(&mut self, r: &Response, family: Family, score: f64) {
        self.questions += 1;
        self.tokens += r.token_ids.len() as u64;
        self.forwards += r.decode.forward_passes;
        self.decode_s += r.timings.decode_s;
        let c = |k: &str| r.decode.counters.get(k).copied().unwrap_or(0);
        self.rounds += c("drafts");
        self.draft_tokens += c("draft_tokens");
        self.accepted += c("accepted_tokens");
        self.draft_forwards += c("draft_forwards");
        self.recovered += c("recovered_tokens");
        self.steps += c("steps");
        self.block_tokens += c("block_tokens");
        self.iterations += c("iterations");
        self.forward_us += c("time_forward_us");
        self.modelled_us += c("modelled_us");
        self.modelled_plain_us +=
            c("modelled_step_us") * (r.token_ids.len() as u64).saturating_sub(1);
        for (t, p) in self.phase_us.iter_mut().zip(PHASES) {
            *t += c(&format!("time_{p}_us"));
        }
        let h = |k: &str| r.decode.histograms.get(k).map_or(&[][..], Vec::as_slice);
        add_into(&mut self.accepted_by_depth, h("accepted_by_depth"));
        add_into(&mut self.offered_by_depth, h("offered_by_depth"));
        add_into(&mut self.rounds_by_position, h("rounds_by_position"));
        add_into(&mut self.emitted_by_position, h("emitted_by_position"));
        add_into(&mut self.accepted_length, h("accepted_length"));
        let i = Family::ALL
            .iter()
            .position(|&f| f == family)
            .expect("every family is in Family::ALL");
        self.scores[i].0 += score;
        self.scores[i].1 += 1;
    }

    /// Tokens after the first: the ones decoding produced.
    pub fn decoded(&self) -> u64 {
        self.tokens.saturating_sub(self.questions as u64)
    }

    /// Mean tokens per target forward, `(completion − 1) / forward passes` over all answers:
    /// 1 for autoregressive decoding, τ (mean tokens per round) for a speculative one.
    pub fn tokens_per_forward(&self) -> f64 {
        ratio(self.decoded() as f64, self.forwards as f64)
    }

    /// The speed-up over autoregressive decoding the cost model predicts for the rounds that
    /// ran (NaN unless cost-aware): its error against the measured one is the model's.
    pub fn predicted_speedup(&self) -> f64 {
        ratio(self.modelled_plain_us as f64, self.modelled_us as f64)
    }

    /// Decode tokens per second (tokens after the first over the decode time).
    pub fn tokens_per_s(&self) -> f64 {
        ratio(self.decoded() as f64, self.decode_s)
    }

    /// Mean rows of a verification pass: the last token plus the tree.
    pub fn mean_tree_rows(&self) -> f64 {
        1.0 + ratio(self.draft_tokens as f64, self.rounds as f64)
    }

    /// Mean draft forwards per round spent growing the tree (the round's first draft pass over
    /// the newly emitted tokens comes on top).
    pub fn draft_forwards_per_round(&self) -> f64 {
        ratio(self.draft_forwards as f64, self.rounds as f64)
    }

    /// Acceptance rate at draft depth `d + 1`: rounds that accepted a token at that depth over
    /// rounds whose tree reached it.
    pub fn acceptance_by_depth(&self) -> Vec<f64> {
        rates(&self.accepted_by_depth, &self.offered_by_depth)
    }

    /// Mean tokens emitted per round, per response-position bucket.
    pub fn tokens_per_round_by_position(&self) -> Vec<f64> {
        rates(&self.emitted_by_position, &self.rounds_by_position)
    }

    /// The evaluation's score: the mean over families of their exact-match accuracy (short
    /// answers, as `glance eval`'s mean) or the mean object F1 (descriptions).
    pub fn accuracy(&self) -> f64 {
        let per_family: Vec<f64> = self
            .scores
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| s / *n as f64)
            .collect();
        ratio(per_family.iter().sum(), per_family.len() as f64)
    }

    /// Everything, with the derived rates, as one report row; `ar_tokens_per_s` gives the
    /// speedup.
    pub fn row(&self, name: &str, ar_tokens_per_s: f64) -> TallyRow {
        let families = Family::ALL
            .iter()
            .zip(&self.scores)
            .filter(|(_, (_, n))| *n > 0)
            .map(|(f, (s, n))| {
                let score = FamilyScore {
                    questions: *n,
                    score: s / *n as f64,
                };
                (f.name().to_string(), score)
            })
            .collect();
        TallyRow {
            strategy: name.to_string(),
            questions: self.questions,
            completion_tokens: self.tokens,
            forward_passes: self.forwards,
            tokens_per_forward: self.tokens_per_forward(),
            decode_s: self.decode_s,
            decode_tokens_per_s: self.tokens_per_s(),
            speedup: self.tokens_per_s() / ar_tokens_per_s,
            predicted_speedup: self.predicted_speedup(),
            rounds: self.rounds,
            draft_tokens: self.draft_tokens,
            accepted_tokens: self.accepted,
            draft_forwards: self.draft_forwards,
            recovered_tokens: self.recovered,
            mean_tree_rows: self.mean_tree_rows(),
            draft_forwards_per_round: self.draft_forwards_per_round(),
            accepted_by_depth: self.accepted_by_depth.clone(),
            offered_by_depth: self.offered_by_depth.clone(),
            acceptance_by_depth: self.acceptance_by_depth(),
            rounds_by_position: self.rounds_by_position.clone(),
            emitted_by_position: self.emitted_by_position.clone(),
            tokens_per_round_by_position: self.tokens_per_round_by_position(),
            phase_s: PHASES
                .iter()
                .zip(self.phase_us)
                .map(|(p, us)| (p.to_string(), us as f64 / 1e6))
                .collect(),
            accuracy: self.accuracy(),
            families,
            greedy_mismatches: self.mismatches,
        }
    }
}

/// A family's score in a [`TallyRow`].
#[derive(Debug, Clone, Serialize)]
pub struct FamilyScore {
    pub questions: usize,
    pub score: f64,
}

/// One strategy on one group of answers: the sums of its [`Tally`] and the rates derived from
/// them (a rate without data is NaN, `null` in JSON).
#[derive(Debug, Clone, Serialize)]
pub struct TallyRow {
    pub strategy: String,
    pub questions: usize,
    pub completion_tokens: u64,
    pub forward_passes: u64,
    pub tokens_per_forward: f64,
    pub decode_s: f64,
    pub decode_tokens_per_s: f64,
    /// Decode tokens/s over autoregressive decoding's in the same group.
    pub speedup: f64,
    pub predicted_speedup: f64,
    pub rounds: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    pub draft_forwards: u64,
    pub recovered_tokens: u64,
    pub mean_tree_rows: f64,
    pub draft_forwards_per_round: f64,
    pub accepted_by_depth: Vec<u64>,
    pub offered_by_depth: Vec<u64>,
    pub acceptance_by_depth: Vec<f64>,
    pub rounds_by_position: Vec<u64>,
    pub emitted_by_position: Vec<u64>,
    pub tokens_per_round_by_position: Vec<f64>,
    /// Seconds of decode time by phase ([`PHASES`]).
    pub phase_s: BTreeMap<String, f64>,
    pub accuracy: f64,
    /// By family name, the families that had questions.
    pub families: BTreeMap<String, FamilyScore>,
    /// Greedy answers that differ from the reference's (`None`: not compared).
    pub greedy_mismatches: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_without_a_denominator_are_nan() {
        assert_eq!(ratio(3.0, 2.0), 1.5);
        assert!(ratio(1.0, 0.0).is_nan());
        let r = rates(&[1, 2], &[2, 0, 4]);
        assert_eq!(r[0], 0.5);
        assert!(r[1].is_nan());
        assert_eq!(r[2], 0.0);
    }

    #[test]
    fn histograms_grow_as_they_are_added() {
        let mut into = vec![1, 1];
        add_into(&mut into, &[1, 2, 3]);
        assert_eq!(into, vec![2, 3, 3]);
        add_into(&mut into, &[1]);
        assert_eq!(into, vec![3, 3, 3]);
    }

    #[test]
    fn rates_are_totals_over_totals() {
        let t = Tally {
            questions: 2,
            tokens: 12,
            forwards: 4,
            decode_s: 0.5,
            rounds: 4,
            draft_tokens: 12,
            draft_forwards: 8,
            scores: [(1.0, 2), (0.0, 0), (0.0, 0), (0.0, 0), (0.0, 0), (0.5, 1)],
            ..Tally::default()
        };
        assert_eq!(t.decoded(), 10);
        assert_eq!(t.tokens_per_forward(), 2.5);
        assert_eq!(t.tokens_per_s(), 20.0);
        assert_eq!(t.mean_tree_rows(), 4.0);
        assert_eq!(t.draft_forwards_per_round(), 2.0);
        // The mean over the families with questions: (0.5 + 0.5) / 2.
        assert_eq!(t.accuracy(), 0.5);
        assert!(t.predicted_speedup().is_nan());
        let row = serde_json::to_value(t.row("x", 10.0)).unwrap();
        assert_eq!(row["speedup"], 2.0);
        assert_eq!(row["predicted_speedup"], serde_json::Value::Null);
        assert_eq!(row["families"].as_object().unwrap().len(), 2);
        assert_eq!(row["greedy_mismatches"], serde_json::Value::Null);
    }
}
