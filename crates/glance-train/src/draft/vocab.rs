//! A draft head's reduced vocabulary (FR-Spec): the tokens its target emits on the head's
//! training data, most frequent first. A draft step then computes logits for these tokens only
//! (`glance_nn::DraftLm::logits`), which at a real vocabulary (32k+ tokens) is most of what a
//! draft step reads; a token outside it is never proposed, and the target verifies every
//! proposal, so decoding stays lossless.

use super::samples::{Length, SampleSource};
use crate::Result;
use glance_world::Split;
use std::collections::HashMap;

/// How the vocabulary is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabSettings {
    /// Training samples of each length (short answers, descriptions) whose answers are counted.
    pub samples: u64,
    /// Most tokens kept (`None`: every token the answers hold).
    pub size: Option<usize>,
}

/// Tokens counted in answers, with how often each occurred.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenCounts {
    counts: HashMap<u32, u64>,
    /// Tokens counted.
    pub total: u64,
}

impl TokenCounts {
    pub fn add(&mut self, tokens: &[u32]) {
        for &t in tokens {
            *self.counts.entry(t).or_default() += 1;
        }
        self.total += tokens.len() as u64;
    }

    /// The `size` most frequent tokens (every one when `None`), most frequent first, ties by id;
    /// `always` (the target's EOS tokens: every answer ends on one) lead the list whatever
    /// their counts.
    pub fn ranked(&self, size: Option<usize>, always: &[u32]) -> Vec<u32> {
        let mut ids: Vec<(u32, u64)> = self
            .counts
            .iter()
            .filter(|(id, _)| !always.contains(id))
            .map(|(&id, &n)| (id, n))
            .collect();
        ids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut out: Vec<u32> = Vec::with_capacity(ids.len() + always.len());
        for &id in always {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out.extend(ids.into_iter().map(|(id, _)| id));
        if let Some(n) = size {
            out.truncate(n.max(always.len()));
        }
        out
    }

    /// The share of the counted tokens that `ids` holds.
    pub fn coverage(&self, ids: &[u32]) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let kept: u64 = ids.iter().filter_map(|id| self.counts.get(id)).sum();
        kept as f64 / self.total as f64
    }
}

/// Counts the target's answers on `settings.samples` training samples of each length (generated
/// by the target, or taken from the source's cache), calling `progress(done, total)` after each.
pub fn count_answers(
    source: &mut SampleSource,
    settings: &VocabSettings,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TokenCounts> {
    let mut counts = TokenCounts::default();
    let total = 2 * settings.samples;
    let mut done = 0;
    for length in [Length::Short, Length::Long] {
        for j in 0..settings.samples {
            let sample = source.get(Split::Train, length, j)?;
            counts.add(&sample.answer);
            done += 1;
            progress(done, total);
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_rank_by_frequency_with_the_eos_tokens_first() {
        let mut c = TokenCounts::default();
        c.add(&[5, 7, 5, 9, 2]);
        c.add(&[7, 5, 3, 2]);
        // 5 ×3, 7 ×2, 2 ×2 (EOS), 9 ×1, 3 ×1.
        assert_eq!(c.ranked(None, &[2]), vec![2, 5, 7, 3, 9]);
        assert_eq!(c.ranked(Some(3), &[2]), vec![2, 5, 7]);
        // The EOS tokens stay even when the cap is smaller, and one never seen is added.
        assert_eq!(c.ranked(Some(1), &[2, 11]), vec![2, 11]);
        assert_eq!(c.total, 9);
        assert!((c.coverage(&[5, 7]) - 5.0 / 9.0).abs() < 1e-12);
        assert_eq!(TokenCounts::default().coverage(&[1]), 0.0);
    }
}
