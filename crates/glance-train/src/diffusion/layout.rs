//! The `[clean | noisy …]` training layout of block-diffusion conversion (Fast-dVLM) and its
//! attention mask.
//!
//! One sample (prompt of `P` rows — text and the image's visual rows —, answer of `R` tokens)
//! becomes one sequence:
//!
//! * **clean** rows `0..P+R`: the prompt, then the answer's tokens, causal — exactly the
//!   autoregressive model's sequence. The visual rows are here only.
//! * **noisy** copies, `R` rows each (row `P + R + c·R + i` is copy `c`'s answer token `i`): the
//!   answer with some tokens replaced by `[MASK]`, at the same positions as their clean twins.
//!
//! The answer is cut into blocks (the first may be shorter: a random phase, so that block
//! boundaries fall anywhere — decoding starts a block wherever the last one stopped). A noisy row
//! of block `[s, e)` sees the clean rows before the block (`< P + s`: the prompt, vision
//! included, and the earlier answer blocks) and every row of its own block in its own copy
//! (bidirectional); nothing else. Clean rows see clean rows causally.
//!
//! **Targets.** Prediction is shifted by one, as in the autoregressive model, so one LM head
//! serves both modes: the output of a row at position `p` predicts the token at `p + 1`.
//! * causal: clean row `P - 1 + i` predicts answer token `i`, every `i`;
//! * diffusion: noisy row `(c, i)` predicts token `i + 1` when `i + 1` lies in the same block and
//!   is masked in copy `c`. A block's first token is predicted by the clean row before it, which
//!   is the causal target already.
//!
//! **Complementary masks.** Copy 1 masks the complement of copy 0 in every block, so every answer
//! token but a block's first is a diffusion target exactly once.
//!
//! This is the layout decoding meets: a draft block `[x, M, …, M]` (linear self-speculation) is
//! a noisy block whose first token is known and the rest masked, attending to the cached clean
//! rows; a pre-draft group of quadratic self-speculation is a wholly masked block
//! (`crates/glance-decode/src/diffusion/`).

use std::ops::Range;

/// Consecutive blocks covering `0..len`: the first has `first` tokens (`1..=size`), the others
/// `size` (the last may be shorter).
pub fn blocks(len: usize, size: usize, first: usize) -> Vec<Range<usize>> {
    let (size, first) = (size.max(1), first.clamp(1, size.max(1)));
    let mut out = Vec::new();
    let mut s = 0;
    while s < len {
        let e = if out.is_empty() { first } else { s + size }.min(len);
        out.push(s..e);
        s = e;
    }
    out
}

/// Which answer tokens a noisy copy masks, block by block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaskPattern {
    /// The first `known` tokens of the block visible, the rest masked (what a decoding draft
    /// sees; `known = 0` is a wholly masked block).
    Prefix { known: usize },
    /// Token `j` masked when `u_j < ratio` (the block's uniform draws).
    Ratio { ratio: f64 },
}

/// One sample's layout: prompt and answer lengths, the answer's blocks, and per noisy copy which
/// answer tokens are `[MASK]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub prompt_len: usize,
    pub answer_len: usize,
    pub blocks: Vec<Range<usize>>,
    /// `masked[c][i]`: copy `c` replaces answer token `i` by `[MASK]`.
    pub masked: Vec<Vec<bool>>,
}

impl Layout {
    /// Two complementary copies: `first[i]` for copy 0, its negation for copy 1.
    pub fn complementary(prompt_len: usize, blocks: Vec<Range<usize>>, first: Vec<bool>) -> Layout {
        let second = first.iter().map(|m| !m).collect();
        Layout {
            prompt_len,
            answer_len: first.len(),
            blocks,
            masked: vec![first, second],
        }
    }

    /// Rows of the sequence: clean, then every noisy copy.
    pub fn rows(&self) -> usize {
        self.prompt_len + self.answer_len * (1 + self.masked.len())
    }

