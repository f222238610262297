//! Per-depth acceptance of a request's drafts, smoothed towards a prior: what cost-aware plans
//! (speculative rounds in [`super::plan`], diffusion blocks) predict the next draft's tokens
//! from. The prior is what earlier requests accepted where remembered, else the head's own
//! measured acceptance ([`glance_nn::DraftLm::acceptance`]), else [`PRIOR_ACCEPTANCE`].

/// Acceptance assumed at depth 1 when nothing better is known.
pub const PRIOR_ACCEPTANCE: f64 = 0.8;
/// Weight of the prior, in rounds.
const PRIOR_ROUNDS: f64 = 2.0;
/// Rounds of depth 1 a memory of earlier requests keeps: older rounds fade (their counts are
/// scaled down) so the memory follows the answers being asked for.
const MEMORY_ROUNDS: f64 = 200.0;

/// Per-depth acceptance of a request's drafts so far, smoothed towards a prior.
#[derive(Debug, Clone, Default)]
pub struct Acceptance {
    /// Per depth `d` (index `d - 1`): rounds that offered a draft at depth `d` with depth
    /// `d - 1` accepted, and rounds that accepted depth `d`.
    offered: Vec<f64>,
    reached: Vec<f64>,
    /// What earlier requests accepted ([`Acceptance::remembered`]), the prior at every depth it
    /// has seen.
    base: Option<Box<Acceptance>>,
    /// The head's measured acceptance by depth ([`Acceptance::with_prior`]), the prior at the
    /// depths it holds where nothing is remembered.
    prior: Vec<f64>,
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

    /// Takes `by_depth` (the head's measured acceptance at depths 1, 2, …) as the prior at the
    /// depths it holds, here and in what is remembered; deeper depths fall back to the estimate
    /// of the depth above.
    pub fn with_prior(mut self, by_depth: &[f64]) -> Self {
        self.prior = by_depth.iter().map(|a| a.clamp(0.0, 1.0)).collect();
        if let Some(b) = &mut self.base {
            b.prior.clone_from(&self.prior);
        }
        self
    }

    /// The head's measured acceptance by depth this estimate was given
    /// ([`Acceptance::with_prior`]); empty without one.
    pub fn prior(&self) -> &[f64] {
        &self.prior
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
    /// accepted at `d` when remembered, else the head's measured acceptance at `d`
    /// ([`Acceptance::with_prior`]), else [`PRIOR_ACCEPTANCE`] at depth 1 and the estimate at
    /// depth `d - 1` below it. (A depth no round has reached
    /// is assumed as good as the one above it, so that a plan tries it once the one above
    /// pays: a pessimistic prior would never be corrected, as only drafted depths are seen.)
    pub fn at(&self, d: usize) -> f64 {
        let remembered = self
            .base
            .as_ref()
            .filter(|b| b.offered.get(d - 1).is_some_and(|&n| n > 0.0));
        let prior = match (remembered, self.prior.get(d - 1)) {
            (Some(b), _) => b.at(d),
            (None, Some(&measured)) => measured,
            (None, None) if d <= 1 => PRIOR_ACCEPTANCE,
            (None, None) => self.at(d - 1),
        };
        let offered = self.offered.get(d - 1).copied().unwrap_or(0.0);
        let reached = self.reached.get(d - 1).copied().unwrap_or(0.0);
        (reached + PRIOR_ROUNDS * prior) / (offered + PRIOR_ROUNDS)
    }
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
    fn a_measured_head_is_its_own_prior_until_rounds_or_memory_say_otherwise() {
        let a = Acceptance::default().with_prior(&[0.95, 0.6]);
        assert_eq!(a.at(1), 0.95);
        assert_eq!(a.at(2), 0.6);
        // Deeper than measured: as good as the depth above.
        assert_eq!(a.at(3), 0.6);
        // The request's own rounds move it.
        let mut b = a.clone();
        for _ in 0..50 {
            b.record(2, 2);
        }
        assert!(b.at(2) > 0.95);
        // What earlier requests accepted comes first where remembered; beyond what they
        // reached, the measured prior still holds.
        let mut memory = Acceptance::default();
        for _ in 0..40 {
            memory.record(1, 0);
        }
        let c = Acceptance::remembered(&memory).with_prior(&[0.95, 0.6]);
        assert!(c.at(1) < 0.1, "{}", c.at(1));
        assert_eq!(c.at(2), 0.6);
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
}
