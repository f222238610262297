//! One scheduler for every request: plain, pruned (token-level and FastV), speculative (ViSpec,
//! EAGLE, cost-aware `auto`) and block-diffusion requests decode side by side in shared target
//! passes, joining at different steps with their prompts prefilled in chunks, and each gets
//! exactly the tokens, text and finish reason it gets alone — greedy and seeded.

mod common;

use candle_core::Tensor;
use common::{head_with_vocab, scheduled, shipped, world_image};
use glance_core::SamplingParams;
use glance_engine::{
    DecodeSpec, Engine, EngineOptions, Flow, ImageInput, Request, Response, Sequence,
};
use glance_engine::{DiffusionMode, DraftKind};
use glance_nn::{
    AttnMask, CausalLm, DraftContext, DraftLm, DraftLogits, DraftPrompt, DraftStart, KvCache,
    RowGroup,
};
use glance_prune::{Budget, Policy, PruneSpec};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn ask(text: &str, images: Vec<ImageInput>, n: usize, decode: DecodeSpec) -> Request {
    Request {
        max_new_tokens: n,
        decode,
        ..Request::chat(text, images)
    }
}

fn pruned(mut r: Request, policy: Policy, keep: f64) -> Request {
    r.prune = Some(PruneSpec::new(policy, Budget::Ratio(keep)));
    r
}

fn check_against_solo(engine: &Engine, requests: &[Request], chunk: usize, at_once: usize) {
    let (got, widest) = scheduled(engine, requests, chunk);
    assert!(
        widest >= at_once,
        "at most {widest} sequences decoded in one step"
    );
    for (r, (g, streamed)) in requests.iter().zip(got) {
        let solo = engine.generate(r, &mut |_| Flow::Continue).unwrap();
        let what = format!("{} / {:?}", r.decode, r.prune.as_ref().map(|p| p.policy));
        assert_eq!(g.token_ids, solo.token_ids, "{what}");
        assert_eq!(g.text, solo.text, "{what}");
        assert_eq!(streamed, solo.text, "{what}");
        assert_eq!(g.finish_reason, solo.finish_reason, "{what}");
        assert_eq!(g.decode.strategy, solo.decode.strategy, "{what}");
        assert_eq!(g.usage, solo.usage, "{what}");
        assert_eq!(g.kept_patches, solo.kept_patches, "{what}");
    }
}

#[test]
fn requests_of_every_kind_share_passes_and_keep_their_solo_tokens() {
    let e = Engine::load(&shipped("glance-tiny"), EngineOptions::default()).unwrap();
    let describe = "Describe the image.";
    let mut sampled = ask(
        describe,
        vec![world_image(3)],
        24,
        DecodeSpec::speculative(DraftKind::Vispec),
    );
    sampled.sampling = SamplingParams {
        top_p: 0.9,
        ..SamplingParams::sampled(0.7, 5)
    };
    let mut stopped = ask(
        describe,
        vec![world_image(4)],
        30,
        DecodeSpec::speculative(DraftKind::Eagle),
    );
    stopped.stop = vec![" and".into()];
    let requests = vec![
        ask(
            describe,
            vec![world_image(0)],
            32,
            DecodeSpec::speculative(DraftKind::Vispec),
        ),
        ask(
            describe,
            vec![world_image(1)],
            24,
            DecodeSpec::Autoregressive,
        ),
        ask(
            "What is one plus one?",
            vec![],
            12,
            DecodeSpec::speculative(DraftKind::Eagle),
        ),
        pruned(
            ask(
                describe,
                vec![world_image(2)],
                28,
                DecodeSpec::speculative(DraftKind::Vispec),
            ),
            Policy::Adaptive,
            0.125,
        ),
        sampled,
        pruned(
            ask(
                describe,
                vec![world_image(5)],
                20,
                DecodeSpec::Autoregressive,
            ),
            Policy::FastV,
            0.25,
        ),
        stopped,
        ask(
            describe,
            vec![world_image(6), world_image(7)],
            16,
            DecodeSpec::auto(),
        ),
        ask(
            describe,
            vec![world_image(0)],
            20,
            DecodeSpec::speculative(DraftKind::Eagle),
        ),
    ];
    check_against_solo(&e, &requests, 96, 4);
}

