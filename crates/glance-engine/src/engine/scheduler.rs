//! The one request path: every request — plain, pruned, speculative, block diffusion — is a
//! [`Sequence`] stepped by [`Engine::step`]. Each step runs at most one prefill unit (a chunk of
//! one plain prompt, or one pruned prompt whole), then one target pass over the rows every
//! decoding request asks for ([`glance_decode::step`]): plain tokens, draft trees and diffusion
//! blocks side by side, each request attending over its own cache under its own mask. Before it,
//! the speculative requests' draft heads run level by level, one pass per head and level for all
//! the requests sharing it. A row gets the bits it gets when its request runs alone, draft rows
//! included, so every lossless contract holds under load.
//! [`Engine::generate`] is this loop with one sequence; the server's worker runs it with many.
//!
//! ```text
//! Engine::prepare(request)      validate, render, tokenise, encode images (cached), plan,
//!                               pruning's selection, the strategy                  → Prepared
//! Engine::sequence(prepared)    a Sequence in its prefill phase
//! Engine::step(&mut seqs, c)    ≤ c prompt rows of one prefilling sequence, the shared draft
//!                               passes (per head, per tree level), then one shared target
//!                               pass of every decoding sequence
//! Sequence::into_response()     when done
//! ```

use super::output::Output;
use super::{attach_images, cache_bytes, image_rows_at, kept_patches, Encoded, Engine};
use crate::cache::{tensor_bytes, CachedPrefix, PrefixKey};
use crate::request::{
    char_offsets, CacheUse, Event, FinishReason, Flow, KeptPatches, Request, Response, Timings,
    Usage,
};
use candle_core::Tensor;
use glance_core::{Error, Result, TokenId};
use glance_decode::{
    DecodeState, DecodeStrategy, DraftOutput, DraftPass, GenerateConfig, Generation, Pass,
    PassOutput, Prefilled, PrefilledImage, Sampler,
};
use glance_models::llava::{PromptPlan, SegmentKind};
use glance_nn::{AttnMask, CausalLm, DraftLm, KvCache};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod sharing;
use sharing::{absorb_each, fail_shared, loads, map_seqs};

/// Prompt rows per prefill pass of a request answered alone ([`Engine::generate`]): a long
/// prompt's attention then materialises `(heads, 512, keys)` scores per layer instead of
/// `(heads, keys, keys)` (1.1 GB at LLaVA-NeXT-7B's 2,953-row prompt).
const ALONE_PREFILL_CHUNK: usize = 512;

/// Prompt rows per prefill pass of a request answered alone on a model whose decoder's linear
/// weights take at most [`CACHE_RESIDENT_BYTES`] (glance-tiny: 12.8 MB in f32). Such weights
/// stay in the CPU's caches between decode steps, and a pass over a whole 265-row prompt evicts
/// them: the steps after it ran 1.40, 0.96, 0.75 … 0.31 ms against 0.25–0.30 ms after the prompt
/// run row by row (`crates/glance-engine/tests/cold_steps.rs`). Passes of 64 rows also take the
/// multi-row kernel instead of a GEMM. Whole answers alone ran 0.96× as long (`glance eval --n
/// 20`, docs/auto.md).
const CACHE_RESIDENT_PREFILL_CHUNK: usize = 64;

/// Linear weights small enough for [`CACHE_RESIDENT_PREFILL_CHUNK`]: a share of the 32 MB
/// last-level cache the CPUs measured here have (a larger model streams its weights from memory
/// each pass anyway, and its prefill is fastest in large passes).
const CACHE_RESIDENT_BYTES: usize = 16 << 20;

/// Rows a request's KV cache is reserved for beyond its prompt and token limit: the draft tree or
/// diffusion block one round verifies before the rejected rows are rolled back.
const RESERVE_SPECULATIVE_ROWS: usize = 64;

/// The most answer tokens a request's KV cache is reserved for up front (past them it doubles).
const RESERVE_ANSWER_ROWS: usize = 1024;

/// The prompt prefix through its last image token, shared through the engine's prefix cache:
/// reused when an earlier request computed it, else recorded once this one has.
struct PrefixPlan {
    key: PrefixKey,
    /// Rows in the prefix.
    split: usize,
    hit: Option<Arc<CachedPrefix>>,
}

/// One prompt prefilled once for the choices of a request (`n > 1`): the leading choice's
/// sequence prefills it and publishes it here; the others wait, then start their strategies
/// from forks of it (each with its own cache, sampler and output).
#[derive(Clone, Default)]
pub struct SharedPrefill(Arc<Mutex<Published>>);

