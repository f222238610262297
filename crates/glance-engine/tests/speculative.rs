//! Speculative decoding (EAGLE / ViSpec draft heads) through the engine on the committed
//! fixtures (Llama with grouped-query attention, Mistral with a sliding window, Qwen2): the
//! lossless contract with untrained heads, a perfect head's acceptance, tree verification against
//! sequential decoding, and the cache after an accepted path against recomputation.

use candle_core::{Device, Tensor};
use glance_core::{Result, SamplingParams};
use glance_decode::speculative::{tree, DraftTree, Grower};
use glance_decode::{shared_draft_pass, DraftPass, TreeSettings};
use glance_engine::DraftKind;
use glance_engine::{DecodeSpec, Engine, EngineOptions, Flow, ImageInput, Prompt, Request};
use glance_models::draft::{DraftConfig, DraftHead};
use glance_models::llava::Llava;
use glance_models::random::random_var_builder;
use glance_nn::{
    AttnMask, CausalLm, DraftContext, DraftLm, DraftPrompt, DraftStart, KvCache, Mode, TreeMask,
};
use glance_prune::{Budget, Policy, PruneSpec};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

const MODELS: [&str; 3] = ["llama-gqa", "mistral", "qwen2"];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn engine(model: &str) -> Engine {
    Engine::load(
        &fixtures().join("models").join(model),
        EngineOptions::default(),
    )
    .unwrap()
}

fn image(name: &str) -> ImageInput {
    ImageInput::bytes(std::fs::read(fixtures().join("images").join(name)).unwrap())
}

fn shipped_tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny")
}

/// A randomly initialised head shaped for `model`.
fn random_head(model: &str, adaptor: Option<usize>, injection: bool, seed: u64) -> DraftHead {
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("models").join(model).join("config.json"))
            .unwrap(),
    )
    .unwrap();
    let config = DraftConfig::for_target(&config["text_config"], adaptor, injection).unwrap();
    DraftHead::from_var_builder(&random_var_builder(seed, &Device::Cpu), config, Mode::Infer)
        .unwrap()
}

/// A "draft" that is the target itself: its rows are the token embeddings and it runs the whole
/// target over its own cache, so it predicts exactly the target's next hidden state. With it every
/// greedy draft token should be accepted — the acceptance path, the kept cache rows and the
/// positions of later rounds are all exercised.
struct Oracle(Arc<Llava>);

impl DraftLm for Oracle {
    fn kind(&self) -> DraftKind {
        DraftKind::Vispec
    }

    fn new_cache(&self) -> KvCache {
        self.0.text().new_cache()
    }

    fn start(&self, p: &DraftPrompt<'_>) -> Result<DraftStart> {
        // Every prompt row (row 0 included, unlike a real head): the cache then matches the
        // target's.
        Ok(DraftStart {
            rows: p.inputs.clone(),
            positions: p.positions.to_vec(),
            context: DraftContext::default(),
        })
    }

    fn fuse(&self, emb: &Tensor, _prev: &Tensor, _: &DraftContext) -> Result<Tensor> {
        Ok(emb.clone())
    }

    fn forward(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        self.0.text().forward(xs, positions, mask, cache)
    }
}

fn request(image_names: &[&str], text: &str, n: usize, decode: DecodeSpec) -> Request {
    Request {
        max_new_tokens: n,
        decode,
        ..Request::chat(text, image_names.iter().map(|i| image(i)).collect())
    }
}

fn run(e: &Engine, r: &Request) -> glance_engine::Response {
    e.generate(r, &mut |_| Flow::Continue).unwrap()
}

/// Largest absolute difference of two tensors of one shape.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn prunings() -> Vec<Option<PruneSpec>> {
    vec![
        None,
        Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5))),
        Some(PruneSpec::new(Policy::FastV, Budget::Ratio(0.5))),
    ]
}

