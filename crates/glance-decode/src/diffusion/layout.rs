//! The rows, positions and masks of block-diffusion decoding passes (Fast-dVLM), relative to the
//! cache: every cached row (the prompt and the finished blocks) is visible to every new row.
//!
//! Notation: `x` is the last emitted token, at position `n`, not yet in the cache; `d₁ … d_k` are
//! draft tokens for positions `n + 1 … n + k`; `M` is the mask token. A row at position `p`
//! predicts the token at `p + 1` (the autoregressive shift, kept by the conversion).
//!
//! * **Draft block** (threshold iterations, linear drafting): `[x, M, …, M]` (or with some slots
//!   already filled) at `n … n + B − 1`, bidirectional: [`AttnMask::Full`]. Row `j` predicts slot
//!   `j + 1`.
//! * **Verification** (linear): `[x, d₁, …, d_k]` at `n … n + k`, [`AttnMask::Causal`]: row `j`
//!   predicts what greedy decoding would put at `n + j + 1`.
//! * **Quadratic step**: the verification rows, then one pre-draft *group* per possible outcome.
//!   Group `a` (`a = 0 … k`: `d₁ … d_a` accepted, the verifier's own token `y` at `n + a + 1`) is
//!   `B` mask rows at `n + a + 1 … n + a + B` seeing the verification rows `x, d₁ … d_a` and
//!   itself (bidirectionally); its rows `0 … B − 2` draft the tokens after `y` for the next
//!   step. Drawn for `k = 2`, `B = 3` (`v` verification, `g_a` groups; `#` visible):
//!
//! ```text
//!            v0 v1 v2 | g0 g0 g0 | g1 g1 g1 | g2 g2 g2
//!   x   v0    #  .  . |  .  .  . |  .  .  . |  .  .  .
//!   d1  v1    #  #  . |  .  .  . |  .  .  . |  .  .  .
//!   d2  v2    #  #  # |  .  .  . |  .  .  . |  .  .  .
//!   M   g0    #  .  . |  #  #  # |  .  .  . |  .  .  .    at n+1, n+2, n+3
//!   M   g1    #  #  . |  .  .  . |  #  #  # |  .  .  .    at n+2, n+3, n+4
//!   M   g2    #  #  # |  .  .  . |  .  .  . |  #  #  #    at n+3, n+4, n+5
//! ```
//!
//!   With `k = B − 1` (the steady state) that is `B + B·B = B (B + 1)` rows: `B` groups of
//!   `B + 1` (a verification row and its group) in one forward pass.
//!
//! Sliding windows are not modelled here (the masks see every cached row); the converted models
//! glance ships have none.

use glance_core::{Result, TokenId};
use glance_nn::AttnMask;

/// The quadratic pass's rows: verification `[x, d₁ … d_k]`, then `k + 1` groups of `group` mask
/// rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuadraticLayout {
    /// Drafts verified (`k`).
    pub drafts: usize,
    /// Rows per group (`B`); 0: no groups (a plain verification).
    pub group: usize,
}

impl QuadraticLayout {
    /// Verification rows (`k + 1`).
    pub fn verify_rows(&self) -> usize {
        self.drafts + 1
    }

    pub fn rows(&self) -> usize {
        self.verify_rows() * (1 + self.group)
    }

    /// First row of group `a`.
    pub fn group_start(&self, a: usize) -> usize {
        self.verify_rows() + a * self.group
    }

    /// Token ids: `x`, the drafts, then every group's mask tokens.
    pub fn ids(&self, x: TokenId, drafts: &[TokenId], mask: TokenId) -> Vec<TokenId> {
        let mut ids = Vec::with_capacity(self.rows());
        ids.push(x);
        ids.extend_from_slice(&drafts[..self.drafts]);
        ids.resize(self.rows(), mask);
        ids
    }

    /// Positions when `x` sits at `n`.
    pub fn positions(&self, n: u32) -> Vec<u32> {
        let mut p: Vec<u32> = (0..self.verify_rows() as u32).map(|j| n + j).collect();
        for a in 0..self.verify_rows() as u32 {
            p.extend((0..self.group as u32).map(|j| n + a + 1 + j));
        }
        p
    }

    /// The mask over the new rows (cached rows all visible): causal verification; group `a`
    /// sees verification rows `0 ..= a` and itself.
    pub fn mask(&self) -> Result<AttnMask> {
        if self.group == 0 {
            return Ok(AttnMask::Causal);
        }
        let (t, v) = (self.rows(), self.verify_rows());
        let mut vis = vec![false; t * t];
        for i in 0..v {
            vis[i * t..i * t + i + 1].fill(true);
        }
        for a in 0..v {
            let g = self.group_start(a);
            for r in g..g + self.group {
                let row = &mut vis[r * t..(r + 1) * t];
                row[..=a].fill(true);
                row[g..g + self.group].fill(true);
            }
        }
        Ok(AttnMask::visible(t, t, vis)?)
    }
}

/// The draft block `slots` (`None`: masked) at `n …`: its ids with masks, positions and mask.
pub fn draft_block(
    slots: &[Option<TokenId>],
    mask: TokenId,
    n: u32,
) -> (Vec<TokenId>, Vec<u32>, AttnMask) {
    let ids = slots.iter().map(|s| s.unwrap_or(mask)).collect();
    let positions = (0..slots.len() as u32).map(|j| n + j).collect();
    (ids, positions, AttnMask::Full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `#` visible, `.` hidden, over the new rows (no cache).
    fn draw(mask: &AttnMask, t: usize) -> Vec<String> {
        let m = mask
            .materialize(None, t, t, &Device::Cpu)
            .unwrap()
            .map(|m| m.to_vec2::<f32>().unwrap());
        (0..t)
            .map(|i| {
                (0..t)
                    .map(|j| match &m {
                        Some(m) if m[i][j] == f32::NEG_INFINITY => '.',
                        _ => '#',
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_quadratic_layout_of_the_module_docs() {
        let l = QuadraticLayout {
            drafts: 2,
            group: 3,
        };
        assert_eq!(l.rows(), 12);
        #[rustfmt::skip]
        let want = [
            // v v v g0    g1    g2
            "#...........", // x
            "##..........", // d1
            "###.........", // d2
            "#..###......", // group 0
            "#..###......",
            "#..###......",
            "##....###...", // group 1
            "##....###...",
            "##....###...",
            "###......###", // group 2
            "###......###",
            "###......###",
        ];
        assert_eq!(draw(&l.mask().unwrap(), 12), want);
        assert_eq!(
            l.positions(10),
            [10, 11, 12, 11, 12, 13, 12, 13, 14, 13, 14, 15]
        );
        assert_eq!(l.ids(7, &[8, 9], 0), [7, 8, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn without_groups_quadratic_is_plain_verification() {
        let l = QuadraticLayout {
            drafts: 3,
            group: 0,
        };
        assert_eq!(l.rows(), 4);
        assert!(matches!(l.mask().unwrap(), AttnMask::Causal));
        assert_eq!(l.positions(5), [5, 6, 7, 8]);
    }

    #[test]
    fn a_draft_block_is_bidirectional() {
        let (ids, pos, mask) = draft_block(&[Some(4), None, Some(6), None], 1, 20);
        assert_eq!(ids, [4, 1, 6, 1]);
        assert_eq!(pos, [20, 21, 22, 23]);
        assert_eq!(draw(&mask, 4), ["####"; 4]);
    }
}
