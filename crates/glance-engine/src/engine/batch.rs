//! Continuous batching: the decode steps of several requests go through the linear and MLP
//! layers as one batch of rows, while each request keeps its own KV cache, sampler, detokeniser
//! and stop matcher. Requests join and leave between steps; a long prompt is prefilled in chunks
//! so that it delays the running requests' next token by at most one chunk.
//!
//! ```text
//! Engine::prepare(request)      render, tokenise, encode images (cached), plan  → Prepared
//! Engine::sequence(prepared)    a Sequence in its prefill phase
//! Engine::step(&mut seqs, c)    ≤ c prompt rows of one prefilling sequence, then one batched
//!                               decode step of every decoding sequence
//! Sequence::into_response()     when done
//! ```
//!
//! Only plain autoregressive requests without pruning are batched ([`Engine::batchable`]);
//! speculative and pruned requests run alone through [`Engine::generate`]. A sequence gets the
//! tokens [`Engine::generate`] gives it alone: the batched linear layers compute each row with
//! the single-row kernel's own dot products (`Linear::forward_rows`, the same bits), and the
//! attention of a batch of two or more runs a dedicated per-row kernel
//! (`glance_nn::attend_rows`) whose sums differ from the general attention's only in rounding
//! (~1e-7 relative), so only an exact near-tie could pick another token.

use super::{cache_bytes, Engine};
use crate::cache::{tensor_bytes, CachedPrefix, PrefixKey};
use crate::request::{
    char_offsets, CacheUse, Event, FinishReason, Flow, Request, Response, Timings, Usage,
};
use candle_core::Tensor;
use glance_core::{Error, Result, TokenId};
use glance_decode::stop::StopStatus;
use glance_decode::{DecodeSpec, DecodeStats, LogprobSink, Sampler, StopStrings, TokenLogprob};
use glance_models::processing::tokenizer::StreamDecoder;
use glance_nn::{AttnMask, CausalLm, KvCache};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The prompt prefix through its last image token, shared through the engine's prefix cache:
/// reused when an earlier request computed it, else recorded once this one has.
struct PrefixPlan {
    key: PrefixKey,
    /// Rows in the prefix.
    split: usize,
    hit: Option<Arc<CachedPrefix>>,
}

/// A request rendered, with its images encoded and its prompt rows embedded: everything before
/// the prefill. Built off the batching thread (the vision tower does not stall decoding).
pub struct Prepared {
    /// Prompt rows `(t, hidden)` and their positions.
    rows: Tensor,
    positions: Vec<u32>,
    sampling: glance_core::SamplingParams,
    /// The prompt's token ids (the repetition penalty reads them).
    prompt_ids: Vec<TokenId>,
    ignore_eos: bool,
    logprobs: Option<usize>,
    max_new_tokens: usize,
    stop: Vec<String>,
    usage: Usage,
    image_hits: usize,
    vision: Duration,
    saved: Duration,
    started: Instant,
    prepared_in: Duration,
    prefix: Option<PrefixPlan>,
    /// Why `auto` chose `ar`, for an `auto` request.
    auto: Option<String>,
}

enum Phase {
    /// `done` of the prompt rows are in the cache.
    Prefill {
        done: usize,
    },
    /// `next` was sampled from the row at `pos` and is fed at `pos + 1`.
    Decode {
        next: TokenId,
        pos: u32,
    },
    Done,
}

/// One request inside a batch.
pub struct Sequence<'e> {
    prepared: Prepared,
    on_event: Box<dyn FnMut(Event) -> Flow + Send + 'e>,
    sampler: Sampler,
    /// Where the sampler records log-probabilities, and those of the tokens taken so far.
    logprobs: Option<(LogprobSink, Vec<TokenLogprob>)>,
    eos: &'e [TokenId],
    max_positions: usize,
    stream: StreamDecoder<'e>,
    stops: StopStrings,
    cache: KvCache,
    phase: Phase,
    text: String,
    tokens: Vec<TokenId>,
    /// Where each token's text ends in `text`, in bytes.
    token_ends: Vec<usize>,
    forwards: u64,
    prefill: Duration,
    first_token: Option<Instant>,
    finish: Option<FinishReason>,
    error: Option<Error>,
    /// Prompt rows whose keys and values came from the prefix cache.
    prefix_rows: usize,
    /// On a prefix-cache miss: the prefix's final hidden states so far, chunk by chunk.
    prefix_hidden: Vec<Tensor>,
}

impl Engine {
    /// Whether `request` can join a batch: plain autoregressive decoding without pruning.
    /// `auto` requests join when `auto` chooses `ar` for them.
    pub fn batchable(&self, request: &Request) -> bool {
        self.batch_reason(request).is_some()
    }

