//! Linear and quadratic self-speculative decoding (Fast-dVLM's Algorithms 1 and 2).
//!
//! State between steps: the cache holds every emitted token but the last, `x` (at position
//! `n`); the quadratic mode also carries drafts `d₁ … d_k` for `n + 1 …` from its previous pass.
//!
//! * linear: a bidirectional pass over `[x, M × (B − 1)]` (rolled back) drafts `d₁ … d_{B−1}`;
//!   then a causal pass over `[x, d₁ …]`;
//! * quadratic: the verification pass also carries the pre-draft groups
//!   ([`super::layout::QuadraticLayout`]); the group of the realised acceptance length becomes
//!   the next step's drafts.
//!
//! Verification is [`crate::speculative::verify`] on the chain of drafts; the cache keeps `x`'s
//! row and the accepted drafts' rows, which were computed exactly as decode steps compute them.

use super::layout::{draft_block, QuadraticLayout};
use super::{Begin, BlockSize, Run, Tally};
use crate::autoregressive::{emit, GenerateConfig, Generation, Prefilled};
use crate::sampler::{argmax, Sampler};
use crate::speculative::{verify, DraftTree};
use crate::strategy::TokenSink;
use glance_core::{Result, TokenId};

pub(crate) fn decode(
    run: &Run<'_>,
    quadratic: bool,
    state: Prefilled,
    mut sampler: Sampler,
    config: &GenerateConfig,
    on_token: TokenSink<'_>,
) -> Result<Generation> {
    let max = run.model.max_positions();
    let mut begin = Begin::new(run.model, state, &mut sampler)?;
    let (mut x, mut n) = (begin.x, begin.n);
    let mut tokens = Vec::new();
    let first = begin.emit_first(&mut tokens, config, on_token)?;
    let cache = &mut begin.cache;
    let mut tally = Tally::default();
    let mut block = match run.cost {
        Some(cost) if !quadratic => BlockSize::cost_aware(run.settings, cost.clone()),
        _ => BlockSize::new(run.settings),
    };
    let mut drafts: Vec<TokenId> = Vec::new();
    let name = if quadratic {
        "diffusion-quadratic"
    } else {
        "diffusion-linear"
    };
    let finish = 'decode: {
        if let Some(r) = first {
            break 'decode r;
        }
        loop {
            tally.step_starts.begin(tokens.len());
            let b = block.fitted(n, tokens.len(), max, config);
            if !quadratic {
                drafts = if b > 1 {
                    draft(run, cache, x, n, b, &mut tally)?
                } else {
                    Vec::new()
                };
            }
            drafts.truncate(b - 1);
            let k = drafts.len();
            // The quadratic groups pre-draft the next step's block (size of the current one);
            // the last group ends at `n + k + group`, inside the context.
            let room = max.saturating_sub(n as usize).max(1);
            let group = match b.min(room.saturating_sub(b)) {
                g if quadratic && g > 1 => g,
                _ => 0,
            };
            let layout = QuadraticLayout { drafts: k, group };
            let h = run.pass(
                &layout.ids(x, &drafts, run.mask),
                &layout.positions(n),
                &layout.mask()?,
                cache,
                &mut tally,
            )?;
            let logits = run.logits(&h, 0, k + 1, &mut tally)?;
            let chain = DraftTree {
                tokens: drafts.clone(),
                parents: (0..k).map(|i| i.checked_sub(1)).collect(),
                probs: vec![1.0; k],
                forwards: 0,
            };
            let verdict = verify(&chain, &logits, &mut sampler)?;
            let a = verdict.accepted.len();
            cache.keep_speculative(layout.rows(), &(0..=a).collect::<Vec<_>>())?;
            let next_drafts = if group > 0 {
                let rows = run.logits(&h, layout.group_start(a), group - 1, &mut tally)?;
                rows.iter().map(|r| argmax(r)).collect()
            } else {
                Vec::new()
            };
            tally.step(b, k, a);
            block.update(a, k);
            for (j, &d) in drafts[..a].iter().enumerate() {
                // `d` sits at `n + 1 + j`, predicted by the row before it.
                if let Some(r) = emit(d, &mut tokens, n + j as u32, max, config, on_token)? {
                    break 'decode r;
                }
            }
            x = verdict.next;
            n += a as u32 + 1;
            drafts = next_drafts;
            if let Some(r) = emit(x, &mut tokens, n - 1, max, config, on_token)? {
                break 'decode r;
            }
        }
    };
    Ok(begin.generation(tokens, finish, tally, name))
}

/// The linear mode's draft: one bidirectional pass over `[x, M × (b − 1)]` at `n …`, rolled
/// back; row `j`'s argmax drafts slot `j + 1`.
fn draft(
    run: &Run<'_>,
    cache: &mut glance_nn::KvCache,
    x: TokenId,
    n: u32,
    b: usize,
    tally: &mut Tally,
) -> Result<Vec<TokenId>> {
    let mut slots = vec![None; b];
    slots[0] = Some(x);
    let (ids, positions, mask) = draft_block(&slots, run.mask, n);
    let mark = cache.mark();
    let h = run.pass(&ids, &positions, &mask, cache, tally)?;
    cache.rollback(&mark)?;
    let rows = run.logits(&h, 0, b - 1, tally)?;
    Ok(rows.iter().map(|r| argmax(r)).collect())
}
