//! `glance bench serve --mix ar,vispec,eagle,prune,diffusion`: the one scheduler under a mixed
//! workload. A real `glance serve` (batching on) answers 1, 2, 4, … concurrent streaming
//! clients, first each request kind alone (every client sends that kind), then all kinds at once
//! (client `c` sends kind `c mod kinds`). Per workload and kind: aggregate generated tokens/s and
//! its ratio to one client sending that kind alone, time to first token and time per output
//! token (p50 / p99) as clients see them, and the batch composition: the mean number of
//! sequences of each strategy per scheduler step (from the server's `/metrics`).

use super::client::{stream_once, wave, Sample};
use super::{server_config, ServeOptions, WaveFigures};
use crate::{BenchError, Context, Result};
use glance_engine::{DecodeSpec, DiffusionMode, DraftKind, Engine};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A kind of request in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixKind {
    Ar,
    Vispec,
    Eagle,
    /// Plain decoding after adaptive pruning to 12.5% of the visual tokens.
    Prune,
    /// Linear block diffusion (a converted model).
    Diffusion,
    Auto,
}

impl MixKind {
    const ALL: [MixKind; 6] = [
        MixKind::Ar,
        MixKind::Vispec,
        MixKind::Eagle,
        MixKind::Prune,
        MixKind::Diffusion,
        MixKind::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MixKind::Ar => "ar",
            MixKind::Vispec => "vispec",
            MixKind::Eagle => "eagle",
            MixKind::Prune => "prune",
            MixKind::Diffusion => "diffusion",
            MixKind::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        MixKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| {
                let known: Vec<&str> = MixKind::ALL.iter().map(|k| k.name()).collect();
                BenchError::Options(format!(
                    "--mix: unknown request kind `{s}` (known: {})",
                    known.join(", ")
                ))
            })
    }

    fn decode(self) -> DecodeSpec {
        match self {
            MixKind::Ar | MixKind::Prune => DecodeSpec::Autoregressive,
            MixKind::Vispec => DecodeSpec::speculative(DraftKind::Vispec),
            MixKind::Eagle => DecodeSpec::speculative(DraftKind::Eagle),
            MixKind::Diffusion => DecodeSpec::diffusion(DiffusionMode::Linear),
            MixKind::Auto => DecodeSpec::auto(),
        }
    }

    /// The request's `glance` options.
    fn options(self) -> Value {
        match self {
            MixKind::Prune => {
                json!({"decode": "ar", "prune": {"policy": "adaptive", "keep": 0.125}})
            }
            k => json!({"decode": k.decode().name()}),
        }
    }
}

/// One kind in one wave of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct MixRow {
    pub workload: String,
    pub clients: usize,
    pub kind: &'static str,
    /// Against one client sending this kind alone (a kind first met in the mixed workload:
    /// its first row).
    #[serde(flatten)]
    pub figures: WaveFigures,
    /// Mean sequences of each strategy per scheduler step during the wave.
    pub sequences_per_step: BTreeMap<String, f64>,
}

/// What `glance bench serve --mix` reports (the JSON it writes).
#[derive(Debug, Clone, Serialize)]
pub struct MixReport {
    pub bench: &'static str,
    pub model: String,
    pub threads: usize,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub requests_per_client: usize,
    pub kinds: Vec<&'static str>,
    pub rows: Vec<MixRow>,
}

