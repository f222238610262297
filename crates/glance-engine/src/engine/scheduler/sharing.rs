//! The scheduler's shared passes, seen from its sequences: what the others bring to a step
//! (the load cost-aware rounds plan for), running each sequence's own work in parallel, and
//! failing the members of a failed pass.

use glance_core::Error;
use glance_decode::Load;
use rayon::prelude::*;

use super::{Phase, Sequence};
use crate::engine::auto::head_key;

/// What the others brought to the last step, for each sequence: the rows of the target pass
/// and, on the sequence's own draft head, the draft passes' rows per level — what the next step
/// will carry about as much of (cost-aware states plan their rounds for it as they open them).
pub(super) fn loads(seqs: &[Sequence<'_>]) -> Vec<Load> {
    // Each sequence's draft head, by address (the scheduler groups draft passes the same way).
    let heads: Vec<Option<usize>> = seqs
        .iter()
        .map(|s| match &s.phase {
            Phase::Decode(state) => state.draft().map(head_key),
            _ => None,
        })
        .collect();
    let rows: usize = seqs.iter().map(|s| s.last_rows).sum();
    let requests = seqs.iter().filter(|s| s.last_rows > 0).count();
    seqs.iter()
        .enumerate()
        .map(|(i, me)| {
            let mine = usize::from(me.last_rows > 0);
            let mut load = Load {
                rows: rows - me.last_rows,
                requests: requests - mine,
                ..Load::default()
            };
            let Some(h) = heads[i] else {
                return load;
            };
            let (mut levels, mut draft_rows) = (0, 0);
            for (j, other) in seqs.iter().enumerate() {
                if j != i && other.last_draft.0 > 0 && heads[j] == Some(h) {
                    levels = levels.max(other.last_draft.0);
                    draft_rows += other.last_draft.1;
                }
            }
            if levels > 0 {
                load.draft_levels = levels;
                load.draft_rows = draft_rows.div_ceil(levels);
            }
            load
        })
        .collect()
}

/// Fails the sequences `members` whose shared pass failed with `e`, each with its own copy.
pub(super) fn fail_shared(
    seqs: &mut [Sequence<'_>],
    members: impl IntoIterator<Item = usize>,
    e: &Error,
) {
    let msg = e.to_string();
    for i in members {
        seqs[i].fail(Error::Candle(candle_core::Error::Msg(msg.clone())));
    }
}

/// `f` on every sequence, in order: in parallel on the engine's pool when `parallel` (each
/// sequence's own work, independent of the others).
pub(super) fn map_seqs<'s, R: Send>(
    seqs: &mut [Sequence<'s>],
    parallel: bool,
    f: impl Fn(&mut Sequence<'s>) -> R + Sync + Send,
) -> Vec<R> {
    if parallel {
        seqs.par_iter_mut().map(f).collect()
    } else {
        seqs.iter_mut().map(f).collect()
    }
}

/// Runs `absorb` on each sequence with its output of a shared pass (`outs[i]` is `seqs[i]`'s;
/// in parallel on the engine's pool when `parallel`), and fails each sequence it returns an
/// error for.
pub(super) fn absorb_each<'s, T: Send>(
    seqs: &mut [Sequence<'s>],
    outs: Vec<Option<T>>,
    parallel: bool,
    absorb: impl Fn((&mut Sequence<'s>, Option<T>)) -> Option<Error> + Sync + Send,
) {
    let failed: Vec<Option<Error>> = if parallel {
        seqs.par_iter_mut().zip(outs).map(&absorb).collect()
    } else {
        seqs.iter_mut().zip(outs).map(&absorb).collect()
    };
    for (s, e) in seqs.iter_mut().zip(failed) {
        if let Some(e) = e {
            s.fail(e);
        }
    }
}