/// What the leading choice published: its prefill, or why there is none (`None`: not yet).
type Published = Option<std::result::Result<Arc<Shared>, String>>;

/// After a pruned prefill: the prompt rows, the visual tokens kept, the patches each image kept.
type Kept = (usize, usize, Vec<KeptPatches>);

/// What a leading choice publishes: its prompt's prefill and what its prefill reports.
struct Shared {
    state: Prefilled,
    kept: Option<Kept>,
}

impl SharedPrefill {
    pub fn new() -> Self {
        Self::default()
    }

    /// The leading choice could not be prefilled (or never started): every follower fails with
    /// `why` (a first failure stays).
    pub fn fail(&self, why: &str) {
        let mut cell = self.0.lock().expect("not poisoned");
        if cell.is_none() {
            *cell = Some(Err(why.to_string()));
        }
    }

    fn publish(&self, shared: Shared) {
        let mut cell = self.0.lock().expect("not poisoned");
        if cell.is_none() {
            *cell = Some(Ok(Arc::new(shared)));
        }
    }

    fn get(&self) -> Published {
        self.0.lock().expect("not poisoned").clone()
    }
}

/// A prepared request's part in a [`SharedPrefill`].
enum Role {
    /// Prefills the prompt and publishes it; fails the followers if dropped before that.
    Lead(SharedPrefill),
    Follow(SharedPrefill),
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Role::Lead(share) = self {
            share.fail("the request's first choice ended before its prompt was prefilled");
        }
    }
}

/// How the prompt is prefilled.
enum Source {
    /// The plan's rows, in chunks, through the prefix cache.
    Plain {
        rows: Tensor,
        positions: Vec<u32>,
        /// Three-part (M-RoPE) positions of the rows, for Qwen2-VL.
        mrope: Option<Vec<[u32; 3]>>,
        images: Vec<PrefilledImage>,
        prefix: Option<PrefixPlan>,
    },
    /// A pruned LLaVA / InternVL plan (1-D positions), prefilled whole (FastV drops rows inside
    /// the decoder).
    Pruned {
        pruned: Box<glance_prune::Pruned>,
        /// The unpruned plan's image segments (their token ranges), for the kept patches.
        images: Vec<std::ops::Range<usize>>,
        /// Each image's token grid `(rows, cols)`, the last `rows · cols` tokens of its range.
        grids: Vec<(usize, usize)>,
    },
    /// A prompt prefilled while it was prepared (a pruned Qwen2-VL prompt: its 3-D positions
    /// go through its own prefill), with the prompt rows, visual tokens and patches it kept.
    Ready(Box<Option<(Prefilled, Kept)>>),
}

/// A request rendered, with its images encoded, its prompt planned (and pruned) and its strategy
/// built: everything before the prefill. Built off the scheduling thread (the vision tower does
/// not stall decoding).
pub struct Prepared {
    source: Source,
    strategy: Box<dyn DecodeStrategy>,
    /// Why `auto` chose the strategy, for an `auto` request.
    auto: Option<String>,
    sampling: glance_core::SamplingParams,
    /// The prompt's token ids (the repetition penalty reads them).
    prompt_ids: Vec<TokenId>,
    ignore_eos: bool,
    logprobs: Option<usize>,
    /// The grammar the answer follows, compiled.
    grammar: Option<glance_decode::Grammar>,
    max_new_tokens: usize,
    stop: Vec<String>,
    usage: Usage,
    image_hits: usize,
    vision: Duration,
    select: Duration,
    saved: Duration,
    started: Instant,
    share: Option<Role>,
}

impl Prepared {
    /// The strategy the request runs (`auto` resolved).
    pub fn strategy(&self) -> &'static str {
        self.strategy.name()
    }

    /// Makes this request's sequence prefill its prompt once for `share` (`lead`), or start from
    /// the leading sequence's prefill instead of its own. The choices of one request have the
    /// same prompt; only their sampling differs.
    pub fn share(mut self, share: &SharedPrefill, lead: bool) -> Self {
        self.share = Some(if lead {
            Role::Lead(share.clone())
        } else {
            Role::Follow(share.clone())
        });
        self
    }
}

enum Phase {
    /// `done` of the prompt rows are in the cache.
    Prefill {
        done: usize,
    },
    /// Waiting for the leading choice's prefill.
    Follow(SharedPrefill),
    /// Decoding, one target pass a step.
    Decode(Box<dyn DecodeState>),
    Done,
}