    /// Row of copy `c`'s answer token `i`.
    pub fn noisy_row(&self, c: usize, i: usize) -> usize {
        self.prompt_len + self.answer_len * (1 + c) + i
    }

    /// The block holding answer token `i`.
    fn block_of(&self, i: usize) -> &Range<usize> {
        let k = self.blocks.partition_point(|b| b.end <= i);
        &self.blocks[k]
    }

    /// Position id of every row: clean row `r` at `r`; noisy rows at their clean twin's.
    pub fn positions(&self) -> Vec<u32> {
        let clean = self.prompt_len + self.answer_len;
        let mut p: Vec<u32> = (0..clean as u32).collect();
        for _ in &self.masked {
            p.extend((self.prompt_len..clean).map(|r| r as u32));
        }
        p
    }

    /// Row-major `(rows, rows)` visibility, `true` = the query row (first index) sees the key.
    pub fn visible(&self) -> Vec<bool> {
        let n = self.rows();
        let clean = self.prompt_len + self.answer_len;
        let mut v = vec![false; n * n];
        for q in 0..clean {
            v[q * n..q * n + q + 1].fill(true);
        }
        for c in 0..self.masked.len() {
            for i in 0..self.answer_len {
                let b = self.block_of(i);
                let row = &mut v[self.noisy_row(c, i) * n..][..n];
                row[..self.prompt_len + b.start].fill(true);
                row[self.noisy_row(c, b.start)..self.noisy_row(c, b.end)].fill(true);
            }
        }
        v
    }

    /// Token id of every row's input: the prompt's ids (the caller puts the visual features in
    /// the image rows), the answer, then each copy with masked tokens as `mask_id`.
    pub fn input_ids(&self, prompt: &[u32], answer: &[u32], mask_id: u32) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.rows());
        ids.extend_from_slice(prompt);
        ids.extend_from_slice(answer);
        for m in &self.masked {
            ids.extend(
                answer
                    .iter()
                    .zip(m)
                    .map(|(&t, &m)| if m { mask_id } else { t }),
            );
        }
        ids
    }

    /// `(rows, targets)` of the causal loss: clean row `P - 1 + i` predicts `answer[i]`.
    pub fn causal_targets(&self, answer: &[u32]) -> (Vec<u32>, Vec<u32>) {
        let rows = (0..self.answer_len)
            .map(|i| (self.prompt_len + i - 1) as u32)
            .collect();
        (rows, answer.to_vec())
    }

    /// `(rows, targets)` of the diffusion loss: noisy row `(c, i)` predicts `answer[i + 1]` when
    /// `i + 1` is in the same block and masked in copy `c`.
    pub fn diffusion_targets(&self, answer: &[u32]) -> (Vec<u32>, Vec<u32>) {
        let (mut rows, mut targets) = (Vec::new(), Vec::new());
        for (c, m) in self.masked.iter().enumerate() {
            for b in &self.blocks {
                for i in b.start..b.end.saturating_sub(1) {
                    if m[i + 1] {
                        rows.push(self.noisy_row(c, i) as u32);
                        targets.push(answer[i + 1]);
                    }
                }
            }
        }
        (rows, targets)
    }
}

