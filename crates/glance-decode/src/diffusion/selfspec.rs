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
use super::{BlockSize, Common};
use crate::autoregressive::Generation;
use crate::sampler::argmax;
use crate::speculative::{verify, DraftTree};
use crate::step::{DecodeState, Pass, PassOutput};
use crate::strategy::TokenSink;
use glance_core::{Error, Result, TokenId};
use glance_nn::{CacheMark, CausalLm, KvCache};
use std::time::Instant;

/// Where a step stands between passes.
enum Phase {
    /// Before the step's first pass.
    Idle,
    /// The linear draft pass of a block of `b` is out; its rows go at `mark`.
    Drafting { b: usize, mark: CacheMark },
    /// The linear drafts are in; the verification pass is next.
    Drafted { b: usize },
    /// The verification pass is out.
    Verifying {
        b: usize,
        group: usize,
        layout: QuadraticLayout,
    },
}

pub(crate) struct SelfSpecState {
    c: Common,
    quadratic: bool,
    block: BlockSize,
    /// Drafts for the slots after `x`.
    drafts: Vec<TokenId>,
    phase: Phase,
}

impl SelfSpecState {
    pub fn new(c: Common, quadratic: bool, block: BlockSize) -> Self {
        Self {
            c,
            quadratic,
            block,
            drafts: Vec::new(),
            phase: Phase::Idle,
        }
    }

    fn name(&self) -> &'static str {
        if self.quadratic {
            "diffusion-quadratic"
        } else {
            "diffusion-linear"
        }
    }

    /// The verification pass of a block of `b` over `[x, drafts…]` (and, quadratic, the
    /// pre-draft groups).
    fn verification(&mut self, b: usize) -> Result<Pass> {
        let c = &mut self.c;
        self.drafts.truncate(b - 1);
        let k = self.drafts.len();
        // The quadratic groups pre-draft the next step's block (size of the current one);
        // the last group ends at `n + k + group`, inside the context.
        let room = c.max.saturating_sub(c.n as usize).max(1);
        let group = match b.min(room.saturating_sub(b)) {
            g if self.quadratic && g > 1 => g,
            _ => 0,
        };
        let layout = QuadraticLayout { drafts: k, group };
        let pass = c.pass(
            layout.ids(c.x, &self.drafts, c.mask),
            layout.positions(c.n),
            layout.mask()?,
            0..k + 1,
        );
        self.phase = Phase::Verifying { b, group, layout };
        Ok(pass)
    }

    /// Verifies the drafts against the pass's rows, keeps the accepted rows, emits.
    fn verified(
        &mut self,
        model: &dyn CausalLm,
        out: &PassOutput,
        b: usize,
        group: usize,
        layout: &QuadraticLayout,
        on_token: TokenSink<'_>,
    ) -> Result<()> {
        let c = &mut self.c;
        let k = self.drafts.len();
        let chain = DraftTree {
            tokens: self.drafts.clone(),
            parents: (0..k).map(|i| i.checked_sub(1)).collect(),
            probs: vec![1.0; k],
            forwards: 0,
        };
        let verdict = verify(&chain, &out.logits, &mut c.sampler)?;
        let a = verdict.accepted.len();
        c.cache
            .keep_speculative(layout.rows(), &(0..=a).collect::<Vec<_>>())?;
        let next_drafts = if group > 0 {
            let t = Instant::now();
            // (group - 1, vocab): the group of the realised acceptance length.
            let rows = model
                .logits(&out.hidden.narrow(0, layout.group_start(a), group - 1)?)?
                .to_vec2::<f32>()?;
            c.tally.forward_us += t.elapsed().as_micros() as u64;
            rows.iter().map(|r| argmax(r)).collect()
        } else {
            Vec::new()
        };
        c.tally.step(b, k, a);
        self.block.update(a, k);
        let (n, drafts) = (c.n, std::mem::replace(&mut self.drafts, next_drafts));
        for (j, &d) in drafts[..a].iter().enumerate() {
            // `d` sits at `n + 1 + j`, predicted by the row before it.
            if c.emit(d, n + j as u32, on_token)? {
                return Ok(());
            }
        }
        c.x = verdict.next;
        c.n += a as u32 + 1;
        c.emit(c.x, c.n - 1, on_token)?;
        Ok(())
    }
}

impl DecodeState for SelfSpecState {
    fn next_pass(&mut self, _: &dyn CausalLm, on_token: TokenSink<'_>) -> Result<Option<Pass>> {
        if self.c.over(on_token)? {
            return Ok(None);
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => {
                let c = &mut self.c;
                c.tally.step_starts.begin(c.tokens.len());
                let b = self.block.fitted(c.n, c.tokens.len(), c.max, &c.config);
                if self.quadratic {
                    return self.verification(b).map(Some);
                }
                if b == 1 {
                    self.drafts.clear();
                    return self.verification(b).map(Some);
                }
                // The linear draft: one bidirectional pass over `[x, M × (b − 1)]` at `n …`,
                // rolled back; row `j`'s argmax drafts slot `j + 1`.
                let mut slots = vec![None; b];
                slots[0] = Some(c.x);
                let (ids, positions, mask) = draft_block(&slots, c.mask, c.n);
                let mark = c.cache.mark();
                self.phase = Phase::Drafting { b, mark };
                Ok(Some(c.pass(ids, positions, mask, 0..b - 1)))
            }
            Phase::Drafted { b } => self.verification(b).map(Some),
            Phase::Drafting { .. } | Phase::Verifying { .. } => Err(Error::Input(
                "block diffusion: a pass was asked for before the last one's outputs".into(),
            )),
        }
    }

    fn cache(&mut self) -> &mut KvCache {
        &mut self.c.cache
    }

    fn absorb(
        &mut self,
        model: &dyn CausalLm,
        out: PassOutput,
        on_token: TokenSink<'_>,
    ) -> Result<()> {
        self.c.passed();
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Drafting { b, mark } => {
                self.c.cache.rollback(&mark)?;
                self.drafts = out.logits.iter().map(|r| argmax(r)).collect();
                self.phase = Phase::Drafted { b };
                Ok(())
            }
            Phase::Verifying { b, group, layout } => {
                self.verified(model, &out, b, group, &layout, on_token)
            }
            Phase::Idle | Phase::Drafted { .. } => Err(Error::Input(
                "block diffusion: outputs without a pass".into(),
            )),
        }
    }

    fn finish(self: Box<Self>) -> Generation {
        let name = self.name();
        self.c.generation(name)
    }
}
