//! Where every coordinate of the small model goes in its twin, axis by axis.
//!
//! A twin weight is described by one [`Slot`] per index of each axis: the small model's index it
//! carries, or what a padded index holds. [`fill_matrix`] / [`fill_vector`] then overwrite a
//! seeded random draw of the whole tensor with the small values and the zeros the slots ask for,
//! so the random part costs what a real weight costs while contributing nothing (see
//! `docs/twins.md` for why each axis is exact).

use crate::text::TextConfig;
use glance_core::{Error, Result};

/// What one index along an axis of a twin weight holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The small model's index `i` along the same axis: with a `Real` index on the other axis,
    /// the small model's value (times the weight's scale).
    Real(usize),
    /// Zero (unless the other axis says [`Slot::Random`]): padded outputs that must stay zero
    /// (residual dimensions, `o_proj` / `down_proj` columns of padded units).
    Zero,
    /// Random where the other axis is not [`Slot::Zero`]: padded units that cost what they cost
    /// (their outputs are cancelled downstream) and input columns whose inputs are always zero.
    Free,
    /// Random whatever the other axis holds (embedding rows of ids no tokenizer produces).
    Random,
}

/// How a head's dimensions are placed inside a bigger head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadLayout {
    /// Queries and keys: small rotary pair `j` (dims `j`, `j + hd/2`) at big pair `j·r`, so the
    /// RoPE frequencies coincide; the other dims of the head are zero.
    Rotary,
    /// Values and `o_proj` columns: the first `hd_s` dims, contiguous (whole 32-blocks of a
    /// quantized `o_proj` row hold real columns only); the rest `unused`.
    Contiguous,
}

/// The sizes of the small decoder and of its twin, and the index maps between them.
#[derive(Debug, Clone)]
pub(crate) struct TwinMap {
    pub small: Sizes,
    pub big: Sizes,
}

/// The sizes of a decoder that the embedding reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

impl Sizes {
    pub fn of(c: &TextConfig) -> Self {
        Self {
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_layers,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            vocab: c.vocab_size,
        }
    }

    /// Query heads per KV head.
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

impl TwinMap {
    /// The maps from `small` into `big`; `Error::Config` naming the first size that does not fit.
    pub fn new(small: &TextConfig, big: &TextConfig) -> Result<Self> {
        let (s, b) = (Sizes::of(small), Sizes::of(big));
        let fits = [
            ("hidden_size", s.hidden, b.hidden),
            ("intermediate_size", s.intermediate, b.intermediate),
            ("num_hidden_layers", s.layers, b.layers),
            ("num_key_value_heads", s.kv_heads, b.kv_heads),
            ("query heads per KV head", s.group(), b.group()),
            ("head_dim", s.head_dim, b.head_dim),
            ("vocab_size", s.vocab, b.vocab),
        ];
        for (what, small, big) in fits {
            if big < small {
                return Err(Error::Config(format!(
                    "the twin shape is smaller than the model: {what} {big} < {small}"
                )));
            }
        }
        if !b.head_dim.is_multiple_of(s.head_dim) {
            return Err(Error::Config(format!(
                "a twin's head_dim must be a multiple of the model's: {} is not a multiple of {}",
                b.head_dim, s.head_dim
            )));
        }
        Ok(Self { small: s, big: b })
    }

    /// Big KV head of small KV head `g`: spread evenly (`g · ⌊kv_b / kv_s⌋`).
    pub fn kv_head(&self, g: usize) -> usize {
        g * (self.big.kv_heads / self.small.kv_heads)
    }

    /// Big query head of small query head `h`: the same place in the group of its KV head's
    /// image, so it reads the keys and values its small head reads.
    pub fn q_head(&self, h: usize) -> usize {
        let (g, r) = (h / self.small.group(), h % self.small.group());
        self.kv_head(g) * self.big.group() + r
    }

    /// `hd_b / hd_s`.
    fn ratio(&self) -> usize {
        self.big.head_dim / self.small.head_dim
    }

