//! Plain autoregressive decoding: one prefill pass over the prompt rows, then one forward pass per
//! new token. The reference every lossless accelerator must reproduce token for token.

use crate::sampler::Sampler;
use crate::step::{DecodeState, Pass, PassOutput};
use crate::strategy::{DecodeStats, DecodeStrategy, TokenSink};
use candle_core::Tensor;
use glance_core::{Error, Result, TokenId};
use glance_nn::{AttnMask, CausalLm, KvCache};
use std::time::{Duration, Instant};

/// When to stop. How tokens are picked is the [`Sampler`]'s alone.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub max_new_tokens: usize,
    /// Tokens that end generation (emitted, then stop).
    pub eos_token_ids: Vec<TokenId>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token was produced.
    Eos,
    /// `max_new_tokens` reached, or the model's context is full.
    Length,
    /// The caller asked to stop (a stop string matched, or the request was cancelled).
    Stop,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// New tokens, including a final EOS token if one ended generation.
    pub tokens: Vec<TokenId>,
    pub finish: FinishReason,
    /// Rows in the prompt.
    pub prompt_len: usize,
    /// Time of the prefill pass, including picking the first token.
    pub prefill: Duration,
    /// Time of all later passes.
    pub decode: Duration,
    /// What the strategy did.
    pub stats: DecodeStats,
}

impl Generation {
    /// Decode throughput over the tokens after the first, in tokens/s.
    pub fn decode_tokens_per_sec(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || self.decode.is_zero() {
            return 0.0;
        }
        n as f64 / self.decode.as_secs_f64()
    }
}

/// One image of a prefilled prompt, as a draft head needs it (its visual rows as the model ran
/// them are `Prefilled::inputs` at these rows).
#[derive(Debug, Clone)]
pub struct PrefilledImage {
    /// Indices (into the prefilled rows) of the image's rows the decoder ran, in prompt order.
    pub rows: Vec<usize>,
}

/// The state after a prefill: what every [`DecodeStrategy`] continues from.
///
/// Strategies that prefill differently (e.g. FastV, which drops visual rows inside the decoder)
/// build it themselves; then deeper layers of `cache` hold fewer rows than the first.
pub struct Prefilled {
    pub cache: KvCache,
    /// The prompt rows as the first layer saw them `(t, hidden)` (token embeddings and projected
    /// visual tokens), for strategies that build their own rows from them (a draft head).
    pub inputs: Tensor,
    /// Final (normed) hidden state of every prompt row the last decoder layer ran, `(t, hidden)`.
    pub hidden: Tensor,
    /// Position id of each of those rows (pruned prompts keep their original positions).
    pub positions: Vec<u32>,
    /// The prompt's images, in prompt order (empty for text-only prompts).
    pub images: Vec<PrefilledImage>,
    /// Time the prefill took.
    pub elapsed: Duration,
}

impl Prefilled {
    /// Rows in the prompt (after pruning).
    pub fn prompt_len(&self) -> usize {
        self.positions.len()
    }

    /// Position of the last prompt row; new tokens continue from here.
    pub fn last_pos(&self) -> u32 {
        self.positions.last().copied().unwrap_or(0)
    }

    /// Hidden state of the last prompt row `(1, hidden)`: the next token is predicted from it.
    pub fn last_hidden(&self) -> Result<Tensor> {
        let t = self.hidden.dim(0)?;
        if t == 0 {
            return Err(Error::Input("the prefill holds no rows".into()));
        }
        Ok(self.hidden.narrow(0, t - 1, 1)?)
    }
}

/// Checks that `t` prompt rows at `positions` leave room for at least one new token and returns
/// the last position. Every prefill strategy calls this first.
pub fn check_prompt<M: CausalLm + ?Sized>(model: &M, t: usize, positions: &[u32]) -> Result<u32> {
    if t == 0 || positions.len() != t {
        return Err(Error::Input(format!(
            "prompt has {t} rows and {} positions",
            positions.len()
        )));
    }
    let max = model.max_positions();
    let last_pos = *positions.iter().max().expect("non-empty") as usize;
    if last_pos + 1 >= max || t >= max {
        return Err(Error::PromptTooLong {
            len: (last_pos + 1).max(t),
            max,
        });
    }
    Ok(*positions.last().expect("non-empty"))
}

/// Runs the prompt rows `(t, hidden)` at `positions` (length `t`; usually `0..t`, but pruned
/// prompts keep their original positions) through the model under a causal mask.
pub fn prefill<M: CausalLm + ?Sized>(
    model: &M,
    prompt: &Tensor,
    positions: &[u32],
) -> Result<Prefilled> {
    let t = prompt.dim(0)?;
    check_prompt(model, t, positions)?;
    let start = Instant::now();
    let mut cache = model.new_cache();
    let hidden = model.forward(prompt, positions, &AttnMask::causal(), &mut cache)?;
    Ok(Prefilled {
        cache,
        inputs: prompt.clone(),
        hidden,
        positions: positions.to_vec(),
        images: Vec::new(),
        elapsed: start.elapsed(),
    })
}

