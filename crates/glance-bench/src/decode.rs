//! Prefill and decode throughput of a text decoder, per thread count, beside the memory-bandwidth
//! bound (decode) and the GEMM rate (prefill) measured in the same run (`glance bench decode`).
//!
//! The timed path is the engine's own: [`glance_decode::prefill`] and the autoregressive
//! [`DecodeStrategy`], each thread count on its own pool (`glance_engine::thread_pool`).
//!
//! Each weight format is loaded in turn (the previous model dropped first) and measured against
//! its own bound: the bytes its weights stream per token (as held, scales included) over the
//! measured read bandwidth. Resident memory is read from `/proc/self/status` after each load,
//! and its peak during the load (`VmHWM`, reset before each load).
//! Random weights are drawn one tensor at a time and packed as they are drawn, so a 7B shape
//! never exists in f32.

use crate::machine::{copy_bandwidth, gemm_rate, read_bandwidth};
use crate::{bail_options, BenchError, Context, Progress, Result};
use glance_core::SamplingParams;
use glance_decode::{Autoregressive, DecodeStrategy, GenerateConfig, Sampler};
use glance_engine::{Engine, EngineOptions, TwinShape};
use glance_models::llava::{Llava, WeightLayout};
use glance_models::presets;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::{AttnMask, CausalLm, KvCache, Mode, WeightFormat, WeightLoad};
use serde::Serialize;
use std::path::PathBuf;

/// What `glance bench decode` measures.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// A model directory whose text decoder is measured (else `random`).
    pub model: Option<PathBuf>,
    /// With `model`: its real-shape twin instead.
    pub twin: Option<TwinShape>,
    /// A preset shape of random weights (`presets::text_config` or `presets::llava_preset`).
    pub random: String,
    /// Weight formats, each loaded in turn.
    pub weights: Vec<WeightFormat>,
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// Thread counts (empty: 1 and all cores).
    pub threads: Vec<usize>,
    /// Repetitions per measurement (the best is reported).
    pub reps: usize,
    /// Row counts of the `c(k)` curve (empty: none).
    pub rows: Vec<usize>,
}

/// The model measured, as the report's header shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeModel {
    pub label: String,
    pub parameters: usize,
    pub parameters_with_vision: usize,
    pub layers: usize,
    pub hidden: usize,
    pub vocab: usize,
}

/// One format on one thread count.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeRow {
    pub weights: &'static str,
    pub threads: usize,
    pub read_bandwidth_gb_s: f64,
    pub copy_bandwidth_gb_s: f64,
    pub gemm_gflop_s: f64,
    pub prefill_s: f64,
    pub prefill_tokens_per_s: f64,
    pub prefill_gflop_s: f64,
    pub prefill_fraction_of_gemm: f64,
    pub decode_ms_per_token: f64,
    pub decode_tokens_per_s: f64,
    pub decode_bound_ms_per_token: f64,
    pub decode_fraction_of_bound: f64,
    pub decode_bound_by_copy_bandwidth_ms_per_token: f64,
    pub bytes_per_decode_step: f64,
}

/// One format's load and memory.
#[derive(Debug, Clone, Serialize)]
pub struct FormatReport {
    pub weights: &'static str,
    pub load_s: f64,
    pub resident_bytes_before_load: Option<u64>,
    pub resident_bytes_after_load: Option<u64>,
    /// The peak of the load alone (`VmHWM`, reset before it).
    pub peak_resident_bytes_during_load: Option<u64>,
    pub resident_bytes_after_decode: Option<u64>,
    pub linear_weight_bytes: usize,
    pub bytes_per_decode_step: f64,
}

/// One pass of `rows` new rows against one row (the `c(k)` curve).
#[derive(Debug, Clone, Serialize)]
pub struct RowCost {
    pub weights: &'static str,
    pub threads: usize,
    pub rows: usize,
    pub ms: f64,
    pub one_row_ms: f64,
    pub cost: f64,
    pub gop_s: f64,
    /// This CPU's peak for the format's kernel instruction on these threads (`None`: unknown).
    pub peak_gmac_s: Option<f64>,
    pub fraction_of_peak: Option<f64>,
    pub floor_cost: Option<f64>,
}

