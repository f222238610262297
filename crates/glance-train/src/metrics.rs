//! The records of `metrics.jsonl`: one JSON object per line, tagged by `kind`. The trainer
//! writes them ([`crate::trainer`]); `glance train curve` reads them back with [`records`].
//!
//! ```json
//! {"kind":"step","stage":"llava","step":12,"loss":1.9,"lr":0.0003,"grad_norm":0.8,"images":8,
//!  "units":412,"seconds":1.7,"max_objects":6,"metrics":{"answer_acc":0.41}}
//! {"kind":"eval","stage":"llava","step":12,"report":{"mean":0.5,"families":[…],…}}
//! ```
//!
//! Non-finite numbers are written as `null` by JSON; the reader turns a `null` float back into
//! NaN, so a record always reads back. Reading streams line by line and refuses a line longer
//! than [`MAX_LINE_BYTES`], so a huge or corrupt file never has to fit in memory.

use crate::config::Stage;
use glance_world::Family;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Read};

/// Longest line [`records`] accepts (an eval record with its examples is a few KiB).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// One optimiser step.
    Step(StepRecord),
    /// One validation.
    Eval(EvalRecord),
}

impl Record {
    /// The stage the record belongs to.
    pub fn stage(&self) -> Stage {
        match self {
            Record::Step(s) => s.stage,
            Record::Eval(e) => e.stage,
        }
    }
}

/// What one optimiser step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub stage: Stage,
    /// Steps done in this stage, this one included (1-based).
    pub step: u64,
    #[serde(deserialize_with = "f32_or_nan")]
    pub loss: f32,
    #[serde(deserialize_with = "f64_or_nan")]
    pub lr: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    pub grad_norm: f64,
    pub images: usize,
    /// Supervised units (patches or answer tokens).
    pub units: usize,
    /// Wall time of the step (data, forward, backward, optimiser).
    #[serde(deserialize_with = "f64_or_nan")]
    pub seconds: f64,
    /// Most objects per image under the curriculum at this step.
    pub max_objects: usize,
    /// Head accuracies (vision) or answer-token accuracy (QA stages) on this batch.
    #[serde(default, deserialize_with = "metrics_or_nan")]
    pub metrics: BTreeMap<String, f32>,
}

/// One validation run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    pub stage: Stage,
    /// Steps done in the stage when it ran.
    pub step: u64,
    pub report: EvalSummary,
}

impl EvalRecord {
    /// The record of an evaluation report (the runner's report type, serialised; it must have
    /// `mean` and `families` fields).
    pub fn new(
        stage: Stage,
        step: u64,
        report: &impl Serialize,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            stage,
            step,
            report: serde_json::from_value(serde_json::to_value(report)?)?,
        })
    }
}

/// The validation report as logged: the scores the curve needs, typed; everything else the
/// runner reported (split, counts, timing, examples, …) kept as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// Mean short-answer accuracy (NaN without questions).
    #[serde(deserialize_with = "f64_or_nan")]
    pub mean: f64,
    pub families: Vec<FamilyResult>,
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// One question family's score in an [`EvalSummary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyResult {
    pub family: Family,
    pub questions: usize,
    /// Accuracy (descriptions: object F1); `None` without questions.
    pub score: Option<f64>,
}

/// Why a line of `metrics.jsonl` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("line {line}: {error}")]
    Io { line: usize, error: std::io::Error },
    #[error("line {line}: longer than {max} bytes (not a metrics.jsonl?)", max = MAX_LINE_BYTES)]
    LineTooLong { line: usize },
    /// Not JSON, or not a record: `message` is the parser's, `column` where it stopped.
    #[error("line {line}, column {column}: not a metrics record: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
}

impl MetricsError {
    fn parse(line: usize, e: &serde_json::Error) -> Self {
        let message = e.to_string();
        // The parser's own position is within the one line: keep only the column.
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        MetricsError::Parse {
            line,
            column: e.column(),
            message: message
                .strip_suffix(&suffix)
                .unwrap_or(&message)
                .to_string(),
        }
    }
}

/// The records of a `metrics.jsonl` stream with their 1-based line numbers, blank lines
/// skipped. The first error ends the stream.
pub fn records<R: BufRead>(reader: R) -> Records<R> {
    Records {
        reader,
        line: 0,
        buf: Vec::new(),
        done: false,
    }
}

/// Iterator of [`records`].
pub struct Records<R> {
    reader: R,
    line: usize,
    buf: Vec<u8>,
    done: bool,
}

