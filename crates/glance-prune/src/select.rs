//! Subset policies: `random`, `saliency`, `text`, `mix` and `adaptive` keep `k` of the tokens
//! unchanged.
//!
//! **The self-adaptive split** (AdaFV, "adaptive visual-token compression with saliency and text
//! relevance": its self-adaptive cross-modality attention mixture). With the saliency ranking `S`
//! and the relevance ranking `T` (both distributions over the tokens, [`crate::signals`]), the
//! candidate set for a split `i + j = k` is `U(i) = S[..i] ∪ T[..j]` (duplicates merged). Its
//! objective is the geometric mean of the two masses it covers, `sqrt(s(U) · t(U))`, where `s(U)`
//! sums the saliency of *every* token in `U` (also those chosen for relevance) and likewise `t(U)`;
//! the square root is monotone, so the product is maximised. Counting coverage over the union
//! (rather than only each list's own prefix) makes duplicated picks cost budget, and makes the
//! split reduce to pure saliency when relevance is flat (`t(U) = |U| / n` is then the same for
//! every full set, and the saliency top-`k` maximises `s`) and to pure relevance when saliency is
//! flat.
//!
//! Search: both rankings are sorted once (O(n log n)); moving from `i` to `i + 1` adds `S[i]` and
//! drops `T[j - 1]`, which a per-token membership count updates in O(1); so all `k + 1` splits
//! cost O(k). When duplicates leave `|U| < k`, the set is refilled to exactly `k` with the tokens
//! of largest first-order gain of `log s(U) + log t(U)`, i.e. `s_x / s(U) + t_x / t(U)` (one more
//! sort). Kept tokens are returned in spatial order.

use crate::signals::{relevance, saliency};
use crate::{ranking, top_k, Kept, PruneInput, Pruner};
use glance_core::Result;

/// A seeded uniform sample of `k` tokens.
#[derive(Debug, Clone)]
pub struct Random {
    pub seed: u64,
}

impl Pruner for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        let n = input.len()?;
        let mut rng = glance_core::Rng::new(
            self.seed ^ ((n as u64) << 32 | k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let mut idx: Vec<usize> = (0..n).collect();
        // Partial Fisher–Yates: the first k slots become a uniform sample.
        for i in 0..k {
            let r = rng.next_u64();
            let j = i + (r % (n - i) as u64) as usize;
            idx.swap(i, j);
        }
        idx.truncate(k);
        Kept::subset(&input.tokens, idx)
    }
}

/// Top-`k` by visual saliency ([CLS] attention, or [CLS] cosine): FasterVLM / VisionZip's
/// dominant tokens.
#[derive(Debug, Clone)]
pub struct Saliency {
    pub tau: f32,
}

impl Pruner for Saliency {
    fn name(&self) -> &'static str {
        "saliency"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        Kept::subset(&input.tokens, top_k(&saliency(input, self.tau)?, k))
    }
}

/// Top-`k` by relevance to the text query.
#[derive(Debug, Clone)]
pub struct Text {
    pub tau: f32,
}

impl Pruner for Text {
    fn name(&self) -> &'static str {
        "text"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        Kept::subset(&input.tokens, top_k(&relevance(input, self.tau)?, k))
    }
}

/// A fixed split: `round(k · saliency_share)` tokens by saliency, the rest by relevance,
/// duplicates merged and refilled to `k`.
#[derive(Debug, Clone)]
pub struct Mix {
    pub tau: f32,
    pub saliency_share: f32,
}

impl Pruner for Mix {
    fn name(&self) -> &'static str {
        "mix"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        let (s, t) = (saliency(input, self.tau)?, relevance(input, self.tau)?);
        let i = ((k as f32 * self.saliency_share).round() as usize).min(k);
        let kept = union_refill(&s, &t, &ranking(&s), &ranking(&t), i, k);
        Kept::subset(&input.tokens, kept)
    }
}

/// AdaFV's self-adaptive split (see the module docs).
#[derive(Debug, Clone)]
pub struct Adaptive {
    pub tau: f32,
}

impl Pruner for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        let (s, t) = (saliency(input, self.tau)?, relevance(input, self.tau)?);
        Kept::subset(&input.tokens, adaptive_split(&s, &t, k).kept)
    }
}