/// [`prefill`] of prompt rows with three-part (M-RoPE) positions `(temporal, height, width)`,
/// as Qwen2-VL places image rows. The state's scalar position of a row is its largest part: the
/// position itself on text rows, and on a prompt ending with image tokens one below where
/// transformers continues (its largest position + 1), so decoding continues as usual.
pub fn prefill_mrope<M: CausalLm + ?Sized>(
    model: &M,
    prompt: &Tensor,
    positions: &[[u32; 3]],
) -> Result<Prefilled> {
    let t = prompt.dim(0)?;
    let largest: Vec<u32> = positions.iter().map(|p| p[0].max(p[1]).max(p[2])).collect();
    check_prompt(model, t, &largest)?;
    let start = Instant::now();
    let mut cache = model.new_cache();
    let hidden = model.forward_mrope(prompt, positions, &AttnMask::causal(), &mut cache)?;
    Ok(Prefilled {
        cache,
        inputs: prompt.clone(),
        hidden,
        positions: positions.iter().map(|p| p[0].max(p[1]).max(p[2])).collect(),
        images: Vec::new(),
        elapsed: start.elapsed(),
    })
}

/// Generates after `prompt` rows placed at `positions`: [`prefill`], then [`Autoregressive`].
pub fn generate<M: CausalLm>(
    model: &M,
    prompt: &Tensor,
    positions: &[u32],
    sampler: Sampler,
    config: &GenerateConfig,
    on_token: TokenSink<'_>,
) -> Result<Generation> {
    let state = prefill(model, prompt, positions)?;
    Autoregressive.decode(model, state, sampler, config, on_token)
}

/// One forward pass per new token.
#[derive(Debug, Clone, Copy, Default)]
pub struct Autoregressive;

impl DecodeStrategy for Autoregressive {
    fn name(&self) -> &'static str {
        "ar"
    }

    /// The first token comes from the prefill's last hidden state (its pick is counted in the
    /// prefill time, as time to first token); then one forward pass per token.
    fn start(
        &self,
        model: &dyn CausalLm,
        state: Prefilled,
        mut sampler: Sampler,
        config: &GenerateConfig,
    ) -> Result<Box<dyn DecodeState>> {
        let start = Instant::now();
        let next = pick(model, &state.last_hidden()?, &mut sampler)?;
        Ok(Box::new(ArState {
            prefill: state.elapsed + start.elapsed(),
            prompt_len: state.prompt_len(),
            pos: state.last_pos(),
            cache: state.cache,
            next,
            sampler,
            config: config.clone(),
            max: model.max_positions(),
            tokens: Vec::new(),
            forwards: 0,
            start: Instant::now(),
            ended: None,
        }))
    }
}

/// Autoregressive decoding between passes: `next` was picked from the row at `pos` and is fed
/// at `pos + 1`.
struct ArState {
    sampler: Sampler,
    config: GenerateConfig,
    max: usize,
    cache: KvCache,
    next: TokenId,
    pos: u32,
    tokens: Vec<TokenId>,
    forwards: u64,
    prompt_len: usize,
    prefill: Duration,
    start: Instant,
    ended: Option<FinishReason>,
}

impl DecodeState for ArState {
    fn next_pass(&mut self, _: &dyn CausalLm, on_token: TokenSink<'_>) -> Result<Option<Pass>> {
        if self.ended.is_some() {
            return Ok(None);
        }
        if self.config.max_new_tokens == 0 {
            self.ended = Some(FinishReason::Length);
            return Ok(None);
        }
        let (next, pos) = (self.next, self.pos);
        if let Some(reason) = emit(
            next,
            &mut self.tokens,
            pos,
            self.max,
            &self.config,
            on_token,
        )? {
            self.ended = Some(reason);
            return Ok(None);
        }
        self.pos += 1;
        Ok(Some(Pass::token(next, self.pos)))
    }

    fn cache(&mut self) -> &mut KvCache {
        &mut self.cache
    }

    fn absorb(&mut self, _: &dyn CausalLm, out: PassOutput, _: TokenSink<'_>) -> Result<()> {
        self.forwards += 1;
        let row = out
            .logits
            .first()
            .ok_or_else(|| Error::Input("a decode step without logits".into()))?;
        self.next = self.sampler.sample(row)?;
        Ok(())
    }

    fn finish(self: Box<Self>) -> Generation {
        let stats = DecodeStats {
            // One token per pass.
            tokens_per_step: vec![1; self.tokens.len()],
            ..DecodeStats::new("ar", self.forwards)
        };
        Generation {
            finish: self.ended.unwrap_or(FinishReason::Stop),
            tokens: self.tokens,
            prompt_len: self.prompt_len,
            prefill: self.prefill,
            decode: self.start.elapsed(),
            stats,
        }
    }
}

/// Emits `token` (predicted from the row at position `pos`) through `on_token`; `Some(reason)`
/// when generation ends with it: end of sequence, the sink's stop, the token limit or a full
/// context (`max` positions). The one stopping rule of every strategy.
pub(crate) fn emit(
    token: TokenId,
    tokens: &mut Vec<TokenId>,
    pos: u32,
    max: usize,
    config: &GenerateConfig,
    on_token: TokenSink<'_>,
) -> Result<Option<FinishReason>> {
    tokens.push(token);
    let stop = on_token(token)?;
    if config.eos_token_ids.contains(&token) {
        return Ok(Some(FinishReason::Eos));
    }
    if stop {
        return Ok(Some(FinishReason::Stop));
    }
    if tokens.len() >= config.max_new_tokens || pos as usize + 2 >= max {
        return Ok(Some(FinishReason::Length));
    }
    Ok(None)
}

/// Logits of one hidden row `(1, hidden)` → the sampled token (the first token after a
/// prefill: [`Prefilled::last_hidden`]).
pub fn pick<M: CausalLm + ?Sized>(
    model: &M,
    hidden: &Tensor,
    sampler: &mut Sampler,
) -> Result<TokenId> {
    let logits: Vec<f32> = model.logits(hidden)?.squeeze(0)?.to_vec1()?;
    sampler.sample(&logits)
}
