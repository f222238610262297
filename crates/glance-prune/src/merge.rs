//! Merging policies: `pool` and `hier` return means of groups of tokens, not a subset.
//!
//! * **`pool`**: the patch grid is cut into exactly `k` rectangular windows, as uniform as the
//!   numbers allow ([`grid_windows`]: row bands, each cut into equal column cells; a band count
//!   dividing `k` with near-square windows is preferred, so 576 → 144 is 2×2 pooling), and each
//!   window becomes the mean of its projected tokens.
//! * **`hier`** (ViSpec's hierarchical compression): the `m = 2⌈k/2⌉` most salient tokens are
//!   clustered by k-means (in the projected space, initialised at the most salient tokens,
//!   deterministic) and each cluster becomes its mean; the remaining tokens are mean-pooled inside
//!   the `⌊k/2⌋` windows of [`grid_windows`]; windows that hold none of them are dropped and the
//!   clusters take up the slack, so exactly `k` rows come out.
//!
//! Means are taken over the projected tokens (the LLM's input space). A merged row takes the
//! position id of the group member nearest to the group's spatial centroid (ties: lowest index).

use crate::signals::saliency;
use crate::{ranking, to_vec_f32, Grid, Kept, PruneInput, Pruner};
use candle_core::{DType, Tensor};
use glance_core::Result;

/// Uniform grid mean-pooling to `k` tokens.
#[derive(Debug, Clone, Default)]
pub struct Pool;

impl Pruner for Pool {
    fn name(&self) -> &'static str {
        "pool"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        merge_groups(&input.tokens, input.grid, grid_windows(input.grid, k))
    }
}

/// ViSpec's hierarchical compression (module docs).
#[derive(Debug, Clone)]
pub struct Hier {
    pub tau: f32,
}

/// Lloyd iterations of the k-means step (it stops earlier once assignments settle).
const KMEANS_ITERS: usize = 10;

