//! One forward pass over the rows of several requests ([`CausalLm::forward_groups`], the
//! scheduler's step): every row gets, bit for bit, what its request's own pass gives it — plain
//! decode steps, a draft tree under its mask, a bidirectional diffusion block computed
//! batch-invariantly — and the caches it leaves are the ones the own passes leave, in every
//! weight format, with and without sliding windows. A draft head's shared pass
//! ([`DraftLm::forward_groups`]) keeps the same promise.

use candle_core::{Device, Tensor};
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::attention::TreeMask;
use glance_nn::{
    AttnMask, CausalLm, DraftContext, DraftLm, KvCache, Mode, RowGroup, WeightFormat, WeightLoad,
};
use serde_json::json;

fn random_model(window: Option<usize>, format: WeightFormat) -> TextModel {
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
    let vb = random_var_builder(11, &Device::Cpu);
    TextModel::load_as(
        &vb,
        &vb.pp("lm_head"),
        &cfg,
        Mode::Infer,
        &WeightLoad::new(format),
    )
    .unwrap()
}

/// One request's pass: its tokens, positions, mask and kernels.
struct Job {
    ids: Vec<u32>,
    positions: Vec<u32>,
    mask: AttnMask,
    invariant: bool,
}

/// Prefills `prompt` alone; returns the cache and the prompt's length.
fn prefill(m: &TextModel, prompt: &[u32]) -> KvCache {
    let mut cache = m.new_cache();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    m.forward(
        &m.embed_tokens(prompt).unwrap(),
        &positions,
        &AttnMask::causal(),
        &mut cache,
    )
    .unwrap();
    cache
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().unwrap()
}

#[test]
fn a_shared_pass_gives_every_request_the_bits_of_its_own_pass() {
    let prompts: [&[u32]; 4] = [
        &[3, 14, 15, 92, 65, 35, 89],
        &[2, 71, 82, 81, 82, 84, 59, 4, 52, 35, 36, 2],
        &[1, 41],
        &[16, 18, 3, 39, 88, 7, 49, 11, 58],
    ];
    let tree = TreeMask::new(vec![None, Some(0), Some(0), Some(1), Some(2)]).unwrap();
    for window in [None, Some(4)] {
        for format in [
            WeightFormat::F32,
            WeightFormat::Bf16,
            WeightFormat::Q8,
            WeightFormat::Q4,
        ] {
            let m = random_model(window, format);
            let what = format!("window {window:?}, {format:?}");
            let caches: Vec<KvCache> = prompts.iter().map(|p| prefill(&m, p)).collect();
            let at = |i: usize| prompts[i].len() as u32;
            let jobs = [
                // A decode step.
                Job {
                    ids: vec![5],
                    positions: vec![at(0)],
                    mask: AttnMask::causal(),
                    invariant: false,
                },
                // A draft tree (root and four nodes) at depth positions.
                Job {
                    ids: vec![6, 7, 8, 9, 10],
                    positions: tree.positions(at(1)),
                    mask: AttnMask::Tree(tree.clone()),
                    invariant: false,
                },
                // Another decode step.
                Job {
                    ids: vec![12],
                    positions: vec![at(2)],
                    mask: AttnMask::causal(),
                    invariant: false,
                },
                // A bidirectional diffusion block, batch-invariant.
                Job {
                    ids: vec![13, 96, 96, 96],
                    positions: (0..4).map(|j| at(3) + j).collect(),
                    mask: AttnMask::Full,
                    invariant: true,
                },
            ];
            // Each pass alone.
            let mut alone_caches: Vec<KvCache> = caches.iter().map(|c| c.fork().unwrap()).collect();
            let alone: Vec<Vec<Vec<f32>>> = jobs
                .iter()
                .zip(alone_caches.iter_mut())
                .map(|(j, c)| {
                    let x = m.embed_tokens(&j.ids).unwrap();
                    let h = if j.invariant {
                        m.forward_batch_invariant(&x, &j.positions, &j.mask, c)
                    } else {
                        m.forward(&x, &j.positions, &j.mask, c)
                    };
                    rows(&h.unwrap())
                })
                .collect();
            // One shared pass.
            let mut shared_caches: Vec<KvCache> =
                caches.iter().map(|c| c.fork().unwrap()).collect();
            let ids: Vec<u32> = jobs.iter().flat_map(|j| j.ids.clone()).collect();
            let mut groups: Vec<RowGroup<'_>> = jobs
                .iter()
                .zip(shared_caches.iter_mut())
                .map(|(j, cache)| RowGroup {
                    positions: &j.positions,
                    mask: &j.mask,
                    cache,
                    invariant: j.invariant,
                })
                .collect();
            let shared = rows(
                &m.forward_groups(&m.embed_tokens(&ids).unwrap(), &mut groups)
                    .unwrap(),
            );
            drop(groups);
            let mut r = 0;
            for (g, own) in alone.iter().enumerate() {
                assert_eq!(
                    &shared[r..r + own.len()],
                    own.as_slice(),
                    "{what}: request {g}"
                );
                r += own.len();
            }
            assert_eq!(r, shared.len());
            // The caches continue alike: one more decode step of each request, alone.
            for (g, (a, s)) in alone_caches
                .iter_mut()
                .zip(shared_caches.iter_mut())
                .enumerate()
            {
                assert_eq!(a.len(), s.len(), "{what}: request {g}");
                let pos = jobs[g].positions.iter().max().unwrap() + 1;
                let x = m.embed_tokens(&[20]).unwrap();
                let ha = m.forward(&x, &[pos], &AttnMask::causal(), a).unwrap();
                let hs = m.forward(&x, &[pos], &AttnMask::causal(), s).unwrap();
                assert_eq!(rows(&ha), rows(&hs), "{what}: request {g} after the pass");
            }
        }
    }
}