    /// Big dimension of small dimension `d` inside a head under HF's rotate-half RoPE: pair `j`
    /// (dims `j` and `j + hd_s/2`, frequency `θ^(−2j/hd_s)`) goes to pair `j·r` (dims `j·r` and
    /// `j·r + hd_b/2`, frequency `θ^(−2jr/hd_b)`, the same).
    pub fn rotary_dim(&self, d: usize) -> usize {
        let (hs, hb) = (self.small.head_dim / 2, self.big.head_dim / 2);
        (d / hs) * hb + (d % hs) * self.ratio()
    }

    /// The query scale that keeps `1/√hd_s` under the big model's `1/√hd_b`: `√(hd_b / hd_s)`.
    pub fn q_scale(&self) -> f32 {
        (self.ratio() as f32).sqrt()
    }

    /// The RMSNorm weight scale that undoes the padded mean: `√(d_s / d_b)` (with the twin's eps
    /// `eps_s · d_s / d_b`).
    pub fn norm_scale(&self) -> f32 {
        (self.small.hidden as f64 / self.big.hidden as f64).sqrt() as f32
    }

    /// The residual stream as an input axis: real dims first, padded inputs (always zero) free.
    pub fn residual_in(&self) -> Vec<Slot> {
        prefix(self.small.hidden, self.big.hidden, Slot::Free)
    }

    /// The residual stream as an output axis: padded dims stay exactly zero.
    pub fn residual_out(&self) -> Vec<Slot> {
        prefix(self.small.hidden, self.big.hidden, Slot::Zero)
    }

    /// MLP units as outputs of `gate` / `up`: padded units random.
    pub fn units_out(&self) -> Vec<Slot> {
        prefix(self.small.intermediate, self.big.intermediate, Slot::Free)
    }

    /// MLP units as inputs of `down`: padded units' columns zero.
    pub fn units_in(&self) -> Vec<Slot> {
        prefix(self.small.intermediate, self.big.intermediate, Slot::Zero)
    }

    /// Vocabulary rows: padded ids as `padded` says.
    pub fn vocab(&self, padded: Slot) -> Vec<Slot> {
        prefix(self.small.vocab, self.big.vocab, padded)
    }

    /// `q_proj` output rows.
    pub fn q_rows(&self) -> Vec<Slot> {
        self.heads(
            self.small.heads,
            self.big.heads,
            |h| self.q_head(h),
            HeadLayout::Rotary,
        )
    }

    /// `k_proj` output rows.
    pub fn k_rows(&self) -> Vec<Slot> {
        self.heads(
            self.small.kv_heads,
            self.big.kv_heads,
            |g| self.kv_head(g),
            HeadLayout::Rotary,
        )
    }

    /// `v_proj` output rows: the unused dims of a real head are random (their `o_proj` columns
    /// are zero).
    pub fn v_rows(&self) -> Vec<Slot> {
        let mut slots = self.heads(
            self.small.kv_heads,
            self.big.kv_heads,
            |g| self.kv_head(g),
            HeadLayout::Contiguous,
        );
        for s in slots.iter_mut().filter(|s| **s == Slot::Zero) {
            *s = Slot::Free;
        }
        slots
    }

    /// `o_proj` input columns: every column but a real head's value dims is zero.
    pub fn o_cols(&self) -> Vec<Slot> {
        self.heads(
            self.small.heads,
            self.big.heads,
            |h| self.q_head(h),
            HeadLayout::Contiguous,
        )
        .into_iter()
        .map(|s| if s == Slot::Free { Slot::Zero } else { s })
        .collect()
    }

    /// ViSpec's adaptor attends with `heads` heads for queries, keys and values alike and no
    /// RoPE: every projection uses the query-head map (`layout` for `q`/`k`: rotary, harmless
    /// without RoPE; `v` and `o` as in the decoder).
    pub fn adaptor_rows(&self, rotary: bool) -> Vec<Slot> {
        let layout = if rotary {
            HeadLayout::Rotary
        } else {
            HeadLayout::Contiguous
        };
        let slots = self.heads(self.small.heads, self.big.heads, |h| self.q_head(h), layout);
        if rotary {
            return slots;
        }
        slots
            .into_iter()
            .map(|s| if s == Slot::Zero { Slot::Free } else { s })
            .collect()
    }