/// One request on its way through the scheduler.
pub struct Sequence<'e> {
    prepared: Prepared,
    output: Output<'e>,
    sampler: Option<Sampler>,
    config: GenerateConfig,
    cache: Option<KvCache>,
    phase: Phase,
    /// The prompt's final hidden states so far, chunk by chunk (the cached prefix's first).
    hidden: Vec<Tensor>,
    /// Compute of this prompt's prefill.
    prefill: Duration,
    generation: Option<Generation>,
    finish: Option<FinishReason>,
    error: Option<Error>,
    /// Prompt rows whose keys and values came from the prefix cache.
    prefix_rows: usize,
    /// After a pruned prefill: rows and visual tokens kept, the patches each image kept.
    kept: Option<Kept>,
    /// Rows it brought to the last shared pass.
    last_rows: usize,
    /// Levels, and rows over all of them, it brought to its draft head's last passes.
    last_draft: (usize, usize),
}

impl Engine {
    /// Everything before the prefill: validation, strategy (refused at once if the model cannot
    /// run it), template, tokens, images (through the encoding cache), the prompt rows, and
    /// pruning's selection. Errors here are the request's (bad images, a prompt too long).
    pub fn prepare(&self, request: &Request) -> Result<Prepared> {
        request.validate()?;
        let started = Instant::now();
        let (strategy, auto) = self.strategy(request)?;
        let prune = request.prune.as_ref().filter(|p| !p.is_noop());
        self.pool.install(|| {
            let rendered = self.render(
                &request.prompt,
                request.continue_final_message,
                prune.is_some_and(|p| p.policy.uses_query()),
                request.tools.as_ref(),
            )?;
            let encoded = self.encode_all(&rendered.images)?;
            let (vision, saved, image_hits) = super::encode_costs(&encoded);
            let plan = self.plan(&rendered.prompt.ids, &encoded)?;
            let visual = plan.visual_tokens();
            let prompt_ids = plan.ids.clone();
            let (source, select) = match prune {
                None => (self.plain_source(plan, &encoded)?, Duration::ZERO),
                Some(spec) if self.model.uses_mrope() => {
                    let model = match &self.model {
                        super::Model::Qwen2Vl(m) => m.clone(),
                        other => return Err(other.only_llava()),
                    };
                    let out =
                        self.prefill_pruned_qwen(&model, plan, &encoded, &rendered.query, spec)?;
                    let kept = (
                        out.state.prompt_len(),
                        out.kept_visual.unwrap_or(visual),
                        out.kept_patches,
                    );
                    (Source::Ready(Box::new(Some((out.state, kept)))), out.select)
                }
                Some(spec) => {
                    let query = self.processor.query_ids(&rendered.query)?;
                    let images = plan
                        .segments
                        .iter()
                        .filter(|s| matches!(s.kind, SegmentKind::Image { .. }))
                        .map(|s| s.source.clone())
                        .collect();
                    let (pruned, grids) = self.transform_1d(plan, &encoded, &query, spec)?;
                    let positions = pruned.plan.positions();
                    glance_decode::check_prompt(self.model.text(), positions.len(), &positions)?;
                    let select = pruned.stats.select_time;
                    let source = Source::Pruned {
                        pruned: Box::new(pruned),
                        images,
                        grids,
                    };
                    (source, select)
                }
            };
            Ok(Prepared {
                source,
                strategy,
                auto,
                usage: Usage {
                    prompt_tokens: rendered.prompt.ids.len(),
                    visual_tokens: visual,
                    kept_visual_tokens: visual,
                    prompt_rows: 0,
                    completion_tokens: 0,
                },
                sampling: request.sampling.clone(),
                prompt_ids,
                ignore_eos: request.ignore_eos,
                logprobs: request.logprobs,
                grammar: request
                    .format
                    .as_ref()
                    .map(|f| self.grammar(f))
                    .transpose()?,
                max_new_tokens: request.max_new_tokens,
                stop: request.stop.clone(),
                image_hits,
                vision,
                select,
                saved,
                started,
                share: None,
            })
        })
    }

