//! Plain autoregressive decoding: one prefill pass over the prompt rows, then one forward pass per
//! new token. The reference for every lossless accelerator.

use crate::sampler::Sampler;
use candle_core::Tensor;
use glance_core::{Error, Result, SamplingParams, TokenId};
use glance_nn::{AttnMask, CausalLm, KvCache};
use std::time::{Duration, Instant};

/// When to stop and how to pick tokens.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
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
    /// The caller asked to stop (e.g. a stop string matched).
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

/// The state after a prefill: what [`decode`] continues from. Strategies that prefill
/// differently (e.g. FastV, which drops visual rows inside the decoder) build it themselves.
pub struct Prefilled {
    pub cache: KvCache,
    /// Final hidden state of the last prompt row, `(1, hidden)`.
    pub last_hidden: Tensor,
    /// Position of the last prompt row; new tokens continue from here.
    pub last_pos: u32,
    /// Rows in the prompt.
    pub prompt_len: usize,
    /// Time the prefill took.
    pub elapsed: Duration,
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
    Ok(last_pos as u32)
}

/// Runs the prompt rows `(t, hidden)` at `positions` (length `t`; usually `0..t`, but pruned
/// prompts keep their original positions) through the model under a causal mask.
pub fn prefill<M: CausalLm + ?Sized>(
    model: &M,
    prompt: &Tensor,
    positions: &[u32],
) -> Result<Prefilled> {
    let t = prompt.dim(0)?;
    let last_pos = check_prompt(model, t, positions)?;
    let start = Instant::now();
    let mut cache = model.new_cache();
    let hidden = model.forward(prompt, positions, &AttnMask::causal(), &mut cache)?;
    Ok(Prefilled {
        cache,
        last_hidden: hidden.narrow(0, t - 1, 1)?,
        last_pos,
        prompt_len: t,
        elapsed: start.elapsed(),
    })
}

/// Generates after `prompt` rows placed at `positions`: [`prefill`] then [`decode`].
/// `on_token` sees each token as it is produced and returns `true` to stop.
pub fn generate<M: CausalLm + ?Sized>(
    model: &M,
    prompt: &Tensor,
    positions: &[u32],
    config: &GenerateConfig,
    on_token: &mut dyn FnMut(TokenId) -> Result<bool>,
) -> Result<Generation> {
    let sampler = Sampler::new(config.sampling.clone())?;
    let state = prefill(model, prompt, positions)?;
    decode(model, state, sampler, config, on_token)
}

/// One forward pass per new token after a prefill. The first token comes from the prefill's last
/// hidden state (its pick is counted in the prefill time, as time to first token).
pub fn decode<M: CausalLm + ?Sized>(
    model: &M,
    state: Prefilled,
    mut sampler: Sampler,
    config: &GenerateConfig,
    on_token: &mut dyn FnMut(TokenId) -> Result<bool>,
) -> Result<Generation> {
    let Prefilled {
        mut cache,
        last_hidden,
        last_pos,
        prompt_len,
        elapsed,
    } = state;
    let max = model.max_positions();
    let start = Instant::now();
    let mut next = pick(model, &last_hidden, &mut sampler)?;
    let prefill = elapsed + start.elapsed();
    let start = Instant::now();
    let mut tokens = Vec::new();
    let mut pos = last_pos;
    let finish = loop {
        if config.max_new_tokens == 0 {
            break FinishReason::Length;
        }
        tokens.push(next);
        let stop = on_token(next)?;
        if config.eos_token_ids.contains(&next) {
            break FinishReason::Eos;
        }
        if stop {
            break FinishReason::Stop;
        }
        if tokens.len() >= config.max_new_tokens || pos as usize + 2 >= max {
            break FinishReason::Length;
        }
        pos += 1;
        let x = model.embed_tokens(&[next])?;
        let hidden = model.forward(&x, &[pos], &AttnMask::causal(), &mut cache)?;
        next = pick(model, &hidden, &mut sampler)?;
    };
    Ok(Generation {
        tokens,
        finish,
        prompt_len,
        prefill,
        decode: start.elapsed(),
    })
}

/// Logits of one hidden row `(1, hidden)` → the sampled token.
fn pick<M: CausalLm + ?Sized>(
    model: &M,
    hidden: &Tensor,
    sampler: &mut Sampler,
) -> Result<TokenId> {
    let logits: Vec<f32> = model.logits(hidden)?.squeeze(0)?.to_vec1()?;
    sampler.sample(&logits)
}
