//! Groups of 16 blocks, the unit of the AVX-512 VNNI kernels of [`super::q8`] and [`super::q4`].
//!
//! **Why.** An integer block dot product needs its own float scale `d_w · d_x`. In the stored
//! layout one 64-byte vector holds two q8 blocks (four q4 blocks), so every `vpdpbusd` of 64
//! multiply-adds was followed by three float operations (scale, convert, add): decode-shaped
//! products over a few input rows ran at a tenth of the integer peak. Here a group of 16 blocks is
//! **transposed in registers** so that lane `l` of every vector belongs to block `l`: the group's
//! 8 `vpdpbusd` accumulate into one integer vector holding the 16 whole block sums, and the float
//! work is one convert, one multiply and one add per group — per 512 multiply-adds, not per 64.
//! The transposition is done once per weight group and shared by every input row; the input rows
//! are arranged the same way once per call ([`super::act::QuantRows`]).
//!
//! **The network.** Stored, a group is `2^w` vectors of 16 lanes (4-byte words): vector `i`,
//! lane `L` holds word `L mod 2^w` of block `i · 2^(4−w) + L / 2^w`, with `w = 3` for q8 (8 words
//! of 4 values per block) and `w = 2` for q4 (4 words of 8 nibbles). Stage `j < w` swaps lane bit
//! `j` with vector-index bit `j` over pairs of vectors (one `vpermt2d` per output vector); after
//! `w` stages vector `t` holds word `t` of every block, and the last stage's indices also put
//! block `l` in lane `l`. [`plan`] builds the indices and the tests check the result by
//! following labels through the network.
//!
//! Integer sums are exact in any order, so how a group's words are split over accumulators never
//! changes a result; the float operations per output (one per group, in group order, then the
//! blocks after the last whole group) are the same whatever the number of input rows.

/// Blocks per group.
pub const GROUP: usize = 16;

/// Bytes of a group's 8-bit input values (16 blocks of 32).
pub const GROUP_BYTES: usize = GROUP * super::BLOCK;

/// Index vectors of a `vpermt2d` (`_mm512_permutex2var_epi32`: lane `l` of the result is lane
/// `idx[l]` of `a` for `idx[l] < 16`, else lane `idx[l] − 16` of `b`) for the two outputs of one
/// stage.
pub type StageIndex = [[u32; 16]; 2];

/// The `w` stages that transpose a group whose blocks have `2^w` words (see the module header).
pub fn plan(w: u32) -> Vec<StageIndex> {
    assert!((1..=3).contains(&w), "2 to 8 words per block");
    let mut stages = Vec::new();
    for j in 0..w {
        let bit = 1u32 << j;
        let mut idx = [[0u32; 16]; 2];
        for l in 0..16u32 {
            if l & bit == 0 {
                idx[0][l as usize] = l;
                idx[1][l as usize] = l | bit;
            } else {
                idx[0][l as usize] = 16 + (l ^ bit);
                idx[1][l as usize] = 16 + l;
            }
        }
        stages.push(idx);
    }
    // After the swaps lane `i + 2^w · s` holds block `i · 2^(4−w) + s`; the last stage reads its
    // lanes in block order instead.
    let last = stages.last_mut().expect("w ≥ 1");
    let from = |block: u32| (block >> (4 - w)) + ((block & ((1 << (4 - w)) - 1)) << w);
    for out in last.iter_mut() {
        let before = *out;
        for (l, o) in out.iter_mut().enumerate() {
            *o = before[from(l as u32) as usize];
        }
    }
    stages
}

/// Runs the network on labelled lanes (the portable model of what the kernels do), pairing
/// vectors that differ in index bit `j` at stage `j`.
pub fn apply<T: Copy>(stages: &[StageIndex], v: &mut [[T; 16]]) {
    for (j, idx) in stages.iter().enumerate() {
        let bit = 1usize << j;
        for a in (0..v.len()).filter(|a| a & bit == 0) {
            let (va, vb) = (v[a], v[a | bit]);
            let pick = |i: u32| {
                if i < 16 {
                    va[i as usize]
                } else {
                    vb[i as usize - 16]
                }
            };
            v[a] = std::array::from_fn(|l| pick(idx[0][l]));
            v[a | bit] = std::array::from_fn(|l| pick(idx[1][l]));
        }
    }
}

/// Reorders one weight row, held as stored (`block_len` elements per block: 32 for q8, 16 for
/// q4's packed bytes), into the kernels' order: each whole group of 16 blocks as the vectors the
/// network would make of it (vector `t`, lane `l` = 4-element word `t` of block `l`), so the
/// kernels load it transposed; a last, partial group stays as stored.
pub fn to_kernel_order<T: Copy + Default>(row: &mut [T], block_len: usize) {
    permute_groups(
        row,
        block_len,
        |b, t, words| b * words + t,
        |b, t, _| t * GROUP + b,
    );
}

