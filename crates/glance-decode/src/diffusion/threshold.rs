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
use super::{bump, BlockSize, Common};
use crate::autoregressive::Generation;
use crate::sampler::argmax;
use crate::step::{DecodeState, Pass, PassOutput};
use crate::strategy::TokenSink;
use glance_core::{Error, Result, TokenId};
use glance_nn::{AttnMask, CacheMark, CausalLm, KvCache};

/// Where a block stands between passes.
enum Phase {
    /// Before the block's first pass.
    Idle,
    /// The block's slots; a denoising pass is out when `open` holds its cache mark.
    Denoising {
        slots: Vec<Option<TokenId>>,
        passes: usize,
        open: Option<CacheMark>,
    },
    /// The finished block of `b` tokens runs causally into the cache.
    Committing { b: usize, passes: usize },
}

pub(crate) struct ThresholdState {
    c: Common,
    block: BlockSize,
    tau: f32,
    phase: Phase,
}

impl ThresholdState {
    pub fn new(c: Common, block: BlockSize, tau: f32) -> Self {
        Self {
            c,
            block,
            tau,
            phase: Phase::Idle,
        }
    }

    /// Unmasks the slots of a denoising pass's rows `logits` (row `j` predicts slot `j + 1`).
    fn unmask(&mut self, slots: &mut [Option<TokenId>], logits: &[Vec<f32>]) -> Result<()> {
        let sampler = &mut self.c.sampler;
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
            if conf >= self.tau || conf == best && decided == 0 {
                slots[slot] = Some(token);
                decided += 1;
            }
        }
        bump(&mut self.c.tally.accepted_length, decided);
        Ok(())
    }

    /// The block's slots are decided: emit them (a block that ends the generation needs no
    /// causal pass), then the causal pass that commits them.
    fn commit(
        &mut self,
        slots: Vec<Option<TokenId>>,
        passes: usize,
        on_token: TokenSink<'_>,
    ) -> Result<Option<Pass>> {
        let c = &mut self.c;
        let b = slots.len();
        c.tally.iterations += passes as u64;
        c.tally.steps += 1;
        c.tally.block_tokens += b as u64;
        bump(&mut c.tally.block_size, b);
        // A block decided up to an end-of-sequence token ends there.
        let end = slots
            .iter()
            .position(|s| s.is_some_and(|t| c.config.eos_token_ids.contains(&t)))
            .map_or(b, |e| e + 1);
        let ids: Vec<TokenId> = slots[..end].iter().map(|s| s.unwrap_or(c.mask)).collect();
        let b = ids.len();
        c.sampler.observe(&ids[1..]);
        let n = c.n;
        for (j, &t) in ids[1..].iter().enumerate() {
            if c.emit(t, n + j as u32, on_token)? {
                return Ok(None);
            }
        }
        // The finished block, causally into the cache; its last row predicts the next `x`.
        let positions: Vec<u32> = (0..b as u32).map(|j| n + j).collect();
        self.phase = Phase::Committing { b, passes };
        Ok(Some(c.pass(ids, positions, AttnMask::Causal, b - 1..b)))
    }
}

impl DecodeState for ThresholdState {
    fn next_pass(&mut self, _: &dyn CausalLm, on_token: TokenSink<'_>) -> Result<Option<Pass>> {
        if self.c.over(on_token)? {
            return Ok(None);
        }
        let (slots, passes) = match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => {
                let c = &mut self.c;
                c.tally.step_starts.begin(c.tokens.len());
                let b = self.block.fitted(c.n, c.tokens.len(), c.max, &c.config);
                let mut slots: Vec<Option<TokenId>> = vec![None; b];
                slots[0] = Some(c.x);
                (slots, 0)
            }
            Phase::Denoising {
                slots,
                passes,
                open: None,
            } => (slots, passes),
            _ => {
                return Err(Error::Input(
                    "threshold diffusion: a pass was asked for before the last one's outputs"
                        .into(),
                ))
            }
        };
        if block_done(&slots, &self.c.config.eos_token_ids) {
            return self.commit(slots, passes, on_token);
        }
        let c = &mut self.c;
        let b = slots.len();
        let (ids, positions, mask) = draft_block(&slots, c.mask, c.n);
        let mark = c.cache.mark();
        self.phase = Phase::Denoising {
            slots,
            passes,
            open: Some(mark),
        };
        Ok(Some(c.pass(ids, positions, mask, 0..b - 1)))
    }

    fn cache(&mut self) -> &mut KvCache {
        &mut self.c.cache
    }

    fn absorb(&mut self, _: &dyn CausalLm, out: PassOutput, on_token: TokenSink<'_>) -> Result<()> {
        self.c.passed();
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Denoising {
                mut slots,
                passes,
                open: Some(mark),
            } => {
                self.c.cache.rollback(&mark)?;
                self.unmask(&mut slots, &out.logits)?;
                self.phase = Phase::Denoising {
                    slots,
                    passes: passes + 1,
                    open: None,
                };
                Ok(())
            }
            Phase::Committing { b, passes } => {
                let row = out
                    .logits
                    .first()
                    .ok_or_else(|| Error::Input("a committed block without logits".into()))?;
                let next = self.c.sampler.sample(row)?;
                update(&mut self.block, passes, b);
                let c = &mut self.c;
                c.x = next;
                c.n += b as u32;
                c.emit(c.x, c.n - 1, on_token)?;
                Ok(())
            }
            _ => Err(Error::Input(
                "threshold diffusion: outputs without a pass".into(),
            )),
        }
    }

    fn finish(self: Box<Self>) -> Generation {
        self.c.generation("diffusion-threshold")
    }
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
