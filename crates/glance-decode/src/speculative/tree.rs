//! The draft tree: proposing it with the draft head (EAGLE-2's dynamic tree, or a chain) and its
//! layout for verification.
//!
//! Nodes are draft tokens below a root, the last emitted token (already sampled, not yet run
//! through the target). Growing the tree, depth by depth:
//!
//! 1. the root's draft distribution gives the first level: its `top_k` tokens;
//! 2. at each depth, the `top_k` frontier nodes of highest cumulative draft log-probability are
//!    expanded — one draft forward over all of them, each attending to the committed rows and its
//!    own ancestors — and each gets its `top_k` most likely tokens as children;
//! 3. after `depth` levels the `budget` nodes of highest cumulative score are kept (closed under
//!    ancestors), parents before children, for one verification pass of the target.
//!
//! A node whose draft probability and whose parent's are both below `min_confidence` is not
//! expanded (early stop of a branch after consecutive low-confidence steps); drafting ends when no
//! frontier node is worth expanding. An end-of-sequence token is never expanded. Chain mode is
//! `top_k = 1`.

use crate::sampler::argmax;
use crate::step::DraftPass;
use candle_core::Tensor;
use glance_core::{Error, Result, TokenId};
use glance_nn::{AttnMask, CausalLm, DraftContext, DraftLm, DraftLogits, KvCache};
use serde::{Deserialize, Serialize};

/// How the draft tree grows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TreeSettings {
    /// Most draft tokens on one path (draft forwards per round, at most).
    pub depth: usize,
    /// Children per expanded node, and nodes expanded per depth; 1 drafts a chain.
    pub top_k: usize,
    /// Most draft tokens verified per round.
    pub budget: usize,
    /// A node below this draft probability whose parent was too is not expanded.
    pub min_confidence: f32,
}

impl Default for TreeSettings {
    fn default() -> Self {
        Self {
            depth: 6,
            top_k: 2,
            budget: 8,
            min_confidence: 0.05,
        }
    }
}

/// Largest depth / top-k / budget accepted: far beyond any useful tree, small enough that a
/// request cannot ask for a gigantic verification pass.
const MAX_TREE: usize = 256;

impl TreeSettings {
    /// A chain of `depth` tokens.
    pub fn chain(depth: usize) -> Self {
        Self {
            depth,
            top_k: 1,
            budget: depth,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("depth", self.depth),
            ("top-k", self.top_k),
            ("budget", self.budget),
        ] {
            if v == 0 || v > MAX_TREE {
                return Err(Error::InvalidParam(format!(
                    "draft tree {name} must be in 1..={MAX_TREE}, got {v}"
                )));
            }
        }
        if !(0.0..=1.0).contains(&self.min_confidence) {
            return Err(Error::InvalidParam(format!(
                "draft min-confidence must be in [0, 1], got {}",
                self.min_confidence
            )));
        }
        Ok(())
    }
}

/// A proposed tree, parents before children.
#[derive(Debug, Clone, Default)]
pub struct DraftTree {
    pub tokens: Vec<TokenId>,
    /// `None`: a child of the root.
    pub parents: Vec<Option<usize>>,
    /// Draft probability of each node's token given its parent.
    pub probs: Vec<f32>,
    /// Draft forwards spent growing it.
    pub forwards: u64,
}

impl DraftTree {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Depth of node `i`, counting the root's children as 1.
    pub fn depth(&self, i: usize) -> usize {
        let mut d = 1;
        let mut n = i;
        while let Some(p) = self.parents[n] {
            d += 1;
            n = p;
        }
        d
    }

    /// Children of `parent` (`None`: the root), most likely first.
    pub fn children(&self, parent: Option<usize>) -> Vec<usize> {
        let mut c: Vec<usize> = (0..self.len())
            .filter(|&i| self.parents[i] == parent)
            .collect();
        c.sort_by(|&a, &b| self.probs[b].total_cmp(&self.probs[a]).then(a.cmp(&b)));
        c
    }

