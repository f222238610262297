//! The last step of every row-wise attention kernel ([`crate::attention`]'s, and
//! [`crate::attend_rows`] for batches of sequences): each query row's softmax over the scores of
//! the keys it sees, then the probability-weighted sum of their values, in an order that depends
//! only on those keys (so a row computed among others equals the row alone, bit for bit).

/// One query row's visible keys (in key order) and its scores over them (`q·k · scale + mask`).
#[derive(Default)]
pub(crate) struct RowScores {
    pub(crate) keys: Vec<usize>,
    pub(crate) scores: Vec<f32>,
    pub(crate) probs: Vec<f32>,
}

impl RowScores {
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.scores.clear();
    }

    /// Key `j` (after every key pushed before) with its score.
    pub(crate) fn push(&mut self, j: usize, score: f32) {
        self.keys.push(j);
        self.scores.push(score);
    }
}

/// For a few query rows of one KV head: the softmax of each row's visible scores, then the
/// probability-weighted sum of their values (`value(j)`, `d` values each) into the row's `d`
/// values of `out` (zeroed by the caller). Every value row is loaded once for all the rows, while
/// each row still adds its terms in key order, each a multiply then an add (never fused): a row's
/// result depends only on the keys it sees, however the rows around it are batched, and not on
/// the instruction set. No visible key: NaN, as the GEMM path.
pub(crate) fn softmax_values<'a>(
    rows: &mut [RowScores],
    value: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let d = out.len() / rows.len().max(1);
    for (r, o) in rows.iter_mut().zip(out.chunks_exact_mut(d.max(1))) {
        if r.scores.is_empty() {
            o.fill(f32::NAN);
            continue;
        }
        r.probs.resize(r.scores.len(), 0.0);
        crate::fused::softmax_row(&r.scores, &mut r.probs);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { weighted_sums_avx512(rows, &value, out, d) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { weighted_sums_avx2(rows, &value, out, d) };
        }
    }
    weighted_sums(rows, &value, out, d)
}

/// [`weighted_sums`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_sums_avx512<'a>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
    d: usize,
) {
    weighted_sums(rows, value, out, d)
}

/// [`weighted_sums`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weighted_sums_avx2<'a>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
    d: usize,
) {
    weighted_sums(rows, value, out, d)
}

/// `out[i] += Σ_j p_ij · v_j` over every row's visible keys, keys outermost: each row meets its
/// keys in order (a cursor per row), so its additions are those it would make alone. Written so
/// the element loop vectorises.
#[inline(always)]
fn weighted_sums<'a>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
    d: usize,
) {
    // In the common head sizes each row's leading keys `0..len` (all of them under full or
    // causal attention, the cached rows under a draft tree's or a block's mask) go with the
    // row's sums held in registers, the rest (a tree's ancestors) by the cursor walk after
    // them: the same additions in the same order.
    match d {
        64 => weighted_sums_split::<64>(rows, value, out),
        128 => weighted_sums_split::<128>(rows, value, out),
        _ => weighted_sums_cursor(rows, value, out, d, &mut vec![0; rows.len()]),
    }
}

