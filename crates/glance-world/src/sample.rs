//! Writing a sample of a split to disk (`glance world sample --split test --n 16 --out DIR`).
//!
//! Output: `NNNN.png` per example (the split index, zero-padded to at least 4 digits),
//! `questions.jsonl` with one line per question — first the example's independent questions
//! (`dialogue: null`), then its dialogue turns (`dialogue` = the example index, `turn` from 0) —
//! and `scenes.jsonl` with the full [`Scene`] of every image.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::qa::{Family, Qa};
use crate::scene::Scene;
use crate::split::{sample, Split};
use crate::WorldError;

/// Maximum number of images one call writes.
pub const MAX_SAMPLE: u64 = 1_000_000;

/// One line of `questions.jsonl`.
#[derive(Debug, Clone, Serialize)]
pub struct QuestionRecord<'a> {
    pub image: &'a str,
    pub split: Split,
    pub index: u64,
    pub seed: u64,
    pub family: Family,
    pub question: &'a str,
    pub answer: &'a str,
    /// Dialogue id (= example index) for dialogue turns, `null` for independent questions.
    pub dialogue: Option<u64>,
    /// Turn number within the dialogue.
    pub turn: Option<usize>,
    pub follow_up: bool,
}

/// One line of `scenes.jsonl`.
#[derive(Debug, Clone, Serialize)]
pub struct SceneRecord<'a> {
    pub image: &'a str,
    pub split: Split,
    pub index: u64,
    pub seed: u64,
    pub scene: &'a Scene,
}

/// What [`write_sample`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SampleSummary {
    pub dir: PathBuf,
    pub images: u64,
    pub questions: u64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WorldError + '_ {
    move |cause| WorldError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// Write examples `0..n` of `split` into `out_dir` (created if missing).
pub fn write_sample(split: Split, n: u64, out_dir: &Path) -> Result<SampleSummary, WorldError> {
    write_sample_range(split, 0, n, out_dir)
}

/// Write examples `start..start + n` of `split` into `out_dir` (created if missing).
pub fn write_sample_range(
    split: Split,
    start: u64,
    n: u64,
    out_dir: &Path,
) -> Result<SampleSummary, WorldError> {
    if n > MAX_SAMPLE {
        return Err(WorldError::InvalidArgument(format!(
            "n = {n} exceeds the maximum of {MAX_SAMPLE}"
        )));
    }
    let end = start
        .checked_add(n)
        .filter(|e| *e <= crate::split::MAX_INDEX)
        .ok_or(WorldError::IndexOutOfRange {
            index: start.saturating_add(n),
            max: crate::split::MAX_INDEX,
        })?;
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let qpath = out_dir.join("questions.jsonl");
    let spath = out_dir.join("scenes.jsonl");
    let mut qout = BufWriter::new(std::fs::File::create(&qpath).map_err(io_err(&qpath))?);
    let mut sout = BufWriter::new(std::fs::File::create(&spath).map_err(io_err(&spath))?);
    let mut questions = 0u64;
    for index in start..end {
        let ex = sample(split, index)?;
        let image = format!("{index:04}.png");
        let ipath = out_dir.join(&image);
        ex.image.save(&ipath).map_err(|cause| WorldError::Image {
            path: ipath.clone(),
            cause,
        })?;
        let rec = SceneRecord {
            image: &image,
            split,
            index,
            seed: ex.seed,
            scene: &ex.scene,
        };
        writeln!(sout, "{}", serde_json::to_string(&rec)?).map_err(io_err(&spath))?;
        let lines = ex.questions.iter().map(|q| (q, None, None)).chain(
            ex.dialogue
                .turns
                .iter()
                .enumerate()
                .map(|(t, q)| (q, Some(index), Some(t))),
        );
        for (q, dialogue, turn) in lines {
            let q: &Qa = q;
            let rec = QuestionRecord {
                image: &image,
                split,
                index,
                seed: ex.seed,
                family: q.family,
                question: &q.question,
                answer: &q.answer,
                dialogue,
                turn,
                follow_up: q.follow_up,
            };
            writeln!(qout, "{}", serde_json::to_string(&rec)?).map_err(io_err(&qpath))?;
            questions += 1;
        }
    }
    qout.flush().map_err(io_err(&qpath))?;
    sout.flush().map_err(io_err(&spath))?;
    Ok(SampleSummary {
        dir: out_dir.to_path_buf(),
        images: n,
        questions,
    })
}
