//! Selection contracts on synthetic inputs: every pre-LLM policy keeps exactly `k` rows with
//! sorted, unique indices for every `k`; `k ≥ n` is the untouched input; merged rows are the means
//! they claim to be; `adaptive` reduces to `saliency` / `text` when the other signal is flat.

use candle_core::{Device, Tensor};
use glance_prune::{adaptive_split, select, Budget, Grid, Policy, PruneInput, PruneSpec};

/// A deterministic pseudo-random `(rows, cols)` tensor.
fn pseudo(rows: usize, cols: usize, seed: u64) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
}

/// A 6×5 grid of tokens with [CLS] attention and a three-token query.
fn input(seed: u64) -> PruneInput {
    let grid = Grid { rows: 6, cols: 5 };
    let n = grid.len();
    let att = (pseudo(4, n, seed + 1).abs().unwrap() + 0.01).unwrap();
    PruneInput {
        tokens: pseudo(n, 16, seed),
        grid,
        vision: Some(pseudo(n, 12, seed + 2)),
        cls: Some(pseudo(1, 12, seed + 3).squeeze(0).unwrap()),
        cls_attention: Some(att),
        query: Some(pseudo(3, 16, seed + 4)),
    }
}

fn pre_llm() -> Vec<Policy> {
    Policy::ALL
        .into_iter()
        .filter(|p| p.stage() == glance_prune::Stage::PreLlm)
        .collect()
}

#[test]
fn every_policy_keeps_exactly_k_sorted_unique() {
    for seed in [1, 2] {
        let inp = input(seed);
        let n = inp.grid.len();
        for p in pre_llm() {
            let pruner = PruneSpec::new(p, Budget::Ratio(0.5)).pruner().unwrap();
            for k in 1..=n + 3 {
                let kept =
                    select(pruner.as_ref(), &inp, k).unwrap_or_else(|e| panic!("{p} k={k}: {e}"));
                let want = k.min(n);
                assert_eq!(kept.rows.dims(), &[want, 16], "{p} k={k}");
                assert_eq!(kept.index.len(), want, "{p} k={k}");
                assert!(
                    kept.index.windows(2).all(|w| w[0] < w[1]),
                    "{p} k={k}: {:?}",
                    kept.index
                );
                assert!(kept.index.iter().all(|&i| i < n));
            }
            assert!(
                select(pruner.as_ref(), &inp, 0).is_err(),
                "{p}: k = 0 must be refused"
            );
        }
    }
}

#[test]
fn keep_all_returns_the_input_untouched() {
    let inp = input(3);
    let n = inp.grid.len();
    let want: Vec<Vec<f32>> = inp.tokens.to_vec2().unwrap();
    for p in pre_llm() {
        let pruner = PruneSpec::new(p, Budget::Ratio(1.0)).pruner().unwrap();
        let kept = select(pruner.as_ref(), &inp, n).unwrap();
        assert_eq!(kept.index, (0..n).collect::<Vec<_>>());
        assert_eq!(kept.rows.to_vec2::<f32>().unwrap(), want, "{p}");
    }
}

#[test]
fn subset_rows_are_the_tokens_and_merged_rows_are_means() {
    let inp = input(4);
    let tokens: Vec<Vec<f32>> = inp.tokens.to_vec2().unwrap();
    for p in [
        Policy::Random,
        Policy::Saliency,
        Policy::Text,
        Policy::Mix,
        Policy::Adaptive,
    ] {
        let kept = select(
            PruneSpec::new(p, Budget::Count(7))
                .pruner()
                .unwrap()
                .as_ref(),
            &inp,
            7,
        )
        .unwrap();
        let rows: Vec<Vec<f32>> = kept.rows.to_vec2().unwrap();
        for (r, &i) in rows.iter().zip(&kept.index) {
            assert_eq!(r, &tokens[i], "{p}");
        }
    }
    // Pool to 15 on 6×5 (5 bands of 3 windows): every merged row is the mean of the window that
    // holds its anchor.
    let kept = select(
        PruneSpec::new(Policy::Pool, Budget::Count(15))
            .pruner()
            .unwrap()
            .as_ref(),
        &inp,
        15,
    )
    .unwrap();
    let windows = glance_prune::grid_windows(inp.grid, 15);
    let rows: Vec<Vec<f32>> = kept.rows.to_vec2().unwrap();
    for (r, &a) in rows.iter().zip(&kept.index) {
        let w = windows.iter().find(|w| w.contains(&a)).unwrap();
        for (d, got) in r.iter().enumerate() {
            let mean = w.iter().map(|&i| tokens[i][d]).sum::<f32>() / w.len() as f32;
            assert!((got - mean).abs() < 1e-5, "pool row at {a}");
        }
    }
}