/// How many of a row's visible keys are `0, 1, 2, …`. They are in key order, each once, so
/// `keys[i] ≥ i`, and `keys[i] == i` holds for a leading run of them: a binary search.
fn leading_run(keys: &[usize]) -> usize {
    let (mut lo, mut hi) = (0, keys.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if keys[mid] == mid {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// [`weighted_sums`] in `D` values a head: each row's [`leading_run`] with its sums in
/// registers ([`weighted_sums_prefix`]), then its other keys by [`weighted_sums_cursor`].
#[inline(always)]
fn weighted_sums_split<'a, const D: usize>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let mut cursor: Vec<usize> = rows.iter().map(|r| leading_run(&r.keys)).collect();
    weighted_sums_prefix::<D>(rows, &cursor, value, out);
    if rows.iter().zip(&cursor).any(|(r, &c)| c < r.keys.len()) {
        weighted_sums_cursor(rows, value, out, D, &mut cursor);
    }
}

/// [`weighted_sums`] for any rows: a cursor per row walks its visible keys from `cursor` on
/// (where each row's walk starts: its keys before it are already in `out`).
#[inline(always)]
fn weighted_sums_cursor<'a>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
    d: usize,
    cursor: &mut [usize],
) {
    let end = rows.iter().filter_map(|r| r.keys.last()).max();
    let start = rows
        .iter()
        .zip(cursor.iter())
        .filter_map(|(r, &c)| r.keys.get(c))
        .min();
    for j in start.map_or(0, |&s| s)..end.map_or(0, |&e| e + 1) {
        let mut v: Option<&[f32]> = None;
        for ((r, c), o) in rows
            .iter()
            .zip(cursor.iter_mut())
            .zip(out.chunks_exact_mut(d))
        {
            if r.keys.get(*c) != Some(&j) {
                continue;
            }
            let v = *v.get_or_insert_with(|| value(j));
            let p = r.probs[*c];
            for (o, &x) in o.iter_mut().zip(v) {
                *o += p * x;
            }
            *c += 1;
        }
    }
}

/// The first `lens[k]` visible keys of each row `k`, which must be `0..lens[k]`, with `D`
/// values a head: four rows at a time, keys outermost, each row's `D` sums kept in registers
/// across its keys. A row adds `p_j · v_j` for `j = 0, 1, …` from zero, each a multiply then an
/// add, as [`weighted_sums_cursor`] does (the same bits), and its sums replace its `D` values of
/// `out` (left as they are where `lens[k]` is 0).
#[inline(always)]
fn weighted_sums_prefix<'a, const D: usize>(
    rows: &[RowScores],
    lens: &[usize],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    const G: usize = 4;
    for ((group, lens), out_g) in rows
        .chunks(G)
        .zip(lens.chunks(G))
        .zip(out.chunks_mut(G * D))
    {
        let mut acc = [[0f32; D]; G];
        for j in 0..lens.iter().copied().max().unwrap_or(0) {
            let v: &[f32; D] = value(j)[..D].try_into().expect("D values a key");
            for k in 0..group.len() {
                if j < lens[k] {
                    let p = group[k].probs[j];
                    for (a, &x) in acc[k].iter_mut().zip(v) {
                        *a += p * x;
                    }
                }
            }
        }
        for ((o, a), &len) in out_g.chunks_exact_mut(D).zip(&acc).zip(lens) {
            // A row without keys keeps the NaN it was given.
            if len > 0 {
                o.copy_from_slice(a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_held_sums_equal_the_cursor_walk() {
        // Rows seeing keys 0..len (one none), 64 values a head: both paths, the same bits.
        let d = 64;
        let values: Vec<f32> = (0..30 * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let rows: Vec<RowScores> = [30, 0, 12, 29, 1, 30]
            .iter()
            .map(|&len| {
                let mut r = RowScores::default();
                for j in 0..len {
                    r.push(j, ((j * 13 % 17) as f32 - 8.0) / 3.0);
                }
                r.probs.resize(len, 0.0);
                crate::fused::softmax_row(&r.scores, &mut r.probs);
                r
            })
            .collect();
        let value = |j: usize| &values[j * d..(j + 1) * d];
        let (mut a, mut b) = (vec![0f32; rows.len() * d], vec![0f32; rows.len() * d]);
        let lens: Vec<usize> = rows.iter().map(|r| r.keys.len()).collect();
        weighted_sums_prefix::<64>(&rows, &lens, &value, &mut a);
        weighted_sums_cursor(&rows, &value, &mut b, d, &mut vec![0; rows.len()]);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
        assert!(
            a[d..2 * d].iter().all(|&x| x == 0.0),
            "a row without keys is left alone"
        );
    }

    #[test]
    fn leading_keys_in_registers_then_the_rest_equal_the_cursor_walk() {
        // Rows as a draft tree's mask gives them: the cached keys 0..c, then some of the
        // tree's (a row's ancestors and itself), in key order; one row without keys, one
        // whose keys start past 0. Head sizes 64 and 128: the same bits as the cursor alone.
        for d in [64, 128] {
            let values: Vec<f32> = (0..40 * d)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let keys: [&[usize]; 7] = [
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30],
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 31, 33],
                &[],
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 32, 35, 39],
                &[3, 4, 30],
                &[0, 1, 2],
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
            ];
            let rows: Vec<RowScores> = keys
                .iter()
                .map(|ks| {
                    let mut r = RowScores::default();
                    for &j in *ks {
                        r.push(j, ((j * 13 % 17) as f32 - 8.0) / 3.0);
                    }
                    r.probs.resize(ks.len(), 0.0);
                    crate::fused::softmax_row(&r.scores, &mut r.probs);
                    r
                })
                .collect();
            assert_eq!(leading_run(&rows[1].keys), 10);
            assert_eq!(leading_run(&rows[4].keys), 0);
            assert_eq!(leading_run(&rows[6].keys), 12);
            let value = |j: usize| &values[j * d..(j + 1) * d];
            let (mut a, mut b) = (vec![0f32; rows.len() * d], vec![0f32; rows.len() * d]);
            weighted_sums(&rows, &value, &mut a, d);
            weighted_sums_cursor(&rows, &value, &mut b, d, &mut vec![0; rows.len()]);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "head size {d}");
            assert!(a[2 * d..3 * d].iter().all(|&x| x == 0.0));
        }
    }
}
