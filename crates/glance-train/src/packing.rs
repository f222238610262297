//! Packing several QA turns about one image into one training sequence.
//!
//! Layout: one shared prefix (`<s> USER : <image>×N`), then one or more *conversations*, each a
//! chain of turns. A conversation's first turn is `question ASSISTANT : answer </s>`, every later
//! one `USER : question ASSISTANT : answer </s>`, exactly as the chat template renders a dialogue.
//! The mask is block-diagonal over the conversations: every row sees the prefix and, causally,
//! its own conversation only; positions restart at the end of the prefix for every conversation.
//!
//! A conversation of one turn is therefore exactly the single-turn prompt the model sees at
//! inference (`USER: <image>\n{q} ASSISTANT:`), trained as if the turn were asked cold; a longer
//! one is a dialogue, each turn seeing the earlier turns and their answers. Mixing both keeps a
//! description asked first answered well (in the PyTorch prototype, packing *only* dialogues
//! taught the model that a description follows other turns) while the model learns that a second
//! `USER :` turn is a new question and that follow-ups refer back.

use crate::{Result, TrainError};
use candle_core::{Device, Tensor};

/// One turn: the question tokens up to and including `ASSISTANT :` (a later turn of a
/// conversation starts with `USER :`), then the answer tokens ending with `</s>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub prompt: Vec<u32>,
    pub answer: Vec<u32>,
}

/// A packed sequence of `t` rows.
#[derive(Debug, Clone)]
pub struct Packed {
    /// Token ids, image placeholders included.
    pub ids: Vec<u32>,
    /// Position id of each row.
    pub positions: Vec<u32>,
    /// Additive mask `(t, t)`, row-major: 0 visible, -inf hidden.
    pub mask: Vec<f32>,
    /// Rows whose next-token logits are trained, and the tokens they must predict.
    pub target_rows: Vec<u32>,
    pub targets: Vec<u32>,
}