    /// An unpruned prompt's rows, their images, and its prefix: the prompt through its last image
    /// token is shared through the prefix cache.
    fn plain_source(&self, plan: PromptPlan, encoded: &[Encoded]) -> Result<Source> {
        let rows = plan.rows()?;
        let mrope = plan.mrope_positions();
        // An M-RoPE row's scalar position is its largest part (where decoding continues from).
        let positions = match &mrope {
            Some(m) => m.iter().map(|p| p[0].max(p[1]).max(p[2])).collect(),
            None => plan.positions(),
        };
        glance_decode::check_prompt(self.model.text(), rows.dim(0)?, &positions)?;
        let images = image_rows_at(&plan, &positions);
        let image_id = self.model.config().image_token_id;
        let prefix = match plan.ids.iter().rposition(|&i| i == image_id) {
            Some(p) if self.prefixes.enabled() && p + 1 < plan.ids.len() => {
                let key = PrefixKey {
                    ids: plan.ids[..p + 1].to_vec(),
                    images: encoded.iter().map(|e| e.key).collect(),
                };
                let hit = self.prefixes.get(&key);
                Some(PrefixPlan {
                    key,
                    split: p + 1,
                    hit,
                })
            }
            _ => None,
        };
        Ok(Source::Plain {
            rows,
            positions,
            mrope,
            images,
            prefix,
        })
    }

