//! The tables `glance bench spec` prints (one per temperature × answer kind) and its two plots:
//! acceptance rate by draft depth, and tokens per round by position in the description (the
//! "middle-forgetting" curve).

use crate::bench::cell;
use crate::plot::{write_line_plot, Axes, Series};
use anyhow::Result;
use glance_bench::spec::{SpecGroup, SpecReport};
use glance_bench::tally::{Kind, TallyRow, PHASES};
use glance_decode::speculative::POSITION_BUCKET;
use std::path::PathBuf;

/// Position buckets with fewer rounds than this are left out of the plot (not the table): the
/// last bucket of the longest answer alone is noise.
const MIN_PLOTTED_ROUNDS: u64 = 5;

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
fn print_group(g: &SpecGroup) {
    let rows = &g.strategies;
    let ar = &rows[0];
    println!(
        "\nT={} · {}: {} questions, {} tokens by ar",
        g.temperature,
        kind_title(g.kind),
        ar.questions,
        ar.completion_tokens
    );
    let depth = rows
        .iter()
        .map(|x| x.offered_by_depth.len())
        .max()
        .unwrap_or(0);
    let buckets = rows
        .iter()
        .map(|x| x.rounds_by_position.len())
        .max()
        .unwrap_or(0);
    let by_depth = format!("acceptance at depth 1..{depth}");
    let score = if g.kind == Kind::Description {
        "F1"
    } else {
        "accuracy"
    };
    let w = depth * 6;
    println!(
        "{:<22} {:>7} {:>7} | {:<w$} | {:>7} {:>8} | {:>8} {:>8}",
        "strategy", "tok/fwd", "rows", by_depth, "tok/s", "speedup", "mismatch", score
    );
    for x in rows {
        let mismatch = x
            .greedy_mismatches
            .map_or("-".to_string(), |m| m.to_string());
        let tree_rows = if x.rounds > 0 {
            x.mean_tree_rows
        } else {
            f64::NAN
        };
        println!(
            "{:<22} {} {} | {:<w$} | {} {}× | {:>8} {}",
            x.strategy,
            cell(x.tokens_per_forward, 7, 2),
            cell(tree_rows, 7, 1),
            if x.rounds > 0 {
                rates(&x.acceptance_by_depth, depth)
            } else {
                String::new()
            },
            cell(x.decode_tokens_per_s, 7, 0),
            cell(x.speedup, 7, 2),
            mismatch,
            cell(x.accuracy, 8, 3)
        );
    }
    for x in rows.iter().filter(|x| x.predicted_speedup.is_finite()) {
        println!(
            "{}: the cost model predicted {:.2}× for the rounds it planned, measured {:.2}×",
            x.strategy, x.predicted_speedup, x.speedup
        );
    }
    let ar_step = ar.decode_s / ar.forward_passes as f64;
    println!(
        "where the decode time went (share of decode time; ms per answer for start, per round for \
         the rest); ar: {} ms per forward",
        cell(ar_step * 1e3, 0, 2).trim()
    );
    for x in rows.iter().filter(|x| x.rounds > 0) {
        let parts: Vec<String> = PHASES
            .iter()
            .map(|p| {
                let s = x.phase_s.get(*p).copied().unwrap_or(0.0);
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
        println!("{:<22} {}", x.strategy, parts.join(" · "));
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
    for x in rows.iter().filter(|x| x.rounds > 0) {
        println!(
            "{:<22} {}",
            x.strategy,
            rates(&x.tokens_per_round_by_position, buckets)
        );
    }
}

/// Prints every group's tables and the run's summary line.
pub fn print(r: &SpecReport) {
    for g in &r.groups {
        print_group(g);
    }
    println!(
        "\n{} images, {} questions at each temperature, {:.1} s (tok/fwd: tokens per target \
         forward; rows: mean rows verified per forward; speedup: decode tokens/s over ar's, \
         measured interleaved)",
        r.images, r.questions, r.seconds
    );
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
pub fn plots(paths: &[PathBuf], r: &SpecReport) -> Result<()> {
    let spec_lines = || {
        r.groups.iter().flat_map(|g| {
            g.strategies
                .iter()
                .filter(|x| x.rounds > 0)
                .map(move |x| (g, x))
        })
    };
    let depth = spec_lines()
        .map(|(_, x)| x.offered_by_depth.len())
        .max()
        .unwrap_or(1);
    let series: Vec<Series> = spec_lines()
        .map(|(g, x): (&SpecGroup, &TallyRow)| Series {
            name: format!("{} {} T{}", x.strategy, short(g.kind), g.temperature),
            points: x
                .acceptance_by_depth
                .iter()
                .enumerate()
                .map(|(d, &a)| ((d + 1) as f64, a))
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
        .filter(|(g, _)| g.kind == Kind::Description)
        .map(|(g, x)| Series {
            name: format!("{} T{}", x.strategy, g.temperature),
            points: x
                .tokens_per_round_by_position
                .iter()
                .enumerate()
                .filter(|&(b, _)| x.rounds_by_position[b] >= MIN_PLOTTED_ROUNDS)
                .map(|(b, &v)| ((b * POSITION_BUCKET) as f64, v))
                .collect(),
        })
        .collect();
    let buckets = spec_lines()
        .filter(|(g, _)| g.kind == Kind::Description)
        .map(|(_, x)| x.rounds_by_position.len())
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