impl Pruner for Hier {
    fn name(&self) -> &'static str {
        "hier"
    }

    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept> {
        let n = input.len()?;
        let order = ranking(&saliency(input, self.tau)?);
        let m = n.min(2 * k.div_ceil(2));
        let important = &order[..m];
        let mut is_important = vec![false; n];
        important.iter().for_each(|&i| is_important[i] = true);
        let pooled_budget = k / 2;
        let rest_groups: Vec<Vec<usize>> = if pooled_budget > 0 && m < n {
            grid_windows(input.grid, pooled_budget)
                .into_iter()
                .map(|w| {
                    w.into_iter()
                        .filter(|&i| !is_important[i])
                        .collect::<Vec<_>>()
                })
                .filter(|g| !g.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        let clusters = k - rest_groups.len();
        let ids: Vec<u32> = important.iter().map(|&i| i as u32).collect();
        let ids = Tensor::from_vec(ids, m, input.tokens.device())?;
        // (m, hidden), rows in decreasing saliency
        let x = input.tokens.index_select(&ids, 0)?;
        let assign = kmeans(&x, clusters)?;
        let mut groups = vec![Vec::new(); clusters];
        for (row, &c) in assign.iter().enumerate() {
            groups[c].push(important[row]);
        }
        groups.extend(rest_groups);
        merge_groups(&input.tokens, input.grid, groups)
    }
}

/// Splits `grid` into exactly `k` non-empty rectangular windows (`1 ≤ k ≤ rows · cols`), each a
/// list of token indices: `b` row bands of near-equal height, band `i` cut into `k / b` (+1 for
/// the first `k mod b` bands) cells of near-equal width. `b` prefers dividing `k`, then
/// near-square windows.
pub fn grid_windows(grid: Grid, k: usize) -> Vec<Vec<usize>> {
    let Grid { rows, cols } = grid;
    let k = k.clamp(1, rows * cols);
    let cost = |b: usize| {
        let (h, w) = (rows as f64 / b as f64, cols as f64 / (k as f64 / b as f64));
        (k % b != 0, (h / w).ln().abs())
    };
    let bands = (k.div_ceil(cols).max(1)..=rows.min(k))
        .min_by(|&a, &b| {
            let (ca, cb) = (cost(a), cost(b));
            ca.0.cmp(&cb.0).then(ca.1.total_cmp(&cb.1))
        })
        .unwrap_or(1);
    let mut out = Vec::with_capacity(k);
    for b in 0..bands {
        let (r0, r1) = (b * rows / bands, (b + 1) * rows / bands);
        let cells = k / bands + usize::from(b < k % bands);
        for c in 0..cells {
            let (c0, c1) = (c * cols / cells, (c + 1) * cols / cells);
            out.push(
                (r0..r1)
                    .flat_map(|r| (c0..c1).map(move |c| r * cols + c))
                    .collect(),
            );
        }
    }
    out
}

/// Means of the tokens of each (non-empty, disjoint) group, in spatial order of their anchors.
fn merge_groups(tokens: &Tensor, grid: Grid, groups: Vec<Vec<usize>>) -> Result<Kept> {
    let n = tokens.dim(0)?;
    // Groups are non-empty by construction; an empty one would leave fewer than k rows, which
    // `select` reports as an error.
    let mut anchored: Vec<(usize, Vec<usize>)> = groups
        .into_iter()
        .filter_map(|g| Some((anchor(grid, &g)?, g)))
        .collect();
    anchored.sort_by_key(|(a, _)| *a);
    let k = anchored.len();
    // (k, n) averaging matrix; a singleton's row is one exact 1.0, so its mean is the token.
    let mut w = vec![0f32; k * n];
    for (row, (_, g)) in anchored.iter().enumerate() {
        let inv = 1.0 / g.len() as f32;
        g.iter().for_each(|&i| w[row * n + i] = inv);
    }
    let w = Tensor::from_vec(w, (k, n), tokens.device())?.to_dtype(tokens.dtype())?;
    Ok(Kept {
        // (k, n) · (n, hidden) -> (k, hidden)
        rows: w.matmul(&tokens.contiguous()?)?,
        index: anchored.into_iter().map(|(a, _)| a).collect(),
    })
}

/// The member of `group` nearest to its spatial centroid (ties: the lowest index); `None` when
/// empty.
fn anchor(grid: Grid, group: &[usize]) -> Option<usize> {
    let len = group.len() as f64;
    let (sr, sc) = group.iter().fold((0.0, 0.0), |(r, c), &i| {
        let (gr, gc) = grid.coords(i);
        (r + gr as f64, c + gc as f64)
    });
    let (cr, cc) = (sr / len, sc / len);
    let dist = |i: usize| {
        let (r, c) = grid.coords(i);
        (r as f64 - cr).powi(2) + (c as f64 - cc).powi(2)
    };
    group
        .iter()
        .copied()
        .min_by(|&a, &b| dist(a).total_cmp(&dist(b)).then(a.cmp(&b)))
}

/// k-means of the rows of `x` `(m, d)` into `k ≤ m` non-empty clusters, initialised at the first
/// `k` rows. Returns each row's cluster.
fn kmeans(x: &Tensor, k: usize) -> Result<Vec<usize>> {
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let m = x.dim(0)?;
    let x2 = to_vec_f32(&x.sqr()?.sum(1)?)?;
    let mut centroids = x.narrow(0, 0, k)?;
    let mut assign: Vec<usize> = Vec::new();
    for _ in 0..KMEANS_ITERS {
        let c2 = to_vec_f32(&centroids.sqr()?.sum(1)?)?;
        // (m, d) · (d, k) -> (m, k)
        let dots = to_vec_f32(&x.matmul(&centroids.t()?)?)?;
        let dist = |p: usize, c: usize| x2[p] - 2.0 * dots[p * k + c] + c2[c];
        let mut next: Vec<usize> = (0..m)
            .map(|p| {
                (0..k)
                    .min_by(|&a, &b| dist(p, a).total_cmp(&dist(p, b)))
                    .unwrap_or(0)
            })
            .collect();
        // Every cluster keeps a member: an empty one takes the worst-fitting point of a cluster
        // that has two or more.
        let mut counts = vec![0usize; k];
        next.iter().for_each(|&c| counts[c] += 1);
        for e in 0..k {
            if counts[e] > 0 {
                continue;
            }
            let far = (0..m).filter(|&p| counts[next[p]] > 1).max_by(|&a, &b| {
                dist(a, next[a])
                    .total_cmp(&dist(b, next[b]))
                    .then(b.cmp(&a))
            });
            if let Some(p) = far {
                counts[next[p]] -= 1;
                next[p] = e;
                counts[e] = 1;
            }
        }
        let settled = next == assign;
        assign = next;
        if settled {
            break;
        }
        let mut w = vec![0f32; k * m];
        for (p, &c) in assign.iter().enumerate() {
            w[c * m + p] = 1.0 / counts[c] as f32;
        }
        // (k, m) · (m, d) -> (k, d)
        centroids = Tensor::from_vec(w, (k, m), x.device())?.matmul(&x)?;
    }
    Ok(assign)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_partition_the_grid_into_exactly_k() {
        for (rows, cols) in [(24, 24), (4, 4), (3, 5), (1, 7), (16, 16)] {
            let grid = Grid { rows, cols };
            for k in 1..=rows * cols {
                let w = grid_windows(grid, k);
                assert_eq!(w.len(), k, "{rows}x{cols} k={k}");
                let mut all: Vec<usize> = w.iter().flatten().copied().collect();
                assert!(w.iter().all(|g| !g.is_empty()));
                all.sort_unstable();
                assert_eq!(all, (0..rows * cols).collect::<Vec<_>>());
            }
        }
        // 576 → 144 is exact 2×2 pooling; 576 → 36 is 4×4.
        let w = grid_windows(Grid { rows: 24, cols: 24 }, 144);
        assert!(w.iter().all(|g| g.len() == 4));
        assert_eq!(w[0], vec![0, 1, 24, 25]);
        assert!(grid_windows(Grid { rows: 24, cols: 24 }, 36)
            .iter()
            .all(|g| g.len() == 16));
    }

    #[test]
    fn anchor_is_the_central_member() {
        let g = Grid { rows: 4, cols: 4 };
        assert_eq!(anchor(g, &[0, 1, 4, 5]), Some(0)); // 2×2: top-left of centre
        assert_eq!(anchor(g, &[0, 1, 2, 4, 5, 6, 8, 9, 10]), Some(5)); // 3×3: the centre
        assert_eq!(anchor(g, &[15]), Some(15));
        assert_eq!(anchor(g, &[]), None);
    }
}
