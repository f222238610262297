//! The planner's rounds, warm-ups and memory on made-up cost curves.

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
    // The start costs 30 × 0.5 = 15 s, and each token after it saves `1 - 1/gain` of a
    // plain step of 1.05 s: plain steps come first until that pays for it.
    let (_, gain) = p.predicted(6).unwrap();
    assert!(gain > 2.0, "{gain}");
    let plain = (15.0 / (1.0 - 1.0 / gain) / 1.05).ceil() as usize;
    assert!((20..40).contains(&plain), "{plain}");
    let rounds: Vec<Round> = (0..=plain).map(|_| p.next_round(6)).collect();
    assert!(rounds[..plain].iter().all(|r| *r == Round::Plain));
    assert!(
        matches!(rounds[plain], Round::Draft { depth } if depth >= 3),
        "{rounds:?}"
    );
    // A cheap start still waits out the warm-up.
    let mut p = Planner::new(cost(&flat), draft(0.05, 0.0), TreeSettings::chain(6), 30);
    let rounds: Vec<Round> = (0..=WARM_UP_STEPS).map(|_| p.next_round(6)).collect();
    assert!(rounds[..WARM_UP_STEPS].iter().all(|r| *r == Round::Plain));
    assert!(matches!(rounds[WARM_UP_STEPS], Round::Draft { .. }));
}