/// Untrained heads accept little, and the output must still be autoregressive decoding's, token
/// for token: every fixture, ViSpec and EAGLE heads, tree and chain, with and without pruning.
#[test]
fn greedy_speculative_output_equals_autoregressive_with_untrained_heads() {
    let trees = [TreeSettings::default(), TreeSettings::chain(4)];
    for model in MODELS {
        let e = engine(model);
        e.set_draft(Arc::new(random_head(model, Some(4), true, 1)));
        e.set_draft(Arc::new(random_head(model, None, false, 2)));
        for prune in prunings() {
            for (images, text) in [
                (&["astronaut.png"][..], "Describe the image."),
                (&["chelsea.jpg", "cup_rgba.png"][..], "Compare them."),
            ] {
                let mut ar = request(images, text, 24, DecodeSpec::Autoregressive);
                ar.prune = prune.clone();
                let want = run(&e, &ar);
                for kind in [DraftKind::Vispec, DraftKind::Eagle] {
                    for tree in &trees {
                        let r = Request {
                            decode: DecodeSpec::Speculative {
                                kind,
                                tree: Some(tree.clone()),
                            },
                            ..ar.clone()
                        };
                        let got = run(&e, &r);
                        assert_eq!(
                            got.token_ids, want.token_ids,
                            "{model} {kind} {tree:?} prune {prune:?}"
                        );
                        assert_eq!(got.finish_reason, want.finish_reason);
                        let c = &got.decode.counters;
                        assert_eq!(got.decode.strategy, kind.name());
                        assert!(c["drafts"] >= 1 && c["draft_tokens"] >= c["accepted_tokens"]);
                        // Every round emits its accepted tokens and one more.
                        assert!(
                            got.decode.forward_passes + c["accepted_tokens"]
                                >= got.token_ids.len() as u64 - 1
                        );
                        // The prefill's token, then one entry per round that emitted: the
                        // accepted drafts and the verifier's token.
                        let steps = &got.decode.tokens_per_step;
                        let sum: u32 = steps.iter().sum();
                        assert_eq!(sum as usize, got.token_ids.len(), "{steps:?}");
                        assert_eq!(steps.len() as u64, c["drafts"] + 1, "{steps:?}");
                        // (A round cut short by the end emits fewer than it accepted.)
                        let more: u32 = steps[1..].iter().map(|&n| n - 1).sum();
                        assert!(u64::from(more) <= c["accepted_tokens"], "{steps:?}");
                    }
                }
            }
        }
    }
}

/// A perfect draft: greedy chains of depth 4 are accepted whole (up to floating-point near-ties),
/// so the strategy's bookkeeping across many accepted rounds is exercised — and the output is
/// still exactly autoregressive decoding's.
#[test]
fn a_perfect_draft_is_accepted_and_changes_nothing() {
    for model in MODELS {
        let e = engine(model);
        e.set_draft(Arc::new(Oracle(Arc::new(
            Llava::load(&fixtures().join("models").join(model), &Device::Cpu).unwrap(),
        ))));
        for prune in prunings() {
            let mut ar = request(
                &["astronaut.png"],
                "Describe the image.",
                40,
                DecodeSpec::Autoregressive,
            );
            ar.prune = prune.clone();
            let want = run(&e, &ar);
            // The random fixtures' distributions are flat: no early stop on low confidence.
            for tree in [TreeSettings::chain(4), TreeSettings::default()] {
                let tree = TreeSettings {
                    min_confidence: 0.0,
                    ..tree
                };
                let r = Request {
                    decode: DecodeSpec::Speculative {
                        kind: DraftKind::Vispec,
                        tree: Some(tree.clone()),
                    },
                    ..ar.clone()
                };
                let got = run(&e, &r);
                assert_eq!(got.token_ids, want.token_ids, "{model} {tree:?} {prune:?}");
                let passes = got.decode.forward_passes as f64;
                let per_pass = (got.token_ids.len() - 1) as f64 / passes;
                // FastV's target drops rows the oracle keeps: its hidden states differ. A chain of 4
                // of a perfect draft emits 5 tokens a pass (bar the last); a small tree over the
                // random fixtures' flat distributions spends its budget on siblings too.
                let floor = if prune.as_ref().is_some_and(|p| p.policy == Policy::FastV) {
                    1.0
                } else if tree.top_k == 1 {
                    4.0
                } else {
                    2.0
                };
                assert!(
                    per_pass >= floor,
                    "{model} {tree:?} {prune:?}: {per_pass} tokens per pass, {:?}",
                    got.decode
                );
            }
        }
    }
}