/// Copy 0's masks for `blocks` of an answer of `len` tokens, block by block from `pattern(k)`;
/// `uniform()` draws the `Ratio` patterns' numbers in `[0, 1)`.
pub fn draw_masks(
    len: usize,
    blocks: &[Range<usize>],
    mut pattern: impl FnMut(usize, usize) -> MaskPattern,
    mut uniform: impl FnMut() -> f64,
) -> Vec<bool> {
    let mut m = vec![false; len];
    for (k, b) in blocks.iter().enumerate() {
        match pattern(k, b.len()) {
            MaskPattern::Prefix { known } => {
                for (j, x) in m[b.clone()].iter_mut().enumerate() {
                    *x = j >= known;
                }
            }
            MaskPattern::Ratio { ratio } => {
                for x in &mut m[b.clone()] {
                    *x = uniform() < ratio;
                }
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `#` visible, `.` hidden; one line per query row.
    fn draw(l: &Layout) -> Vec<String> {
        let n = l.rows();
        l.visible()
            .chunks(n)
            .map(|r| r.iter().map(|&v| if v { '#' } else { '.' }).collect())
            .collect()
    }

    #[test]
    fn blocks_start_with_the_phase_and_cover_the_answer() {
        assert_eq!(blocks(7, 3, 2), vec![0..2, 2..5, 5..7]);
        assert_eq!(blocks(6, 3, 3), vec![0..3, 3..6]);
        assert_eq!(blocks(2, 4, 4), vec![0..2]);
        assert_eq!(blocks(3, 1, 1), vec![0..1, 1..2, 2..3]);
        assert!(blocks(0, 4, 1).is_empty());
    }

    #[test]
    fn the_mask_of_a_small_case() {
        // Prompt p0 p1 (the image would be among them), answer a0..a3 in blocks [a0 a1][a2 a3];
        // copy 0 masks a1 and a2, copy 1 (the complement) a0 and a3.
        let l = Layout::complementary(2, blocks(4, 2, 2), vec![false, true, true, false]);
        assert_eq!(l.rows(), 2 + 4 * 3);
        #[rustfmt::skip]
        let want = [
            //   clean     copy0 copy1
            //  p p a a a a a a a a a a a a
            //  0 1 0 1 2 3 0 1 2 3 0 1 2 3
            "#.............",   // p0
            "##............",   // p1
            "###...........",   // a0  clean: causal
            "####..........",   // a1
            "#####.........",   // a2
            "######........",   // a3
            "##....##......",   // a0  copy 0, block 1: the prompt + its block
            "##....##......",   // M
            "####....##....",   // M   block 2: the prompt, clean a0 a1, its block
            "####....##....",   // a3
            "##........##..",   // M   copy 1
            "##........##..",   // a1
            "####........##",   // a2
            "####........##",   // M
        ];
        assert_eq!(draw(&l), want);
        assert_eq!(l.positions(), [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3, 4, 5]);
        let (a, m) = ([10, 11, 12, 13], 99);
        assert_eq!(
            l.input_ids(&[7, 8], &a, m),
            [7, 8, 10, 11, 12, 13, 10, 99, 99, 13, 99, 11, 12, 99]
        );
        // Causal: p1 → a0, a0 → a1, … ; diffusion: only in-block masked successors.
        assert_eq!(
            l.causal_targets(&a),
            (vec![1, 2, 3, 4], vec![10, 11, 12, 13])
        );
        // copy 0: row of a0 → a1 (masked); a2 is a block start. copy 1: row of a2 → a3.
        assert_eq!(l.diffusion_targets(&a), (vec![6, 12], vec![11, 13]));
    }

    #[test]
    fn complementary_copies_supervise_every_token_but_block_starts() {
        let bl = blocks(23, 8, 5);
        let mut k = 0u64;
        let m = draw_masks(
            23,
            &bl,
            |b, _| {
                if b % 2 == 0 {
                    MaskPattern::Prefix { known: 1 }
                } else {
                    MaskPattern::Ratio { ratio: 0.5 }
                }
            },
            || {
                k += 1;
                (k % 3) as f64 / 3.0
            },
        );
        let l = Layout::complementary(3, bl.clone(), m);
        let answer: Vec<u32> = (100..123).collect();
        let (_, targets) = l.diffusion_targets(&answer);
        let mut seen: Vec<u32> = targets.clone();
        seen.sort();
        let starts: Vec<u32> = bl.iter().map(|b| answer[b.start]).collect();
        let want: Vec<u32> = answer
            .iter()
            .copied()
            .filter(|t| !starts.contains(t))
            .collect();
        assert_eq!(seen, want);
        // A prefix pattern with one known token: the draft block of linear self-speculation.
        assert_eq!(&l.masked[0][0..5], &[false, true, true, true, true]);
    }
}
