//! Pruned prefill and generation on the committed fixture checkpoints (Llama + GQA; Mistral +
//! sliding window + `full` features, i.e. [CLS] among the image tokens; Qwen2 + tied embeddings):
//! keep-all is exactly the unpruned prefill (identical logits) for every policy, pruned prompts
//! keep their position ids, the KV cache holds only kept rows, FastV's deeper layers hold fewer
//! rows, and greedy generation after pruning is the greedy generation of the kept rows recomputed
//! without a cache (first token, EOS handling, and token by token for the pre-LLM policies).

use candle_core::Device;
use glance_core::SamplingParams;
use glance_decode::{
    Autoregressive, DecodeStrategy, FinishReason, GenerateConfig, Generation, Prefilled, Sampler,
};
use glance_models::llava::{ImageEncoding, Llava, LlavaConfig, LlavaProcessor, PromptFormat};
use glance_models::processing::image::load_image;
use glance_nn::CausalLm;
use glance_prune::{prefill_llava, Budget, Policy, PruneSpec, Stage};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

struct Case {
    name: &'static str,
    model: Llava,
    ids: Vec<u32>,
    query: Vec<u32>,
    image: ImageEncoding,
}

fn case(name: &'static str, image: &str, question: &str) -> Case {
    let dir = fixtures().join("models").join(name);
    let config = LlavaConfig::from_dir(&dir).unwrap();
    let processor = LlavaProcessor::from_dir(&dir, &config).unwrap();
    let model = Llava::load(&dir, &Device::Cpu).unwrap();
    let prompt = processor.prepare(question, 1, PromptFormat::Chat).unwrap();
    let pixels = processor
        .image
        .preprocess_tensor(
            &load_image(&fixtures().join("images").join(image)).unwrap(),
            &Device::Cpu,
        )
        .unwrap();
    let image = model.encode_image(&pixels).unwrap();
    let query = processor.text.encode_plain(question).unwrap();
    Case {
        name,
        model,
        ids: prompt.ids,
        query,
        image,
    }
}

fn cases() -> Vec<Case> {
    vec![
        case(
            "llama-gqa",
            "astronaut.png",
            "What is the astronaut holding?",
        ),
        case("mistral", "chelsea.jpg", "What colour is the cat?"),
        case("qwen2", "coffee_palette.png", "Describe the picture."),
    ]
}

fn prefill(c: &Case, spec: &PruneSpec) -> glance_prune::PrunedPrefill {
    prefill_llava(&c.model, &c.ids, &[&c.image], &c.query, spec)
        .unwrap_or_else(|e| panic!("{} {}: {e}", c.name, spec.policy))
}

fn last_logits(c: &Case, s: &Prefilled) -> Vec<f32> {
    c.model
        .text()
        .logits(&s.last_hidden().unwrap())
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn generate(c: &Case, state: Prefilled, n: usize, eos_token_ids: Vec<u32>) -> Generation {
    let config = GenerateConfig {
        max_new_tokens: n,
        eos_token_ids,
    };
    let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    Autoregressive
        .decode(c.model.text(), state, sampler, &config, &mut |_| Ok(false))
        .unwrap()
}

fn greedy(c: &Case, state: Prefilled, n: usize) -> Vec<u32> {
    generate(c, state, n, vec![]).tokens
}

/// Index of the largest logit (written here, independent of the sampler).
fn argmax(xs: &[f32]) -> u32 {
    let best = xs
        .iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > xs[b] { i } else { b });
    best as u32
}

#[test]
fn keep_all_is_exactly_a_noop() {
    for c in cases() {
        let base = prefill(&c, &PruneSpec::default());
        let want = last_logits(&c, &base.state);
        let want_tokens = greedy(&c, base.state, 6);
        let n = c.model.config().image_tokens_per_image();
        for p in Policy::ALL {
            for budget in [Budget::Ratio(1.0), Budget::Count(n), Budget::Count(n + 50)] {
                let got = prefill(&c, &PruneSpec::new(p, budget));
                assert_eq!(got.stats.kept_visual_tokens, n, "{} {p}", c.name);
                assert_eq!(
                    last_logits(&c, &got.state),
                    want,
                    "{} {p} {budget}: logits differ",
                    c.name
                );
                assert_eq!(
                    greedy(&c, got.state, 6),
                    want_tokens,
                    "{} {p} {budget}",
                    c.name
                );
            }
        }
    }
}