    /// An axis of `big` heads × `hd_b` dims holding `small` heads × `hd_s` dims: small head `h`
    /// at big head `map(h)`, placed by `layout`; a real head's other dims [`Slot::Zero`],
    /// padded heads [`Slot::Free`].
    fn heads(
        &self,
        small: usize,
        big: usize,
        map: impl Fn(usize) -> usize,
        layout: HeadLayout,
    ) -> Vec<Slot> {
        let (hs, hb) = (self.small.head_dim, self.big.head_dim);
        let mut slots = vec![Slot::Free; big * hb];
        for h in 0..small {
            let base = map(h) * hb;
            slots[base..base + hb].fill(Slot::Zero);
            for d in 0..hs {
                let at = match layout {
                    HeadLayout::Rotary => self.rotary_dim(d),
                    HeadLayout::Contiguous => d,
                };
                slots[base + at] = Slot::Real(h * hs + d);
            }
        }
        slots
    }
}

/// `big` slots: `Real(0..small)` first, then `padded`.
pub(crate) fn prefix(small: usize, big: usize, padded: Slot) -> Vec<Slot> {
    (0..big)
        .map(|i| if i < small { Slot::Real(i) } else { padded })
        .collect()
}

/// `Real(i)` for every index: an axis the twin keeps as it is.
pub(crate) fn identity(n: usize) -> Vec<Slot> {
    (0..n).map(Slot::Real).collect()
}

/// Overwrites `out` `(rows.len(), cols.len())`, row-major, holding random draws: a (Real, Real)
/// entry gets `small[(i, j)] · scale` (`small` row-major with `small_cols` columns), a Zero axis
/// zeroes the entry unless the other is Random; everything else keeps its draw.
pub(crate) fn fill_matrix(
    out: &mut [f32],
    rows: &[Slot],
    cols: &[Slot],
    small: &[f32],
    small_cols: usize,
    scale: f32,
) {
    let n = cols.len();
    debug_assert_eq!(out.len(), rows.len() * n);
    for (row, r) in out.chunks_exact_mut(n).zip(rows) {
        match *r {
            Slot::Random => {}
            Slot::Zero => {
                for (v, c) in row.iter_mut().zip(cols) {
                    if *c != Slot::Random {
                        *v = 0.0;
                    }
                }
            }
            Slot::Free => {
                for (v, c) in row.iter_mut().zip(cols) {
                    if *c == Slot::Zero {
                        *v = 0.0;
                    }
                }
            }
            Slot::Real(i) => {
                let src = &small[i * small_cols..(i + 1) * small_cols];
                for (v, c) in row.iter_mut().zip(cols) {
                    match *c {
                        Slot::Real(j) => *v = src[j] * scale,
                        Slot::Zero => *v = 0.0,
                        Slot::Free | Slot::Random => {}
                    }
                }
            }
        }
    }
}

/// Overwrites `out` (one value per slot, holding random draws): `Real(i)` gets `small[i] ·
/// scale`, `Zero` 0, the rest keep their draws.
pub(crate) fn fill_vector(out: &mut [f32], slots: &[Slot], small: &[f32], scale: f32) {
    for (v, s) in out.iter_mut().zip(slots) {
        match *s {
            Slot::Real(i) => *v = small[i] * scale,
            Slot::Zero => *v = 0.0,
            Slot::Free | Slot::Random => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(hidden: usize, heads: usize, kv: usize, hd: usize) -> TextConfig {
        TextConfig::from_value(&json!({"model_type": "llama", "vocab_size": 141,
            "hidden_size": hidden, "intermediate_size": 704, "num_hidden_layers": 4,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd}))
        .unwrap()
    }

    fn real_at(slots: &[Slot], i: usize) -> Option<usize> {
        slots.iter().position(|s| *s == Slot::Real(i))
    }

    #[test]
    fn tinyllama_heads_map_small_head_h_to_big_query_head_8h_and_kv_head_h() {
        let m = TwinMap::new(&config(256, 4, 4, 64), &config(2048, 32, 4, 64)).unwrap();
        for h in 0..4 {
            assert_eq!((m.q_head(h), m.kv_head(h)), (8 * h, h));
            // The big GQA grouping: query head 8h reads KV head 8h / 8 = h.
            assert_eq!(m.q_head(h) / (32 / 4), m.kv_head(h));
        }
        let q = m.q_rows();
        assert_eq!(q.len(), 32 * 64);
        // Same head_dim: the dims stay in place inside the mapped head.
        assert_eq!(real_at(&q, 64 + 5), Some(8 * 64 + 5));
        // Head 1 (big query head 1) is padded: random rows.
        assert!(q[64..128].iter().all(|s| *s == Slot::Free));
        let o = m.o_cols();
        assert!(o[64..128].iter().all(|s| *s == Slot::Zero));
        assert_eq!(m.q_scale(), 1.0);
        assert_eq!(
            m.k_rows()
                .iter()
                .filter(|s| matches!(s, Slot::Real(_)))
                .count(),
            4 * 64
        );
    }

    #[test]
    fn head_dim_64_into_128_puts_pair_j_at_pair_2j() {
        let m = TwinMap::new(&config(256, 4, 4, 64), &config(4096, 32, 32, 128)).unwrap();
        // MHA at both sizes, four small heads spread over 32: head h → 8h.
        assert_eq!((m.q_head(3), m.kv_head(3)), (24, 24));
        for j in 0..32 {
            // Small pair j = dims (j, j + 32); big pair 2j = dims (2j, 2j + 64).
            assert_eq!(m.rotary_dim(j), 2 * j);
            assert_eq!(m.rotary_dim(j + 32), 2 * j + 64);
            // The frequencies θ^(−2i/hd) coincide, as RotaryEmbedding computes them (f32).
            let f = |i: usize, hd: usize| 10000f32.powf((2 * i) as f32 / hd as f32);
            assert_eq!(f(j, 64), f(2 * j, 128));
        }
        let q = m.q_rows();
        let head = &q[8 * 128..9 * 128];
        assert_eq!(head[2], Slot::Real(64 + 1));
        assert_eq!(head[66], Slot::Real(64 + 33));
        // Odd pairs inside a real head: zero query (and key) rows.
        assert_eq!((head[1], head[65]), (Slot::Zero, Slot::Zero));
        // Values are contiguous; the rest of a real head's values are random, their o_proj
        // columns zero.
        let (v, o) = (m.v_rows(), m.o_cols());
        assert_eq!(v[8 * 128 + 63], Slot::Real(64 + 63));
        assert_eq!((v[8 * 128 + 64], o[8 * 128 + 64]), (Slot::Free, Slot::Zero));
        assert_eq!(o[8 * 128 + 10], Slot::Real(64 + 10));
        assert_eq!(m.q_scale(), 2f32.sqrt());
        assert_eq!(m.norm_scale(), 0.25);
    }

    #[test]
    fn grouped_small_heads_keep_their_group() {
        // 6 query heads over 2 KV heads into 16 over 4: groups of 3 into groups of 4.
        let m = TwinMap::new(&config(72, 6, 2, 12), &config(160, 16, 4, 24)).unwrap();
        for h in 0..6 {
            let (g, bh) = (h / 3, m.q_head(h));
            assert_eq!(bh / 4, m.kv_head(g), "head {h}");
        }
        let q: Vec<usize> = (0..6).map(|h| m.q_head(h)).collect();
        assert_eq!(q, [0, 1, 2, 8, 9, 10]);
    }

    #[test]
    fn shapes_smaller_than_the_model_are_refused() {
        let small = config(256, 4, 4, 64);
        for (big, what) in [
            (config(128, 4, 4, 32), "hidden_size"),
            (config(2048, 32, 2, 64), "num_key_value_heads"),
            (config(2048, 32, 32, 96), "multiple"),
        ] {
            let e = TwinMap::new(&small, &big).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }

    #[test]
    fn fill_keeps_draws_where_free_and_zeroes_where_zero() {
        let rows = [Slot::Real(1), Slot::Zero, Slot::Free, Slot::Random];
        let cols = [Slot::Real(0), Slot::Zero, Slot::Free];
        let small = [1.0, 2.0, 3.0, 4.0]; // (2, 2)
        let mut out = vec![9.0; 12];
        fill_matrix(&mut out, &rows, &cols, &small, 2, 0.5);
        assert_eq!(
            out,
            [1.5, 0.0, 9.0, 0.0, 0.0, 0.0, 9.0, 0.0, 9.0, 9.0, 9.0, 9.0]
        );
        let mut v = vec![9.0; 3];
        fill_vector(&mut v, &cols, &[4.0], 2.0);
        assert_eq!(v, [8.0, 0.0, 9.0]);
    }
}