/// What `glance bench decode` reports (the JSON it writes).
#[derive(Debug, Clone, Serialize)]
pub struct DecodeReport {
    pub bench: &'static str,
    pub model: String,
    pub parameters: usize,
    pub parameters_with_vision: usize,
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// The first format's.
    pub bytes_per_decode_step: Option<f64>,
    pub prefill_flops: f64,
    pub formats: Vec<FormatReport>,
    pub rows: Vec<DecodeRow>,
    pub row_costs: Vec<RowCost>,
}

/// Weight bytes a decode step streams: every linear matrix once as held (scales included), one
/// embedding row and the norms.
fn weight_bytes_per_token(model: &TextModel) -> f64 {
    let c = model.config();
    let row = c.hidden_size * model.embedding_bytes_per_value();
    let norms = (2 * c.num_layers + 1) * c.hidden_size * 4;
    (model.linear_weight_bytes() + row + norms) as f64
}

/// Resident memory of this process (`VmRSS`), bytes; `None` where /proc is not available. Freed
/// heap pages are handed back to the system first (glibc keeps them otherwise, and a model
/// measured after another would be charged for its predecessor's memory).
pub fn resident_bytes() -> Option<u64> {
    glance_nn::runtime::release_free_memory();
    glance_nn::runtime::resident_bytes()
}

/// FLOPs of a prefill of `n` tokens as executed (dense matmuls; attention over the full n×n
/// square; the LM head on the last row only).
pub fn prefill_flops(c: &TextConfig, n: usize) -> f64 {
    let emb = c.vocab_size * c.hidden_size;
    let head = if c.tie_word_embeddings { 0 } else { emb };
    let linear = c.num_parameters() - emb - head;
    let attn = 4 * n * n * c.num_heads * c.head_dim * c.num_layers;
    (2 * n * linear + attn + 2 * c.hidden_size * c.vocab_size) as f64
}

/// The most repetitions per measurement.
pub const MAX_REPS: usize = 100;
/// Most rows of one pass the `c(k)` curve measures (the decode kernels' range).
pub const MAX_ROWS: usize = glance_nn::matvec::MAX_SMALL_ROWS;

/// Best prefill time (with the first token's pick) and best mean decode-step time over
/// `o.reps` runs, in seconds.
fn time_model(
    model: &TextModel,
    ids: &[u32],
    positions: &[u32],
    o: &DecodeOptions,
) -> Result<(f64, f64)> {
    let x = model.embed_tokens(ids)?;
    let config = GenerateConfig {
        max_new_tokens: o.new_tokens,
        eos_token_ids: Vec::new(),
    };
    let (mut best_prefill, mut best_step) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..o.reps {
        let state = glance_decode::prefill(model, &x, positions)?;
        let sampler = Sampler::new(SamplingParams::greedy())?;
        let g = Autoregressive.decode(model, state, sampler, &config, &mut |_| Ok(false))?;
        if g.tokens.len() != o.new_tokens {
            return Err(BenchError::Check(format!(
                "decoding stopped after {} of {} tokens",
                g.tokens.len(),
                o.new_tokens
            )));
        }
        best_prefill = best_prefill.min(g.prefill.as_secs_f64());
        // `decode` covers the passes after the first token.
        best_step = best_step.min(g.decode.as_secs_f64() / (o.new_tokens - 1) as f64);
    }
    Ok((best_prefill, best_step))
}

/// A model measured by this run: its text decoder, and the whole LLaVA model when it is one.
enum Loaded {
    Text(Box<TextModel>),
    Llava(Box<Llava>),
    Engine(Box<Engine>),
}

impl Loaded {
    fn text(&self) -> &TextModel {
        match self {
            Loaded::Text(t) => t,
            Loaded::Llava(l) => l.text(),
            Loaded::Engine(e) => e.model().text(),
        }
    }
}

/// Loads the model of `o` with its linear weights in `format`.
fn load(o: &DecodeOptions, format: WeightFormat) -> Result<Loaded> {
    let load = WeightLoad::new(format);
    let cpu = candle_core::Device::Cpu;
    if let Some(dir) = &o.model {
        let options = EngineOptions::single_request()
            .with_weights(format)
            .with_twin(o.twin.clone());
        let engine = Engine::load(dir, options)
            .with_context(|| format!("loading {} with {format} weights", dir.display()))?;
        return Ok(Loaded::Engine(Box::new(engine)));
    }
    let vb = random_var_builder(0, &cpu);
    if let Some(config) = presets::llava_preset(&o.random) {
        let model =
            Llava::from_var_builder_as(&vb, config?, &WeightLayout::hub(), Mode::Infer, &load)?;
        return Ok(Loaded::Llava(Box::new(model)));
    }
    let config = presets::text_config(&o.random)?;
    let model = TextModel::load_as(&vb, &vb.pp("lm_head"), &config, Mode::Infer, &load)?;
    Ok(Loaded::Text(Box::new(model)))
}

