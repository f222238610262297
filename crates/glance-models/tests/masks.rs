//! Tree, block and boolean attention masks and speculative KV-cache rollback on real decoders:
//! small random-weight models (one without a window, one Mistral-style with a sliding window on
//! some layers) and the transformers Mistral fixture.
//!
//! * tree rows (EAGLE / ViSpec verification) equal their root-to-node branch run on its own;
//! * bidirectional blocks (Fast-dVLM) equal full attention run block by block;
//! * keeping the accepted path of a verified tree equals recomputing the prefix + path, also
//!   with FastV-style layers that hold fewer cached rows;
//! * a chain-shaped tree and a boolean causal mask reproduce transformers' sliding-window logits.

mod common;

use candle_core::{Device, Tensor};
use common::{fixtures, max_abs};
use glance_models::llava::Llava;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::attention::TreeMask;
use glance_nn::{AttnMask, CausalLm, KvCache, Mode};
use serde_json::{json, Value};

const TOL: f32 = 1e-4;

/// A 3-layer llama-style decoder (GQA) with random weights; `window`: Mistral-style with a
/// sliding window on layers 1 and 2 only, so the layers need different masks.
fn random_model(window: Option<usize>) -> TextModel {
    let mut cfg = json!({
        "model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    });
    if let Some(w) = window {
        cfg["model_type"] = json!("mistral");
        cfg["sliding_window"] = json!(w);
        cfg["layer_types"] = json!(["full_attention", "sliding_attention", "sliding_attention"]);
    }
    let cfg = TextConfig::from_value(&cfg).unwrap();
    let vb = random_var_builder(7, &Device::Cpu);
    TextModel::load(&vb, &vb.pp("lm_head"), &cfg, Mode::Infer).unwrap()
}

/// Models under test: no window, and window 4 (shorter than the prefix and the tree depth).
fn models() -> Vec<(&'static str, TextModel)> {
    vec![
        ("llama", random_model(None)),
        ("windowed", random_model(Some(4))),
    ]
}

const PREFIX: [u32; 7] = [3, 14, 15, 92, 65, 35, 89];

/// Token ids of a draft tree and its parents:
///
/// ```text
/// 0 ─ 1 ─ 3 ─ 6
///  │   └─ 4
///  └─ 2 ─ 5 ─ 7 ─ 8
/// 9                 (a second root)
/// ```
fn draft_tree() -> (Vec<u32>, TreeMask) {
    let ids = vec![11, 22, 33, 44, 55, 66, 77, 88, 21, 43];
    let parents = vec![
        None,
        Some(0),
        Some(0),
        Some(1),
        Some(1),
        Some(2),
        Some(3),
        Some(5),
        Some(7),
        None,
    ];
    (ids, TreeMask::new(parents).unwrap())
}

fn positions(a: usize, b: usize) -> Vec<u32> {
    (a as u32..b as u32).collect()
}

/// Prefills `ids` causally into a new cache; returns the logits of every row and the cache.
fn prefill(m: &TextModel, ids: &[u32]) -> (Tensor, KvCache) {
    let mut cache = m.new_cache();
    let h = m
        .forward(
            &m.embed_tokens(ids).unwrap(),
            &positions(0, ids.len()),
            &AttnMask::causal(),
            &mut cache,
        )
        .unwrap();
    (m.logits(&h).unwrap(), cache)
}

/// Runs `ids` at `pos` under `mask` over `cache`; returns the logits `(t, vocab)`.
fn step(m: &TextModel, ids: &[u32], pos: &[u32], mask: &AttnMask, cache: &mut KvCache) -> Tensor {
    let h = m
        .forward(&m.embed_tokens(ids).unwrap(), pos, mask, cache)
        .unwrap();
    m.logits(&h).unwrap()
}

fn row(t: &Tensor, i: usize) -> Tensor {
    t.narrow(0, i, 1).unwrap()
}

#[test]
fn tree_rows_equal_their_branches_run_sequentially() {
    let (ids, tree) = draft_tree();
    let p = PREFIX.len();
    for (name, m) in models() {
        let (_, mut cache) = prefill(&m, &PREFIX);
        let mark = cache.mark();
        let tree_logits = step(
            &m,
            &ids,
            &tree.positions(p as u32),
            &AttnMask::Tree(tree.clone()),
            &mut cache,
        );
        cache.rollback(&mark).unwrap();
        assert_eq!(cache.len(), p);
        let mut worst = 0f32;
        for i in 0..ids.len() {
            // The branch root → i, one token at a time on a copy of the prefix cache.
            let path = tree.path(i);
            let mut c = cache.fork().unwrap();
            let mut last = None;
            for (d, &n) in path.iter().enumerate() {
                let pos = [(p + d) as u32];
                last = Some(step(&m, &[ids[n]], &pos, &AttnMask::causal(), &mut c));
            }
            let d = max_abs(&row(&tree_logits, i), &last.unwrap());
            worst = worst.max(d);
            assert!(
                d <= TOL,
                "{name}: tree row {i} differs from its branch by {d}"
            );
        }
        // The test can fail: reading the tree rows as a plain causal sequence changes the rows
        // whose branch is not a prefix of the row order.
        let mut c = cache.fork().unwrap();
        let causal = step(
            &m,
            &ids,
            &tree.positions(p as u32),
            &AttnMask::causal(),
            &mut c,
        );
        let off = max_abs(&row(&causal, 8), &row(&tree_logits, 8));
        println!("{name}: tree vs branches {worst:.1e}, vs causal {off:.1e}");
        assert!(off > 100.0 * TOL, "{name}: causal ≈ tree ({off})");
    }
}

#[test]
fn block_mask_equals_full_attention_block_by_block() {
    let ids: Vec<u32> = vec![5, 6, 7, 8, 9, 10, 11, 12];
    let p = PREFIX.len();
    let n = ids.len();
    for (name, m) in models() {
        let (_, mut cache) = prefill(&m, &PREFIX);
        for size in [1, 3, 4, 8] {
            // One pass with bidirectional blocks of `size` rows.
            let mut c = cache.fork().unwrap();
            let joint = step(
                &m,
                &ids,
                &positions(p, p + n),
                &AttnMask::block(size).unwrap(),
                &mut c,
            );
            // Reference: each block alone under full attention, after the blocks before it.
            let mut c = cache.fork().unwrap();
            let mut parts = Vec::new();
            for a in (0..n).step_by(size) {
                let b = (a + size).min(n);
                parts.push(step(
                    &m,
                    &ids[a..b],
                    &positions(p + a, p + b),
                    &AttnMask::Full,
                    &mut c,
                ));
            }
            let d = max_abs(&joint, &Tensor::cat(&parts, 0).unwrap());
            assert!(d <= TOL, "{name}: blocks of {size} differ by {d}");
        }
        // A block covering the whole input on a fresh cache is full attention.
        let mut c = m.new_cache();
        let block = step(
            &m,
            &ids,
            &positions(0, n),
            &AttnMask::block(n).unwrap(),
            &mut c,
        );
        let mut c = m.new_cache();
        let full = step(&m, &ids, &positions(0, n), &AttnMask::Full, &mut c);
        assert!(max_abs(&block, &full) <= TOL, "{name}: whole-input block");
        // …and not causal attention (the test can fail).
        let mut c = m.new_cache();
        let causal = step(&m, &ids, &positions(0, n), &AttnMask::causal(), &mut c);
        assert!(
            max_abs(&row(&block, 0), &row(&causal, 0)) > 100.0 * TOL,
            "{name}"
        );
        // Rolling a block back restores the cache exactly: the next step is bit-identical.
        let next = [17];
        let mut c = cache.fork().unwrap();
        let want = step(&m, &next, &[p as u32], &AttnMask::causal(), &mut c);
        let mark = cache.mark();
        step(&m, &ids, &positions(p, p + n), &AttnMask::Full, &mut cache);
        cache.rollback(&mark).unwrap();
        let got = step(&m, &next, &[p as u32], &AttnMask::causal(), &mut cache);
        assert_eq!(max_abs(&got, &want), 0.0, "{name}: rollback");
    }
}

/// Prefills `PREFIX`, then — when `fastv` — drops rows 1, 2, 4 from the layers after the first
/// (FastV-style: layer 0 keeps 7 rows, layers 1, 2 keep 4).
fn context(m: &TextModel, fastv: bool) -> KvCache {
    let (_, mut cache) = prefill(m, &PREFIX);
    if fastv {
        cache.compact_layers(1..3, &[0, 3, 5, 6]).unwrap();
        assert_eq!(cache.layer_lens(), vec![7, 4, 4]);
    }
    cache
}

#[test]
fn keeping_the_accepted_path_equals_recomputation() {
    let (ids, tree) = draft_tree();
    let p = PREFIX.len() as u32;
    let t = ids.len();
    let next = 30;
    for (name, m) in models() {
        for fastv in [false, true] {
            for leaf in [4, 8, 9] {
                let path = tree.path(leaf);
                let path_ids: Vec<u32> = path.iter().map(|&i| ids[i]).collect();
                let k = path.len() as u32;

                // Verify the whole tree, keep the accepted path, decode the next token.
                let mut cache = context(&m, fastv);
                let before = cache.layer_lens();
                let mask = AttnMask::Tree(tree.clone());
                step(&m, &ids, &tree.positions(p), &mask, &mut cache);
                cache.keep_speculative(t, &path).unwrap();
                let lens: Vec<usize> = before.iter().map(|l| l + path.len()).collect();
                assert_eq!(cache.layer_lens(), lens);
                let got = step(&m, &[next], &[p + k], &AttnMask::causal(), &mut cache);

                // Recompute: the context, the path as plain tokens, the next token.
                let mut c = context(&m, fastv);
                let pos: Vec<u32> = (p..p + k + 1).collect();
                let mut seq = path_ids.clone();
                seq.push(next);
                let want = step(&m, &seq, &pos, &AttnMask::causal(), &mut c);
                let d = max_abs(&got, &row(&want, path.len()));
                assert!(
                    d <= TOL,
                    "{name} fastv={fastv} leaf {leaf}: kept path vs recomputed {d}"
                );
                // The wrong rows kept (the first k rows of the region) give other logits.
                let mut cache = context(&m, fastv);
                step(&m, &ids, &tree.positions(p), &mask, &mut cache);
                let wrong: Vec<usize> = (0..path.len()).collect();
                if wrong != path {
                    cache.keep_speculative(t, &wrong).unwrap();
                    let bad = step(&m, &[next], &[p + k], &AttnMask::causal(), &mut cache);
                    assert!(max_abs(&bad, &got) > 100.0 * TOL, "{name} leaf {leaf}");
                }
            }
        }
    }
}

#[test]
fn boolean_masks_equal_their_structured_forms() {
    let (ids, tree) = draft_tree();
    let p = PREFIX.len();
    let t = ids.len();
    for (name, m) in models() {
        let cache = context(&m, true);
        let pos = tree.positions(p as u32);
        let run = |mask: &AttnMask| step(&m, &ids, &pos, mask, &mut cache.fork().unwrap());
        // The tree as a (t, t) boolean over the new rows: valid whatever each layer caches.
        let mut vis = vec![false; t * t];
        for i in 0..t {
            tree.path(i).iter().for_each(|&a| vis[i * t + a] = true);
        }
        let boolean_tree = run(&AttnMask::visible(t, t, vis).unwrap());
        let tree_logits = run(&AttnMask::Tree(tree.clone()));
        let d = max_abs(&boolean_tree, &tree_logits);
        if m.config().layer_windows.iter().all(Option::is_none) {
            assert!(d <= TOL, "{name}: boolean tree differs by {d}");
        } else {
            // With a window they differ by design: a boolean row's window counts from its row
            // order (`past + i`), a tree row's from its depth (`past + depth(i)`).
            assert!(
                d > 100.0 * TOL,
                "{name}: boolean tree ≈ tree under a window ({d})"
            );
        }
        // Causal as a (t, t) boolean, windows included.
        let causal: Vec<bool> = (0..t).flat_map(|i| (0..t).map(move |j| j <= i)).collect();
        let got = run(&AttnMask::visible(t, t, causal).unwrap());
        let want = run(&AttnMask::causal());
        assert!(max_abs(&got, &want) <= TOL, "{name}: boolean causal");
        // A (t, past + t) boolean cannot fit layers of different lengths.
        let mut c = cache.fork().unwrap();
        let wide = AttnMask::visible(t, p + t, vec![true; t * (p + t)]).unwrap();
        let x = m.embed_tokens(&ids).unwrap();
        assert!(m.forward(&x, &pos, &wide, &mut c).is_err(), "{name}");
    }
}

#[test]
fn sliding_window_fixture_under_chain_tree_and_boolean_masks() {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap())
            .unwrap();
    // The case of a windowed model whose prompt is longer than the window.
    let case = manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            let model = c["model"].as_str().unwrap().trim_start_matches("models/");
            let w = manifest["models"][model]["sliding_window"].as_u64();
            w.is_some_and(|w| c["seq_len"].as_u64().unwrap() > w + 8)
        })
        .max_by_key(|c| c["seq_len"].as_u64().unwrap())
        .expect("a sliding-window case longer than its window");
    let name = case["name"].as_str().unwrap();
    let model = Llava::load(
        &fixtures().join(case["model"].as_str().unwrap()),
        &Device::Cpu,
    )
    .unwrap();
    let t = candle_core::safetensors::load(
        fixtures().join(case["tensors"].as_str().unwrap()),
        &Device::Cpu,
    )
    .unwrap();
    let input_ids = common::ids(&t["input_ids"]);
    let n = input_ids.len();
    let enc = model.encode_image(&t["pixel_values"]).unwrap();
    let emb = model.embed_prompt(&input_ids, &[&enc.features]).unwrap();
    let text = model.text();
    let want = &t["logits"];
    let pos = positions(0, n);

    let chain = AttnMask::Tree(TreeMask::chain(n));
    let causal_bool: Vec<bool> = (0..n).flat_map(|i| (0..n).map(move |j| j <= i)).collect();
    let boolean = AttnMask::visible(n, n, causal_bool).unwrap();
    for (what, mask) in [("chain tree", &chain), ("boolean causal", &boolean)] {
        let h = text.forward_uncached(&emb, &pos, mask).unwrap();
        let d = max_abs(&text.logits(&h).unwrap(), want);
        println!("{name}: {what} {d:.1e}");
        assert!(d <= TOL, "{name}: {what} differs from transformers by {d}");
    }

    // Over a cache: the first rows causally, the rest as a chain tree (the window reaches back
    // into the cached rows).
    let split = 10;
    let mut cache = text.new_cache();
    let a = text
        .forward(
            &emb.narrow(0, 0, split).unwrap(),
            &positions(0, split),
            &AttnMask::causal(),
            &mut cache,
        )
        .unwrap();
    let rest = TreeMask::chain(n - split);
    let b = text
        .forward(
            &emb.narrow(0, split, n - split).unwrap(),
            &rest.positions(split as u32),
            &AttnMask::Tree(rest),
            &mut cache,
        )
        .unwrap();
    let got = text.logits(&Tensor::cat(&[a, b], 0).unwrap()).unwrap();
    let d = max_abs(&got, want);
    assert!(d <= TOL, "{name}: cached chain tree differs by {d}");

    // The window matters here (the test can fail): an additive causal mask is used as given, with
    // no window, and moves the rows past the window away from the fixture.
    let additive: Vec<f32> = (0..n)
        .flat_map(|i| (0..n).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    let no_window = AttnMask::Custom(Tensor::from_vec(additive, (n, n), &Device::Cpu).unwrap());
    let h = text.forward_uncached(&emb, &pos, &no_window).unwrap();
    let d = max_abs(&text.logits(&h).unwrap(), want);
    println!("{name}: without the window {d:.1e}");
    assert!(d > 10.0 * TOL, "{name}: the window changes nothing ({d})");
}
