//! `glance bench serve --mix ar,vispec,eagle,prune,diffusion`: the one scheduler under a mixed
//! workload. A real `glance serve` (batching on) answers 1, 2, 4, … concurrent streaming clients,
//! first each request kind alone (every client sends that kind), then all kinds at once (client
//! `c` sends kind `c mod kinds`). Per workload and kind: aggregate generated tokens/s and its ratio
//! to one client sending that kind alone, time to first token and time per output token (p50 / p99) as clients see them,
//! and the batch composition: the mean number of sequences of each strategy per scheduler step
//! (from the server's `/metrics`).

use super::serve::{pct, stream_once, wave, Sample, ServeBenchArgs};
use anyhow::{Context, Result};
use glance_engine::{DecodeSpec, DiffusionMode, DraftKind, Engine};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A kind of request in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ar,
    Vispec,
    Eagle,
    /// Plain decoding after adaptive pruning to 12.5% of the visual tokens.
    Prune,
    /// Linear block diffusion (a converted model).
    Diffusion,
    Auto,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Ar,
        Kind::Vispec,
        Kind::Eagle,
        Kind::Prune,
        Kind::Diffusion,
        Kind::Auto,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Ar => "ar",
            Kind::Vispec => "vispec",
            Kind::Eagle => "eagle",
            Kind::Prune => "prune",
            Kind::Diffusion => "diffusion",
            Kind::Auto => "auto",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .with_context(|| {
                let known: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "--mix: unknown request kind `{s}` (known: {})",
                    known.join(", ")
                )
            })
    }

    fn decode(self) -> DecodeSpec {
        match self {
            Kind::Ar | Kind::Prune => DecodeSpec::Autoregressive,
            Kind::Vispec => DecodeSpec::speculative(DraftKind::Vispec),
            Kind::Eagle => DecodeSpec::speculative(DraftKind::Eagle),
            Kind::Diffusion => DecodeSpec::diffusion(DiffusionMode::Linear),
            Kind::Auto => DecodeSpec::auto(),
        }
    }

    /// The request's `glance` options.
    fn options(self) -> Value {
        match self {
            Kind::Prune => json!({"decode": "ar", "prune": {"policy": "adaptive", "keep": 0.125}}),
            k => json!({"decode": k.decode().name()}),
        }
    }
}

pub fn run(
    args: &ServeBenchArgs,
    name: &str,
    engine: Arc<Engine>,
    images: &[String],
) -> Result<()> {
    let kinds: Vec<Kind> = args
        .mix
        .iter()
        .map(|s| Kind::parse(s))
        .collect::<Result<_>>()?;
    for k in &kinds {
        engine.check_decode(&k.decode()).with_context(|| {
            format!("--mix {}: {name} cannot run this kind of request", k.name())
        })?;
    }
    let mut workloads: Vec<(String, Vec<Kind>)> = kinds
        .iter()
        .map(|k| (k.name().to_string(), vec![*k]))
        .collect();
    if kinds.len() > 1 {
        workloads.push(("mixed".into(), kinds.clone()));
    }
    let server = glance_serve::spawn(
        engine.clone(),
        super::serve::server_config(args, true),
        "127.0.0.1:0",
    )?;
    let ask = (args.max_tokens, args.ignore_eos);
    // One warm-up request of each kind (thread pools, allocator, the cost model of `auto`).
    for k in &kinds {
        stream_once(server.addr, &images[0], 0, ask, &k.options())?;
    }
    println!(
        "{:<10} {:>7} {:<10} {:>6} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9}  sequences per step",
        "workload",
        "clients",
        "kind",
        "tokens",
        "tok/s",
        "× 1 cli",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99"
    );
    let mut report = Vec::new();
    // Each kind's rate with one client sending it alone: what every row of that kind is
    // compared with (the mixed workload's rows too).
    let mut single: BTreeMap<&str, f64> = BTreeMap::new();
    for (workload, mix) in &workloads {
        for &c in &args.clients {
            let before = scrape(server.addr)?;
            let start = Instant::now();
            let options: Vec<Value> = mix.iter().map(|k| k.options()).collect();
            let samples: Vec<(Kind, Sample)> =
                wave(server.addr, images, &options, c, args.requests, ask)?
                    .into_iter()
                    .map(|(o, s)| (mix[o], s))
                    .collect();
            let wall = start.elapsed().as_secs_f64();
            let after = scrape(server.addr)?;
            let composition = composition(&before, &after);
            let shown: Vec<String> = composition
                .iter()
                .map(|(s, n)| format!("{s} {n:.2}"))
                .collect();
            for k in mix {
                let mine: Vec<&Sample> = samples
                    .iter()
                    .filter(|(kind, _)| kind == k)
                    .map(|(_, s)| s)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let tokens: usize = mine.iter().map(|s| s.tokens).sum();
                let rate = tokens as f64 / wall;
                let base = *single.entry(k.name()).or_insert(rate);
                // (A kind first met in the mixed workload is compared with its first row.)
                let ttft: Vec<f64> = mine.iter().map(|s| s.ttft).collect();
                let tpot: Vec<f64> = mine.iter().filter_map(|s| s.tpot).collect();
                let (t50, t99, p50, p99) = (
                    pct(&ttft, 50.0),
                    pct(&ttft, 99.0),
                    pct(&tpot, 50.0),
                    pct(&tpot, 99.0),
                );
                println!(
                    "{:<10} {:>7} {:<10} {:>6} {:>9.1} {:>8.2} {:>7.0}ms {:>7.0}ms {:>7.2}ms {:>7.2}ms  {}",
                    workload,
                    c,
                    k.name(),
                    tokens,
                    rate,
                    rate / base,
                    t50 * 1e3,
                    t99 * 1e3,
                    p50 * 1e3,
                    p99 * 1e3,
                    shown.join(" · ")
                );
                report.push(json!({
                    "workload": workload, "clients": c, "kind": k.name(),
                    "requests": mine.len(), "tokens": tokens, "wall_s": wall,
                    "tokens_per_s": rate, "speedup_vs_one_client": rate / base,
                    "ttft_p50_s": t50, "ttft_p99_s": t99, "tpot_p50_s": p50, "tpot_p99_s": p99,
                    "sequences_per_step": composition,
                }));
            }
            let _ = std::io::stdout().flush();
        }
    }
    server.shutdown()?;
    let out = json!({
        "bench": "serve-mix", "model": name, "threads": engine.threads(),
        "max_tokens": args.max_tokens, "ignore_eos": args.ignore_eos,
        "requests_per_client": args.requests,
        "kinds": kinds.iter().map(|k| k.name()).collect::<Vec<_>>(), "rows": report,
    });
    super::write_json(&args.json, &out)?;
    println!("wrote {}", args.json.display());
    Ok(())
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
