//! One forward pass over the rows of several requests ([`CausalLm::forward_groups`], the
//! scheduler's step): every row gets, bit for bit, what its request's own pass gives it — plain
//! decode steps, a draft tree under its mask, a bidirectional diffusion block computed
//! batch-invariantly — and the caches it leaves are the ones the own passes leave, in every
//! weight format, with and without sliding windows.

use candle_core::{Device, Tensor};
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::attention::TreeMask;
use glance_nn::{AttnMask, CausalLm, KvCache, Mode, RowGroup, WeightFormat, WeightLoad};
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
