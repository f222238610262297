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
    // Rows that see keys `0..len` (full or causal attention) in the common head sizes: the
    // same additions, with each row's sums held in registers.
    let prefix = rows
        .iter()
        .all(|r| r.keys.last().is_none_or(|&l| l + 1 == r.keys.len()));
    match d {
        64 if prefix => weighted_sums_prefix::<64>(rows, value, out),
        128 if prefix => weighted_sums_prefix::<128>(rows, value, out),
        _ => weighted_sums_cursor(rows, value, out, d),
    }
}

/// [`weighted_sums`] for any rows: a cursor per row walks its visible keys.
#[inline(always)]
fn weighted_sums_cursor<'a>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
    d: usize,
) {
    let mut cursor = vec![0usize; rows.len()];
    let end = rows.iter().filter_map(|r| r.keys.last()).max();
    for j in 0..end.map_or(0, |&e| e + 1) {
        let mut v: Option<&[f32]> = None;
        for ((r, c), o) in rows.iter().zip(&mut cursor).zip(out.chunks_exact_mut(d)) {
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

/// [`weighted_sums`] for rows whose visible keys are `0..len` each and `D` values a head: four
/// rows at a time, keys outermost, each row's `D` sums kept in registers across its keys. A row
/// adds `p_j · v_j` for `j = 0, 1, …` from zero, each a multiply then an add, as
/// [`weighted_sums`] does (the same bits).
#[inline(always)]
fn weighted_sums_prefix<'a, const D: usize>(
    rows: &[RowScores],
    value: &impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    const G: usize = 4;
    for (group, out_g) in rows.chunks(G).zip(out.chunks_mut(G * D)) {
        let mut lens = [0usize; G];
        for (l, r) in lens.iter_mut().zip(group) {
            *l = r.keys.len();
        }
        let mut acc = [[0f32; D]; G];
        for j in 0..lens.iter().copied().max().unwrap_or(0) {
            let v: &[f32; D] = value(j)[..D].try_into().expect("D values a key");
            for k in 0..G {
                if j < lens[k] {
                    let p = group[k].probs[j];
                    for (a, &x) in acc[k].iter_mut().zip(v) {
                        *a += p * x;
                    }
                }
            }
        }
        for ((o, a), &len) in out_g.chunks_exact_mut(D).zip(&acc).zip(&lens) {
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
        weighted_sums_prefix::<64>(&rows, &value, &mut a);
        weighted_sums_cursor(&rows, &value, &mut b, d);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
        assert!(
            a[d..2 * d].iter().all(|&x| x == 0.0),
            "a row without keys is left alone"
        );
    }
}