    /// Each node's path probability: the product of the draft probabilities from the root down
    /// to it (the draft's estimate that verification accepts it).
    pub fn path_probs(&self) -> Vec<f32> {
        let mut path: Vec<f32> = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            // Parents come before children.
            let above = self.parents[i].map_or(1.0, |p| path[p]);
            path.push(above * self.probs[i]);
        }
        path
    }

    /// Node indices by path probability, highest first (ties by index, so parents — never less
    /// likely than their children — come before them).
    pub fn best_first(&self) -> Vec<usize> {
        let path = self.path_probs();
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|&a, &b| path[b].total_cmp(&path[a]).then(a.cmp(&b)));
        order
    }

    /// Keeps the `n` nodes of highest path probability (closed under ancestors), parents first.
    pub fn keep_best(&mut self, n: usize) {
        if n >= self.len() {
            return;
        }
        let mut keep = vec![false; self.len()];
        let mut kept = 0;
        for i in self.best_first() {
            if kept == n {
                break;
            }
            // Ancestors first: every ancestor is at least as likely, so it is kept already
            // unless tied; keep the chain up to a kept node.
            let mut chain = Vec::new();
            let mut a = Some(i);
            while let Some(j) = a.filter(|&j| !keep[j]) {
                chain.push(j);
                a = self.parents[j];
            }
            if kept + chain.len() > n {
                continue;
            }
            kept += chain.len();
            chain.into_iter().for_each(|j| keep[j] = true);
        }
        let mut index = vec![usize::MAX; self.len()];
        let chosen: Vec<usize> = (0..self.len()).filter(|&i| keep[i]).collect();
        chosen.iter().enumerate().for_each(|(k, &i)| index[i] = k);
        self.tokens = chosen.iter().map(|&i| self.tokens[i]).collect();
        self.parents = chosen
            .iter()
            .map(|&i| self.parents[i].map(|p| index[p]))
            .collect();
        self.probs = chosen.iter().map(|&i| self.probs[i]).collect();
    }

    /// Parents for the verification pass over `[root, nodes…]`: the root is row 0.
    pub fn verify_parents(&self) -> Vec<Option<usize>> {
        std::iter::once(None)
            .chain(self.parents.iter().map(|p| Some(p.map_or(0, |j| j + 1))))
            .collect()
    }
}

/// One node while growing.
struct Grown {
    token: TokenId,
    parent: Option<usize>,
    prob: f32,
    /// Cumulative log-probability from the root.
    score: f32,
    depth: usize,
    /// The draft's predicted hidden state after this node `(1, hidden)`, once expanded.
    hidden: Option<Tensor>,
    /// Row of the node in the draft cache's speculative region, once expanded.
    row: Option<usize>,
}

/// A draft tree growing level by level, between draft passes: it hands out the rows of the next
/// level ([`Grower::next_pass`]: the frontier nodes worth expanding, each attending to the
/// committed rows and its expanded ancestors) and takes back the draft's predicted hidden states
/// for them ([`Grower::absorb`]). Whoever runs the passes decides how: [`grow`] runs them alone,
/// a scheduler runs one level of every request's tree in one shared pass per draft head
/// ([`glance_nn::DraftLm::forward_groups`]); the tree is the same.
pub struct Grower {
    top_k: usize,
    budget: usize,
    min_confidence: f32,
    /// The caller's cap on the depth (room left in the answer and the context).
    depth: usize,
    eos: Vec<TokenId>,
    /// The root's draft output `(1, hidden)`.
    root_hidden: Tensor,
    root_pos: u32,
    /// Rows committed in the draft cache (all visible to every node).
    committed: usize,
    nodes: Vec<Grown>,
    frontier: Vec<usize>,
    /// Depth of the rows of the next level (its nodes' depth).
    level: usize,
    /// Speculative rows appended to the draft cache so far.
    spec_rows: usize,
    forwards: u64,
    /// The nodes of the level handed out, until their hidden states come back.
    asked: Option<Vec<usize>>,
}

