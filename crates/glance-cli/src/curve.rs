//! `glance train curve RUN…`: validation accuracy against training time, read back from the
//! `metrics.jsonl` of one or more training runs (in order: a vision-stage run, then the LLaVA
//! stage initialised from it, …). Prints a table and writes an SVG plot and JSON.
//!
//! Training time is the sum of the step times (`seconds` of every `step` record); validation
//! time is not counted. A step logged twice — re-run after a resume from an earlier checkpoint —
//! counts once (its last record), so the curve is the recipe's, not the interruptions'.

use crate::plot::{write_line_plot, Axes, Series};
use anyhow::{bail, Context, Result};
use clap::Args;
use glance_train::metrics::{records, Record};
use glance_train::Stage;
use glance_world::Family;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::BufRead;
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
    pub stage: Stage,
    pub step: u64,
    /// Mean short-answer accuracy (NaN without questions).
    pub mean: f64,
    /// Score per family (descriptions: object F1), `None` without questions.
    pub families: Vec<(Family, Option<f64>)>,
}

/// The validation points of `metrics.jsonl` streams (named for errors), in run order. Records
/// are read one line at a time; only step times and validation scores are kept.
pub fn points<R: BufRead>(runs: Vec<(String, R)>) -> Result<Vec<Point>> {
    let mut out = Vec::new();
    let mut offset = 0.0;
    for (name, reader) in runs {
        // (stage rank, step) → step seconds; the last record of a step wins.
        let mut steps: BTreeMap<(usize, u64), f64> = BTreeMap::new();
        // Stage order as first seen, so cumulative time follows the run.
        let mut stages: Vec<Stage> = Vec::new();
        let mut evals = Vec::new();
        for record in records(reader) {
            let (line, record) = record.with_context(|| format!("{name}: metrics.jsonl"))?;
            let stage = record.stage();
            let rank = match stages.iter().position(|s| *s == stage) {
                Some(k) => k,
                None => {
                    stages.push(stage);
                    stages.len() - 1
                }
            };
            match record {
                Record::Step(s) => {
                    if !(s.seconds.is_finite() && s.seconds >= 0.0) {
                        bail!(
                            "{name}: metrics.jsonl line {line}: step time {} is not a finite \
                             number of seconds",
                            s.seconds
                        );
                    }
                    steps.insert((rank, s.step), s.seconds);
                }
                Record::Eval(e) => evals.push((rank, e)),
            }
        }
        // Seconds spent before (stage, step) ends: earlier stages whole, this one up to `step`.
        let mut cumulative = Vec::with_capacity(steps.len());
        let mut total = 0.0;
        for (key, sec) in &steps {
            total += sec;
            cumulative.push((*key, total));
        }
        if !total.is_finite() {
            bail!("{name}: the step times add up to more than a number can hold ({total} s)");
        }
        for (rank, e) in evals {
            let done = cumulative.partition_point(|(key, _)| *key <= (rank, e.step));
            let before = if done == 0 {
                0.0
            } else {
                cumulative[done - 1].1
            };
            let families = Family::ALL
                .iter()
                .map(|&f| {
                    let score = e.report.families.iter().find(|x| x.family == f);
                    (f, score.and_then(|x| x.score))
                })
                .collect();
            let minutes = (offset + before) / 60.0;
            if !minutes.is_finite() {
                bail!("{name}: training time before validation is not finite ({minutes} min)");
            }
            out.push(Point {
                minutes,
                stage: e.stage,
                step: e.step,
                mean: e.report.mean,
                families,
            });
        }
        offset += total;
    }
    Ok(out)
}

fn open_metrics(dir: &Path) -> Result<(String, std::io::BufReader<std::fs::File>)> {
    let path = dir.join("metrics.jsonl");
    if !path.is_file() {
        bail!(
            "{}: no metrics.jsonl (is it a training run directory?)",
            dir.display()
        );
    }
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    Ok((dir.display().to_string(), std::io::BufReader::new(file)))
}

/// `v` with `decimals` decimals, or in scientific notation when that would be long.
fn number(v: f64, decimals: usize) -> String {
    if v.is_finite() && v.abs() >= 1e6 {
        format!("{v:.2e}")
    } else {
        format!("{v:.decimals$}")
    }
}

