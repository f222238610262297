//! The memory-bound projection's tables ([`glance_bench::spec::projection`] measures it).

use glance_bench::spec::projection::{Projection, KS, PROMPT};

/// Prints the measured costs and each strategy's projected speedup.
pub fn print(p: &Projection) {
    println!(
        "\nmemory-bound projection: random {} ({:.2}B parameters, {} layers, hidden {}), \
         {PROMPT}-row prompt in the cache, best of {}, {} threads",
        p.shape,
        p.parameters as f64 / 1e9,
        p.layers,
        p.hidden,
        p.reps,
        p.threads
    );
    let row = |label: &str, f: &dyn Fn(usize) -> String| {
        let cells: Vec<String> = (0..KS.len().min(p.verify.len())).map(f).collect();
        println!("{label:<26} {}", cells.join(" "));
    };
    row("verify k rows (tree)", &|i| format!("{:>7}", p.verify[i].k));
    row("t(k) ms", &|i| {
        format!("{:>7.1}", p.verify[i].seconds * 1e3)
    });
    row("c(k) = t(k) / t(1)", &|i| {
        format!("{:>7.2}", p.verify[i].cost_ratio)
    });
    for d in &p.draft_step {
        println!(
            "draft step, {} head (fc, one layer, LM head over {} rows): {:.1} ms = {:.3} t(1); \
             at the memory bound {:.3} t(1)",
            d.head,
            d.rows,
            d.seconds * 1e3,
            d.fraction_of_t1,
            d.memory_bound_fraction_of_t1
        );
    }
    println!(
        "{:<22} {:>3} {:>12} | {:>5} {:>6} {:>6} {:>6} {:>7} | {:>9} {:>9}",
        "strategy", "T", "answers", "τ", "k̄", "steps", "c(k̄)", "draft", "projected", "bound"
    );
    for r in &p.rows {
        println!(
            "{:<22} {:>3} {:>12} | {:>5.2} {:>6.1} {:>6.2} {:>6.2} {:>7.2} | {:>8.2}× {:>8.2}×",
            r.strategy,
            r.temperature,
            r.answers,
            r.tokens_per_round,
            r.mean_tree_rows,
            r.draft_steps_per_round,
            r.verify_cost,
            r.draft_cost,
            r.projected_speedup,
            r.memory_bound_speedup
        );
    }
    println!(
        "(τ: tokens per round; k̄: rows verified per round; steps: draft steps per round; costs in \
         units of t(1); projected = τ / (c(k̄) + steps · draft step), measured; bound: the same \
         with c = 1 and the draft step's share of the weight bytes)"
    );
}