impl Grower {
    /// A tree below the root whose draft output is `root_hidden` `(1, hidden)` with draft
    /// logits `root_logits` ([`DraftLm::logits`]), at `root_pos`, with `committed` rows in the
    /// draft cache (the root's among them): its first level (the root's `top_k` tokens) is read
    /// from the root's draft distribution here. `depth` is the caller's cap (room left in the
    /// answer and the context); 0 grows nothing.
    pub fn new(
        root_hidden: &Tensor,
        root_logits: &DraftLogits,
        root_pos: u32,
        committed: usize,
        settings: &TreeSettings,
        depth: usize,
        eos: &[TokenId],
    ) -> Result<Self> {
        let mut g = Self {
            top_k: settings.top_k,
            budget: settings.budget,
            min_confidence: settings.min_confidence,
            depth,
            eos: eos.to_vec(),
            root_hidden: root_hidden.clone(),
            root_pos,
            committed,
            nodes: Vec::new(),
            frontier: Vec::new(),
            level: 1,
            spec_rows: 0,
            forwards: 0,
            asked: None,
        };
        if depth == 0 {
            return Ok(g);
        }
        // The root's children.
        let probs = DraftProbs::new(root_logits.clone())?;
        for (token, p) in probs.top_k(0, g.top_k) {
            g.nodes.push(Grown {
                token,
                parent: None,
                prob: p,
                score: p.max(f32::MIN_POSITIVE).ln(),
                depth: 1,
                hidden: None,
                row: None,
            });
        }
        g.frontier = (0..g.nodes.len()).collect();
        Ok(g)
    }

    /// The rows of the next level for the draft, appended after the cache's committed rows and
    /// the speculative rows of the levels before; `None` once the tree is grown (the cap is
    /// reached or no frontier node is worth expanding).
    pub fn next_pass(
        &mut self,
        target: &dyn CausalLm,
        draft: &dyn DraftLm,
        context: &DraftContext,
    ) -> Result<Option<DraftPass>> {
        if self.asked.is_some() {
            return Err(Error::Input(
                "draft tree: a level's rows were handed out and never came back".into(),
            ));
        }
        if self.level >= self.depth {
            return Ok(None);
        }
        let nodes = &self.nodes;
        // The best frontier nodes worth expanding.
        let low = |i: usize| nodes[i].prob < self.min_confidence;
        let mut pick: Vec<usize> = self
            .frontier
            .iter()
            .copied()
            .filter(|&i| !self.eos.contains(&nodes[i].token))
            .filter(|&i| !(low(i) && nodes[i].parent.is_none_or(low)))
            .collect();
        pick.sort_by(|&a, &b| nodes[b].score.total_cmp(&nodes[a].score).then(a.cmp(&b)));
        pick.truncate(self.top_k);
        if pick.is_empty() {
            // Nothing later can be worth it either.
            self.depth = self.level;
            return Ok(None);
        }
        // Rows: (this node's token, its parent's predicted hidden state).
        let ids: Vec<TokenId> = pick.iter().map(|&i| nodes[i].token).collect();
        let prev =
            pick.iter()
                .map(|&i| match nodes[i].parent {
                    None => Ok(self.root_hidden.clone()),
                    Some(p) => nodes[p].hidden.clone().ok_or_else(|| {
                        Error::Input("draft tree: a parent was never expanded".into())
                    }),
                })
                .collect::<Result<Vec<_>>>()?;
        // (n, hidden)
        let prev = Tensor::cat(&prev, 0)?;
        // (n, hidden)
        let rows = draft.fuse(&target.embed_tokens(&ids)?, &prev, context)?;
        let positions: Vec<u32> = vec![self.root_pos + self.level as u32; pick.len()];
        // Each row sees the committed rows, its expanded ancestors and itself.
        let ancestors = pick
            .iter()
            .map(|&i| {
                let mut rows = Vec::new();
                let mut a = nodes[i].parent;
                while let Some(j) = a {
                    rows.push(nodes[j].row.ok_or_else(|| {
                        Error::Input("draft tree: an ancestor has no row".into())
                    })?);
                    a = nodes[j].parent;
                }
                Ok(rows)
            })
            .collect::<Result<Vec<_>>>()?;
        let mask = level_mask(self.committed, self.spec_rows, &ancestors)?;
        let n = pick.len();
        self.asked = Some(pick);
        Ok(Some(DraftPass {
            rows,
            positions,
            mask,
            logits: 0..n,
        }))
    }