    /// A sequence ready to be stepped; its text streams through `on_event`, which may cancel.
    pub fn sequence<'e>(
        &'e self,
        prepared: Prepared,
        on_event: Box<dyn FnMut(Event) -> Flow + Send + 'e>,
    ) -> Result<Sequence<'e>> {
        let text = self.model.text();
        let mut prepared = prepared;
        let follows = matches!(prepared.share, Some(Role::Follow(_)));
        let (mut cache, done, hidden, prefix_rows) = match &prepared.source {
            // A follower starts from its leader's prefill: nothing of its own to set up.
            _ if follows => (None, 0, Vec::new(), 0),
            Source::Plain {
                prefix:
                    Some(PrefixPlan {
                        hit: Some(entry), ..
                    }),
                ..
            } => {
                prepared.saved += entry.state.elapsed;
                let rows = entry.state.positions.len();
                (
                    Some(entry.state.cache.fork()?),
                    rows,
                    vec![entry.state.hidden.clone()],
                    rows,
                )
            }
            Source::Plain { .. } => (Some(text.new_cache()), 0, Vec::new(), 0),
            Source::Pruned { .. } | Source::Ready(_) => (None, 0, Vec::new(), 0),
        };
        if let (Some(cache), Source::Plain { positions, .. }) = (&mut cache, &prepared.source) {
            // The prompt, the answer (its first `RESERVE_ANSWER_ROWS` tokens: a large token limit
            // is no promise of a long answer) and a round's speculative rows, allocated once
            // (a cached prefix's fork grows to them once too).
            let answer = prepared.max_new_tokens.min(RESERVE_ANSWER_ROWS);
            cache.reserve(positions.len() + answer + RESERVE_SPECULATIVE_ROWS);
        }
        let (sampler, sink) =
            self.sampler(&prepared.sampling, prepared.logprobs, &prepared.prompt_ids)?;
        let sampler = match prepared.grammar.take() {
            Some(g) => sampler.with_grammar(g),
            None => sampler,
        };
        let config = GenerateConfig {
            max_new_tokens: prepared.max_new_tokens,
            eos_token_ids: self.eos(prepared.ignore_eos).to_vec(),
        };
        let output = Output::new(
            on_event,
            sink,
            self.processor.text.stream_decoder(),
            prepared.stop.clone(),
        );
        let phase = match &prepared.share {
            Some(Role::Follow(share)) => Phase::Follow(share.clone()),
            _ => Phase::Prefill { done },
        };
        Ok(Sequence {
            prepared,
            output,
            sampler: Some(sampler),
            config,
            cache,
            phase,
            hidden,
            prefill: Duration::ZERO,
            generation: None,
            finish: None,
            error: None,
            prefix_rows,
            kept: None,
            last_rows: 0,
            last_draft: (0, 0),
        })
    }

    /// Answers `request` alone: the scheduler's loop with one sequence, streaming the answer's
    /// text through `on_event`, which may cancel.
    pub fn generate(
        &self,
        request: &Request,
        on_event: &mut (dyn FnMut(Event) -> Flow + Send),
    ) -> Result<Response> {
        let prepared = self.prepare(request)?;
        let mut seqs = vec![self.sequence(prepared, Box::new(on_event))?];
        let chunk = if self.model.text().linear_weight_bytes() <= CACHE_RESIDENT_BYTES {
            CACHE_RESIDENT_PREFILL_CHUNK
        } else {
            ALONE_PREFILL_CHUNK
        };
        // One entry into the pool for the whole answer (not one per step).
        self.pool.install(|| {
            while !seqs[0].is_done() {
                self.step_in_pool(&mut seqs, chunk);
            }
        });
        // A non-finite failure names the layer (of the vision tower, the projector or the
        // decoder) whose output first is not finite.
        seqs.pop()
            .expect("one sequence")
            .into_response()
            .map_err(|e| {
                self.pool
                    .install(|| self.explain_non_finite(e, &request.prompt))
            })
    }

    /// One scheduling step: up to `prefill_chunk` prompt rows of the first sequence still
    /// prefilling (a pruned prompt whole), then one target pass over the rows of every decoding
    /// sequence. A failure ends only the sequences it concerns.
    pub fn step(&self, seqs: &mut [Sequence<'_>], prefill_chunk: usize) {
        self.pool.install(|| self.step_in_pool(seqs, prefill_chunk))
    }

    /// [`Engine::step`] on a thread of the engine's pool.
    fn step_in_pool(&self, seqs: &mut [Sequence<'_>], prefill_chunk: usize) {
        {
            if let Some(s) = seqs
                .iter_mut()
                .find(|s| matches!(s.phase, Phase::Prefill { .. }))
            {
                if let Err(e) = self.prefill_unit(s, prefill_chunk.max(1)) {
                    if let Some(Role::Lead(share)) = &s.prepared.share {
                        share.fail(&e.to_string());
                    }
                    s.fail(e);
                }
            }
            for s in seqs.iter_mut() {
                if let Err(e) = self.follow(s) {
                    s.fail(e);
                }
            }
            self.decode_step(seqs);
        }
    }

    /// The answer of a finished sequence ([`Sequence::into_response`]), a non-finite failure
    /// naming the first decoder layer (or the prompt rows) whose output is not finite.
    pub fn response(&self, mut s: Sequence<'_>) -> Result<Response> {
        let Some(e) = s.error.take() else {
            return s.into_response();
        };
        let rows = match &s.prepared.source {
            Source::Plain {
                rows, positions, ..
            } => Some((rows.clone(), positions.clone())),
            Source::Pruned { pruned, .. } => pruned
                .plan
                .rows()
                .ok()
                .map(|rows| (rows, pruned.plan.positions())),
            Source::Ready(_) => None,
        };
        Err(match rows {
            Some((rows, positions)) => self
                .pool
                .install(|| self.explain_non_finite_rows(e, &rows, &positions)),
            None => e,
        })
    }

    /// Prefills the next unit of `s`: a chunk of a plain prompt, or a pruned prompt whole; when
    /// the prompt is in, its strategy starts.
    fn prefill_unit(&self, s: &mut Sequence<'_>, chunk: usize) -> Result<()> {
        let Phase::Prefill { done } = s.phase else {
            return Ok(());
        };
        let start = Instant::now();
        let text = self.model.text();
        let ready = match &mut s.prepared.source {
            Source::Ready(ready) => Some(
                ready
                    .take()
                    .ok_or_else(|| Error::Input("a prefilled prompt was taken twice".into()))?,
            ),
            _ => None,
        };
        let state = match &s.prepared.source {
            Source::Ready(_) => {
                let (state, kept) = ready.expect("taken above");
                s.kept = Some(kept);
                s.prefill = state.elapsed;
                state
            }
            Source::Pruned {
                pruned,
                images,
                grids,
            } => {
                let mut state = glance_prune::prefill_1d(self.model.text(), pruned)?;
                attach_images(&mut state, &pruned.plan);
                // A LLaVA-NeXT image reports its base image's patches.
                let anyres = self.model.llava().is_ok_and(|m| m.config().is_next());
                let patches = kept_patches(images, grids, &state.positions, anyres);
                s.kept = Some((state.prompt_len(), pruned.stats.kept_visual_tokens, patches));
                s.prefill = state.elapsed;
                state
            }
            Source::Plain {
                rows,
                positions,
                mrope,
                images,
                prefix,
            } => {
                let t = positions.len();
                // On a prefix-cache miss, no chunk crosses the end of the prefix.
                let record = match prefix {
                    Some(p) if p.hit.is_none() && done < p.split => Some(p.split),
                    _ => None,
                };
                let n = chunk.min(record.unwrap_or(t) - done);
                let cache = s.cache.as_mut().expect("a plain prefill has a cache");
                // (n, hidden): these rows after every cached one.
                let chunk_rows = rows.narrow(0, done, n)?;
                let causal = AttnMask::causal();
                let hidden = match mrope {
                    Some(m) => {
                        text.forward_mrope(&chunk_rows, &m[done..done + n], &causal, cache)?
                    }
                    None => {
                        text.forward(&chunk_rows, &positions[done..done + n], &causal, cache)?
                    }
                };
                s.hidden.push(hidden);
                s.prefill += start.elapsed();
                if let (Some(split), Some(p)) = (record, prefix) {
                    if done + n == split {
                        let prefix = Prefilled {
                            cache: cache.fork()?,
                            inputs: rows.narrow(0, 0, split)?,
                            // (split, hidden): the chunks so far are exactly the prefix.
                            hidden: Tensor::cat(&s.hidden, 0)?,
                            positions: positions[..split].to_vec(),
                            images: Vec::new(),
                            elapsed: s.prefill,
                        };
                        self.record_prefix(&p.key, prefix);
                    }
                }
                if done + n < t {
                    s.phase = Phase::Prefill { done: done + n };
                    return Ok(());
                }
                Prefilled {
                    cache: s.cache.take().expect("checked"),
                    inputs: rows.clone(),
                    hidden: Tensor::cat(&std::mem::take(&mut s.hidden), 0)?,
                    positions: positions.clone(),
                    images: images.clone(),
                    elapsed: s.prefill,
                }
            }
        };
        if let Some(Role::Lead(share)) = &s.prepared.share {
            share.publish(Shared {
                state: fork(&state)?,
                kept: s.kept.clone(),
            });
        }
        self.start(s, state)
    }

    /// Starts the strategy of `s` on its prefilled prompt.
    fn start(&self, s: &mut Sequence<'_>, state: Prefilled) -> Result<()> {
        let sampler = s.sampler.take().expect("the strategy starts once");
        let decoding = s
            .prepared
            .strategy
            .start(self.model.text(), state, sampler, &s.config)?;
        s.phase = Phase::Decode(decoding);
        Ok(())
    }

    /// A follower whose leading choice has published its prefill starts from a fork of it.
    fn follow(&self, s: &mut Sequence<'_>) -> Result<()> {
        let Phase::Follow(share) = &s.phase else {
            return Ok(());
        };
        match share.get() {
            None => Ok(()),
            Some(Err(why)) => Err(Error::Input(why)),
            Some(Ok(shared)) => {
                s.kept = shared.kept.clone();
                // Every prompt row came from the leading choice.
                s.prefix_rows = shared.state.prompt_len();
                s.prepared.saved += shared.state.elapsed;
                let mut state = fork(&shared.state)?;
                state.elapsed = Duration::ZERO;
                self.start(s, state)
            }
        }
    }

    /// Puts a prompt's prefix in the prefix cache: its keys and values, final hidden states and
    /// positions, and what they cost.
    fn record_prefix(&self, key: &PrefixKey, state: Prefilled) {
        let bytes =
            tensor_bytes(&state.hidden) + cache_bytes(self.model.config(), state.prompt_len());
        self.prefixes
            .insert(key.clone(), Arc::new(CachedPrefix { state }), bytes);
    }

    /// One target pass over the rows every decoding sequence asks for, after the draft heads'
    /// passes for it ([`Engine::draft_passes`]).
    fn decode_step(&self, seqs: &mut [Sequence<'_>]) {
        let text = self.model.text();
        for (i, load) in loads(seqs).into_iter().enumerate() {
            if let Phase::Decode(state) = &mut seqs[i].phase {
                state.share(load);
            }
        }
        self.draft_passes(seqs);
        // Each sequence's own work for the pass — independent of the others, so the sequences
        // run it in parallel on the engine's pool.
        let ask = |s: &mut Sequence<'_>| {
            let Phase::Decode(state) = &mut s.phase else {
                return None;
            };
            let output = &mut s.output;
            Some(state.next_pass(text, &mut |id| output.push(id)))
        };
        let parallel = seqs.iter().filter(|s| s.is_decoding()).count() > 1;
        let asked: Vec<Option<Result<Option<Pass>>>> = map_seqs(seqs, parallel, ask);
        let mut passes: Vec<(usize, Pass)> = Vec::new();
        for (i, asked) in asked.into_iter().enumerate() {
            seqs[i].last_rows = match &asked {
                Some(Ok(Some(pass))) => pass.rows(),
                _ => 0,
            };
            match asked {
                None => {}
                Some(Ok(Some(pass))) => passes.push((i, pass)),
                Some(Ok(None)) => seqs[i].conclude(),
                Some(Err(e)) => seqs[i].fail(e),
            }
        }
        if passes.is_empty() {
            return;
        }
        // Each pass with its sequence's cache, in sequence order.
        let mut jobs: Vec<(&Pass, &mut KvCache)> = Vec::with_capacity(passes.len());
        let mut next = passes.iter().peekable();
        for (i, s) in seqs.iter_mut().enumerate() {
            if let (Some((j, pass)), Phase::Decode(state)) = (next.peek(), &mut s.phase) {
                if *j == i {
                    jobs.push((pass, state.cache()));
                    next.next();
                }
            }
        }
        let outputs = glance_decode::shared_pass(text, &mut jobs);
        drop(jobs);
        let outputs = match outputs {
            Ok(o) => o,
            Err(e) => {
                fail_shared(seqs, passes.iter().map(|(i, _)| *i), &e);
                return;
            }
        };
        let mut outs: Vec<Option<PassOutput>> = (0..seqs.len()).map(|_| None).collect();
        for ((i, _), out) in passes.iter().zip(outputs) {
            outs[*i] = Some(out);
        }
        // Verification, the cache's rows, the emitted tokens: each sequence's own, in parallel.
        let absorb = |(s, out): (&mut Sequence<'_>, Option<PassOutput>)| {
            let out = out?;
            let Phase::Decode(state) = &mut s.phase else {
                return None;
            };
            let output = &mut s.output;
            state.absorb(text, out, &mut |id| output.push(id)).err()
        };
        absorb_each(seqs, outs, passes.len() > 1, absorb);
    }

    /// The draft heads' passes before a target pass, level by level: every decoding sequence
    /// says which rows it needs from its head ([`DecodeState::draft_pass`]: its pending rows,
    /// then one level of its tree), the sequences sharing a head run theirs in one pass
    /// ([`glance_decode::shared_draft_pass`]: the head's layer and its draft logits, each read
    /// once), and each takes its outputs back, until none has a draft pass left. Trees of
    /// different depths drop out of the later levels. Each sequence's own work (opening its
    /// round, fusing its rows, ranking its tree) runs in parallel on the engine's pool.
    fn draft_passes(&self, seqs: &mut [Sequence<'_>]) {
        let text = self.model.text();
        for s in seqs.iter_mut() {
            s.last_draft = (0, 0);
        }
        loop {
            let parallel = seqs.iter().filter(|s| s.is_decoding()).count() > 1;
            let ask = |s: &mut Sequence<'_>| {
                let Phase::Decode(state) = &mut s.phase else {
                    return None;
                };
                let output = &mut s.output;
                Some(state.draft_pass(text, &mut |id| output.push(id)))
            };
            let asked: Vec<Option<Result<Option<DraftPass>>>> = map_seqs(seqs, parallel, ask);
            let mut passes: Vec<Option<DraftPass>> = Vec::with_capacity(seqs.len());
            for (i, asked) in asked.into_iter().enumerate() {
                passes.push(match asked {
                    Some(Ok(pass)) => pass,
                    Some(Err(e)) => {
                        seqs[i].fail(e);
                        None
                    }
                    None => None,
                });
            }
            if passes.iter().all(Option::is_none) {
                return;
            }
            // The heads, each with the sequences whose passes run on it.
            let mut heads: Vec<(Arc<dyn DraftLm>, Vec<usize>)> = Vec::new();
            for (i, s) in seqs.iter_mut().enumerate() {
                let (Some(_), Phase::Decode(state)) = (&passes[i], &s.phase) else {
                    continue;
                };
                let Some(head) = state.draft() else {
                    s.fail(Error::Input("a draft pass without a draft head".into()));
                    passes[i] = None;
                    continue;
                };
                match heads.iter_mut().find(|(h, _)| Arc::ptr_eq(h, head)) {
                    Some((_, members)) => members.push(i),
                    None => heads.push((head.clone(), vec![i])),
                }
            }
            let mut outs: Vec<Option<DraftOutput>> = (0..seqs.len()).map(|_| None).collect();
            for (head, members) in &heads {
                // Each pass with its sequence's draft cache, in sequence order.
                let mut jobs: Vec<(&DraftPass, &mut KvCache)> = Vec::with_capacity(members.len());
                let mut ran = Vec::with_capacity(members.len());
                for (i, s) in seqs.iter_mut().enumerate() {
                    if !members.contains(&i) {
                        continue;
                    }
                    let (Some(pass), Phase::Decode(state)) = (&passes[i], &mut s.phase) else {
                        continue;
                    };
                    if let Some(cache) = state.draft_cache() {
                        jobs.push((pass, cache));
                        ran.push(i);
                        s.last_draft.0 += 1;
                        s.last_draft.1 += pass.positions.len();
                    }
                }
                let done = glance_decode::shared_draft_pass(text, head.as_ref(), &mut jobs);
                drop(jobs);
                match done {
                    Ok(done) => {
                        for (i, out) in ran.into_iter().zip(done) {
                            outs[i] = Some(out);
                        }
                    }
                    Err(e) => fail_shared(seqs, ran, &e),
                }
            }
            let absorb = |(s, out): (&mut Sequence<'_>, Option<DraftOutput>)| {
                let out = out?;
                let Phase::Decode(state) = &mut s.phase else {
                    return None;
                };
                state.absorb_draft(text, out).err()
            };
            absorb_each(seqs, outs, parallel, absorb);
        }
    }
}

impl Sequence<'_> {
    /// Whether the sequence has ended (answered, stopped, cancelled or failed).
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Whether its prompt is in and it is decoding.
    pub fn is_decoding(&self) -> bool {
        matches!(self.phase, Phase::Decode(_))
    }

    /// The strategy it runs.
    pub fn strategy(&self) -> &'static str {
        self.prepared.strategy()
    }

    /// When its first token was picked.
    pub fn first_token_at(&self) -> Option<Instant> {
        self.output.first_token
    }

    fn fail(&mut self, e: Error) {
        self.error = Some(e);
        self.phase = Phase::Done;
    }

    /// The strategy ended: the generation and the answer's finish reason.
    fn conclude(&mut self) {
        let Phase::Decode(state) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        let generation = state.finish();
        match self.output.finish(generation.finish) {
            Ok(reason) => self.finish = Some(reason),
            Err(e) => self.error = Some(e),
        }
        self.generation = Some(generation);
    }

    /// The answer, once [`Sequence::is_done`] (errors as they happened: [`Engine::response`]
    /// explains a non-finite one). Time to first token is wall time from
    /// [`Engine::prepare`] (scheduled with other requests, it includes their steps);
    /// `prefill_s` is the compute of this prompt's prefill.
    pub fn into_response(mut self) -> Result<Response> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let Some(mut generation) = self.generation.take() else {
            return Err(Error::Input(
                "the request ended before it was answered".into(),
            ));
        };
        let p = &self.prepared;
        let first = self.output.first_token.unwrap_or_else(Instant::now);
        let ttft = first.saturating_duration_since(p.started);
        let (prompt_rows, kept_visual, kept_patches) = match self.kept.take() {
            Some(k) => k,
            None => (generation.prompt_len, p.usage.visual_tokens, Vec::new()),
        };
        let usage = Usage {
            completion_tokens: generation.tokens.len(),
            kept_visual_tokens: kept_visual,
            prompt_rows,
            ..p.usage
        };
        generation.stats.auto = p.auto.clone();
        let logprobs = self.output.take_logprobs();
        Ok(Response {
            token_ends: char_offsets(&self.output.text, &self.output.token_ends),
            kept_patches,
            text: std::mem::take(&mut self.output.text),
            finish_reason: self.finish.unwrap_or(FinishReason::Cancelled),
            usage,
            timings: Timings {
                preprocess_s: ttft
                    .saturating_sub(p.vision + p.select + generation.prefill)
                    .as_secs_f64(),
                vision_s: p.vision.as_secs_f64(),
                prune_select_s: p.select.as_secs_f64(),
                prefill_s: generation.prefill.as_secs_f64(),
                time_to_first_token_s: ttft.as_secs_f64(),
                decode_s: generation.decode.as_secs_f64(),
                decode_tokens_per_s: generation.decode_tokens_per_sec(),
                cache_saved_s: p.saved.as_secs_f64(),
            },
            cache: CacheUse {
                image_hits: p.image_hits,
                prefix_rows: self.prefix_rows,
            },
            token_ids: generation.tokens,
            decode: generation.stats,
            logprobs,
        })
    }
}

/// A prefill state another sequence can continue from (the cache forked, the tensors shared).
fn fork(state: &Prefilled) -> Result<Prefilled> {
    Ok(Prefilled {
        cache: state.cache.fork()?,
        inputs: state.inputs.clone(),
        hidden: state.hidden.clone(),
        positions: state.positions.clone(),
        images: state.images.clone(),
        elapsed: state.elapsed,
    })
}
