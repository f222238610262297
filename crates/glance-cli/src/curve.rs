//! `glance train curve RUN…`: validation accuracy against training time, read back from the
//! `metrics.jsonl` of one or more training runs (in order: a vision-stage run, then the LLaVA
//! stage initialised from it, …). Prints a table and writes an SVG plot and JSON.
//!
//! Training time is the sum of the step times (`seconds` of every `step` record); validation
//! time is not counted. A step logged twice — re-run after a resume from an earlier checkpoint —
//! counts once (its last record), so the curve is the recipe's, not the interruptions'.

use crate::plot::{line_plot, linear_ticks, write_svg, Axes, Series};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_world::Family;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct CurveArgs {
    /// Training output directories (each holds metrics.jsonl), in the order they ran.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Where to write the plot (default: curve.svg in the last run directory).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Where to write the points as JSON (default: curve.json beside the plot).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One validation of the curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Training minutes before this validation, over every run before it too.
    pub minutes: f64,
    pub stage: String,
    pub step: u64,
    /// Mean short-answer accuracy.
    pub mean: f64,
    /// Score per family (descriptions: object F1), `None` without questions.
    pub families: Vec<(Family, Option<f64>)>,
}

/// The validation points of `metrics.jsonl` texts, in run order.
pub fn points(runs: &[String]) -> Result<Vec<Point>> {
    let mut out = Vec::new();
    let mut offset = 0.0;
    for (r, text) in runs.iter().enumerate() {
        // (stage, step) → step seconds; the last record of a step wins.
        let mut steps: BTreeMap<(String, u64), f64> = BTreeMap::new();
        // Stage order as first seen, so cumulative time follows the run.
        let mut stages: Vec<String> = Vec::new();
        let mut evals: Vec<(String, u64, Value)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("run {}: line {} is not JSON", r + 1, i + 1))?;
            let stage = v["stage"].as_str().unwrap_or_default().to_string();
            let step = v["step"].as_u64().unwrap_or(0);
            if !stages.contains(&stage) {
                stages.push(stage.clone());
            }
            match v["kind"].as_str() {
                Some("step") => {
                    steps.insert((stage, step), v["seconds"].as_f64().unwrap_or(0.0));
                }
                Some("eval") => evals.push((stage, step, v["report"].clone())),
                _ => {}
            }
        }
        // Seconds spent before (stage, step) ends: earlier stages whole, this one up to `step`.
        let before = |stage: &str, step: u64| -> f64 {
            let rank = stages.iter().position(|s| s == stage).unwrap_or(0);
            steps
                .iter()
                .filter(|((s, n), _)| {
                    let k = stages.iter().position(|x| x == s).unwrap_or(0);
                    k < rank || (k == rank && *n <= step)
                })
                .map(|(_, sec)| sec)
                .sum()
        };
        for (stage, step, report) in evals {
            let families = Family::ALL
                .iter()
                .map(|&f| {
                    let score = report["families"].as_array().and_then(|fs| {
                        fs.iter()
                            .find(|x| x["family"] == f.name())
                            .and_then(|x| x["score"].as_f64())
                    });
                    (f, score)
                })
                .collect();
            out.push(Point {
                minutes: (offset + before(&stage, step)) / 60.0,
                stage,
                step,
                mean: report["mean"].as_f64().unwrap_or(f64::NAN),
                families,
            });
        }
        offset += steps.values().sum::<f64>();
    }
    Ok(out)
}