    /// Takes the draft's predicted hidden states `(n, hidden)` for the rows of the last
    /// [`Grower::next_pass`] and their draft logits ([`DraftLm::logits`]): each expanded node
    /// gets its `top_k` most likely tokens as children.
    pub fn absorb(&mut self, hidden: &Tensor, logits: &DraftLogits) -> Result<()> {
        let Some(pick) = self.asked.take() else {
            return Err(Error::Input(
                "draft tree: hidden states for no level's rows".into(),
            ));
        };
        if hidden.dim(0)? != pick.len() {
            return Err(Error::Input(format!(
                "draft tree: {} hidden states for a level of {} rows",
                hidden.dim(0)?,
                pick.len()
            )));
        }
        self.forwards += 1;
        let probs = DraftProbs::new(logits.clone())?;
        if probs.rows.len() != pick.len() {
            return Err(Error::Input(format!(
                "draft tree: {} rows of draft logits for a level of {} rows",
                probs.rows.len(),
                pick.len()
            )));
        }
        let mut next = Vec::new();
        for (m, &i) in pick.iter().enumerate() {
            self.nodes[i].hidden = Some(hidden.narrow(0, m, 1)?);
            self.nodes[i].row = Some(self.spec_rows + m);
            for (token, p) in probs.top_k(m, self.top_k) {
                next.push(self.nodes.len());
                let score = self.nodes[i].score + p.max(f32::MIN_POSITIVE).ln();
                self.nodes.push(Grown {
                    token,
                    parent: Some(i),
                    prob: p,
                    score,
                    depth: self.level + 1,
                    hidden: None,
                    row: None,
                });
            }
        }
        self.spec_rows += pick.len();
        self.frontier = next;
        self.level += 1;
        Ok(())
    }

    /// The grown tree: the `budget` best nodes, closed under ancestors, parents first.
    pub fn tree(&self) -> DraftTree {
        select(&self.nodes, self.budget, self.forwards)
    }
}

/// Grows a tree below the root whose draft output is `root_hidden` `(1, hidden)`, running the
/// draft's passes alone ([`Grower`] with [`DraftLm::forward`]). The root's draft row is committed
/// in `cache` (its `len()` rows, all visible to every node); the speculative rows appended while
/// growing are left in `cache` for the caller to roll back. `depth` is the caller's cap (room
/// left in the answer and the context).
#[allow(clippy::too_many_arguments)]
pub fn grow(
    target: &dyn CausalLm,
    draft: &dyn DraftLm,
    context: &DraftContext,
    cache: &mut KvCache,
    root_hidden: &Tensor,
    root_pos: u32,
    settings: &TreeSettings,
    depth: usize,
    eos: &[TokenId],
) -> Result<DraftTree> {
    let mut g = Grower::new(
        root_hidden,
        &draft.logits(target, root_hidden)?,
        root_pos,
        cache.len(),
        settings,
        depth,
        eos,
    )?;
    while let Some(pass) = g.next_pass(target, draft, context)? {
        // (n, hidden)
        let hidden = draft.forward(&pass.rows, &pass.positions, &pass.mask, cache)?;
        g.absorb(&hidden, &draft.logits(target, &hidden)?)?;
    }
    Ok(g.tree())
}

/// The mask of one draft step over `ancestors.len()` new rows appended after `committed`
/// committed rows and `spec_rows` speculative ones in the draft cache: new row `m` sees every
/// committed row, the speculative rows `ancestors[m]` (its expanded ancestors, indices into the
/// speculative region) and itself. A mask `(rows, committed + spec_rows + rows)`.
pub fn level_mask(
    committed: usize,
    spec_rows: usize,
    ancestors: &[Vec<usize>],
) -> Result<AttnMask> {
    let n = ancestors.len();
    let kv_len = committed + spec_rows + n;
    let mut visible = vec![false; n * kv_len];
    for (m, rows) in ancestors.iter().enumerate() {
        let row = &mut visible[m * kv_len..(m + 1) * kv_len];
        row[..committed].fill(true);
        row[committed + spec_rows + m] = true;
        for &r in rows {
            if r >= spec_rows {
                return Err(Error::Input(format!(
                    "draft tree: ancestor row {r} is past the {spec_rows} speculative rows"
                )));
            }
            row[committed + r] = true;
        }
    }
    Ok(AttnMask::visible(n, kv_len, visible)?)
}

