//! Scorers: normalised exact match for short answers, and object-level precision / recall / F1
//! for descriptions (an object is its size, colour, shape and position; a predicted object is a
//! true positive only if all four fields equal those of a not-yet-matched reference object).

use serde::{Deserialize, Serialize};

use crate::scene::{Colour, Object, Position, Shape, Size};

const NUMBER_WORDS: [&str; 21] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];

/// Lower-case, punctuation to spaces, articles dropped, number words (zero–twenty) to digits,
/// "centre"/"colour"/"grey" to one spelling, whitespace collapsed.
pub fn normalize(answer: &str) -> String {
    let lower = answer.to_lowercase();
    let cleaned: String = lower
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect();
    let mut out: Vec<String> = Vec::new();
    for w in cleaned.split_whitespace() {
        if matches!(w, "a" | "an" | "the") {
            continue;
        }
        let w = match w {
            "centre" => "center",
            "colour" => "color",
            "colours" => "colors",
            "grey" => "gray",
            _ => w,
        };
        match NUMBER_WORDS.iter().position(|n| *n == w) {
            Some(i) => out.push(i.to_string()),
            None => out.push(w.to_string()),
        }
    }
    out.join(" ")
}

/// Normalised exact match.
pub fn exact_match(predicted: &str, reference: &str) -> bool {
    normalize(predicted) == normalize(reference)
}

/// An object mentioned in free text. Fields the text did not give are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParsedObject {
    pub size: Option<Size>,
    pub colour: Option<Colour>,
    pub shape: Shape,
    pub position: Option<Position>,
}

fn words_of(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in text.to_lowercase().split_whitespace() {
        let mut cur = String::new();
        for c in raw.chars() {
            if c.is_alphanumeric() {
                cur.push(c);
            } else {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                if matches!(c, '.' | ',' | ';' | ':' | '!' | '?') {
                    out.push(c.to_string());
                }
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

fn is_separator(w: &str) -> bool {
    matches!(w, "." | "," | ";" | ":" | "!" | "?" | "and")
}

fn colour_word(w: &str) -> Option<Colour> {
    Colour::from_name(w)
}

fn size_word(w: &str) -> Option<Size> {
    match w {
        "small" | "little" | "tiny" => Some(Size::Small),
        "large" | "big" => Some(Size::Large),
        _ => None,
    }
}

/// First position phrase in `words` ("top left", "center", "middle right", "top", …).
fn position_in(words: &[String]) -> Option<Position> {
    let row_of = |w: &str| match w {
        "top" | "upper" => Some(0),
        "bottom" | "lower" => Some(2),
        _ => None,
    };
    let col_of = |w: &str| match w {
        "left" => Some(0),
        "center" | "centre" | "middle" => Some(1),
        "right" => Some(2),
        _ => None,
    };
    for (k, w) in words.iter().enumerate() {
        let next = words.get(k + 1).map(String::as_str).unwrap_or("");
        if let Some(r) = row_of(w) {
            return Position::at(r, col_of(next).unwrap_or(1));
        }
        if matches!(w.as_str(), "center" | "centre" | "middle") {
            return Position::at(
                1,
                match next {
                    "left" => 0,
                    "right" => 2,
                    _ => 1,
                },
            );
        }
        if let Some(c) = col_of(w) {
            return Position::at(1, c);
        }
    }
    None
}

/// Objects mentioned in a description: one per shape noun. Clauses are split at `. , ; : ! ?` and
/// "and"; within a clause, size and colour words are taken from before the shape noun (back to the
/// previous shape noun) and the position from after it, else from before it.
pub fn parse_objects(text: &str) -> Vec<ParsedObject> {
    let words = words_of(text);
    let mut out = Vec::new();
    for clause in words.split(|w| is_separator(w)) {
        let shapes: Vec<usize> = (0..clause.len())
            .filter(|&k| Shape::from_word(&clause[k]).is_some())
            .collect();
        for (n, &k) in shapes.iter().enumerate() {
            let start = if n == 0 { 0 } else { shapes[n - 1] + 1 };
            let end = shapes.get(n + 1).copied().unwrap_or(clause.len());
            let before = &clause[start..k];
            let after = &clause[k + 1..end];
            let Some(shape) = Shape::from_word(&clause[k]) else {
                continue;
            };
            out.push(ParsedObject {
                size: before.iter().rev().find_map(|w| size_word(w)),
                colour: before.iter().rev().find_map(|w| colour_word(w)),
                shape,
                position: position_in(after).or_else(|| position_in(before)),
            });
        }
    }
    out
}

/// Precision / recall / F1 of a description.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prf {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub true_positives: usize,
    pub predicted: usize,
    pub reference: usize,
}

/// Object-level P/R/F1 of `predicted` against reference keys (size, colour, shape, position).
/// Both empty → 1, 1, 1; nothing predicted (or nothing to find) → 0 for the undefined ratio.
pub fn prf(predicted: &[ParsedObject], reference: &[(Size, Colour, Shape, Position)]) -> Prf {
    let mut used = vec![false; reference.len()];
    let mut tp = 0;
    for p in predicted {
        let hit = reference.iter().enumerate().position(|(k, r)| {
            !used[k]
                && p.size == Some(r.0)
                && p.colour == Some(r.1)
                && p.shape == r.2
                && p.position == Some(r.3)
        });
        if let Some(k) = hit {
            used[k] = true;
            tp += 1;
        }
    }
    let (np, nr) = (predicted.len(), reference.len());
    if np == 0 && nr == 0 {
        return Prf {
            precision: 1.0,
            recall: 1.0,
            f1: 1.0,
            true_positives: 0,
            predicted: 0,
            reference: 0,
        };
    }
    let precision = if np == 0 { 0.0 } else { tp as f64 / np as f64 };
    let recall = if nr == 0 { 0.0 } else { tp as f64 / nr as f64 };
    let f1 = if precision + recall == 0.0 {
        0.0
    } else {
        2.0 * precision * recall / (precision + recall)
    };
    Prf {
        precision,
        recall,
        f1,
        true_positives: tp,
        predicted: np,
        reference: nr,
    }
}

/// P/R/F1 of a free-text description against the scene's objects.
pub fn description_prf(predicted: &str, reference: &[Object]) -> Prf {
    let keys: Vec<_> = reference.iter().map(Object::key).collect();
    prf(&parse_objects(predicted), &keys)
}

/// P/R/F1 of a free-text description against a reference description text (objects missing any
/// field in the reference text are ignored).
pub fn description_prf_text(predicted: &str, reference: &str) -> Prf {
    let keys: Vec<_> = parse_objects(reference)
        .into_iter()
        .filter_map(|o| Some((o.size?, o.colour?, o.shape, o.position?)))
        .collect();
    prf(&parse_objects(predicted), &keys)
}