#[test]
fn pruned_generation_runs_end_to_end() {
    for c in cases() {
        let n = c.model.config().image_tokens_per_image();
        let t = c.ids.len();
        let layers = c.model.text().num_layers();
        for p in Policy::ALL {
            for budget in [Budget::Ratio(0.5), Budget::Ratio(0.25), Budget::Count(1)] {
                let spec = PruneSpec::new(p, budget);
                let got = prefill(&c, &spec);
                let kept = got.stats.kept_visual_tokens;
                if p == Policy::None {
                    assert_eq!(kept, n);
                    continue;
                }
                // The `full` strategy's [CLS] is always kept on top of at least one patch.
                let prefix = usize::from(c.name == "mistral");
                let want = budget.resolve(n).max(prefix + 1);
                if p.stage() == Stage::InLlm {
                    assert_eq!(kept, budget.resolve(n), "{} {p} {budget}", c.name);
                } else {
                    assert_eq!(kept, want, "{} {p} {budget}", c.name);
                }
                assert_eq!(
                    got.state.prompt_len(),
                    t - n + kept,
                    "{} {p} {budget}",
                    c.name
                );
                assert_eq!(
                    got.state.last_pos() as usize,
                    t - 1,
                    "text after the image keeps its positions"
                );
                let cache = &got.state.cache;
                if p.stage() == Stage::InLlm {
                    // FastV: layers before its layer (1 for these 2-layer models) hold every row.
                    assert_eq!(cache.layer(0).len(), t);
                    assert_eq!(cache.layer(layers - 1).len(), t - n + kept);
                } else {
                    for l in 0..layers {
                        assert_eq!(
                            cache.layer(l).len(),
                            t - n + kept,
                            "{} {p}: KV cache holds only kept rows",
                            c.name
                        );
                    }
                }
                let first = argmax(&last_logits(&c, &got.state));
                let g = generate(&c, got.state, 5, vec![]);
                assert_eq!(g.finish, FinishReason::Length, "{} {p} {budget}", c.name);
                assert_eq!(g.tokens.len(), 5, "{} {p} {budget}", c.name);
                assert_eq!(g.tokens[0], first, "{} {p} {budget}: first token", c.name);
                if budget == Budget::Ratio(0.5) {
                    // The same generation with its third token as EOS stops at that token's
                    // first occurrence.
                    let eos = g.tokens[2];
                    let stop = g.tokens.iter().position(|&t| t == eos).unwrap();
                    let again = generate(&c, prefill(&c, &spec).state, 5, vec![eos]);
                    assert_eq!(again.finish, FinishReason::Eos, "{} {p}", c.name);
                    assert_eq!(again.tokens, g.tokens[..=stop], "{} {p}", c.name);
                }
            }
        }
    }
}

#[test]
fn pruning_changes_the_answer_input_but_not_the_text_positions() {
    let c = &cases()[0];
    let full = prefill(c, &PruneSpec::default());
    let pruned = prefill(c, &PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.25)));
    assert_eq!(full.state.last_pos(), pruned.state.last_pos());
    assert!(pruned.state.prompt_len() < full.state.prompt_len());
    assert_ne!(last_logits(c, &full.state), last_logits(c, &pruned.state));
}

#[test]
fn bad_requests_are_errors() {
    let c = &cases()[0];
    let mut spec = PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5));
    spec.tau = 0.0;
    assert!(prefill_llava(&c.model, &c.ids, &[&c.image], &c.query, &spec).is_err());
    let mut spec = PruneSpec::new(Policy::FastV, Budget::Ratio(0.5));
    spec.fastv_layer = Some(2); // the fixture has 2 layers: nothing after layer 2 to prune
    let e = prefill_llava(&c.model, &c.ids, &[&c.image], &c.query, &spec).unwrap_err();
    assert!(e.to_string().contains("FastV layer"), "{e}");
    // No query: the text-relevance policies say so.
    let spec = PruneSpec::new(Policy::Text, Budget::Ratio(0.5));
    let e = prefill_llava(&c.model, &c.ids, &[&c.image], &[], &spec).unwrap_err();
    assert!(e.to_string().contains("query"), "{e}");
    // Image count mismatch.
    let spec = PruneSpec::new(Policy::Saliency, Budget::Ratio(0.5));
    assert!(prefill_llava(&c.model, &c.ids, &[], &c.query, &spec).is_err());
}

#[test]
fn pre_llm_pruning_is_the_unpruned_prompt_restricted_to_kept_rows() {
    // Reference: the unpruned prompt rows, gathered at the kept rows, at their original positions.
    for c in cases() {
        let n = c.model.config().image_tokens_per_image();
        let start = c
            .ids
            .iter()
            .position(|&i| i == c.model.config().image_token_id)
            .unwrap();
        let (prefix, input) = glance_prune::llava_input(&c.model, &c.image, None).unwrap();
        let spec = PruneSpec::new(Policy::Saliency, Budget::Ratio(0.5));
        let k = Budget::Ratio(0.5).resolve(n) - prefix;
        let kept = glance_prune::select(spec.pruner().unwrap().as_ref(), &input, k).unwrap();
        let rows: Vec<usize> = (0..start + prefix)
            .chain(kept.index.iter().map(|&i| start + prefix + i))
            .chain(start + n..c.ids.len())
            .collect();
        let full = c.model.embed_prompt(&c.ids, &[&c.image.features]).unwrap();
        let positions: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = candle_core::Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
        let want = glance_decode::prefill(
            c.model.text(),
            &full.index_select(&idx, 0).unwrap(),
            &positions,
        )
        .unwrap();
        let got = prefill(&c, &spec);
        assert_eq!(got.state.prompt_len(), rows.len(), "{}", c.name);
        assert_eq!(
            last_logits(&c, &got.state),
            last_logits(&c, &want),
            "{}",
            c.name
        );
        // Decoding on the pruned cache: each greedy token is the one the kept rows plus the
        // tokens so far give when recomputed from scratch at their positions.
        let text = c.model.text();
        let mut seq = full.index_select(&idx, 0).unwrap();
        let mut pos = positions.clone();
        let mut want_tokens = Vec::new();
        for _ in 0..4 {
            let s = glance_decode::prefill(text, &seq, &pos).unwrap();
            let next = argmax(&last_logits(&c, &s));
            want_tokens.push(next);
            let x = text.embed_tokens(&[next]).unwrap();
            seq = candle_core::Tensor::cat(&[&seq, &x], 0).unwrap();
            pos.push(pos.last().unwrap() + 1);
        }
        assert_eq!(greedy(&c, got.state, 4), want_tokens, "{}", c.name);
    }
}