fn metrics_text(dir: &Path) -> Result<String> {
    let path = dir.join("metrics.jsonl");
    if !path.is_file() {
        bail!(
            "{}: no metrics.jsonl (is it a training run directory?)",
            dir.display()
        );
    }
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

pub fn run(a: CurveArgs) -> Result<()> {
    let texts = a
        .runs
        .iter()
        .map(|d| metrics_text(d))
        .collect::<Result<Vec<_>>>()?;
    let pts = points(&texts)?;
    if pts.is_empty() {
        bail!("no validation records in these runs (train with --eval-per-family > 0)");
    }
    print!(
        "{:>8} {:>7} {:>6} {:>6}",
        "minutes", "stage", "step", "mean"
    );
    for f in Family::ALL {
        print!(" {:>11}", f.name());
    }
    println!();
    for p in &pts {
        print!(
            "{:>8.1} {:>7} {:>6} {:>6.3}",
            p.minutes, p.stage, p.step, p.mean
        );
        for (_, s) in &p.families {
            match s {
                Some(s) => print!(" {s:>11.3}"),
                None => print!(" {:>11}", "-"),
            }
        }
        println!();
    }
    let last = a.runs.last().expect("clap requires one run");
    let svg = a.svg.clone().unwrap_or_else(|| last.join("curve.svg"));
    let json_path = a.json.clone().unwrap_or_else(|| svg.with_extension("json"));
    let mut series = vec![Series {
        name: "mean (short)".into(),
        points: pts.iter().map(|p| (p.minutes, p.mean)).collect(),
    }];
    for (k, f) in Family::ALL.iter().enumerate() {
        series.push(Series {
            name: if *f == Family::Description {
                "description F1".into()
            } else {
                f.name().into()
            },
            points: pts
                .iter()
                .filter_map(|p| p.families[k].1.map(|s| (p.minutes, s)))
                .collect(),
        });
    }
    let max = pts.iter().map(|p| p.minutes).fold(0.0, f64::max);
    let ticks = linear_ticks(max, 6);
    let axes = Axes {
        title: "Validation accuracy vs training time",
        x_label: "training minutes",
        y_label: "accuracy (descriptions: object F1)",
        x_ticks: &ticks,
        log2_x: false,
    };
    write_svg(&svg, &line_plot(&axes, &series))?;
    let rows: Vec<Value> = pts
        .iter()
        .map(|p| {
            let fams: serde_json::Map<String, Value> = p
                .families
                .iter()
                .map(|(f, s)| (f.name().to_string(), json!(s)))
                .collect();
            json!({"minutes": p.minutes, "stage": p.stage, "step": p.step, "mean": p.mean,
                   "families": fams})
        })
        .collect();
    crate::bench::write_json(&json_path, &json!({"runs": a.runs, "points": rows}))?;
    eprintln!("plot: {} · points: {}", svg.display(), json_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(stage: &str, n: u64, s: f64) -> String {
        format!(r#"{{"kind":"step","stage":"{stage}","step":{n},"seconds":{s}}}"#)
    }
    fn eval(stage: &str, n: u64, mean: f64) -> String {
        format!(
            r#"{{"kind":"eval","stage":"{stage}","step":{n},"report":{{"mean":{mean},"families":[{{"family":"sign","questions":4,"score":0.25}}]}}}}"#
        )
    }

    #[test]
    fn time_accumulates_across_stages_and_runs_and_replays_count_once() {
        let run1 = [step("vision", 1, 60.0), step("vision", 2, 60.0)].join("\n");
        let run2 = [
            step("llava", 1, 30.0),
            step("llava", 2, 30.0),
            // Resumed from the checkpoint after step 1: step 2 runs again.
            step("llava", 2, 30.0),
            eval("llava", 2, 0.5),
            step("llava", 3, 60.0),
            eval("llava", 3, 0.75),
        ]
        .join("\n");
        let p = points(&[run1, run2]).unwrap();
        assert_eq!(p.len(), 2);
        assert!((p[0].minutes - 3.0).abs() < 1e-9, "{}", p[0].minutes);
        assert!((p[1].minutes - 4.0).abs() < 1e-9, "{}", p[1].minutes);
        assert_eq!(
            (p[1].stage.as_str(), p[1].step, p[1].mean),
            ("llava", 3, 0.75)
        );
        let sign = p[0].families.iter().find(|f| f.0 == Family::Sign).unwrap();
        assert_eq!(sign.1, Some(0.25));
        let attr = p[0].families.iter().find(|f| f.0 == Family::Attribute);
        assert_eq!(attr.unwrap().1, None);
    }

    #[test]
    fn bad_lines_are_named() {
        let e = points(&["{\"kind\":\"step\"}\nnot json".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("line 2"), "{e:#}");
    }
}