/// The `budget` best nodes, closed under ancestors, parents first.
fn select(nodes: &[Grown], budget: usize, forwards: u64) -> DraftTree {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| nodes[b].score.total_cmp(&nodes[a].score).then(a.cmp(&b)));
    let mut keep = vec![false; nodes.len()];
    let mut kept = 0;
    for &i in &order {
        // The node and its ancestors not yet kept.
        let mut chain = Vec::new();
        let mut n = Some(i);
        while let Some(j) = n {
            if keep[j] {
                break;
            }
            chain.push(j);
            n = nodes[j].parent;
        }
        if kept + chain.len() > budget {
            continue;
        }
        kept += chain.len();
        chain.iter().for_each(|&j| keep[j] = true);
        if kept == budget {
            break;
        }
    }
    // Parents before children: by depth, then by creation.
    let mut chosen: Vec<usize> = (0..nodes.len()).filter(|&i| keep[i]).collect();
    chosen.sort_by_key(|&i| (nodes[i].depth, i));
    let mut index = vec![usize::MAX; nodes.len()];
    chosen.iter().enumerate().for_each(|(k, &i)| index[i] = k);
    DraftTree {
        tokens: chosen.iter().map(|&i| nodes[i].token).collect(),
        parents: chosen
            .iter()
            .map(|&i| nodes[i].parent.map(|p| index[p]))
            .collect(),
        probs: chosen.iter().map(|&i| nodes[i].prob).collect(),
        forwards,
    }
}

/// The draft's distribution over the tokens it may propose, per predicted hidden state.
pub(crate) struct DraftProbs {
    /// `(n, columns)`: softmax at temperature 1 (the tree ranks by the draft's own confidence).
    rows: Vec<Vec<f32>>,
    logits: DraftLogits,
}

impl DraftProbs {
    /// The `k` most likely tokens of row `m` with their probabilities, most likely first (ties
    /// by column).
    fn top_k(&self, m: usize, k: usize) -> Vec<(TokenId, f32)> {
        top_k(&self.rows[m], k)
            .into_iter()
            .map(|(j, p)| (self.logits.token(j), p))
            .collect()
    }
}

/// Draft probabilities of predicted hidden states `(n, hidden)` through the target's LM head,
/// restricted to the draft's reduced vocabulary where it keeps one ([`DraftLm::logits`]).
pub(crate) fn draft_probs(
    target: &dyn CausalLm,
    draft: &dyn DraftLm,
    hidden: &Tensor,
) -> Result<DraftProbs> {
    DraftProbs::new(draft.logits(target, hidden)?)
}

impl DraftProbs {
    /// The distributions of draft logits, row by row.
    fn new(logits: DraftLogits) -> Result<Self> {
        let rows: Vec<Vec<f32>> = logits.logits.to_vec2()?;
        let rows = rows
            .into_iter()
            .map(|mut row| {
                let max = row[argmax(&row) as usize];
                let mut sum = 0.0;
                for x in row.iter_mut() {
                    *x = if x.is_finite() { (*x - max).exp() } else { 0.0 };
                    sum += *x;
                }
                if sum > 0.0 && sum.is_finite() {
                    row.iter_mut().for_each(|x| *x /= sum);
                }
                row
            })
            .collect();
        Ok(DraftProbs { rows, logits })
    }
}