/// Parameters of the whole model `o` names (the text decoder's, plus the vision tower's and
/// projector's for a LLaVA preset), for a memory estimate before loading.
fn all_parameters(o: &DecodeOptions, text: &TextConfig) -> Result<usize> {
    Ok(match presets::llava_preset(&o.random) {
        Some(c) if o.model.is_none() => {
            let c = c?;
            let v = &c.vision;
            let per_layer =
                4 * v.hidden_size * v.hidden_size + 2 * v.hidden_size * v.intermediate_size;
            let proj = v.hidden_size * text.hidden_size + text.hidden_size * text.hidden_size;
            text.num_parameters() + v.num_hidden_layers * per_layer + proj
        }
        _ => text.num_parameters(),
    })
}

/// The text decoder's configuration of the model `o` names.
fn text_config(o: &DecodeOptions) -> Result<TextConfig> {
    use glance_models::family::Family;
    Ok(match &o.model {
        Some(dir) => match &o.twin {
            Some(shape) => glance_models::twin::llava_config(dir, shape).map(|c| c.text),
            None => match Family::of_dir(dir)? {
                f if f.is_llava() => {
                    glance_models::llava::LlavaConfig::from_dir(dir).map(|c| c.text)
                }
                Family::InternVl => {
                    glance_models::internvl::InternVlConfig::from_dir(dir).map(|c| c.text)
                }
                _ => glance_models::qwen2_vl::Qwen2VlConfig::from_dir(dir).map(|c| c.text),
            },
        }
        .with_context(|| format!("loading {}", dir.display()))?,
        None => match presets::llava_preset(&o.random) {
            Some(c) => c?.text,
            None => presets::text_config(&o.random)?,
        },
    })
}

/// A checked decode benchmark: the model's facts are known before anything is timed.
pub struct DecodeBench {
    options: DecodeOptions,
    config: TextConfig,
    thread_counts: Vec<usize>,
    /// The model as the report's header shows it.
    pub model: DecodeModel,
}

impl DecodeBench {
    /// Checks `options` (every count, the context, the memory each format needs) before
    /// anything loads.
    pub fn new(options: DecodeOptions) -> Result<Self> {
        let o = &options;
        if o.prompt_len == 0 || o.new_tokens < 2 || o.reps == 0 || o.reps > MAX_REPS {
            bail_options!(
                "--prompt-len ≥ 1, --new-tokens ≥ 2 and --reps in 1..={MAX_REPS} are required"
            );
        }
        if let Some(k) = o.rows.iter().find(|&&k| k == 0 || k > MAX_ROWS) {
            bail_options!("--rows {k}: each row count must be in 1..={MAX_ROWS}");
        }
        if o.weights.is_empty() {
            bail_options!("--weights needs at least one format");
        }
        let cores = glance_engine::cores();
        let thread_counts = if !o.threads.is_empty() {
            o.threads.clone()
        } else if cores > 1 {
            vec![1, cores]
        } else {
            vec![1]
        };
        for &t in &thread_counts {
            glance_engine::resolve_threads(Some(t)).context("--threads")?;
        }
        let config = text_config(o)?;
        let context = config.max_position_embeddings;
        if o.prompt_len
            .checked_add(o.new_tokens)
            .is_none_or(|n| n >= context)
        {
            bail_options!(
                "--prompt-len {} + --new-tokens {} must stay below the model's context ({context})",
                o.prompt_len,
                o.new_tokens
            );
        }
        // Refuse a format whose weights cannot fit before spending minutes drawing them.
        let params = all_parameters(o, &config)?;
        if let Some(avail) = glance_nn::runtime::available_memory() {
            for &f in &o.weights {
                let need = params as f64 * f.bits_per_weight() / 8.0;
                if need > 0.95 * avail as f64 {
                    bail_options!(
                        "{f} weights of this model need about {:.1} GB; this machine has {:.1} GB \
                         available (try --weights q4,q8,bf16)",
                        need / 1e9,
                        avail as f64 / 1e9
                    );
                }
            }
        }
        let label = match (&o.model, &o.twin) {
            (Some(dir), Some(shape)) => format!("{} (twin {shape})", dir.display()),
            (Some(dir), None) => dir.display().to_string(),
            (None, _) => format!("random {}", o.random),
        };
        let model = DecodeModel {
            label,
            parameters: config.num_parameters(),
            parameters_with_vision: params,
            layers: config.num_layers,
            hidden: config.hidden_size,
            vocab: config.vocab_size,
        };
        Ok(Self {
            options,
            config,
            thread_counts,
            model,
        })
    }

