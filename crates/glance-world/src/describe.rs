//! Long descriptions: every object with size, colour, shape and position, in varied templates
//! and orders, optionally preceded by the object count and followed (or preceded) by the sign.
//!
//! Every object clause holds exactly one shape noun and no clause-separating punctuation, so the
//! scorer's parser ([`crate::score::parse_objects`]) recovers the objects exactly.

use crate::families::with_article;
use crate::rng::WorldRng;
use crate::scene::{Object, Scene, Size};

const NUMBER_WORDS: [&str; 10] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
];

/// The number as a word (0–9) or digits.
pub(crate) fn number_word(n: usize) -> String {
    NUMBER_WORDS
        .get(n)
        .map_or_else(|| n.to_string(), |w| w.to_string())
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
        None => String::new(),
    }
}

/// One sentence (without the final full stop) about `o` using template `t`.
fn object_sentence(o: &Object, t: usize) -> String {
    let x = with_article(&o.phrase());
    let p = o.position.name();
    match t {
        0 => format!("there is {x} in the {p}"),
        1 => format!("{x} is in the {p}"),
        2 => format!("in the {p} there is {x}"),
        3 => format!("the {p} has {x}"),
        4 => format!("{x} sits in the {p}"),
        _ => format!("at the {p} is {x}"),
    }
}

/// A description of `scene` listing every object.
pub fn describe(scene: &Scene, rng: &mut WorldRng) -> String {
    let mut objs: Vec<Object> = scene.objects.clone();
    match rng.below(5) {
        0 | 1 => {} // row-major (the scene's order)
        2 => rng.shuffle(&mut objs),
        3 => objs.sort_by_key(|o| (o.position.col(), o.position.row())),
        _ => objs.sort_by_key(|o| (if o.size == Size::Large { 0 } else { 1 }, o.position)),
    }
    let n = objs.len();
    let mut sentences: Vec<String> = Vec::new();
    let count_first = rng.chance(0.7);
    if count_first {
        let num = if rng.chance(0.5) {
            number_word(n)
        } else {
            n.to_string()
        };
        let noun = if n == 1 { "object" } else { "objects" };
        let s = match (rng.below(3), n == 1) {
            (0, true) => format!("there is {num} {noun}"),
            (0, false) => format!("there are {num} {noun}"),
            (1, _) => format!("the image shows {num} {noun}"),
            _ => format!("i can see {num} {noun}"),
        };
        sentences.push(s);
    }
    let sign_first = rng.chance(0.2);
    let sign_sentence = scene.sign.map(|s| {
        let p = s.position.name();
        let v = s.number;
        match rng.below(3) {
            0 if sign_first => format!("there is a sign in the {p} that reads {v}"),
            0 => format!("there is also a sign in the {p} that reads {v}"),
            1 => format!("a sign in the {p} shows the number {v}"),
            _ => format!("in the {p} there is a sign with the number {v}"),
        }
    });
    if sign_first {
        sentences.extend(sign_sentence.clone());
    }
    if n >= 2 && rng.chance(0.3) {
        // One list sentence: "the objects are: a …, a … and a …".
        let items: Vec<String> = objs
            .iter()
            .map(|o| format!("{} in the {}", with_article(&o.phrase()), o.position))
            .collect();
        let head = if rng.chance(0.5) {
            "the objects are"
        } else {
            "it contains"
        };
        let (last, rest) = items
            .split_last()
            .map_or((String::new(), &[][..]), |(l, r)| (l.clone(), r));
        sentences.push(format!("{head} {} and {last}", rest.join(", ")));
    } else {
        let fixed = rng.chance(0.5).then(|| rng.below(6));
        for o in &objs {
            let t = fixed.unwrap_or_else(|| rng.below(6));
            sentences.push(object_sentence(o, t));
        }
    }
    if !sign_first {
        sentences.extend(sign_sentence);
    }
    sentences
        .iter()
        .map(|s| capitalise(s) + ".")
        .collect::<Vec<_>>()
        .join(" ")
}