/// The `k` most likely columns with their probabilities, most likely first (ties by column).
fn top_k(probs: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..probs.len()).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| {
        probs[b].total_cmp(&probs[a]).then(a.cmp(&b))
    });
    idx.truncate(k);
    idx.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    idx.into_iter().map(|i| (i, probs[i])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_sees_the_committed_rows_its_ancestors_and_itself() -> Result<()> {
        // 2 committed rows, 2 speculative ones; row 0 hangs below speculative row 1, row 1 is
        // a child of the root.
        let AttnMask::Visible(m) = level_mask(2, 2, &[vec![1], vec![]])? else {
            panic!("a visibility mask");
        };
        assert_eq!(m.dims(), (2, 6));
        let row = |i: usize| (0..6).map(|j| m.get(i, j)).collect::<Vec<_>>();
        assert_eq!(row(0), [true, true, false, true, true, false]);
        assert_eq!(row(1), [true, true, false, false, false, true]);
        assert!(level_mask(2, 1, &[vec![1]]).is_err());
        Ok(())
    }

    fn node(token: TokenId, parent: Option<usize>, score: f32, depth: usize) -> Grown {
        Grown {
            token,
            parent,
            prob: score.exp(),
            score,
            depth,
            hidden: None,
            row: None,
        }
    }

    #[test]
    fn selection_keeps_the_best_nodes_with_their_ancestors_parents_first() {
        // root ─ 0 (-0.1) ─ 2 (-0.2) ─ 4 (-0.3)
        //      └ 1 (-1.0) ─ 3 (-1.1)
        //                 └ 5 (-1.05)
        let nodes = vec![
            node(10, None, -0.1, 1),
            node(11, None, -1.0, 1),
            node(12, Some(0), -0.2, 2),
            node(13, Some(1), -1.1, 2),
            node(14, Some(2), -0.3, 3),
            node(15, Some(1), -1.05, 2),
        ];
        let t = select(&nodes, 3, 0);
        assert_eq!(t.tokens, vec![10, 12, 14]);
        assert_eq!(t.parents, vec![None, Some(0), Some(1)]);
        // Budget 5: node 5 comes with its parent 1.
        let t = select(&nodes, 5, 0);
        assert_eq!(t.tokens, vec![10, 11, 12, 15, 14]);
        assert_eq!(t.parents, vec![None, None, Some(0), Some(1), Some(2)]);
        assert_eq!(
            t.verify_parents(),
            vec![None, Some(0), Some(0), Some(1), Some(2), Some(3)]
        );
        assert_eq!(t.depth(4), 3);
        assert_eq!(t.children(None), vec![0, 1]);
    }

    #[test]
    fn the_best_nodes_are_kept_with_their_ancestors() {
        // root ─ 0 (0.9) ─ 2 (0.5: path 0.45)
        //      └ 1 (0.1) ─ 3 (0.9: path 0.09)
        let mut t = DraftTree {
            tokens: vec![10, 11, 12, 13],
            parents: vec![None, None, Some(0), Some(1)],
            probs: vec![0.9, 0.1, 0.5, 0.9],
            forwards: 2,
        };
        let path = t.path_probs();
        assert!((path[2] - 0.45).abs() < 1e-6 && (path[3] - 0.09).abs() < 1e-6);
        assert_eq!(t.best_first(), vec![0, 2, 1, 3]);
        let mut two = t.clone();
        two.keep_best(2);
        assert_eq!(two.tokens, vec![10, 12]);
        assert_eq!(two.parents, vec![None, Some(0)]);
        t.keep_best(3);
        assert_eq!(t.tokens, vec![10, 11, 12]);
        assert_eq!(t.parents, vec![None, None, Some(0)]);
    }

    #[test]
    fn top_k_is_sorted_and_bounded() {
        let p = [0.1, 0.4, 0.1, 0.3, 0.1];
        assert_eq!(
            top_k(&p, 3).iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![1, 3, 0]
        );
        assert_eq!(top_k(&p, 10).len(), 5);
    }

    #[test]
    fn settings_are_validated() {
        assert!(TreeSettings::default().validate().is_ok());
        assert!(TreeSettings::chain(5).validate().is_ok());
        let bad = TreeSettings {
            budget: 0,
            ..TreeSettings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("budget"));
    }
}