/// The outcome of the adaptive search.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitChoice {
    /// `i`: tokens taken from the top of the saliency ranking.
    pub from_saliency: usize,
    /// `j = k - i`: tokens taken from the top of the relevance ranking.
    pub from_text: usize,
    /// The objective `s(U) · t(U)` of the chosen union (before refilling).
    pub objective: f64,
    /// The kept tokens (exactly `k`, refilled), in spatial order.
    pub kept: Vec<usize>,
}

/// Searches the split `i + j = k` maximising `s(U) · t(U)` over `U = S[..i] ∪ T[..j]` in
/// O(n log n) and refills to exactly `k` (module docs). `s` and `t` are non-negative scores of the
/// same `n` tokens (normally distributions); `k ≤ n`. Ties keep the smallest `i`.
pub fn adaptive_split(s: &[f32], t: &[f32], k: usize) -> SplitChoice {
    let n = s.len().min(t.len());
    let k = k.min(n);
    let (rs, rt) = (ranking(&s[..n]), ranking(&t[..n]));
    let mut count = vec![0u8; n];
    let (mut su, mut tu) = (0f64, 0f64);
    let add = |x: usize, count: &mut Vec<u8>, su: &mut f64, tu: &mut f64| {
        count[x] += 1;
        if count[x] == 1 {
            *su += s[x] as f64;
            *tu += t[x] as f64;
        }
    };
    let remove = |x: usize, count: &mut Vec<u8>, su: &mut f64, tu: &mut f64| {
        count[x] -= 1;
        if count[x] == 0 {
            *su -= s[x] as f64;
            *tu -= t[x] as f64;
        }
    };
    for &x in &rt[..k] {
        add(x, &mut count, &mut su, &mut tu);
    }
    let (mut best_i, mut best) = (0, su * tu);
    for i in 1..=k {
        add(rs[i - 1], &mut count, &mut su, &mut tu);
        remove(rt[k - i], &mut count, &mut su, &mut tu);
        let f = su * tu;
        if f > best {
            (best_i, best) = (i, f);
        }
    }
    let mut kept = union_refill(s, t, &rs, &rt, best_i, k);
    kept.sort_unstable();
    SplitChoice {
        from_saliency: best_i,
        from_text: k - best_i,
        objective: best,
        kept,
    }
}

/// `rs[..i] ∪ rt[..k - i]`, refilled to `k` tokens by the gain `s_x / s(U) + t_x / t(U)`.
fn union_refill(
    s: &[f32],
    t: &[f32],
    rs: &[usize],
    rt: &[usize],
    i: usize,
    k: usize,
) -> Vec<usize> {
    let n = rs.len();
    let mut in_u = vec![false; n];
    let mut kept = Vec::with_capacity(k);
    for &x in rs[..i].iter().chain(&rt[..k - i]) {
        if !in_u[x] {
            in_u[x] = true;
            kept.push(x);
        }
    }
    if kept.len() < k {
        let su = kept.iter().map(|&x| s[x] as f64).sum::<f64>().max(1e-12);
        let tu = kept.iter().map(|&x| t[x] as f64).sum::<f64>().max(1e-12);
        let gain: Vec<f32> = (0..n)
            .map(|x| {
                if in_u[x] {
                    f32::NEG_INFINITY
                } else {
                    (s[x] as f64 / su + t[x] as f64 / tu) as f32
                }
            })
            .collect();
        let missing = k - kept.len();
        kept.extend(top_k(&gain, missing));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_reaches_k_without_duplicates() {
        // Both rankings agree: any split's union has fewer than k tokens until refilled.
        let s = [0.4, 0.3, 0.2, 0.1];
        let t = [0.4, 0.3, 0.2, 0.1];
        for k in 1..=4 {
            let c = adaptive_split(&s, &t, k);
            assert_eq!(c.kept, (0..k).collect::<Vec<_>>());
        }
    }

    #[test]
    fn split_balances_two_peaked_signals() {
        // Saliency peaks on 0..2, relevance on 6..8: the best 4 take two of each.
        let s = [0.3, 0.3, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05];
        let t = [0.05, 0.05, 0.05, 0.05, 0.1, 0.1, 0.3, 0.3];
        let c = adaptive_split(&s, &t, 4);
        assert_eq!((c.from_saliency, c.from_text), (2, 2));
        assert_eq!(c.kept, vec![0, 1, 6, 7]);
    }
}