/// Runs each kind alone, then all of them mixed, on one batching server over `engine`.
pub fn run(
    o: &ServeOptions,
    name: &str,
    engine: Arc<Engine>,
    images: &[String],
) -> Result<MixReport> {
    let kinds: Vec<MixKind> = o
        .mix
        .iter()
        .map(|s| MixKind::parse(s))
        .collect::<Result<_>>()?;
    for k in &kinds {
        engine.check_decode(&k.decode()).with_context(|| {
            format!("--mix {}: {name} cannot run this kind of request", k.name())
        })?;
    }
    let mut workloads: Vec<(String, Vec<MixKind>)> = kinds
        .iter()
        .map(|k| (k.name().to_string(), vec![*k]))
        .collect();
    if kinds.len() > 1 {
        workloads.push(("mixed".into(), kinds.clone()));
    }
    let server = glance_serve::spawn(engine.clone(), server_config(o, true), "127.0.0.1:0")?;
    let ask = (o.max_tokens, o.ignore_eos);
    // One warm-up request of each kind (thread pools, allocator, the cost model of `auto`).
    for k in &kinds {
        stream_once(server.addr, &images[0], 0, ask, &k.options())?;
    }
    let mut rows = Vec::new();
    // Each kind's rate with one client sending it alone: what every row of that kind is
    // compared with (the mixed workload's rows too).
    let mut single: BTreeMap<&str, f64> = BTreeMap::new();
    for (workload, mix) in &workloads {
        for &c in &o.clients {
            let before = scrape(server.addr)?;
            let start = Instant::now();
            let options: Vec<Value> = mix.iter().map(|k| k.options()).collect();
            let samples: Vec<(MixKind, Sample)> =
                wave(server.addr, images, &options, c, o.requests, ask)?
                    .into_iter()
                    .map(|(i, s)| (mix[i], s))
                    .collect();
            let wall = start.elapsed().as_secs_f64();
            let after = scrape(server.addr)?;
            let composition = composition(&before, &after);
            for k in mix {
                let mine: Vec<&Sample> = samples
                    .iter()
                    .filter(|(kind, _)| kind == k)
                    .map(|(_, s)| s)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let figures = WaveFigures::new(&mine, wall, single.get(k.name()).copied());
                single.entry(k.name()).or_insert(figures.tokens_per_s);
                rows.push(MixRow {
                    workload: workload.clone(),
                    clients: c,
                    kind: k.name(),
                    figures,
                    sequences_per_step: composition.clone(),
                });
            }
        }
    }
    server.shutdown()?;
    Ok(MixReport {
        bench: "serve-mix",
        model: name.to_string(),
        threads: engine.threads(),
        max_tokens: o.max_tokens,
        ignore_eos: o.ignore_eos,
        requests_per_client: o.requests,
        kinds: kinds.iter().map(|k| k.name()).collect(),
        rows,
    })
}

/// The server's scheduler counters: steps, and sequences decoded per strategy.
fn scrape(addr: SocketAddr) -> Result<BTreeMap<String, f64>> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    BufReader::new(conn)
        .take(4 << 20)
        .read_to_string(&mut text)?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if key.starts_with("glance_batch_decode_steps_total") {
            out.insert("steps".to_string(), v);
        } else if key.starts_with("glance_batch_decode_rows_by_strategy_total") {
            if let Some(s) = key
                .split("strategy=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
            {
                out.insert(s.to_string(), v);
            }
        }
    }
    Ok(out)
}

/// Mean sequences of each strategy per scheduler step between two scrapes.
fn composition(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let delta =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let steps = delta("steps");
    after
        .keys()
        .filter(|k| *k != "steps")
        .map(|k| (k.clone(), if steps > 0.0 { delta(k) / steps } else { 0.0 }))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composition_is_sequences_per_step_between_scrapes() {
        let before: BTreeMap<String, f64> =
            [("steps".to_string(), 10.0), ("ar".to_string(), 10.0)].into();
        let after: BTreeMap<String, f64> = [
            ("steps".to_string(), 14.0),
            ("ar".to_string(), 18.0),
            ("vispec".to_string(), 2.0),
            ("eagle".to_string(), 0.0),
        ]
        .into();
        let c = composition(&before, &after);
        assert_eq!(c.get("ar"), Some(&2.0));
        assert_eq!(c.get("vispec"), Some(&0.5));
        assert!(!c.contains_key("eagle") && !c.contains_key("steps"));
    }

    #[test]
    fn kinds_parse_by_name() {
        assert_eq!(MixKind::parse(" prune").unwrap(), MixKind::Prune);
        assert!(MixKind::parse("beam").is_err());
        assert_eq!(MixKind::Prune.decode(), DecodeSpec::Autoregressive);
    }
}
