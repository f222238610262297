//! Prometheus metrics in the text exposition format, with vLLM's names where vLLM has one
//! (`vllm:num_requests_running`, `vllm:time_to_first_token_seconds`, …) and `glance_` names for
//! what is glance's own (visual tokens, pruning, per-position acceptance).

use glance_engine::Response;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds of the latency histograms, in seconds.
const TTFT_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const TPOT_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];
const E2E_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0,
];

/// A cumulative histogram with fixed buckets.
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// How a request ended, for `vllm:request_success_total` and `glance_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished (any finish reason but cancelled).
    Finished(&'static str),
    /// The client went away.
    Cancelled,
    /// Refused as bad input (4xx).
    Rejected,
    /// Refused for overload (503).
    Overloaded,
    /// A server fault (500).
    Failed,
}

#[derive(Default)]
struct Counters {
    by_status: std::collections::BTreeMap<String, u64>,
    success_by_reason: std::collections::BTreeMap<&'static str, u64>,
    accepted_by_position: Vec<u64>,
    /// Requests by the strategy that decoded them and whether `auto` chose it.
    by_strategy: std::collections::BTreeMap<(String, &'static str), u64>,
    /// Sequences decoded in scheduler steps, by strategy.
    batch_by_strategy: std::collections::BTreeMap<&'static str, u64>,
}

/// Every metric of one server.
pub struct Metrics {
    model: String,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    visual_tokens: AtomicU64,
    kept_visual_tokens: AtomicU64,
    drafts: AtomicU64,
    draft_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    batch_steps: AtomicU64,
    batch_rows: AtomicU64,
    counters: Mutex<Counters>,
    ttft: Mutex<Histogram>,
    tpot: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
}

impl Metrics {
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            visual_tokens: AtomicU64::new(0),
            kept_visual_tokens: AtomicU64::new(0),
            drafts: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted_tokens: AtomicU64::new(0),
            batch_steps: AtomicU64::new(0),
            batch_rows: AtomicU64::new(0),
            counters: Mutex::new(Counters::default()),
            ttft: Mutex::new(Histogram::new(&TTFT_BUCKETS)),
            tpot: Mutex::new(Histogram::new(&TPOT_BUCKETS)),
            e2e: Mutex::new(Histogram::new(&E2E_BUCKETS)),
        }
    }

    /// Counts a request's end.
    pub fn outcome(&self, o: Outcome) {
        let mut c = self.counters.lock().expect("not poisoned");
        let status = match o {
            Outcome::Finished(reason) => {
                *c.success_by_reason.entry(reason).or_default() += 1;
                "finished"
            }
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
            Outcome::Overloaded => "overloaded",
            Outcome::Failed => "failed",
        };
        *c.by_status.entry(status.to_string()).or_default() += 1;
    }

    /// Records a generation: tokens, latencies (time to first token measured by the server, from
    /// the request's arrival) and the strategy's counters.
    pub fn generation(&self, r: &Response, ttft_s: f64, e2e_s: f64) {
        let add = |a: &AtomicU64, n: usize| a.fetch_add(n as u64, Ordering::Relaxed);
        add(&self.prompt_tokens, r.usage.prompt_tokens);
        add(&self.generation_tokens, r.usage.completion_tokens);
        add(&self.visual_tokens, r.usage.visual_tokens);
        add(&self.kept_visual_tokens, r.usage.kept_visual_tokens);
        let stat = |k: &str| r.decode.counters.get(k).copied().unwrap_or(0);
        self.drafts.fetch_add(stat("drafts"), Ordering::Relaxed);
        self.draft_tokens
            .fetch_add(stat("draft_tokens"), Ordering::Relaxed);
        self.accepted_tokens
            .fetch_add(stat("accepted_tokens"), Ordering::Relaxed);
        let mut c = self.counters.lock().expect("not poisoned");
        let chosen_by = if r.decode.auto.is_some() {
            "auto"
        } else {
            "request"
        };
        *c.by_strategy
            .entry((r.decode.strategy.clone(), chosen_by))
            .or_default() += 1;
        if let Some(h) = r.decode.histograms.get("accepted_by_depth") {
            if c.accepted_by_position.len() < h.len() {
                c.accepted_by_position.resize(h.len(), 0);
            }
            for (a, n) in c.accepted_by_position.iter_mut().zip(h) {
                *a += *n;
            }
        }
        drop(c);
        self.ttft.lock().expect("not poisoned").observe(ttft_s);
        let later = r.usage.completion_tokens.saturating_sub(1);
        if later > 0 {
            let per = (e2e_s - ttft_s).max(0.0) / later as f64;
            let mut h = self.tpot.lock().expect("not poisoned");
            for _ in 0..later {
                h.observe(per);
            }
        }
        self.e2e.lock().expect("not poisoned").observe(e2e_s);
    }

    /// Counts one scheduler step that decoded sequences of these `strategies` (one entry per
    /// sequence).
    pub fn batch_step(&self, strategies: &[&'static str]) {
        self.batch_steps.fetch_add(1, Ordering::Relaxed);
        self.batch_rows
            .fetch_add(strategies.len() as u64, Ordering::Relaxed);
        let mut c = self.counters.lock().expect("not poisoned");
        for s in strategies {
            *c.batch_by_strategy.entry(s).or_default() += 1;
        }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let m = format!(
            "model_name=\"{}\"",
            self.model.replace(['"', '\\', '\n'], "_")
        );
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut gauge = |name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{m}}} {v}"
            );
        };
        gauge(
            "vllm:num_requests_running",
            "Requests generating now.",
            "gauge",
            get(&self.running),
        );
        gauge(
            "vllm:num_requests_waiting",
            "Requests waiting for a slot.",
            "gauge",
            get(&self.waiting),
        );
        gauge(
            "vllm:prompt_tokens_total",
            "Prompt tokens processed (visual tokens included).",
            "counter",
            get(&self.prompt_tokens),
        );
        gauge(
            "vllm:generation_tokens_total",
            "Tokens generated.",
            "counter",
            get(&self.generation_tokens),
        );
        gauge(
            "vllm:spec_decode_num_drafts_total",
            "Speculative drafts verified.",
            "counter",
            get(&self.drafts),
        );
        gauge(
            "vllm:spec_decode_num_draft_tokens_total",
            "Draft tokens proposed.",
            "counter",
            get(&self.draft_tokens),
        );
        gauge(
            "vllm:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted.",
            "counter",
            get(&self.accepted_tokens),
        );
        gauge(
            "glance_visual_tokens_total",
            "Visual tokens in prompts before pruning.",
            "counter",
            get(&self.visual_tokens),
        );
        gauge(
            "glance_visual_tokens_kept_total",
            "Visual tokens the decoder ran after pruning.",
            "counter",
            get(&self.kept_visual_tokens),
        );
        gauge(
            "glance_batch_decode_steps_total",
            "Scheduler steps that decoded at least one sequence (one shared target pass each).",
            "counter",
            get(&self.batch_steps),
        );
        gauge(
            "glance_batch_decode_rows_total",
            "Sequences decoded in those steps (sequences / steps = mean batch size).",
            "counter",
            get(&self.batch_rows),
        );
        let c = self.counters.lock().expect("not poisoned");
        let _ = writeln!(
            out,
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted draft tokens by \
             position.\n# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"
        );
        for (i, n) in c.accepted_by_position.iter().enumerate() {
            let _ = writeln!(
                out,
                "vllm:spec_decode_num_accepted_tokens_per_pos{{{m},position=\"{i}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Finished requests by finish reason.\n\
             # TYPE vllm:request_success_total counter"
        );
        for (reason, n) in &c.success_by_reason {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{m},finished_reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP glance_requests_total Requests by outcome (finished, cancelled, rejected, \
             overloaded, failed).\n# TYPE glance_requests_total counter"
        );
        for (status, n) in &c.by_status {
            let _ = writeln!(out, "glance_requests_total{{{m},status=\"{status}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP glance_decode_strategy_total Generations by the strategy that decoded them, \
             and whether `auto` chose it (chosen_by=\"auto\") or the request named it.\n\
             # TYPE glance_decode_strategy_total counter"
        );
        for ((strategy, by), n) in &c.by_strategy {
            let _ = writeln!(
                out,
                "glance_decode_strategy_total{{{m},strategy=\"{strategy}\",chosen_by=\"{by}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP glance_batch_decode_rows_by_strategy_total Sequences decoded in scheduler \
             steps, by the strategy each runs (their sum is glance_batch_decode_rows_total).\n\
             # TYPE glance_batch_decode_rows_by_strategy_total counter"
        );
        for (strategy, n) in &c.batch_by_strategy {
            let _ = writeln!(
                out,
                "glance_batch_decode_rows_by_strategy_total{{{m},strategy=\"{strategy}\"}} {n}"
            );
        }
        drop(c);
        self.ttft.lock().expect("not poisoned").render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            &m,
            "Time from the request's arrival to its first token.",
        );
        self.tpot.lock().expect("not poisoned").render(
            &mut out,
            "vllm:time_per_output_token_seconds",
            &m,
            "Time per output token after the first.",
        );
        self.e2e.lock().expect("not poisoned").render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            &m,
            "Time from arrival to the last token.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_render() {
        let mut h = Histogram::new(&TTFT_BUCKETS);
        h.observe(0.003);
        h.observe(0.3);
        let mut s = String::new();
        h.render(&mut s, "x", "a=\"b\"", "help");
        assert!(s.contains("x_bucket{a=\"b\",le=\"0.005\"} 1"), "{s}");
        assert!(s.contains("x_bucket{a=\"b\",le=\"0.5\"} 2"), "{s}");
        assert!(s.contains("x_count{a=\"b\"} 2"), "{s}");
        let m = Metrics::new("tiny");
        m.outcome(Outcome::Overloaded);
        let text = m.render();
        assert!(text.contains("glance_requests_total{model_name=\"tiny\",status=\"overloaded\"} 1"));
        assert!(text.contains("vllm:num_requests_running{model_name=\"tiny\"} 0"));
    }
}