impl<R: BufRead> Iterator for Records<R> {
    type Item = Result<(usize, Record), MetricsError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.line += 1;
            let line = self.line;
            self.buf.clear();
            let cap = MAX_LINE_BYTES as u64 + 1;
            let n = match (&mut self.reader)
                .take(cap)
                .read_until(b'\n', &mut self.buf)
            {
                Ok(n) => n,
                Err(error) => {
                    self.done = true;
                    return Some(Err(MetricsError::Io { line, error }));
                }
            };
            if n == 0 {
                self.done = true;
                return None;
            }
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
            } else if self.buf.len() > MAX_LINE_BYTES {
                self.done = true;
                return Some(Err(MetricsError::LineTooLong { line }));
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(match serde_json::from_slice(&self.buf) {
                Ok(r) => Ok((line, r)),
                Err(e) => {
                    self.done = true;
                    Err(MetricsError::parse(line, &e))
                }
            });
        }
        None
    }
}

fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn f32_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

fn metrics_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f32>, D::Error> {
    let m = BTreeMap::<String, Option<f32>>::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f32::NAN)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seconds: f64) -> Record {
        Record::Step(StepRecord {
            stage: Stage::Llava,
            step: 3,
            loss: 1.5,
            lr: 1e-3,
            grad_norm: f64::NAN,
            images: 4,
            units: 99,
            seconds,
            max_objects: 6,
            metrics: [("answer_acc".to_string(), 0.25)].into(),
        })
    }

    fn read(text: &str) -> Result<Vec<(usize, Record)>, MetricsError> {
        records(text.as_bytes()).collect()
    }

    #[test]
    fn records_round_trip_and_non_finite_reads_back_as_nan() {
        let line = serde_json::to_string(&step(0.5)).unwrap();
        assert!(
            line.starts_with(r#"{"kind":"step","stage":"llava""#),
            "{line}"
        );
        assert!(line.contains(r#""grad_norm":null"#), "{line}");
        let got = read(&format!("\n{line}\n  \n{line}")).unwrap();
        assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 4]);
        let Record::Step(s) = &got[0].1 else {
            panic!("not a step: {:?}", got[0].1)
        };
        assert!(s.grad_norm.is_nan());
        assert_eq!(
            (s.loss, s.seconds, s.metrics["answer_acc"]),
            (1.5, 0.5, 0.25)
        );
    }

    #[test]
    fn eval_records_keep_the_whole_report() {
        let report = serde_json::json!({"split": "validation", "mean": 0.5, "images": 8,
            "families": [{"family": "sign", "questions": 4, "score": 0.25},
                         {"family": "counting", "questions": 0, "score": null}]});
        let r = Record::Eval(EvalRecord::new(Stage::EndToEnd, 7, &report).unwrap());
        let line = serde_json::to_string(&r).unwrap();
        let back = read(&line).unwrap().remove(0).1;
        assert_eq!(back, r);
        let Record::Eval(e) = back else { panic!() };
        assert_eq!((e.stage, e.step, e.report.mean), (Stage::EndToEnd, 7, 0.5));
        assert_eq!(e.report.families[0].family, Family::Sign);
        assert_eq!(e.report.families[1].score, None);
        assert_eq!(e.report.other["split"], "validation");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["report"]["images"], 8, "{line}");
        // A report without the typed fields is refused at write time.
        assert!(EvalRecord::new(Stage::Llava, 1, &serde_json::json!({"mean": 1})).is_err());
    }

    #[test]
    fn bad_lines_are_errors_with_their_line_number() {
        let good = serde_json::to_string(&step(1.0)).unwrap();
        for (text, line, needle) in [
            (format!("{good}\nnot json"), 2, "not a metrics record"),
            (
                format!("{good}\n{good}\n{{\"kind\":\"lunch\"}}"),
                3,
                "lunch",
            ),
            (
                r#"{"kind":"step","stage":"llava"}"#.to_string(),
                1,
                "missing field",
            ),
            (
                format!("{good}\n{}", good.replace("llava", "dessert")),
                2,
                "dessert",
            ),
            (
                good.replace("\"step\":3", "\"step\":-3"),
                1,
                "not a metrics record",
            ),
        ] {
            let e = read(&text).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("line {line}, column ")), "{msg}");
            assert!(msg.contains(needle), "{msg}");
            assert!(!msg.contains(" at line "), "{msg}");
        }
    }

    #[test]
    fn a_huge_line_is_refused_without_reading_it_whole() {
        // An endless line: reading stops at the cap instead of exhausting memory.
        let endless = std::io::BufReader::new(std::io::repeat(b'x'));
        let mut it = records(endless);
        let e = it.next().unwrap().unwrap_err();
        assert!(matches!(e, MetricsError::LineTooLong { line: 1 }), "{e}");
        assert!(it.next().is_none());
        // Just under the cap is fine as far as length goes.
        let long = format!("{}\n", " ".repeat(MAX_LINE_BYTES - 1));
        assert!(read(&long).unwrap().is_empty());
    }
}