#[test]
fn a_draft_that_only_just_pays_waits_for_an_answer_long_enough_to_recover_its_start() {
    // A cache-resident model's curve (glance-tiny's, measured: c(2) 1.41, c(4) 2.04, c(8)
    // 3.97), a draft step 0.29 of a decode step and a prompt row 0.12: the prompt of 265
    // rows costs 32 steps, and drafted rounds are predicted only a little faster.
    let curve = [1.0, 1.41, 1.72, 2.04, 2.47, 2.91, 3.44, 3.97];
    let mut p = Planner::new(cost(&curve), draft(0.29, 0.12), TreeSettings::chain(6), 265)
        .with_prior(Some(&[0.92, 0.91, 0.91]));
    let (_, gain) = p.predicted(6).expect("it pays, a little");
    assert!(gain < 1.4, "{gain}");
    // The start is bought once its 31.8 steps are saved back at `1 - 1/gain` a token: more
    // than a hundred plain steps, not 32.
    let wait = (31.8 / (1.0 - 1.0 / gain)).ceil() as usize;
    assert!(wait > 100, "{wait}");
    for step in 0..wait {
        assert_eq!(p.next_round(6), Round::Plain, "step {step}");
    }
    assert!(matches!(p.next_round(6), Round::Draft { .. }));
    // Remembered answers of 60 steps: not long enough ever to recover the start.
    let mut memory = Memory::default();
    for _ in 0..20 {
        let mut a = Planner::new(cost(&curve), draft(0.29, 0.12), TreeSettings::chain(6), 265)
            .starting_with(5);
        a.answered(61);
        memory.merge(&a);
    }
    let mut q = Planner::new(cost(&curve), draft(0.29, 0.12), TreeSettings::chain(6), 265)
        .with_prior(Some(&[0.92, 0.91, 0.91]))
        .starting_with(5)
        .remembering(&memory);
    for step in 0..300 {
        assert_eq!(q.next_round(6), Round::Plain, "step {step}");
    }
    // `auto` asks the same before choosing the draft at all: with the start the answers
    // remember (265 prompt rows), not; with a free one, yes; with too few answers, it
    // leaves the choice to the request's planner.
    let fresh = || {
        Planner::new(cost(&curve), draft(0.29, 0.12), TreeSettings::chain(6), 0)
            .with_prior(Some(&[0.92, 0.91, 0.91]))
    };
    assert!(
        (memory.start_steps() - 31.8).abs() < 1e-6,
        "{}",
        memory.start_steps()
    );
    assert!(fresh().pays_at_prior());
    assert!(!fresh().pays_for_remembered_answers(&memory));
    let declined = (0..2 * EXPLORE_AFTER).filter(|_| memory.decline()).count();
    assert_eq!(declined as u32, 2 * EXPLORE_AFTER - 2);
    assert!(fresh().pays_for_remembered_answers(&Memory::default()));
    let mut free = Memory::default();
    for _ in 0..20 {
        let mut a = Planner::new(cost(&curve), draft(0.29, 0.0), TreeSettings::chain(6), 265);
        a.answered(61);
        free.merge(&a);
    }
    assert!(fresh().pays_for_remembered_answers(&free));
    // With a free start the same memory drafts from the first round.
    let mut r = Planner::new(cost(&curve), draft(0.29, 0.0), TreeSettings::chain(6), 265)
        .with_prior(Some(&[0.92, 0.91, 0.91]))
        .starting_with(5)
        .remembering(&memory);
    assert!(matches!(r.next_round(6), Round::Draft { .. }));
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
    let mut q =
        Planner::new(cost(&curve), draft(0.05, 0.0), TreeSettings::chain(6), 30).without_clock();
    warm_up(&mut q);
    q.share(load(60, 7));
    assert!(matches!(q.next_round(6), Round::Draft { .. }));
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
fn remembered_answer_lengths_set_the_warm_up() {
    // A pass over up to 16 rows costs little more than one, the start nothing: drafting
    // pays from the first round, unless the answer is about to end.
    let flat: Vec<f64> = (1..=16).map(|k| 1.0 + 0.05 * k as f64).collect();
    let plan = |first: TokenId| {
        Planner::new(cost(&flat), draft(0.05, 0.0), TreeSettings::chain(6), 30).starting_with(first)
    };
    let answer = |first, tokens| {
        let mut p = plan(first);
        p.answered(tokens);
        p
    };
    let first_draft = |memory: &Memory, first| {
        let mut p = plan(first).remembering(memory);
        (0..=WARM_UP_STEPS)
            .position(|_| matches!(p.next_round(6), Round::Draft { .. }))
            .expect("drafts within the default warm-up")
    };
    // Fewer answers than it takes to trust them: the default warm-up.
    let mut memory = Memory::default();
    for _ in 0..MIN_ANSWERS as usize - 1 {
        memory.merge(&answer(7, 60));
    }
    assert_eq!(first_draft(&memory, 7), WARM_UP_STEPS);
    // Long answers only: an answer that begins as they did drafts from its first round; one
    // that begins unlike any of them keeps the default warm-up.
    memory.merge(&answer(7, 60));
    assert_eq!(first_draft(&memory, 7), 0);
    assert_eq!(first_draft(&memory, 9), WARM_UP_STEPS);
    // Twenty answers of one step after a first token 8, beside the long ones: one plain
    // step lets those end (a drafted round costs 1.6 steps), and the rare long answer that
    // begins so loses less than that.
    for _ in 0..20 {
        memory.merge(&answer(8, 2));
    }
    assert_eq!(first_draft(&memory, 8), 1);
    assert_eq!(first_draft(&memory, 7), 0);
    // Answers of one and two steps only: the longest warm-up (ties go to the longer one).
    let mut short = Memory::default();
    for _ in 0..20 {
        short.merge(&answer(8, 2));
        short.merge(&answer(8, 3));
    }
    assert_eq!(first_draft(&short, 8), WARM_UP_STEPS);
    // The memory keeps its size, fading older answers.
    for _ in 0..500 {
        short.merge(&answer(7, 1000));
    }
    let kept: f64 = short.lengths.all.iter().sum();
    assert!((kept - MEMORY_ANSWERS).abs() < 1e-6, "{kept}");
    assert_eq!(short.lengths.all.len(), LONGEST_REMEMBERED + 1);
    let by_first: f64 = short.lengths.by_first.values().flatten().sum();
    assert!((by_first - MEMORY_ANSWERS).abs() < 1e-6, "{by_first}");
    assert_eq!(first_draft(&short, 7), 0);
}

#[test]
fn a_measured_head_plans_from_its_acceptance() {
    // Verifying costs a quarter of a step a row: an 0.8 draft pays, a 0.3 one does not.
    let curve: Vec<f64> = (1..=16).map(|k| 1.0 + 0.25 * (k - 1) as f64).collect();
    let plan = || Planner::new(cost(&curve), draft(0.1, 0.0), TreeSettings::chain(6), 0);
    assert!(plan().pays_at_prior());
    let poor = plan().with_prior(Some(&[0.3]));
    assert!(!poor.pays_at_prior());
    let (d_good, g_good) = plan().with_prior(Some(&[0.95])).predicted(6).unwrap();
    let (d_prior, g_prior) = plan().predicted(6).unwrap();
    assert!(g_good > g_prior && d_good >= d_prior, "{g_good} {g_prior}");
    // Remembered rounds come first; the measured prior survives the memory.
    let memory = Memory::default();
    let kept = plan().with_prior(Some(&[0.3])).remembering(&memory);
    assert!(!kept.pays_at_prior());
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
    warm_up(&mut p);
    assert!(matches!(p.next_round(6), Round::Draft { .. }), "started");
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
