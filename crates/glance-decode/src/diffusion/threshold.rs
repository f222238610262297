//! Threshold decoding: denoise a block `[x, M … M]` in bidirectional passes, unmasking every
//! slot whose prediction is confident enough, then run the finished block causally into the
//! cache (whose last row gives the next block's first token). A block is finished once every
//! slot up to an end-of-sequence token is decided; one that ends the generation needs no causal
//! pass.
//!
//! A slot's prediction comes from the row before it (the autoregressive shift). Greedy: the
//! argmax, confidence its softmax probability; sampling: a draw from the sampler's distribution,
//! confidence the drawn token's probability. Each pass unmasks every masked slot with confidence
//! ≥ τ, and at least the most confident one, so a block of `B` takes between 1 and `B − 1`
//! passes. The sampler's processors see the history and the slots of the block decided before
//! the one being predicted; log-probabilities are not recorded (the engine refuses them for this
//! lossy mode). Dynamic block size grows the block when it finished in at most two passes and halves
//! it when it needed more than half its slots in passes.

use super::layout::draft_block;
use super::{bump, Begin, BlockSize, Run, Tally};
use crate::autoregressive::{emit, pick, GenerateConfig, Generation, Prefilled};
use crate::sampler::{argmax, Sampler};
use crate::strategy::TokenSink;
use glance_core::{Result, TokenId};
use glance_nn::AttnMask;

pub(crate) fn decode(
    run: &Run<'_>,
    state: Prefilled,
    mut sampler: Sampler,
    config: &GenerateConfig,
    on_token: TokenSink<'_>,
) -> Result<Generation> {
    let model = run.model;
    let max = model.max_positions();
    let mut begin = Begin::new(model, state, &mut sampler)?;
    let (mut x, mut n) = (begin.x, begin.n);
    let mut tokens = Vec::new();
    let first = begin.emit_first(&mut tokens, config, on_token)?;
    let cache = &mut begin.cache;
    let mut tally = Tally::default();
    let mut block = BlockSize::new(run.settings);
    let tau = run.settings.threshold;
    let finish = 'decode: {
        if let Some(r) = first {
            break 'decode r;
        }
        loop {
            tally.step_starts.begin(tokens.len());
            let b = block.fitted(n, tokens.len(), max, config);
            let mut slots: Vec<Option<TokenId>> = vec![None; b];
            slots[0] = Some(x);
            let mut passes = 0usize;
            while !block_done(&slots, &config.eos_token_ids) {
                let (ids, positions, mask) = draft_block(&slots, run.mask, n);
                let mark = cache.mark();
                let h = run.pass(&ids, &positions, &mask, cache, &mut tally)?;
                cache.rollback(&mark)?;
                let logits = run.logits(&h, 0, b - 1, &mut tally)?;
                passes += 1;
                // (slot, token, confidence) of every masked slot.
                let mut picks = Vec::new();
                for (j, row) in logits.iter().enumerate() {
                    if slots[j + 1].is_some() {
                        continue;
                    }
                    // The processors see the slots decided before this one.
                    let path: Vec<TokenId> = slots[1..=j].iter().flatten().copied().collect();
                    let (token, conf) = if sampler.params().is_greedy() {
                        let row = sampler.processed(row, &path);
                        let t = argmax(&row);
                        (t, softmax_at(&row, t))
                    } else {
                        let dist = sampler.checked_distribution(row, &path)?;
                        let t = sampler.draw(&dist)?;
                        let p = dist.iter().find(|d| d.0 == t).map_or(0.0, |d| d.1);
                        (t, p)
                    };
                    picks.push((j + 1, token, conf));
                }
                let best = picks.iter().map(|p| p.2).fold(f32::NEG_INFINITY, f32::max);
                let mut decided = 0;
                for (slot, token, conf) in picks {
                    if conf >= tau || conf == best && decided == 0 {
                        slots[slot] = Some(token);
                        decided += 1;
                    }
                }
                bump(&mut tally.accepted_length, decided);
            }
            tally.iterations += passes as u64;
            tally.steps += 1;
            tally.block_tokens += b as u64;
            bump(&mut tally.block_size, b);
            // A block decided up to an end-of-sequence token ends there.
            let end = slots
                .iter()
                .position(|s| s.is_some_and(|t| config.eos_token_ids.contains(&t)))
                .map_or(b, |e| e + 1);
            let ids: Vec<TokenId> = slots[..end].iter().map(|s| s.unwrap_or(run.mask)).collect();
            let b = ids.len();
            sampler.observe(&ids[1..]);
            // Emitted first: a block that ends the generation (end of sequence, token limit,
            // stop) needs no causal pass.
            for (j, &t) in ids[1..].iter().enumerate() {
                if let Some(r) = emit(t, &mut tokens, n + j as u32, max, config, on_token)? {
                    break 'decode r;
                }
            }
            // The finished block, causally into the cache; its last row predicts the next `x`.
            let positions: Vec<u32> = (0..b as u32).map(|j| n + j).collect();
            let h = run.pass(&ids, &positions, &AttnMask::Causal, cache, &mut tally)?;
            let next = pick(model, &h.narrow(0, b - 1, 1)?, &mut sampler)?;
            update(&mut block, passes, b);
            x = next;
            n += b as u32;
            if let Some(r) = emit(x, &mut tokens, n - 1, max, config, on_token)? {
                break 'decode r;
            }
        }
    };
    Ok(begin.generation(tokens, finish, tally, "diffusion-threshold"))
}

/// The dynamic rule of threshold decoding: a block finished in ≤ 2 passes counts as fully
/// accepted, one that needed more than half its slots in passes as barely accepted.
fn update(block: &mut BlockSize, passes: usize, b: usize) {
    let offered = b.saturating_sub(1);
    if offered == 0 {
        return;
    }
    let accepted = if passes <= 2 {
        offered
    } else if 2 * passes > offered {
        0
    } else {
        offered / 2
    };
    block.update(accepted, offered);
}

/// Every slot decided, or every slot up to a decided end-of-sequence token.
fn block_done(slots: &[Option<TokenId>], eos: &[TokenId]) -> bool {
    for s in slots {
        match s {
            None => return false,
            Some(t) if eos.contains(t) => return true,
            Some(_) => {}
        }
    }
    true
}

/// `softmax(row)[t]`.
fn softmax_at(row: &[f32], t: TokenId) -> f32 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = row.iter().map(|&v| (v - m).exp()).sum();
    (row[t as usize] - m).exp() / z
}