#[test]
fn block_diffusion_requests_share_passes_with_plain_ones() {
    let e = Engine::load(&shipped("glance-tiny-dvlm"), EngineOptions::default()).unwrap();
    let describe = "Describe the image.";
    let mut sampled = ask(
        describe,
        vec![world_image(2)],
        20,
        DecodeSpec::diffusion(DiffusionMode::Linear),
    );
    sampled.sampling = SamplingParams::sampled(0.8, 9);
    let requests = vec![
        ask(
            describe,
            vec![world_image(0)],
            32,
            DecodeSpec::diffusion(DiffusionMode::Linear),
        ),
        ask(
            describe,
            vec![world_image(1)],
            24,
            DecodeSpec::diffusion(DiffusionMode::Quadratic),
        ),
        ask(
            describe,
            vec![world_image(2)],
            16,
            DecodeSpec::Autoregressive,
        ),
        ask(
            describe,
            vec![world_image(3)],
            24,
            DecodeSpec::diffusion(DiffusionMode::Threshold),
        ),
        sampled,
        pruned(
            ask(
                describe,
                vec![world_image(4)],
                24,
                DecodeSpec::diffusion(DiffusionMode::Linear),
            ),
            Policy::Adaptive,
            0.25,
        ),
    ];
    check_against_solo(&e, &requests, 64, 3);
}

/// The choices of one request (`n > 1`) prefill their prompt once: the first computes it, the
/// others start from forks of it, and each answers as it does alone with its own seed; pruned
/// and speculative choices too. A first choice that never runs fails the others clearly.
#[test]
fn choices_share_one_prefill_and_answer_as_alone() {
    use glance_engine::SharedPrefill;
    let e = Engine::load(&shipped("glance-tiny"), EngineOptions::single_request()).unwrap();
    for (decode, prune) in [
        (DecodeSpec::Autoregressive, None),
        (
            DecodeSpec::speculative(DraftKind::Vispec),
            Some(Policy::Adaptive),
        ),
    ] {
        let choices: Vec<Request> = (0..3)
            .map(|i| {
                let mut r = ask(
                    "Describe the image.",
                    vec![world_image(1)],
                    24,
                    decode.clone(),
                );
                if let Some(p) = prune {
                    r = pruned(r, p, 0.25);
                }
                r.sampling = SamplingParams::sampled(0.9, 40 + i);
                r
            })
            .collect();
        let share = SharedPrefill::new();
        let mut seqs: Vec<Sequence<'_>> = choices
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let p = e.prepare(r).unwrap().share(&share, i == 0);
                e.sequence(p, Box::new(|_| Flow::Continue)).unwrap()
            })
            .collect();
        while seqs.iter().any(|s| !s.is_done()) {
            e.step(&mut seqs, 64);
        }
        let got: Vec<Response> = seqs
            .into_iter()
            .map(|s| s.into_response().unwrap())
            .collect();
        for (i, (r, g)) in choices.iter().zip(&got).enumerate() {
            let solo = e.generate(r, &mut |_| Flow::Continue).unwrap();
            assert_eq!(g.token_ids, solo.token_ids, "{decode} choice {i}");
            assert_eq!(g.usage, solo.usage, "{decode} choice {i}");
            let rows = g.usage.prompt_rows;
            assert_eq!(
                g.cache.prefix_rows,
                if i == 0 { 0 } else { rows },
                "choice {i}"
            );
        }
        assert!(
            got.windows(2).any(|w| w[0].token_ids != w[1].token_ids),
            "{decode}: three seeds gave one answer"
        );
    }
    // The first choice is dropped before it runs: the others fail, saying why.
    let share = SharedPrefill::new();
    let r = ask(
        "Describe the image.",
        vec![world_image(1)],
        8,
        DecodeSpec::Autoregressive,
    );
    let lead = e.prepare(&r).unwrap().share(&share, true);
    let mut seqs = vec![e
        .sequence(
            e.prepare(&r).unwrap().share(&share, false),
            Box::new(|_| Flow::Continue),
        )
        .unwrap()];
    drop(lead);
    e.step(&mut seqs, 64);
    let err = seqs.pop().unwrap().into_response().unwrap_err().to_string();
    assert!(err.contains("first choice"), "{err}");
}

/// A shipped head that records the most requests one of its passes served.
struct Watched {
    head: glance_models::draft::DraftHead,
    widest: AtomicUsize,
}