#[test]
fn random_is_seeded() {
    let inp = input(5);
    let run = |seed| {
        let mut s = PruneSpec::new(Policy::Random, Budget::Count(8));
        s.seed = seed;
        select(s.pruner().unwrap().as_ref(), &inp, 8).unwrap().index
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn adaptive_reduces_to_saliency_when_the_query_is_flat() {
    let mut inp = input(6);
    // A zero query is equally (un)related to every token: relevance is uniform.
    inp.query = Some(Tensor::zeros((2, 16), candle_core::DType::F32, &Device::Cpu).unwrap());
    let n = inp.grid.len();
    for k in 1..n {
        let get = |p| {
            select(
                PruneSpec::new(p, Budget::Count(k))
                    .pruner()
                    .unwrap()
                    .as_ref(),
                &inp,
                k,
            )
            .unwrap()
            .index
        };
        assert_eq!(get(Policy::Adaptive), get(Policy::Saliency), "k={k}");
    }
}

#[test]
fn adaptive_reduces_to_text_when_saliency_is_flat() {
    let mut inp = input(7);
    let n = inp.grid.len();
    inp.cls_attention = Some(Tensor::ones((4, n), candle_core::DType::F32, &Device::Cpu).unwrap());
    for k in 1..n {
        let get = |p| {
            select(
                PruneSpec::new(p, Budget::Count(k))
                    .pruner()
                    .unwrap()
                    .as_ref(),
                &inp,
                k,
            )
            .unwrap()
            .index
        };
        assert_eq!(get(Policy::Adaptive), get(Policy::Text), "k={k}");
    }
}

#[test]
fn adaptive_split_extremes_and_balance() {
    let n = 40;
    let peaked: Vec<f32> = (0..n).map(|i| ((n - i) as f32).powi(3)).collect();
    let sum: f32 = peaked.iter().sum();
    let peaked: Vec<f32> = peaked.iter().map(|x| x / sum).collect();
    let flat = vec![1.0 / n as f32; n];
    for k in [1, 5, 17, 39] {
        let c = adaptive_split(&peaked, &flat, k);
        assert_eq!(c.kept, (0..k).collect::<Vec<_>>(), "saliency-only, k={k}");
        let c = adaptive_split(&flat, &peaked, k);
        assert_eq!(c.kept, (0..k).collect::<Vec<_>>(), "text-only, k={k}");
    }
    // Disjoint peaks: the split takes from both ends.
    let rev: Vec<f32> = peaked.iter().rev().copied().collect();
    let c = adaptive_split(&peaked, &rev, 10);
    assert_eq!((c.from_saliency, c.from_text), (5, 5));
    assert_eq!(c.kept, vec![0, 1, 2, 3, 4, 35, 36, 37, 38, 39]);
}

#[test]
fn adaptive_split_scales_to_many_tokens() {
    // O(n log n): 100k tokens and k = 50k would be hopeless for a quadratic search.
    let n = 100_000;
    let s: Vec<f32> = (0..n).map(|i| ((i * 7919) % n) as f32 + 1.0).collect();
    let t: Vec<f32> = (0..n).map(|i| ((i * 104_729) % n) as f32 + 1.0).collect();
    let c = adaptive_split(&s, &t, n / 2);
    assert_eq!(c.kept.len(), n / 2);
    assert!(c.kept.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn missing_signals_are_errors_not_panics() {
    let mut inp = input(8);
    inp.query = None;
    for p in [Policy::Text, Policy::Mix, Policy::Adaptive] {
        let e = select(
            PruneSpec::new(p, Budget::Count(5))
                .pruner()
                .unwrap()
                .as_ref(),
            &inp,
            5,
        )
        .unwrap_err();
        assert!(e.to_string().contains("query"), "{p}: {e}");
    }
    // Without attention, saliency falls back to the [CLS] cosine; without [CLS] it is an error.
    inp.cls_attention = None;
    assert!(select(
        PruneSpec::new(Policy::Saliency, Budget::Count(5))
            .pruner()
            .unwrap()
            .as_ref(),
        &inp,
        5
    )
    .is_ok());
    inp.cls = None;
    let e = select(
        PruneSpec::new(Policy::Hier, Budget::Count(5))
            .pruner()
            .unwrap()
            .as_ref(),
        &inp,
        5,
    )
    .unwrap_err();
    assert!(e.to_string().contains("[CLS]"), "{e}");
}