#[test]
fn shared_logits_are_each_rows_own() {
    for format in [WeightFormat::F32, WeightFormat::Q4] {
        let m = random_model(None, format);
        let x = m.embed_tokens(&[4, 8, 15, 16, 23, 42]).unwrap();
        let mut cache = m.new_cache();
        let h = m
            .forward(&x, &[0, 1, 2, 3, 4, 5], &AttnMask::causal(), &mut cache)
            .unwrap();
        let all = rows(&CausalLm::logits_rows(&m, &h).unwrap());
        for (r, row) in all.iter().enumerate() {
            let one = rows(&m.logits(&h.narrow(0, r, 1).unwrap()).unwrap());
            assert_eq!(row, &one[0], "{format:?} row {r}");
        }
    }
}

/// A random draft head over the test target's shape, its matrices held as `format`.
fn random_head(format: WeightFormat, global: bool) -> DraftHead {
    let text = json!({
        "model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    });
    let config = DraftConfig::for_target(&text, None, global).unwrap();
    let vb = random_var_builder(5, &Device::Cpu);
    DraftHead::from_var_builder_as(&vb, config, Mode::Infer, &WeightLoad::new(format)).unwrap()
}

/// Draft rows for `n` tokens: fused from pseudo-random embeddings and hidden states.
fn draft_rows(h: &DraftHead, n: usize, seed: f32) -> Tensor {
    // (n, 64) each
    let x = Tensor::arange(0f32, (n * 64) as f32, &Device::Cpu)
        .unwrap()
        .reshape((n, 64))
        .unwrap();
    let emb = x.affine(0.37, seed as f64).unwrap().sin().unwrap();
    let prev = x.affine(0.11, -(seed as f64)).unwrap().cos().unwrap();
    h.fuse(&emb, &prev, &DraftContext::default()).unwrap()
}

/// A draft head's shared pass ([`DraftLm::forward_groups`], one per tree level for every
/// request) gives every request the bits of its own [`DraftLm::forward`] and leaves the same
/// caches: a draft start's prompt rows (wide: run alone), pending rows under the causal mask, a
/// tree level under its visibility mask, a one-row step.
#[test]
fn a_shared_draft_pass_gives_every_request_the_bits_of_its_own_pass() {
    for format in [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::Q8,
        WeightFormat::Q4,
    ] {
        for global in [false, true] {
            let h = random_head(format, global);
            let what = format!("{format:?}, global {global}");
            // Committed rows per request.
            let committed = [5usize, 9, 3, 7];
            let caches: Vec<KvCache> = committed
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let mut c = h.new_cache();
                    let positions: Vec<u32> = (0..n as u32).collect();
                    h.forward(
                        &draft_rows(&h, n, i as f32),
                        &positions,
                        &AttnMask::causal(),
                        &mut c,
                    )
                    .unwrap();
                    c
                })
                .collect();
            let at = |i: usize| committed[i] as u32;
            // A tree level of two rows after one speculative row: row 0 sees it, row 1 not.
            let kv = committed[1] + 1 + 2;
            let mut visible = vec![false; 2 * kv];
            for (m, row) in visible.chunks_mut(kv).enumerate() {
                row[..committed[1]].fill(true);
                row[committed[1] + 1 + m] = true;
            }
            visible[committed[1]] = true;
            let level = AttnMask::visible(2, kv, visible).unwrap();
            let wide = glance_nn::matvec::MAX_SMALL_ROWS + 3;
            let jobs: Vec<(Tensor, Vec<u32>, AttnMask, bool)> = vec![
                // Pending rows.
                (
                    draft_rows(&h, 3, 10.0),
                    vec![at(0), at(0) + 1, at(0) + 2],
                    AttnMask::causal(),
                    false,
                ),
                // A tree level (after one speculative row of the request's).
                (
                    draft_rows(&h, 2, 11.0),
                    vec![at(1) + 1, at(1) + 1],
                    level,
                    true,
                ),
                // One row.
                (
                    draft_rows(&h, 1, 12.0),
                    vec![at(2)],
                    AttnMask::causal(),
                    false,
                ),
                // A draft start's prompt rows.
                (
                    draft_rows(&h, wide, 13.0),
                    (0..wide as u32).map(|p| at(3) + p).collect(),
                    AttnMask::causal(),
                    false,
                ),
            ];
            let fork = |cs: &[KvCache]| -> Vec<KvCache> {
                cs.iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let mut c = c.fork().unwrap();
                        if jobs[i].3 {
                            // The speculative row the tree level hangs below.
                            h.forward(
                                &draft_rows(&h, 1, 14.0),
                                &[at(i)],
                                &AttnMask::causal(),
                                &mut c,
                            )
                            .unwrap();
                        }
                        c
                    })
                    .collect()
            };
            for parts in [&[0usize, 1, 2, 3][..], &[0, 1, 2], &[1, 2]] {
                let what = format!("{what}, requests {parts:?}");
                let mut alone_caches = fork(&caches);
                let alone: Vec<Vec<Vec<f32>>> = parts
                    .iter()
                    .map(|&i| {
                        let (x, p, m, _) = &jobs[i];
                        rows(&h.forward(x, p, m, &mut alone_caches[i]).unwrap())
                    })
                    .collect();
                let mut shared_caches = fork(&caches);
                let xs: Vec<&Tensor> = parts.iter().map(|&i| &jobs[i].0).collect();
                let xs = Tensor::cat(&xs, 0).unwrap();
                let mut groups: Vec<RowGroup<'_>> = shared_caches
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| parts.contains(i))
                    .map(|(i, cache)| RowGroup {
                        positions: &jobs[i].1,
                        mask: &jobs[i].2,
                        cache,
                        invariant: false,
                    })
                    .collect();
                let shared = rows(&DraftLm::forward_groups(&h, &xs, &mut groups).unwrap());
                drop(groups);
                let mut r = 0;
                for (k, own) in alone.iter().enumerate() {
                    assert_eq!(
                        &shared[r..r + own.len()],
                        own.as_slice(),
                        "{what}: request {}",
                        parts[k]
                    );
                    r += own.len();
                }
                assert_eq!(r, shared.len());
                // The caches continue alike.
                for &i in parts {
                    let (a, s) = (&mut alone_caches[i], &mut shared_caches[i]);
                    assert_eq!(a.len(), s.len(), "{what}: request {i}");
                    let pos = jobs[i].1.iter().max().unwrap() + 1;
                    let x = draft_rows(&h, 1, 15.0);
                    let ha = h.forward(&x, &[pos], &AttnMask::causal(), a).unwrap();
                    let hs = h.forward(&x, &[pos], &AttnMask::causal(), s).unwrap();
                    assert_eq!(rows(&ha), rows(&hs), "{what}: request {i} after the pass");
                }
            }
        }
    }
}