/// A fixed seed at temperature 1 gives the same speculative answer twice.
#[test]
fn sampled_speculative_decoding_is_deterministic_per_seed() {
    let e = engine("llama-gqa");
    e.set_draft(Arc::new(random_head("llama-gqa", Some(4), true, 1)));
    let mut r = request(
        &["astronaut.png"],
        "Describe the image.",
        30,
        DecodeSpec::speculative(DraftKind::Vispec),
    );
    r.sampling = SamplingParams {
        top_p: 0.95,
        ..SamplingParams::sampled(1.0, 5)
    };
    let a = run(&e, &r);
    let b = run(&e, &r);
    assert_eq!(a.token_ids, b.token_ids);
    assert!(!a.token_ids.is_empty());
}

/// The rows of a draft tree verified in one pass under the tree mask equal each root-to-node path
/// decoded on its own; and keeping an accepted path in the cache equals having decoded it.
#[test]
fn tree_verification_equals_sequential_decoding_and_kept_rows_equal_recomputation() {
    for model in MODELS {
        let llava = Llava::load(&fixtures().join("models").join(model), &Device::Cpu).unwrap();
        let lm = llava.text();
        let prompt: Vec<u32> = (3..40).collect();
        let pos: Vec<u32> = (0..prompt.len() as u32).collect();
        let mut base = lm.new_cache();
        lm.forward(
            &lm.embed_tokens(&prompt).unwrap(),
            &pos,
            &AttnMask::causal(),
            &mut base,
        )
        .unwrap();
        let start = prompt.len() as u32;
        // root ─ a ─ c ─ e
        //      │   └ d
        //      └ b ─ f
        let tokens = [7u32, 8, 9, 10, 11, 12, 13];
        let parents = vec![None, Some(0), Some(0), Some(1), Some(1), Some(3), Some(2)];
        let tree = TreeMask::new(parents).unwrap();
        let mut cache = base.fork().unwrap();
        let positions = tree.positions(start);
        let hidden = lm
            .forward(
                &lm.embed_tokens(&tokens).unwrap(),
                &positions,
                &AttnMask::Tree(tree.clone()),
                &mut cache,
            )
            .unwrap();
        for node in 0..tokens.len() {
            let path = tree.path(node);
            let ids: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
            let pos: Vec<u32> = (0..ids.len() as u32).map(|i| start + i).collect();
            let mut c = base.fork().unwrap();
            let h = lm
                .forward(
                    &lm.embed_tokens(&ids).unwrap(),
                    &pos,
                    &AttnMask::causal(),
                    &mut c,
                )
                .unwrap();
            let want = h.narrow(0, ids.len() - 1, 1).unwrap();
            let got = hidden.narrow(0, node, 1).unwrap();
            let diff = max_diff(&got, &want);
            assert!(diff < 1e-4, "{model} node {node}: {diff}");
            if node == 5 {
                // Keep the path root ─ a ─ c ─ e (rows 0, 1, 3, 5) and decode one more token:
                // the same as after decoding the path itself.
                let mut kept = cache.fork().unwrap();
                kept.keep_speculative(tokens.len(), &path).unwrap();
                assert_eq!(kept.len(), c.len());
                let next_pos = [start + path.len() as u32];
                let x = lm.embed_tokens(&[20]).unwrap();
                let a = lm
                    .forward(&x, &next_pos, &AttnMask::causal(), &mut kept)
                    .unwrap();
                let b = lm
                    .forward(&x, &next_pos, &AttnMask::causal(), &mut c)
                    .unwrap();
                let diff = max_diff(&a, &b);
                assert!(diff < 1e-4, "{model} kept path: {diff}");
            }
        }
    }
}