impl DraftLm for Watched {
    fn kind(&self) -> DraftKind {
        self.head.kind()
    }
    fn new_cache(&self) -> KvCache {
        self.head.new_cache()
    }
    fn start(&self, p: &DraftPrompt<'_>) -> glance_core::Result<DraftStart> {
        self.head.start(p)
    }
    fn start_rows(&self, rows: usize, image_rows: &[usize]) -> usize {
        self.head.start_rows(rows, image_rows)
    }
    fn fuse(&self, emb: &Tensor, prev: &Tensor, c: &DraftContext) -> glance_core::Result<Tensor> {
        self.head.fuse(emb, prev, c)
    }
    fn forward(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> glance_core::Result<Tensor> {
        self.head.forward(xs, positions, mask, cache)
    }
    fn forward_groups(
        &self,
        xs: &Tensor,
        groups: &mut [RowGroup<'_>],
    ) -> glance_core::Result<Tensor> {
        self.widest.fetch_max(groups.len(), Ordering::Relaxed);
        self.head.forward_groups(xs, groups)
    }
    fn vocab(&self) -> Option<&[u32]> {
        self.head.vocab()
    }
    fn logits(&self, target: &dyn CausalLm, hidden: &Tensor) -> glance_core::Result<DraftLogits> {
        self.head.logits(target, hidden)
    }
    fn logits_rows(
        &self,
        target: &dyn CausalLm,
        hidden: &Tensor,
    ) -> glance_core::Result<DraftLogits> {
        self.head.logits_rows(target, hidden)
    }
}

/// The shipped `kind` head of glance-tiny, watched; with `reduced`, keeping two tokens in three
/// (a reduced draft vocabulary, FR-Spec).
fn watched(e: &Engine, kind: DraftKind, reduced: bool) -> Arc<Watched> {
    let from = shipped("glance-tiny").join(format!("draft-{kind}"));
    let dir = if reduced {
        let n = e.read_draft(&from).unwrap().vocab_size() as u32;
        head_with_vocab(
            &kind.to_string(),
            &format!("scheduler-{kind}-reduced"),
            Some((0..n).filter(|t| t % 3 != 1).collect()),
        )
    } else {
        from
    };
    Arc::new(Watched {
        head: e.read_draft(&dir).unwrap(),
        widest: AtomicUsize::new(0),
    })
}

/// Speculative requests of both kinds decode side by side, their draft heads running one pass
/// per head and tree level for all of them (trees of different depths, answers of different
/// lengths, one sampled; whole and reduced draft vocabularies), and each gets exactly its solo
/// answer.
#[test]
fn speculative_requests_draft_together_and_keep_their_solo_tokens() {
    let e = Engine::load(&shipped("glance-tiny"), EngineOptions::default()).unwrap();
    for reduced in [false, true] {
        let heads: Vec<Arc<Watched>> = DraftKind::ALL
            .iter()
            .map(|&kind| watched(&e, kind, reduced))
            .collect();
        for h in &heads {
            e.set_draft(h.clone());
        }
        speculative_side_by_side(&e, &heads);
    }
}

fn speculative_side_by_side(e: &Engine, heads: &[Arc<Watched>]) {
    let describe = "Describe the image.";
    let mut sampled = ask(
        describe,
        vec![world_image(2)],
        40,
        DecodeSpec::speculative(DraftKind::Eagle),
    );
    sampled.sampling = SamplingParams::sampled(0.8, 11);
    let mut chain = ask(
        describe,
        vec![world_image(5)],
        36,
        DecodeSpec::speculative(DraftKind::Vispec),
    );
    if let DecodeSpec::Speculative { tree, .. } = &mut chain.decode {
        *tree = Some(glance_engine::TreeSettings::chain(3));
    }
    let requests = vec![
        ask(
            describe,
            vec![world_image(0)],
            48,
            DecodeSpec::speculative(DraftKind::Vispec),
        ),
        ask(
            describe,
            vec![world_image(1)],
            44,
            DecodeSpec::speculative(DraftKind::Vispec),
        ),
        ask(
            "What is one plus one?",
            vec![],
            24,
            DecodeSpec::speculative(DraftKind::Eagle),
        ),
        sampled,
        chain,
        ask(
            describe,
            vec![world_image(3)],
            46,
            DecodeSpec::speculative(DraftKind::Eagle),
        ),
        ask(
            describe,
            vec![world_image(4)],
            32,
            DecodeSpec::speculative(DraftKind::Vispec),
        ),
    ];
    check_against_solo(e, &requests, 1024, 4);
    for h in heads {
        assert!(
            h.widest.load(Ordering::Relaxed) >= 2,
            "the {} head (vocabulary {:?}) never ran a pass for several requests",
            h.kind(),
            h.vocab().map(<[u32]>::len)
        );
    }
}
