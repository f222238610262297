//! The tables `glance bench spec` prints (one per temperature × answer kind), its JSON, and its
//! two plots: acceptance rate by draft depth, and tokens per round by position in the
//! description (the "middle-forgetting" curve).

use super::{Column, Measured, SpecBenchArgs};
use crate::bench::tally::{num, Kind, Tally, PHASES};
use crate::plot::{write_line_plot, Axes, Series};
use anyhow::Result;
use glance_decode::speculative::POSITION_BUCKET;
use glance_decode::TreeSettings;
use glance_engine::eval::SHORT_MAX_NEW_TOKENS;
use glance_engine::Engine;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Position buckets with fewer rounds than this are left out of the plot (not the table): the
/// last bucket of the longest answer alone is noise.
const MIN_PLOTTED_ROUNDS: u64 = 5;

/// `v` to `decimals`, `-` when not finite, right-aligned in `width`.
fn cell(v: f64, width: usize, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:>width$.decimals$}")
    } else {
        format!("{:>width$}", "-")
    }
}

/// A row of rates, each in 5 characters.
fn rates(v: &[f64], n: usize) -> String {
    (0..n)
        .map(|i| cell(v.get(i).copied().unwrap_or(f64::NAN), 5, 2))
        .collect::<Vec<_>>()
        .join(" ")
}

fn kind_title(kind: Kind) -> &'static str {
    match kind {
        Kind::Short => "short answers (attribute, counting, spatial, existence, sign)",
        Kind::Description => "descriptions",
    }
}

/// Prints one group's tables.
fn print_group(t: f32, kind: Kind, cols: &[Column], tallies: &[Tally]) {
    let ar = &tallies[0];
    println!(
        "\nT={t} · {}: {} questions, {} tokens by ar",
        kind_title(kind),
        ar.questions,
        ar.tokens
    );
    let depth = tallies
        .iter()
        .map(|x| x.offered_by_depth.len())
        .max()
        .unwrap_or(0);
    let buckets = tallies
        .iter()
        .map(|x| x.rounds_by_position.len())
        .max()
        .unwrap_or(0);
    let by_depth = format!("acceptance at depth 1..{depth}");
    let score = if kind == Kind::Description {
        "F1"
    } else {
        "accuracy"
    };
    let w = depth * 6;
    println!(
        "{:<22} {:>7} {:>7} | {:<w$} | {:>7} {:>8} | {:>8} {:>8}",
        "strategy", "tok/fwd", "rows", by_depth, "tok/s", "speedup", "mismatch", score
    );
    for (c, x) in cols.iter().zip(tallies) {
        let mismatch = x.mismatches.map_or("-".to_string(), |m| m.to_string());
        let rows = if x.rounds > 0 {
            x.mean_tree_rows()
        } else {
            f64::NAN
        };
        println!(
            "{:<22} {} {} | {:<w$} | {} {}× | {:>8} {}",
            c.name,
            cell(x.tokens_per_forward(), 7, 2),
            cell(rows, 7, 1),
            if x.rounds > 0 {
                rates(&x.acceptance_by_depth(), depth)
            } else {
                String::new()
            },
            cell(x.tokens_per_s(), 7, 0),
            cell(x.tokens_per_s() / ar.tokens_per_s(), 7, 2),
            mismatch,
            cell(x.accuracy(), 8, 3)
        );
    }
    for (c, x) in cols.iter().zip(tallies) {
        let predicted = x.predicted_speedup();
        if predicted.is_finite() {
            println!(
                "{}: the cost model predicted {predicted:.2}× for the rounds it planned, measured \
                 {:.2}×",
                c.name,
                x.tokens_per_s() / ar.tokens_per_s()
            );
        }
    }
    let ar_step = ar.decode_s / ar.forwards as f64;
    println!(
        "where the decode time went (share of decode time; ms per answer for start, per round for \
         the rest); ar: {} ms per forward",
        cell(ar_step * 1e3, 0, 2).trim()
    );
    for (c, x) in cols.iter().zip(tallies).filter(|(_, x)| x.rounds > 0) {
        let parts: Vec<String> = PHASES
            .iter()
            .zip(x.phase_us)
            .map(|(p, us)| {
                let s = us as f64 / 1e6;
                let per = if *p == "start" {
                    x.questions as u64
                } else {
                    x.rounds
                };
                format!(
                    "{p} {}% {}",
                    cell(100.0 * s / x.decode_s, 3, 0),
                    cell(1e3 * s / per as f64, 5, 2)
                )
            })
            .collect();
        println!("{:<22} {}", c.name, parts.join(" · "));
    }
    if buckets == 0 {
        return;
    }
    let head: Vec<String> = (0..buckets)
        .map(|b| format!("{:>5}", format!("{}+", b * POSITION_BUCKET)))
        .collect();
    println!(
        "tokens per round by response position ({POSITION_BUCKET}-token buckets)\n{:<22} {}",
        "strategy",
        head.join(" ")
    );
    for (c, x) in cols.iter().zip(tallies).filter(|(_, x)| x.rounds > 0) {
        println!(
            "{:<22} {}",
            c.name,
            rates(&x.tokens_per_round_by_position(), buckets)
        );
    }
}