/// Missing heads, mismatched heads and bad tree settings are clear errors, not panics.
#[test]
fn missing_or_mismatched_heads_and_bad_trees_are_errors() {
    let e = engine("llama-gqa");
    let r = request(
        &["astronaut.png"],
        "Hi",
        8,
        DecodeSpec::speculative(DraftKind::Eagle),
    );
    let err = e
        .generate(&r, &mut |_| Flow::Continue)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("eagle draft head") && err.contains("draft-eagle"),
        "{err}"
    );
    let mut r = request(
        &["astronaut.png"],
        "Hi",
        8,
        DecodeSpec::speculative(DraftKind::Vispec),
    );
    r.decode = DecodeSpec::Speculative {
        kind: DraftKind::Vispec,
        tree: Some(TreeSettings {
            depth: 0,
            ..TreeSettings::default()
        }),
    };
    let err = e
        .generate(&r, &mut |_| Flow::Continue)
        .unwrap_err()
        .to_string();
    assert!(err.contains("depth"), "{err}");
    let head = random_head("qwen2", None, false, 3);
    let llama = Llava::load(&fixtures().join("models/llama-gqa"), &Device::Cpu).unwrap();
    let t = llama.text();
    let err = head
        .config()
        .check_target(t.hidden_size() + 1, t.vocab_size());
    assert!(err.is_err());
    let _ = Prompt::Raw {
        text: String::new(),
        images: vec![],
    };
}

/// glance-tiny with the heads it ships (`models/glance-tiny/draft-vispec`, `draft-eagle`), found
/// with no flag: on a fixed sample of test images, every question and a long description, ViSpec
/// and EAGLE (tree and chain) give exactly autoregressive decoding's tokens, also under 12.5%
/// adaptive pruning — and the trained ViSpec head is accepted deep enough to matter (a floor far
/// under what it measures, to catch a broken or swapped head).
#[test]
fn glance_tiny_with_its_shipped_heads_is_lossless_and_accepts_deep() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny");
    let e = Engine::load(&dir, EngineOptions::default()).unwrap();
    let tight = Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.125)));
    let (mut decoded, mut passes) = (0usize, 0u64);
    for index in 0..6 {
        let ex = glance_world::sample(glance_world::Split::Test, index).unwrap();
        let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
        let mut prompts: Vec<(String, usize)> = ex
            .questions
            .iter()
            .map(|q| (q.question.clone(), 16))
            .collect();
        prompts.push(("Describe the image in detail.".into(), 160));
        for (text, n) in prompts {
            for prune in [None, tight.clone()] {
                let ar = Request {
                    max_new_tokens: n,
                    prune: prune.clone(),
                    ..Request::chat(&text, vec![image.clone()])
                };
                let want = run(&e, &ar);
                for (kind, tree) in [
                    (DraftKind::Vispec, None),
                    (DraftKind::Vispec, Some(TreeSettings::chain(5))),
                    (DraftKind::Eagle, None),
                ] {
                    let r = Request {
                        decode: DecodeSpec::Speculative {
                            kind,
                            tree: tree.clone(),
                        },
                        ..ar.clone()
                    };
                    let got = run(&e, &r);
                    assert_eq!(
                        got.token_ids, want.token_ids,
                        "image {index} {text:?} {kind} {tree:?} {prune:?}"
                    );
                    if kind == DraftKind::Vispec && tree.is_none() && prune.is_none() && n > 16 {
                        decoded += got.token_ids.len() - 1;
                        passes += got.decode.forward_passes;
                    }
                }
            }
        }
    }
    let per_pass = decoded as f64 / passes as f64;
    assert!(
        per_pass >= 3.0,
        "ViSpec on descriptions: {per_pass:.2} tokens per target pass"
    );
}

/// A bounded schema (every string and list short, every number small): a random model's answer
/// under it ends within a few hundred tokens.
fn bounded_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}
        },
        "required": ["name", "count", "ok", "color", "tags"],
        "additionalProperties": false
    })
}

/// `v` is valid under [`bounded_schema`] (checked by hand, property by property).
fn assert_bounded(v: &Value, what: &str) {
    let o = v.as_object().unwrap_or_else(|| panic!("{what}: {v}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["color", "count", "name", "ok", "tags"],
        "{what}: {v}"
    );
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 6),
        "{what}: {v}"
    );
    assert!(o["count"].as_u64().is_some_and(|c| c <= 99), "{what}: {v}");
    assert!(o["ok"].is_boolean(), "{what}: {v}");
    assert!(
        ["red", "green", "blue"].contains(&o["color"].as_str().unwrap_or("")),
        "{what}: {v}"
    );
    let tags = o["tags"].as_array().unwrap();
    assert!(tags.len() <= 2, "{what}: {v}");
    assert!(
        tags.iter()
            .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 3)),
        "{what}: {v}"
    );
}