    /// Measures every format on every thread count.
    pub fn run(&self, progress: &mut dyn Progress) -> Result<DecodeReport> {
        let (o, c) = (&self.options, &self.config);
        let ids: Vec<u32> = (0..o.prompt_len)
            .map(|i| ((i * 7919 + 13) % c.vocab_size) as u32)
            .collect();
        let positions: Vec<u32> = (0..o.prompt_len as u32).collect();
        let mean_kv = o.prompt_len + o.new_tokens / 2;
        let flops = prefill_flops(c, o.prompt_len);
        // Copy bandwidth and GEMM rate once per thread count, shared by every format (the read
        // bandwidth is measured beside each decode, below).
        let mut yardsticks = Vec::new();
        for &t in &self.thread_counts {
            let copy = copy_bandwidth(t, o.reps.max(3))?;
            let pool = glance_engine::thread_pool(t)?;
            let gemm = pool.install(|| gemm_rate(1024, 1024, 1024, o.reps.max(3)))?;
            yardsticks.push((t, copy, gemm));
        }
        let mut rows = Vec::new();
        let mut row_costs = Vec::new();
        let mut formats = Vec::new();
        for &format in &o.weights {
            progress.note(&format!("measuring {} weights…", format.name()));
            let rss_before = resident_bytes();
            // The high-water mark of this load alone (VmHWM), taken before free pages go back.
            let peak_known = glance_nn::runtime::reset_peak_resident();
            let start = std::time::Instant::now();
            let loaded = load(o, format)?;
            let load_s = start.elapsed().as_secs_f64();
            let load_peak = glance_nn::runtime::peak_resident_bytes().filter(|_| peak_known);
            let rss = resident_bytes();
            let model = loaded.text();
            let step_bytes = weight_bytes_per_token(model) + c.kv_bytes(mean_kv) as f64;
            let mut rss_after_decode = None;
            for &(t, copy, gemm) in &yardsticks {
                // The read bandwidth again, just before this format's timing: the machine is
                // shared and its bandwidth moves over minutes, so each bound is taken side by
                // side with the decode it judges.
                let bandwidth = read_bandwidth(t, o.reps.max(3))?;
                // Every kernel (candle's GEMM, glance's matvec, rayon-parallel element-wise ops)
                // runs on a pool of exactly `t` threads.
                let pool = glance_engine::thread_pool(t)?;
                let (best_prefill, best_step) =
                    pool.install(|| time_model(model, &ids, &positions, o))?;
                rss_after_decode = resident_bytes();
                let prefill_rate = flops / best_prefill;
                let bound = step_bytes / bandwidth;
                rows.push(DecodeRow {
                    weights: format.name(),
                    threads: t,
                    read_bandwidth_gb_s: bandwidth / 1e9,
                    copy_bandwidth_gb_s: copy / 1e9,
                    gemm_gflop_s: gemm / 1e9,
                    prefill_s: best_prefill,
                    prefill_tokens_per_s: o.prompt_len as f64 / best_prefill,
                    prefill_gflop_s: prefill_rate / 1e9,
                    prefill_fraction_of_gemm: prefill_rate / gemm,
                    decode_ms_per_token: best_step * 1e3,
                    decode_tokens_per_s: 1.0 / best_step,
                    decode_bound_ms_per_token: bound * 1e3,
                    decode_fraction_of_bound: bound / best_step,
                    decode_bound_by_copy_bandwidth_ms_per_token: step_bytes / copy * 1e3,
                    bytes_per_decode_step: step_bytes,
                });
            }
            if !o.rows.is_empty() {
                row_costs.extend(self.rows_curves(model, &ids, &positions, format)?);
            }
            formats.push(FormatReport {
                weights: format.name(),
                load_s,
                resident_bytes_before_load: rss_before,
                resident_bytes_after_load: rss,
                peak_resident_bytes_during_load: load_peak,
                resident_bytes_after_decode: rss_after_decode,
                linear_weight_bytes: model.linear_weight_bytes(),
                bytes_per_decode_step: step_bytes,
            });
            drop(loaded);
        }
        Ok(DecodeReport {
            bench: "decode",
            model: self.model.label.clone(),
            parameters: c.num_parameters(),
            parameters_with_vision: self.model.parameters_with_vision,
            prompt_len: o.prompt_len,
            new_tokens: o.new_tokens,
            bytes_per_decode_step: formats.first().map(|f| f.bytes_per_decode_step),
            prefill_flops: flops,
            formats,
            rows,
            row_costs,
        })
    }