pub fn run(a: CurveArgs) -> Result<()> {
    let readers = a
        .runs
        .iter()
        .map(|d| open_metrics(d))
        .collect::<Result<Vec<_>>>()?;
    let pts = points(readers)?;
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
            "{:>8} {:>7} {:>6} {:>6}",
            number(p.minutes, 1),
            p.stage.name(),
            p.step,
            number(p.mean, 3)
        );
        for (_, s) in &p.families {
            match s {
                Some(s) => print!(" {:>11}", number(*s, 3)),
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
    let axes = Axes {
        title: "Validation accuracy vs training time",
        x_label: "training minutes",
        y_label: "accuracy (descriptions: object F1)",
        x_ticks: &[],
        log2_x: false,
    };
    write_line_plot(&svg, &axes, &series)?;
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
    use glance_train::metrics::{EvalRecord, StepRecord};

    fn step(stage: Stage, n: u64, seconds: f64) -> String {
        serde_json::to_string(&Record::Step(StepRecord {
            stage,
            step: n,
            loss: 1.0,
            lr: 1e-3,
            grad_norm: 1.0,
            images: 2,
            units: 10,
            seconds,
            max_objects: 4,
            metrics: BTreeMap::new(),
        }))
        .unwrap()
    }

    fn eval(stage: Stage, n: u64, mean: f64) -> String {
        let report = json!({"mean": mean, "split": "validation",
            "families": [{"family": "sign", "questions": 4, "score": 0.25}]});
        serde_json::to_string(&Record::Eval(EvalRecord::new(stage, n, &report).unwrap())).unwrap()
    }

    fn pts(runs: &[String]) -> Result<Vec<Point>> {
        points(
            runs.iter()
                .enumerate()
                .map(|(i, t)| (format!("run {}", i + 1), t.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn time_accumulates_across_stages_and_runs_and_replays_count_once() {
        let run1 = [step(Stage::Vision, 1, 60.0), step(Stage::Vision, 2, 60.0)].join("\n");
        let run2 = [
            step(Stage::Llava, 1, 30.0),
            step(Stage::Llava, 2, 30.0),
            // Resumed from the checkpoint after step 1: step 2 runs again.
            step(Stage::Llava, 2, 30.0),
            eval(Stage::Llava, 2, 0.5),
            step(Stage::Llava, 3, 60.0),
            eval(Stage::Llava, 3, 0.75),
        ]
        .join("\n");
        let p = pts(&[run1, run2]).unwrap();
        assert_eq!(p.len(), 2);
        assert!((p[0].minutes - 3.0).abs() < 1e-9, "{}", p[0].minutes);
        assert!((p[1].minutes - 4.0).abs() < 1e-9, "{}", p[1].minutes);
        assert_eq!((p[1].stage, p[1].step, p[1].mean), (Stage::Llava, 3, 0.75));
        let sign = p[0].families.iter().find(|f| f.0 == Family::Sign).unwrap();
        assert_eq!(sign.1, Some(0.25));
        let attr = p[0].families.iter().find(|f| f.0 == Family::Attribute);
        assert_eq!(attr.unwrap().1, None);
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, needle) in [
            (
                format!("{}\nnot json", step(Stage::Llava, 1, 1.0)),
                "line 2",
            ),
            (r#"{"kind":"step"}"#.to_string(), "line 1"),
            (
                format!("\n\n{}", r#"{"kind":"nap","stage":"llava"}"#),
                "line 3",
            ),
        ] {
            let e = pts(&[text]).unwrap_err();
            assert!(format!("{e:#}").contains(needle), "{e:#}");
            assert!(format!("{e:#}").contains("run 1"), "{e:#}");
        }
    }

    #[test]
    fn step_times_that_overflow_or_are_not_numbers_are_errors() {
        let huge = [
            step(Stage::Llava, 1, 1e308),
            step(Stage::Llava, 2, 1e308),
            eval(Stage::Llava, 2, 0.5),
        ]
        .join("\n");
        let e = pts(&[huge]).unwrap_err();
        assert!(format!("{e:#}").contains("add up"), "{e:#}");
        // One finite run each, but not together.
        let one = [step(Stage::Llava, 1, 1e308), eval(Stage::Llava, 1, 0.5)].join("\n");
        let e = pts(&[one.clone(), one]).unwrap_err();
        assert!(format!("{e:#}").contains("not finite"), "{e:#}");
        // NaN seconds are written as null and read back as NaN.
        let nan = step(Stage::Llava, 1, f64::NAN);
        assert!(nan.contains(r#""seconds":null"#), "{nan}");
        let e = pts(&[nan]).unwrap_err();
        assert!(format!("{e:#}").contains("line 1: step time NaN"), "{e:#}");
        let e = pts(&[step(Stage::Llava, 1, -1.0)]).unwrap_err();
        assert!(format!("{e:#}").contains("step time -1"), "{e:#}");
    }

    #[test]
    fn extreme_means_give_a_table_and_a_plot() {
        let dir = std::env::temp_dir().join(format!("glance-curve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines = [
            step(Stage::Llava, 1, 30.0),
            eval(Stage::Llava, 1, 1e308),
            step(Stage::Llava, 2, 30.0),
            eval(Stage::Llava, 2, -1e308),
            eval(Stage::Llava, 2, f64::NAN),
            eval(Stage::Llava, 2, f64::INFINITY),
        ];
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n")).unwrap();
        run(CurveArgs {
            runs: vec![dir.clone()],
            svg: None,
            json: None,
        })
        .unwrap();
        let svg = std::fs::read_to_string(dir.join("curve.svg")).unwrap();
        assert!(
            svg.contains("Validation accuracy vs training time"),
            "{svg}"
        );
        assert!(svg.contains("training minutes"));
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("curve.json")).unwrap())
                .unwrap();
        let means: Vec<Value> = v["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["mean"].clone())
            .collect();
        assert_eq!(
            means,
            vec![json!(1e308), json!(-1e308), Value::Null, Value::Null]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