    /// `Some` when `request` can join a batch, with `auto`'s reason if it chose `ar`.
    fn batch_reason(&self, request: &Request) -> Option<Option<String>> {
        // M-RoPE prompts (Qwen2-VL) prefill with 3-D positions: one request at a time.
        if self.model.uses_mrope() || request.prune.as_ref().is_some_and(|p| !p.is_noop()) {
            return None;
        }
        match request.decode {
            DecodeSpec::Ar => Some(None),
            DecodeSpec::Auto => match self.choose(request) {
                Ok(Some(c)) if c.spec == DecodeSpec::Ar => Some(Some(c.reason)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Everything before the prefill: validation, template, tokens, images (through the encoding
    /// cache), the prompt rows. Errors here are the request's (bad images, a prompt too long).
    pub fn prepare(&self, request: &Request) -> Result<Prepared> {
        request.validate()?;
        let Some(auto) = self.batch_reason(request) else {
            return Err(Error::InvalidParam(
                "only autoregressive requests without pruning are batched".into(),
            ));
        };
        let started = Instant::now();
        self.pool.install(|| {
            let rendered = self.render(&request.prompt, request.continue_final_message, false)?;
            let encoded = self.encode_all(&rendered.images)?;
            let (vision, saved, image_hits) = super::encode_costs(&encoded);
            let plan = self.plan(&rendered.prompt.ids, &encoded)?;
            let rows = plan.rows()?;
            let positions = plan.positions();
            glance_decode::check_prompt(self.model.text(), rows.dim(0)?, &positions)?;
            let visual = plan.visual_tokens();
            // As the plain path: the prompt through its last image token is a shared prefix.
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
            Ok(Prepared {
                prefix,
                auto,
                usage: Usage {
                    prompt_tokens: rendered.prompt.ids.len(),
                    visual_tokens: visual,
                    kept_visual_tokens: visual,
                    prompt_rows: positions.len(),
                    completion_tokens: 0,
                },
                rows,
                positions,
                sampling: request.sampling.clone(),
                prompt_ids: plan.ids.clone(),
                ignore_eos: request.ignore_eos,
                logprobs: request.logprobs,
                max_new_tokens: request.max_new_tokens,
                stop: request.stop.clone(),
                image_hits,
                vision,
                saved,
                started,
                prepared_in: started.elapsed(),
            })
        })
    }

    /// A sequence ready to join a batch; its text streams through `on_event`, which may cancel.
    pub fn sequence<'e>(
        &'e self,
        prepared: Prepared,
        on_event: Box<dyn FnMut(Event) -> Flow + Send + 'e>,
    ) -> Result<Sequence<'e>> {
        let text = self.model.text();
        let (cache, done, mut saved) = match prepared.prefix.as_ref().and_then(|p| p.hit.as_ref()) {
            Some(entry) => (
                entry.state.cache.fork()?,
                entry.state.positions.len(),
                entry.state.elapsed,
            ),
            None => (text.new_cache(), 0, Duration::ZERO),
        };
        saved += prepared.saved;
        let mut prepared = prepared;
        prepared.saved = saved;
        let (sampler, sink) =
            self.sampler(&prepared.sampling, prepared.logprobs, &prepared.prompt_ids)?;
        Ok(Sequence {
            prefix_rows: done,
            prefix_hidden: Vec::new(),
            sampler,
            logprobs: sink.map(|s| (s, Vec::new())),
            eos: self.eos(prepared.ignore_eos),
            stops: StopStrings::new(prepared.stop.clone()),
            prepared,
            on_event,
            max_positions: text.max_positions(),
            stream: self.processor.text.stream_decoder(),
            cache,
            phase: Phase::Prefill { done },
            text: String::new(),
            tokens: Vec::new(),
            token_ends: Vec::new(),
            forwards: 0,
            prefill: Duration::ZERO,
            first_token: None,
            finish: None,
            error: None,
        })
    }

    /// One scheduling step: up to `prefill_chunk` prompt rows of the first sequence still
    /// prefilling, then one decode step of every decoding sequence, batched. A failure ends only
    /// the sequences it concerns.
    pub fn step(&self, seqs: &mut [Sequence<'_>], prefill_chunk: usize) {
        self.pool.install(|| {
            if let Some(s) = seqs
                .iter_mut()
                .find(|s| matches!(s.phase, Phase::Prefill { .. }))
            {
                if let Err(e) = self.prefill_chunk(s, prefill_chunk.max(1)) {
                    let e =
                        self.explain_non_finite_rows(e, &s.prepared.rows, &s.prepared.positions);
                    s.fail(e);
                }
            }
            let decoding: Vec<usize> = (0..seqs.len())
                .filter(|&i| matches!(seqs[i].phase, Phase::Decode { .. }))
                .collect();
            if decoding.is_empty() {
                return;
            }
            if let Err(e) = self.decode_step(seqs, &decoding) {
                let msg = e.to_string();
                for i in decoding {
                    let e = Error::Candle(candle_core::Error::Msg(msg.clone()));
                    seqs[i].fail(e);
                }
            }
        })
    }

    fn prefill_chunk(&self, s: &mut Sequence<'_>, chunk: usize) -> Result<()> {
        let Phase::Prefill { done } = s.phase else {
            return Ok(());
        };
        let start = Instant::now();
        let text = self.model.text();
        let t = s.prepared.positions.len();
        // On a prefix-cache miss, no chunk crosses the end of the prefix.
        let record = match &s.prepared.prefix {
            Some(p) if p.hit.is_none() && done < p.split => Some(p.split),
            _ => None,
        };
        let n = chunk.min(record.unwrap_or(t) - done);
        let rows = s.prepared.rows.narrow(0, done, n)?;
        let positions = &s.prepared.positions[done..done + n];
        // (n, hidden): these rows after every cached one.
        let hidden = text.forward(&rows, positions, &AttnMask::causal(), &mut s.cache)?;
        if let Some(split) = record {
            s.prefix_hidden.push(hidden.clone());
            if done + n == split {
                self.record_prefix(s, split, start.elapsed())?;
            }
        }
        if done + n < t {
            s.phase = Phase::Prefill { done: done + n };
            s.prefill += start.elapsed();
            return Ok(());
        }
        // (1, vocab): the first token comes from the last prompt row.
        let logits: Vec<f32> = text
            .logits(&hidden.narrow(0, n - 1, 1)?)?
            .squeeze(0)?
            .to_vec1()?;
        let next = s.sampler.sample(&logits)?;
        s.prefill += start.elapsed();
        s.first_token = Some(Instant::now());
        let pos = *s.prepared.positions.last().expect("checked non-empty");
        s.accept(next, pos)
    }

    /// Puts the first `split` prefilled rows of `s` in the prefix cache (the same entry the plain
    /// path makes: their keys and values, final hidden states and positions).
    fn record_prefix(&self, s: &mut Sequence<'_>, split: usize, last: Duration) -> Result<()> {
        let Some(plan) = s.prepared.prefix.as_ref() else {
            return Ok(());
        };
        // (split, hidden)
        let hidden = Tensor::cat(&std::mem::take(&mut s.prefix_hidden), 0)?;
        let bytes = tensor_bytes(&hidden) + cache_bytes(self.model.config(), split);
        let state = glance_decode::Prefilled {
            cache: s.cache.fork()?,
            inputs: s.prepared.rows.narrow(0, 0, split)?,
            hidden,
            positions: s.prepared.positions[..split].to_vec(),
            images: Vec::new(),
            elapsed: s.prefill + last,
        };
        self.prefixes
            .insert(plan.key.clone(), Arc::new(CachedPrefix { state }), bytes);
        Ok(())
    }

    /// Feeds each decoding sequence's last token as one batch of rows.
    fn decode_step(&self, seqs: &mut [Sequence<'_>], idx: &[usize]) -> Result<()> {
        let text = self.model.text();
        let mut ids = Vec::with_capacity(idx.len());
        let mut positions = Vec::with_capacity(idx.len());
        for &i in idx {
            if let Phase::Decode { next, pos } = seqs[i].phase {
                ids.push(next);
                positions.push(pos + 1);
            }
        }
        // (n, hidden)
        let rows = text.embed_tokens(&ids)?;
        // (n, hidden), row r attending over its own cache.
        let hidden = {
            let mut caches: Vec<&mut KvCache> = seqs
                .iter_mut()
                .filter(|s| matches!(s.phase, Phase::Decode { .. }))
                .map(|s| &mut s.cache)
                .collect();
            text.forward_batch(&rows, &positions, &mut caches)?
        };
        // (n, vocab)
        let logits = text.logits_rows(&hidden)?;
        for (r, &i) in idx.iter().enumerate() {
            let s = &mut seqs[i];
            s.forwards += 1;
            let row: Vec<f32> = logits.get(r)?.to_vec1()?;
            let result = s
                .sampler
                .sample(&row)
                .and_then(|t| s.accept(t, positions[r]));
            if let Err(e) = result {
                let e = self.explain_non_finite_rows(e, &s.prepared.rows, &s.prepared.positions);
                s.fail(e);
            }
        }
        Ok(())
    }
}

impl Sequence<'_> {
    /// Whether the sequence has ended (answered, stopped, cancelled or failed).
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Whether its prompt is fully prefilled.
    pub fn is_decoding(&self) -> bool {
        matches!(self.phase, Phase::Decode { .. })
    }

    /// When its first token was picked.
    pub fn first_token_at(&self) -> Option<Instant> {
        self.first_token
    }

    fn fail(&mut self, e: Error) {
        self.error = Some(e);
        self.phase = Phase::Done;
    }

    fn emit(&mut self, piece: &str) -> Flow {
        if piece.is_empty() {
            return Flow::Continue;
        }
        self.text.push_str(piece);
        (self.on_event)(Event::Text(piece))
    }

    /// Takes token `id`, sampled from the row at `pos`: detokenise, hold back or cut at stop
    /// strings, stream, and decide whether generation ends (as the autoregressive strategy and
    /// [`Engine::generate`] do, in the same order).
    fn accept(&mut self, id: TokenId, pos: u32) -> Result<()> {
        if let Some((sink, out)) = &mut self.logprobs {
            let entry = super::take_logprob(sink, out.len(), id)?;
            if (self.on_event)(Event::Logprob(&entry)) == Flow::Cancel {
                return self.end(FinishReason::Cancelled);
            }
            out.push(entry);
        }
        self.tokens.push(id);
        let piece = self.stream.push(id)?;
        let (released, stop) = match self.stops.push(&piece) {
            StopStatus::Continue(s) => (s, false),
            StopStatus::Stopped(s) => (s, true),
        };
        let flow = self.emit(&released);
        self.token_ends.push(self.text.len());
        if flow == Flow::Cancel {
            return self.end(FinishReason::Cancelled);
        }
        if stop {
            return self.end(FinishReason::Stop);
        }
        if self.eos.contains(&id) {
            return self.flush(FinishReason::Eos);
        }
        if self.tokens.len() >= self.prepared.max_new_tokens
            || pos as usize + 2 >= self.max_positions
        {
            return self.flush(FinishReason::Length);
        }
        self.phase = Phase::Decode { next: id, pos };
        Ok(())
    }

    /// Releases what the detokeniser and the stop matcher still hold, then ends.
    fn flush(&mut self, reason: FinishReason) -> Result<()> {
        let tail = self.stream.finish()?;
        let (released, stopped) = match self.stops.push(&tail) {
            StopStatus::Continue(s) => (s + &self.stops.finish(), false),
            StopStatus::Stopped(s) => (s, true),
        };
        let flow = self.emit(&released);
        if let Some(last) = self.token_ends.last_mut() {
            *last = self.text.len();
        }
        if flow == Flow::Cancel {
            return self.end(FinishReason::Cancelled);
        }
        self.end(if stopped { FinishReason::Stop } else { reason })
    }

    fn end(&mut self, reason: FinishReason) -> Result<()> {
        self.finish = Some(reason);
        self.phase = Phase::Done;
        Ok(())
    }

    /// The answer, once [`Sequence::is_done`]. Time to first token is wall time from
    /// [`Engine::prepare`] (batched with other requests, it includes their steps);
    /// `prefill_s` is the compute of this prompt's chunks.
    pub fn into_response(self) -> Result<Response> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let p = &self.prepared;
        let first = self.first_token.unwrap_or_else(Instant::now);
        let ttft = first - p.started;
        let decode = first.elapsed();
        let later = self.tokens.len().saturating_sub(1);
        let usage = Usage {
            completion_tokens: self.tokens.len(),
            ..p.usage
        };
        // One token per pass.
        let steps = vec![1; self.tokens.len()];
        Ok(Response {
            token_ends: char_offsets(&self.text, &self.token_ends),
            kept_patches: Vec::new(),
            text: self.text,
            finish_reason: self.finish.unwrap_or(FinishReason::Cancelled),
            usage,
            timings: Timings {
                preprocess_s: p.prepared_in.saturating_sub(p.vision).as_secs_f64(),
                vision_s: p.vision.as_secs_f64(),
                prune_select_s: 0.0,
                prefill_s: self.prefill.as_secs_f64(),
                time_to_first_token_s: ttft.as_secs_f64(),
                decode_s: decode.as_secs_f64(),
                decode_tokens_per_s: if later == 0 || decode.is_zero() {
                    0.0
                } else {
                    later as f64 / decode.as_secs_f64()
                },
                cache_saved_s: p.saved.as_secs_f64(),
            },
            cache: CacheUse {
                image_hits: p.image_hits,
                prefix_rows: self.prefix_rows,
            },
            token_ids: self.tokens,
            decode: DecodeStats {
                auto: p.auto.clone(),
                tokens_per_step: steps,
                ..DecodeStats::new("ar", self.forwards)
            },
            logprobs: self.logprobs.map(|(_, l)| l),
        })
    }
}