/// Prints every table and returns the report's JSON (without the projection).
pub fn report(
    dir: &Path,
    engine: &Engine,
    args: &SpecBenchArgs,
    tree: &TreeSettings,
    cols: &[Column],
    m: &Measured,
) -> Result<Value> {
    let mut groups = Vec::new();
    for g in &m.groups {
        print_group(g.temperature, g.kind, cols, &g.tallies);
        let ar_rate = g.tallies[0].tokens_per_s();
        let strategies: Vec<Value> = cols
            .iter()
            .zip(&g.tallies)
            .map(|(c, x)| x.to_json(&c.name, ar_rate))
            .collect();
        groups.push(json!({
            "temperature": g.temperature,
            "answers": g.kind.name(),
            "questions": g.tallies[0].questions,
            "strategies": strategies,
        }));
    }
    println!(
        "\n{} images, {} questions at each temperature, {:.1} s (tok/fwd: tokens per target \
         forward; rows: mean rows verified per forward; speedup: decode tokens/s over ar's, \
         measured interleaved)",
        m.images, m.questions, m.seconds
    );
    let strategies: Vec<Value> = cols
        .iter()
        .map(|c| match &c.head {
            None => json!({"name": c.name, "decode": c.spec.name()}),
            Some(h) => json!({"name": c.name, "decode": c.spec.name(), "head": h.dir,
                "adaptor_queries": h.config.adaptor_queries,
                "global_injection": h.config.global_injection}),
        })
        .collect();
    Ok(json!({
        "bench": "spec",
        "model": dir,
        "threads": engine.threads(),
        "split": "test",
        "start": args.start,
        "images": m.images,
        "questions": m.questions,
        "temperatures": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "short_max_new_tokens": SHORT_MAX_NEW_TOKENS.min(args.max_new_tokens),
        "tree": tree,
        "position_bucket": POSITION_BUCKET,
        "strategies": strategies,
        "groups": groups,
        "seconds": num(m.seconds),
    }))
}

fn short(kind: Kind) -> &'static str {
    match kind {
        Kind::Short => "short",
        Kind::Description => "desc",
    }
}

fn ticks(n: usize, step: usize, first: usize) -> Vec<(f64, String)> {
    (0..n)
        .map(|i| ((first + i * step) as f64, (first + i * step).to_string()))
        .collect()
}

/// The acceptance-by-depth plot (a line per strategy × answer kind × temperature) and the
/// tokens-per-round-by-position plot (descriptions; a line per strategy × temperature; buckets of
/// at least [`MIN_PLOTTED_ROUNDS`] rounds).
pub fn plots(paths: &[PathBuf], cols: &[Column], m: &Measured) -> Result<()> {
    let spec_lines = || {
        m.groups.iter().flat_map(|g| {
            cols.iter()
                .zip(&g.tallies)
                .filter(|(_, x)| x.rounds > 0)
                .map(move |(c, x)| (g, c, x))
        })
    };
    let depth = spec_lines()
        .map(|(_, _, x)| x.offered_by_depth.len())
        .max()
        .unwrap_or(1);
    let series: Vec<Series> = spec_lines()
        .map(|(g, c, x)| Series {
            name: format!("{} {} T{}", c.name, short(g.kind), g.temperature),
            points: x
                .acceptance_by_depth()
                .into_iter()
                .enumerate()
                .map(|(d, a)| ((d + 1) as f64, a))
                .collect(),
        })
        .collect();
    let x_ticks = ticks(depth, 1, 1);
    let axes = Axes {
        title: "Acceptance rate by draft depth",
        x_label: "draft depth",
        y_label: "acceptance rate (accepted / reached)",
        x_ticks: &x_ticks,
        log2_x: false,
    };
    write_line_plot(&paths[0], &axes, &series)?;
    let series: Vec<Series> = spec_lines()
        .filter(|(g, _, _)| g.kind == Kind::Description)
        .map(|(g, c, x)| Series {
            name: format!("{} T{}", c.name, g.temperature),
            points: x
                .tokens_per_round_by_position()
                .into_iter()
                .enumerate()
                .filter(|&(b, _)| x.rounds_by_position[b] >= MIN_PLOTTED_ROUNDS)
                .map(|(b, v)| ((b * POSITION_BUCKET) as f64, v))
                .collect(),
        })
        .collect();
    let buckets = spec_lines()
        .filter(|(g, _, _)| g.kind == Kind::Description)
        .map(|(_, _, x)| x.rounds_by_position.len())
        .max()
        .unwrap_or(1);
    let x_ticks = ticks(buckets, POSITION_BUCKET, 0);
    let x_label =
        format!("response position (tokens; start of each {POSITION_BUCKET}-token bucket)");
    let axes = Axes {
        title: "Tokens per round by position in the description",
        x_label: &x_label,
        y_label: "tokens emitted per target forward",
        x_ticks: &x_ticks,
        log2_x: false,
    };
    write_line_plot(&paths[1], &axes, &series)
}