    /// The `c(k)` curve of one format at every thread count.
    fn rows_curves(
        &self,
        model: &TextModel,
        ids: &[u32],
        positions: &[u32],
        format: WeightFormat,
    ) -> Result<Vec<RowCost>> {
        let o = &self.options;
        let c = model.config();
        // Multiply-adds of one row through the linear layers (LM head included); attention over
        // the short prompt is a small addition left out of the floor.
        let emb = c.vocab_size * c.hidden_size;
        let macs_row = (c.num_parameters() - if c.tie_word_embeddings { 0 } else { emb }) as f64;
        let mut out = Vec::new();
        for &t in &self.thread_counts {
            let pool = glance_engine::thread_pool(t)?;
            // This CPU's peak for the instruction the format's kernels use, on `t` threads.
            let peak = pool
                .broadcast(|_| glance_nn::peak::macs_per_second(format))
                .into_iter()
                .sum::<Option<f64>>();
            let times = pool.install(|| -> Result<Vec<f64>> {
                let x = model.embed_tokens(ids)?;
                let mut cache = glance_decode::prefill(model, &x, positions)?.cache;
                let mut t1 = time_rows(model, &mut cache, ids.len(), 1, o.reps)?;
                let mut times = Vec::new();
                for &k in &o.rows {
                    let tk = time_rows(model, &mut cache, ids.len(), k, o.reps)?;
                    if k == 1 {
                        t1 = t1.min(tk);
                    }
                    times.push(tk);
                }
                times.insert(0, t1);
                Ok(times)
            })?;
            let t1 = times[0];
            for (&k, &tk) in o.rows.iter().zip(&times[1..]) {
                let macs = k as f64 * macs_row;
                let floor = peak.map(|p| (macs / p / t1).max(1.0));
                let pct = peak.map(|p| 100.0 * macs / tk / p);
                out.push(RowCost {
                    weights: format.name(),
                    threads: t,
                    rows: k,
                    ms: tk * 1e3,
                    one_row_ms: t1 * 1e3,
                    cost: tk / t1,
                    gop_s: 2.0 * macs / tk / 1e9,
                    peak_gmac_s: peak.map(|p| p / 1e9),
                    fraction_of_peak: pct.map(|p| p / 100.0),
                    floor_cost: floor,
                });
            }
        }
        Ok(out)
    }
}

/// Best time over `reps` of one pass of `k` new rows after the `start` prompt rows in `cache`
/// (forward and logits, as a verification pass runs them: [`glance_decode::cost::time_pass`],
/// which rolls the rows back).
fn time_rows(
    model: &TextModel,
    cache: &mut KvCache,
    start: usize,
    k: usize,
    reps: usize,
) -> Result<f64> {
    let vocab = model.config().vocab_size;
    let ids: Vec<u32> = (0..k).map(|i| ((i * 31 + 7) % vocab) as u32).collect();
    let positions: Vec<u32> = (start..start + k).map(|p| p as u32).collect();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let s =
            glance_decode::cost::time_pass(model, cache, &ids, &positions, &AttnMask::causal())?;
        best = best.min(s);
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_flops_count_the_linear_layers_attention_and_one_head_row() {
        let c = presets::text_config("llama-134m").unwrap();
        let n = 16;
        let emb = c.vocab_size * c.hidden_size;
        let head = if c.tie_word_embeddings { 0 } else { emb };
        let linear = (c.num_parameters() - emb - head) as f64;
        let f = prefill_flops(&c, n);
        // Linear layers dominate a short prompt; attention and the head row come on top.
        assert!(f > 2.0 * n as f64 * linear);
        let f2 = prefill_flops(&c, 2 * n);
        assert!(f2 > 2.0 * f - 2.0 * (2 * c.hidden_size * c.vocab_size) as f64);
    }
}