/// Constrained decoding under speculation: the grammar masks each tree node's row given that
/// node's own history, so a draft that breaks the schema is never accepted and the greedy answer
/// is autoregressive decoding's — with untrained heads (drafts rejected) and with the oracle (its
/// unconstrained drafts accepted wherever the schema allows them). Every answer is valid JSON under
/// the schema, ended by end-of-sequence.
#[test]
fn constrained_answers_are_the_same_with_and_without_speculation() {
    let format = glance_engine::OutputFormat::JsonSchema(bounded_schema());
    for model in MODELS {
        let e = engine(model);
        e.set_draft(Arc::new(random_head(model, Some(4), true, 1)));
        e.set_draft(Arc::new(random_head(model, None, false, 2)));
        let mut ar = request(
            &["astronaut.png"],
            "Describe the image as JSON.",
            300,
            DecodeSpec::Autoregressive,
        );
        ar.format = Some(format.clone());
        let want = run(&e, &ar);
        assert_eq!(
            want.finish_reason,
            glance_engine::FinishReason::Eos,
            "{model}: {}",
            want.text
        );
        assert_bounded(&serde_json::from_str(&want.text).unwrap(), model);
        // Unconstrained, the same prompt is not JSON: the mask made the answer.
        let free = run(
            &e,
            &Request {
                format: None,
                ..ar.clone()
            },
        );
        assert!(
            serde_json::from_str::<Value>(&free.text).is_err(),
            "{model}: {}",
            free.text
        );
        for kind in [DraftKind::Vispec, DraftKind::Eagle] {
            for tree in [TreeSettings::default(), TreeSettings::chain(4)] {
                let r = Request {
                    decode: DecodeSpec::Speculative {
                        kind,
                        tree: Some(tree.clone()),
                    },
                    ..ar.clone()
                };
                let got = run(&e, &r);
                assert_eq!(got.token_ids, want.token_ids, "{model} {kind} {tree:?}");
            }
        }
        e.set_draft(Arc::new(Oracle(Arc::new(
            Llava::load(&fixtures().join("models").join(model), &Device::Cpu).unwrap(),
        ))));
        let tree = TreeSettings {
            min_confidence: 0.0,
            ..TreeSettings::chain(4)
        };
        let r = Request {
            decode: DecodeSpec::Speculative {
                kind: DraftKind::Vispec,
                tree: Some(tree),
            },
            ..ar.clone()
        };
        let got = run(&e, &r);
        assert_eq!(got.token_ids, want.token_ids, "{model} oracle");
        let c = &got.decode.counters;
        // Some drafts pass the mask (accepted), some do not (rejected: the answer is AR's).
        assert!(
            c["accepted_tokens"] > 0 && c["accepted_tokens"] < c["draft_tokens"],
            "{c:?}"
        );
        // A schema the compiler refuses is an input error.
        let bad = Request {
            format: Some(glance_engine::OutputFormat::JsonSchema(
                serde_json::json!({"type": 7}),
            )),
            ..ar.clone()
        };
        let err = e.generate(&bad, &mut |_| Flow::Continue).unwrap_err();
        assert!(matches!(err, glance_core::Error::InvalidParam(_)), "{err}");
    }
}