impl Packed {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The sequence restricted to `rows` (strictly increasing): ids, positions and the mask's rows
    /// and columns are kept as they are, so a kept row sees exactly the kept rows it saw before
    /// and keeps its position id. Every target row must be kept.
    pub fn keep_rows(&self, rows: &[usize]) -> Result<Packed> {
        let t = self.len();
        if !rows.windows(2).all(|w| w[0] < w[1]) || rows.last().is_some_and(|&r| r >= t) {
            return Err(TrainError::Config(format!(
                "rows to keep must be increasing and below {t}"
            )));
        }
        // new index of each old row
        let mut new = vec![u32::MAX; t];
        for (j, &r) in rows.iter().enumerate() {
            new[r] = j as u32;
        }
        let target_rows = self
            .target_rows
            .iter()
            .map(|&r| match new[r as usize] {
                u32::MAX => Err(TrainError::Config(format!("target row {r} was dropped"))),
                j => Ok(j),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut mask = Vec::with_capacity(rows.len() * rows.len());
        for &r in rows {
            mask.extend(rows.iter().map(|&c| self.mask[r * t + c]));
        }
        Ok(Packed {
            ids: rows.iter().map(|&r| self.ids[r]).collect(),
            positions: rows.iter().map(|&r| self.positions[r]).collect(),
            mask,
            target_rows,
            targets: self.targets.clone(),
        })
    }

    /// The mask as a `(t, t)` tensor.
    pub fn mask_tensor(&self, device: &Device) -> Result<Tensor> {
        let t = self.len();
        Ok(Tensor::from_slice(&self.mask, (t, t), device)?)
    }
}

/// Packs `conversations` (each a chain of turns) after `prefix`, keeping only as many as fit in
/// `max_rows` rows (the model's position limit bounds the whole packed sequence). The first
/// conversation is always kept, cut after its last turn that fits (its first turn at least).
pub fn pack(prefix: &[u32], conversations: &[Vec<Segment>], max_rows: usize) -> Packed {
    let p = prefix.len();
    let len = |s: &Segment| s.prompt.len() + s.answer.len();
    let mut kept: Vec<&[Segment]> = Vec::new();
    let mut t = p;
    for c in conversations.iter().filter(|c| !c.is_empty()) {
        let rows: usize = c.iter().map(len).sum();
        if kept.is_empty() {
            // The longest run of leading turns that fits, at least one.
            let mut n = 1;
            let mut rows = p + len(&c[0]);
            while n < c.len() && rows + len(&c[n]) <= max_rows {
                rows += len(&c[n]);
                n += 1;
            }
            kept.push(&c[..n]);
            t = rows;
        } else if t + rows <= max_rows {
            kept.push(c);
            t += rows;
        }
    }
    let mut ids = prefix.to_vec();
    let mut positions: Vec<u32> = (0..p as u32).collect();
    let mut mask = vec![f32::NEG_INFINITY; t * t];
    // Prefix: causal.
    for i in 0..p {
        mask[i * t..i * t + i + 1].fill(0.0);
    }
    let mut target_rows = Vec::new();
    let mut targets = Vec::new();
    let mut start = p;
    for c in kept {
        let mut k = 0;
        for s in c {
            let turn_start = k;
            for &id in s.prompt.iter().chain(&s.answer) {
                let row = start + k;
                ids.push(id);
                positions.push((p + k) as u32);
                mask[row * t..row * t + p].fill(0.0);
                mask[row * t + start..row * t + row + 1].fill(0.0);
                k += 1;
            }
            // The row of token j predicts token j + 1; the answer starts at prompt.len().
            for j in (turn_start + s.prompt.len()).saturating_sub(1)..k - 1 {
                target_rows.push((start + j) as u32);
                targets.push(ids[start + j + 1]);
            }
        }
        start += k;
    }
    Packed {
        ids,
        positions,
        mask,
        target_rows,
        targets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn singles(segs: &[Segment]) -> Vec<Vec<Segment>> {
        segs.iter().map(|s| vec![s.clone()]).collect()
    }

    #[test]
    fn a_dialogue_is_causal_across_its_turns_and_apart_from_other_conversations() {
        let prefix = [1u32, 9];
        let turn = |prompt: &[u32], answer: &[u32]| Segment {
            prompt: prompt.to_vec(),
            answer: answer.to_vec(),
        };
        let dialogue = vec![turn(&[10], &[20, 3]), turn(&[5, 11], &[21, 3])];
        let single = vec![turn(&[12], &[22, 3])];
        let p = pack(&prefix, &[dialogue, single], 100);
        assert_eq!(p.ids, vec![1, 9, 10, 20, 3, 5, 11, 21, 3, 12, 22, 3]);
        assert_eq!(p.positions, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4]);
        // Turn 1 answers from row 2 ("10"), turn 2 from row 6 ("11"), the single from row 9.
        assert_eq!(p.target_rows, vec![2, 3, 6, 7, 9, 10]);
        assert_eq!(p.targets, vec![20, 3, 21, 3, 22, 3]);
        let t = p.len();
        let vis = |r: usize| -> String {
            (0..t)
                .map(|c| if p.mask[r * t + c] == 0.0 { '1' } else { '0' })
                .collect()
        };
        assert_eq!(vis(7), "111111110000", "turn 2 sees turn 1 and its answer");
        assert_eq!(vis(10), "110000000110", "the single sees only the prefix");
    }

    #[test]
    fn block_diagonal_layout() {
        let prefix = [1u32, 9, 9];
        let segs = [
            Segment {
                prompt: vec![10, 11],
                answer: vec![20, 3],
            },
            Segment {
                prompt: vec![12],
                answer: vec![21, 22, 3],
            },
        ];
        let p = pack(&prefix, &singles(&segs), 100);
        assert_eq!(p.ids, vec![1, 9, 9, 10, 11, 20, 3, 12, 21, 22, 3]);
        assert_eq!(p.positions, vec![0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 6]);
        // Segment 1's prompt row 4 ("11") predicts 20, then 20 → 3.
        assert_eq!(p.target_rows, vec![4, 5, 7, 8, 9]);
        assert_eq!(p.targets, vec![20, 3, 21, 22, 3]);
        let t = p.len();
        let vis = |r: usize| -> Vec<bool> { (0..t).map(|c| p.mask[r * t + c] == 0.0).collect() };
        let row = |s: &str| -> Vec<bool> { s.chars().map(|c| c == '1').collect() };
        assert_eq!(vis(1), row("11000000000"));
        assert_eq!(vis(5), row("11111100000"));
        assert_eq!(vis(7), row("11100001000"));
        assert_eq!(vis(10), row("11100001111"));
    }

    #[test]
    fn keeping_rows_keeps_positions_visibility_and_targets() {
        let prefix = [1u32, 9, 9, 9];
        let segs = [
            Segment {
                prompt: vec![10],
                answer: vec![20, 3],
            },
            Segment {
                prompt: vec![12],
                answer: vec![3],
            },
        ];
        let p = pack(&prefix, &singles(&segs), 100);
        // drop the image rows 1 and 3
        let q = p.keep_rows(&[0, 2, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(q.ids, vec![1, 9, 10, 20, 3, 12, 3]);
        assert_eq!(q.positions, vec![0, 2, 4, 5, 6, 4, 5]);
        assert_eq!(q.targets, p.targets);
        assert_eq!(q.target_rows, vec![2, 3, 5]);
        let t = q.len();
        let vis = |r: usize| -> Vec<bool> { (0..t).map(|c| q.mask[r * t + c] == 0.0).collect() };
        assert_eq!(vis(1), [true, true, false, false, false, false, false]);
        assert_eq!(vis(6), [true, true, false, false, false, true, true]);
        assert!(
            p.keep_rows(&[0, 1, 2, 3, 5, 6, 7, 8]).is_err(),
            "target row 4 dropped"
        );
        assert!(p.keep_rows(&[2, 1]).is_err());
        assert!(p.keep_rows(&[0, 99]).is_err());
    }

    #[test]
    fn drops_segments_that_do_not_fit() {
        let segs = vec![
            Segment {
                prompt: vec![5; 4],
                answer: vec![3]
            };
            5
        ];
        let p = pack(&[1, 2], &singles(&segs), 13);
        assert_eq!(p.len(), 12);
        let p = pack(&[1, 2], &singles(&segs[..1]), 3);
        assert_eq!(p.len(), 7, "one segment is always kept");
        // A dialogue that does not fit is cut after its last turn that does.
        let p = pack(&[1, 2], std::slice::from_ref(&segs), 13);
        assert_eq!(p.len(), 12);
        assert_eq!(p.positions, (0..12).collect::<Vec<u32>>());
    }
}