/// Draft logits gathered from several requests ([`DraftLm::logits_rows`]: one read of the head
/// for a level of all their trees) are each request's own ([`DraftLm::logits`] of its level),
/// over the whole vocabulary and over a reduced one.
#[test]
fn shared_draft_logits_are_each_requests_own() {
    for format in [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::Q8,
        WeightFormat::Q4,
    ] {
        let m = random_model(None, format);
        for vocab in [None, Some(vec![3u32, 50, 7, 96, 0, 41])] {
            let text = json!({
                "model_type": "llama", "vocab_size": 97, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256,
            });
            let mut config = DraftConfig::for_target(&text, None, false).unwrap();
            if let Some(ids) = &vocab {
                config.set_draft_vocab(ids.clone()).unwrap();
            }
            let vb = random_var_builder(5, &Device::Cpu);
            let h =
                DraftHead::from_var_builder_as(&vb, config, Mode::Infer, &WeightLoad::new(format))
                    .unwrap();
            // (7, hidden): levels of 2, 1 and 4 rows.
            let hidden = draft_rows(&h, 7, 3.0);
            let all = DraftLm::logits_rows(&h, &m, &hidden).unwrap();
            assert_eq!(all.ids.as_deref(), vocab.as_deref());
            let all = rows(&all.logits);
            let mut first = 0;
            for n in [2, 1, 4] {
                let own = h.logits(&m, &hidden.narrow(0, first, n).unwrap()).unwrap();
                assert_eq!(
                    &all[first..first + n],
                    rows(&own.logits).as_slice(),
                    "{format:?}, vocab {vocab:?}: rows {first}..{}",
                    first + n
                );
                first += n;
            }
        }
    }
}