/// The inverse of [`to_kernel_order`].
pub fn to_stored_order<T: Copy + Default>(row: &mut [T], block_len: usize) {
    permute_groups(
        row,
        block_len,
        |b, t, _| t * GROUP + b,
        |b, t, words| b * words + t,
    );
}

/// Moves word `(block b, word t)` of every whole group from index `from(b, t, words)` to
/// `to(b, t, words)` (in words of 4 elements).
fn permute_groups<T: Copy + Default>(
    row: &mut [T],
    block_len: usize,
    from: impl Fn(usize, usize, usize) -> usize,
    to: impl Fn(usize, usize, usize) -> usize,
) {
    let words = block_len / 4;
    let group_len = GROUP * block_len;
    let mut tmp = vec![T::default(); group_len];
    for group in row.chunks_exact_mut(group_len) {
        tmp.copy_from_slice(group);
        for b in 0..GROUP {
            for t in 0..words {
                let (src, dst) = (4 * from(b, t, words), 4 * to(b, t, words));
                group[dst..dst + 4].copy_from_slice(&tmp[src..src + 4]);
            }
        }
    }
}

/// One group of a row's 8-bit input values (`group`: up to 16 blocks of 32, as quantized) into
/// `out` (512 bytes) in the kernels' order: vector `v` (`0..8`) of 64 bytes, lane `l` holding
/// values `4v..4v + 4` of block `l`; the lanes of blocks a partial group lacks are zero.
pub fn arrange_group(group: &[i8], out: &mut [i8]) {
    assert!(
        out.len() == GROUP_BYTES
            && group.len() <= GROUP_BYTES
            && group.len().is_multiple_of(super::BLOCK),
        "arrange_group: {} values into {} bytes",
        group.len(),
        out.len()
    );
    let blocks = group.len() / super::BLOCK;
    if blocks < GROUP {
        out.fill(0);
    }
    for (l, block) in group.chunks_exact(super::BLOCK).enumerate() {
        for (v, word) in block.chunks_exact(4).enumerate() {
            let at = 4 * (v * GROUP + l);
            out[at..at + 4].copy_from_slice(word);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follows (block, word) labels through the network from the stored layout: vector `t`
    /// ends with word `t` of block `l` in lane `l`.
    #[test]
    fn the_network_transposes_a_group() {
        for w in [2u32, 3] {
            let per_vec = 1usize << (4 - w); // blocks per stored vector
            let mut v: Vec<[(usize, usize); 16]> = (0..1usize << w)
                .map(|i| std::array::from_fn(|l| (i * per_vec + (l >> w), l & ((1 << w) - 1))))
                .collect();
            apply(&plan(w), &mut v);
            for (t, vec) in v.iter().enumerate() {
                for (l, &label) in vec.iter().enumerate() {
                    assert_eq!(label, (l, t), "w {w}: vector {t} lane {l}");
                }
            }
        }
    }

    #[test]
    fn weight_rows_round_trip_and_match_the_network() {
        for block_len in [32usize, 16] {
            // Two whole groups and 3 blocks more.
            let stored: Vec<u16> = (0..(2 * GROUP + 3) * block_len).map(|i| i as u16).collect();
            let mut row = stored.clone();
            to_kernel_order(&mut row, block_len);
            assert_ne!(row, stored);
            // Vector t lane l of the first group: word t of block l.
            let (t, l) = (1, 9);
            let at = 4 * (t * GROUP + l);
            assert_eq!(row[at], stored[l * block_len + 4 * t]);
            // The partial group is untouched.
            let tail = 2 * GROUP * block_len;
            assert_eq!(row[tail..], stored[tail..]);
            to_stored_order(&mut row, block_len);
            assert_eq!(row, stored);
        }
    }

    #[test]
    fn inputs_are_arranged_by_block_lane() {
        let qs: Vec<i8> = (0..GROUP_BYTES + 32).map(|i| (i % 251) as i8).collect();
        let mut out = vec![7i8; 2 * GROUP_BYTES];
        for (g, group) in qs.chunks(GROUP_BYTES).enumerate() {
            arrange_group(group, &mut out[g * GROUP_BYTES..(g + 1) * GROUP_BYTES]);
        }
        // Vector 5, lane 9, byte 2: value 4·5 + 2 of block 9.
        assert_eq!(out[5 * 64 + 9 * 4 + 2], qs[9 * 32 + 22]);
        // The second group has one block: lane 0 holds it, the other lanes are zero.
        let second = &out[GROUP_BYTES..];
        assert_eq!(second[3 * 64 + 1], qs[GROUP_BYTES + 13]);
        assert!(second[3 * 64 + 4..4 * 64].iter().all(|&v| v == 0));
    }
}