/// Draft trees grown side by side — each level of every tree in one shared draft pass
/// ([`shared_draft_pass`]) — are the trees [`tree::grow`] grows alone, node for node and
/// probability for probability: trees of different shapes and depths, ending at different
/// levels.
#[test]
fn trees_grown_together_are_the_trees_grown_alone() {
    let e = Engine::load(&shipped_tiny(), EngineOptions::default()).unwrap();
    let target = e.model().text();
    let eos = [target.vocab_size() as u32 - 1];
    let prompts: [&[u32]; 4] = [
        &[1, 17, 40, 23, 9, 31, 12],
        &[1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 60],
        &[1, 33, 2],
        &[1, 44, 45, 20, 71, 19, 18, 3, 50],
    ];
    let settings = [
        TreeSettings::default(),
        TreeSettings {
            depth: 5,
            top_k: 3,
            budget: 12,
            min_confidence: 0.0,
        },
        TreeSettings::chain(4),
        TreeSettings {
            min_confidence: 0.9,
            ..TreeSettings::default()
        },
    ];
    for kind in DraftKind::ALL {
        let head = e
            .read_draft(&shipped_tiny().join(format!("draft-{kind}")))
            .unwrap();
        let context = DraftContext::default();
        // Per request: the draft cache after its prompt's rows, the root and its position.
        let starts: Vec<(KvCache, Tensor, u32)> = prompts
            .iter()
            .map(|p| {
                let positions: Vec<u32> = (0..p.len() as u32).collect();
                let mut cache = target.new_cache();
                // (t, hidden)
                let hidden = target
                    .forward(
                        &target.embed_tokens(p).unwrap(),
                        &positions,
                        &AttnMask::causal(),
                        &mut cache,
                    )
                    .unwrap();
                let t = p.len();
                let emb = target.embed_tokens(&p[1..]).unwrap();
                let rows = head
                    .fuse(&emb, &hidden.narrow(0, 0, t - 1).unwrap(), &context)
                    .unwrap();
                let mut draft_cache = head.new_cache();
                let out = head
                    .forward(
                        &rows,
                        &positions[1..],
                        &AttnMask::causal(),
                        &mut draft_cache,
                    )
                    .unwrap();
                (
                    draft_cache,
                    out.narrow(0, t - 2, 1).unwrap(),
                    (t - 1) as u32,
                )
            })
            .collect();
        // Each tree alone, and the rows it left in its draft cache.
        let alone: Vec<(DraftTree, usize)> = starts
            .iter()
            .zip(&settings)
            .map(|((cache, root, pos), s)| {
                let mut cache = cache.fork().unwrap();
                let tree = tree::grow(
                    target, &head, &context, &mut cache, root, *pos, s, s.depth, &eos,
                )
                .unwrap();
                (tree, cache.len())
            })
            .collect();
        let mut caches: Vec<KvCache> = starts.iter().map(|(c, _, _)| c.fork().unwrap()).collect();
        let mut growers: Vec<Grower> = starts
            .iter()
            .zip(&settings)
            .zip(&caches)
            .map(|(((_, root, pos), s), cache)| {
                let logits = head.logits(target, root).unwrap();
                Grower::new(root, &logits, *pos, cache.len(), s, s.depth, &eos).unwrap()
            })
            .collect();
        let mut widest = 0;
        loop {
            let passes: Vec<Option<DraftPass>> = growers
                .iter_mut()
                .map(|g| g.next_pass(target, &head, &context).unwrap())
                .collect();
            let mut jobs: Vec<(&DraftPass, &mut KvCache)> = passes
                .iter()
                .zip(caches.iter_mut())
                .filter_map(|(p, c)| p.as_ref().map(|p| (p, c)))
                .collect();
            if jobs.is_empty() {
                break;
            }
            widest = widest.max(jobs.len());
            let mut outs = shared_draft_pass(target, &head, &mut jobs)
                .unwrap()
                .into_iter();
            for (g, p) in growers.iter_mut().zip(&passes) {
                if p.is_some() {
                    let out = outs.next().unwrap();
                    g.absorb(&out.hidden, &out.logits).unwrap();
                }
            }
        }
        assert!(widest >= 3, "{kind}: at most {widest} trees grew together");
        assert!(
            alone.iter().any(|(t, _)| t.forwards != alone[0].0.forwards),
            "{kind}: every tree took as many levels"
        );
        for (i, (g, (want, rows))) in growers.iter().zip(&alone).enumerate() {
            let got = g.tree();
            assert_eq!(got.tokens, want.tokens, "{kind}: request {i}");
            assert_eq!(got.parents, want.parents, "{kind}: request {i}");
            assert_eq!(got.probs, want.probs, "{kind}: request {i}");
            assert_eq!(got.forwards, want.forwards, "{kind}: request {i}");
            assert_eq!(caches[i].len(), *rows, "{kind}: request {i}");
        }
    }
}
