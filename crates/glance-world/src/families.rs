//! Per-family question generators (templates, referring expressions, answer balancing).
//!
//! Balancing rules: existence answers are decided by a fair coin first (absent things are mostly
//! near misses: a present colour with another shape, or vice versa — POPE's adversarial setting);
//! counting mixes total counts with per-attribute counts whose target is drawn proportionally to
//! its squared count (and sometimes absent, answer 0) so "1" does not dominate; spatial relations are
//! yes/no by a fair coin. Referring expressions are always unique in the scene.

use crate::describe;
use crate::qa::{Family, Qa};
use crate::rng::WorldRng;
use crate::scene::{Colour, Object, Position, Scene, Shape, Size};

/// "a" or "an" before `word`.
pub(crate) fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// "a large red circle".
pub(crate) fn with_article(phrase: &str) -> String {
    format!("{} {phrase}", article(phrase))
}

fn pick<'a>(rng: &mut WorldRng, items: &[&'a str]) -> &'a str {
    rng.choose(items).copied().unwrap_or("")
}

/// Which fields a referring expression may use.
#[derive(Clone, Copy)]
struct Allow {
    colour: bool,
    shape: bool,
    size: bool,
    position: bool,
}

const ALL_FIELDS: Allow = Allow {
    colour: true,
    shape: true,
    size: true,
    position: true,
};

/// A unique referring expression ("the red circle", "the object in the top left") for object `i`.
fn refer(scene: &Scene, i: usize, allow: Allow, rng: &mut WorldRng) -> Option<String> {
    let o = scene.objects.get(i)?;
    // (colour, shape, size, position) flags of each candidate form.
    const FORMS: [(bool, bool, bool, bool); 8] = [
        (false, true, false, false),
        (false, true, true, false),
        (true, true, false, false),
        (true, true, true, false),
        (true, false, false, false),
        (true, false, true, false),
        (false, false, false, true),
        (false, true, false, true),
    ];
    let mut options = Vec::new();
    for (c, s, z, p) in FORMS {
        if (c && !allow.colour)
            || (s && !allow.shape)
            || (z && !allow.size)
            || (p && !allow.position)
        {
            continue;
        }
        let unique = p
            || scene.count(
                c.then_some(o.colour),
                s.then_some(o.shape),
                z.then_some(o.size),
            ) == 1;
        if !unique {
            continue;
        }
        let mut words = Vec::new();
        if z {
            words.push(o.size.name());
        }
        if c {
            words.push(o.colour.name());
        }
        words.push(if s { o.shape.name() } else { "object" });
        let mut phrase = format!("the {}", words.join(" "));
        if p {
            phrase = format!("{phrase} in the {}", o.position);
        }
        options.push(phrase);
    }
    rng.choose(&options).cloned()
}

pub(crate) fn attribute(scene: &Scene, rng: &mut WorldRng) -> Option<Qa> {
    let i = rng.below(scene.objects.len());
    let o = *scene.objects.get(i)?;
    let kind = rng.weighted(&[0.4, 0.35, 0.25])?;
    let (question, answer) = match kind {
        0 => {
            let r = refer(
                scene,
                i,
                Allow {
                    colour: false,
                    ..ALL_FIELDS
                },
                rng,
            )?;
            let t = pick(
                rng,
                &[
                    "What colour is {r}?",
                    "What color is {r}?",
                    "Which colour is {r}?",
                    "What is the colour of {r}?",
                    "Tell me the colour of {r}.",
                ],
            );
            (t.replace("{r}", &r), o.colour.name())
        }
        1 => {
            if rng.chance(0.25) {
                let t = pick(
                    rng,
                    &["What shape is in the {p}?", "Which shape is in the {p}?"],
                );
                (t.replace("{p}", o.position.name()), o.shape.name())
            } else {
                let r = refer(
                    scene,
                    i,
                    Allow {
                        shape: false,
                        ..ALL_FIELDS
                    },
                    rng,
                )?;
                let t = pick(
                    rng,
                    &[
                        "What shape is {r}?",
                        "What is the shape of {r}?",
                        "Which shape does {r} have?",
                    ],
                );
                (t.replace("{r}", &r), o.shape.name())
            }
        }
        _ => {
            let r = refer(
                scene,
                i,
                Allow {
                    size: false,
                    ..ALL_FIELDS
                },
                rng,
            )?;
            let t = pick(
                rng,
                &[
                    "What size is {r}?",
                    "Is {r} large or small?",
                    "Is {r} small or large?",
                    "How big is {r}?",
                ],
            );
            (t.replace("{r}", &r), o.size.name())
        }
    };
    Some(Qa::new(Family::Attribute, question, answer))
}

pub(crate) fn counting(scene: &Scene, rng: &mut WorldRng) -> Qa {
    let kind = rng.weighted(&[0.35, 0.25, 0.2, 0.1, 0.1]).unwrap_or(0);
    // Target value: absent with probability 0.15 (when possible), else ∝ its count squared.
    fn target<T: Copy + PartialEq>(rng: &mut WorldRng, all: &[T], count: impl Fn(T) -> usize) -> T {
        let absent: Vec<T> = all.iter().copied().filter(|v| count(*v) == 0).collect();
        if !absent.is_empty() && rng.chance(0.15) {
            if let Some(v) = rng.choose(&absent) {
                return *v;
            }
        }
        let w: Vec<f64> = all.iter().map(|v| (count(*v) * count(*v)) as f64).collect();
        all[rng.weighted(&w).unwrap_or(0)]
    }
    let (question, n) = match kind {
        0 => {
            let t = pick(
                rng,
                &[
                    "How many objects are there?",
                    "How many objects are in the image?",
                    "How many shapes can you see?",
                    "Count the objects in the image.",
                    "How many objects do you see?",
                ],
            );
            (t.to_string(), scene.objects.len())
        }
        1 => {
            let c = target(rng, Colour::ALL, |c| scene.count(Some(c), None, None));
            let t = pick(
                rng,
                &[
                    "How many {c} objects are there?",
                    "How many {c} shapes are in the image?",
                    "Count the {c} objects.",
                ],
            );
            (t.replace("{c}", c.name()), scene.count(Some(c), None, None))
        }
        2 => {
            let s = target(rng, Shape::ALL, |s| scene.count(None, Some(s), None));
            let t = pick(
                rng,
                &[
                    "How many {s} are there?",
                    "How many {s} can you see?",
                    "Count the {s}.",
                    "How many {s} are in the image?",
                ],
            );
            (
                t.replace("{s}", s.plural()),
                scene.count(None, Some(s), None),
            )
        }
        3 => {
            let z = target(rng, Size::ALL, |z| scene.count(None, None, Some(z)));
            let t = pick(
                rng,
                &[
                    "How many {z} objects are there?",
                    "How many {z} shapes can you see?",
                    "Count the {z} objects.",
                ],
            );
            (t.replace("{z}", z.name()), scene.count(None, None, Some(z)))
        }
        _ => {
            let pairs: Vec<(Colour, Shape)> = Colour::ALL
                .iter()
                .flat_map(|c| Shape::ALL.iter().map(move |s| (*c, *s)))
                .collect();
            let (c, s) = target(rng, &pairs, |(c, s)| scene.count(Some(c), Some(s), None));
            let t = pick(
                rng,
                &[
                    "How many {c} {s} are there?",
                    "Count the {c} {s}.",
                    "How many {c} {s} can you see?",
                ],
            );
            (
                t.replace("{c}", c.name()).replace("{s}", s.plural()),
                scene.count(Some(c), Some(s), None),
            )
        }
    };
    Qa::new(Family::Counting, question, n.to_string())
}

/// Is `a` in relation `rel` (0 above, 1 below, 2 left of, 3 right of) to `b`?
fn related(a: &Object, b: &Object, rel: usize) -> bool {
    let (ar, ac, br, bc) = (
        a.position.row(),
        a.position.col(),
        b.position.row(),
        b.position.col(),
    );
    match rel {
        0 => ar < br,
        1 => ar > br,
        2 => ac < bc,
        _ => ac > bc,
    }
}

const RELATIONS: [&str; 4] = ["above", "below", "to the left of", "to the right of"];

/// "What is in the {p}?" → "a large red circle" / "nothing" / "a sign".
fn what_at(scene: &Scene, rng: &mut WorldRng) -> Option<Qa> {
    let empty: Vec<Position> = Position::ALL
        .iter()
        .copied()
        .filter(|p| scene.object_at(*p).is_none() && scene.sign.is_none_or(|s| s.position != *p))
        .collect();
    let sign_w = if scene.sign.is_some() { 0.1 } else { 0.0 };
    let k = rng.weighted(&[0.75, if empty.is_empty() { 0.0 } else { 0.15 }, sign_w])?;
    let (p, answer) = match k {
        0 => {
            let o = rng.choose(&scene.objects)?;
            (o.position, with_article(&o.phrase()))
        }
        1 => (*rng.choose(&empty)?, "nothing".to_string()),
        _ => (scene.sign?.position, "a sign".to_string()),
    };
    let t = pick(
        rng,
        &[
            "What is in the {p}?",
            "What is at the {p}?",
            "Which object is in the {p}?",
            "What can you see in the {p}?",
        ],
    );
    Some(Qa::new(Family::Spatial, t.replace("{p}", p.name()), answer))
}

pub(crate) fn spatial(scene: &Scene, rng: &mut WorldRng) -> Option<Qa> {
    let sign_w = if scene.sign.is_some() { 0.1 } else { 0.0 };
    let rel_w = if scene.objects.len() >= 2 { 0.2 } else { 0.0 };
    let kind = rng.weighted(&[0.45, 0.25, rel_w, sign_w])?;
    let no_pos = Allow {
        position: false,
        ..ALL_FIELDS
    };
    // Objects that can be named without their position (identical twins cannot).
    let named: Vec<Option<String>> = (0..scene.objects.len())
        .map(|i| refer(scene, i, no_pos, rng))
        .collect();
    let (question, answer) = match kind {
        0 => {
            let cands: Vec<usize> = (0..named.len()).filter(|i| named[*i].is_some()).collect();
            let Some(&i) = rng.choose(&cands) else {
                return what_at(scene, rng);
            };
            let r = named[i].clone()?;
            let t = pick(
                rng,
                &[
                    "Where is {r}?",
                    "In which part of the image is {r}?",
                    "Where can you find {r}?",
                    "What is the position of {r}?",
                ],
            );
            (
                t.replace("{r}", &r),
                scene.objects[i].position.name().to_string(),
            )
        }
        1 => return what_at(scene, rng),
        2 => return relation_among(scene, &named, rng),
        _ => {
            let t = pick(
                rng,
                &[
                    "Where is the sign?",
                    "In which part of the image is the sign?",
                    "Where can you find the sign?",
                ],
            );
            (t.to_string(), scene.sign?.position.name().to_string())
        }
    };
    Some(Qa::new(Family::Spatial, question, answer))
}

/// A yes / no question about how two objects lie ("Is the red circle above the blue square?"),
/// yes and no by a fair coin; `None` with fewer than two objects that can be named without
/// their position.
pub(crate) fn relation(scene: &Scene, rng: &mut WorldRng) -> Option<Qa> {
    let no_pos = Allow {
        position: false,
        ..ALL_FIELDS
    };
    let named: Vec<Option<String>> = (0..scene.objects.len())
        .map(|i| refer(scene, i, no_pos, rng))
        .collect();
    relation_among(scene, &named, rng).filter(|qa| qa.answer == "yes" || qa.answer == "no")
}

/// [`relation`] over objects already named (`None`: cannot be named without its position);
/// falls back to a "what is in the …" question when no pair has the drawn truth.
fn relation_among(scene: &Scene, named: &[Option<String>], rng: &mut WorldRng) -> Option<Qa> {
    let want = rng.chance(0.5);
    // Pairs (a, b, relation) of nameable objects whose truth is `want`.
    let mut cands = Vec::new();
    for (i, a) in scene.objects.iter().enumerate() {
        for (j, b) in scene.objects.iter().enumerate() {
            if i != j && named[i].is_some() && named[j].is_some() {
                for rel in 0..4 {
                    if related(a, b, rel) == want {
                        cands.push((i, j, rel));
                    }
                }
            }
        }
    }
    let Some(&(i, j, rel)) = rng.choose(&cands) else {
        return what_at(scene, rng);
    };
    let (ra, rb) = (named[i].clone()?, named[j].clone()?);
    let t = pick(rng, &["Is {a} {rel} {b}?", "Is {a} located {rel} {b}?"]);
    let q = t
        .replace("{a}", &ra)
        .replace("{rel}", RELATIONS[rel])
        .replace("{b}", &rb);
    Some(Qa::new(Family::Spatial, q, if want { "yes" } else { "no" }))
}

/// Existence question phrasings for a thing described by `phrase` (singular) / `plural`.
fn existence_question(rng: &mut WorldRng, phrase: &str, plural: &str) -> String {
    let a = with_article(phrase);
    match rng.below(5) {
        0 => format!("Is there {a}?"),
        1 => format!("Is there {a} in the image?"),
        2 => format!("Can you see {a}?"),
        3 => format!("Does the image contain {a}?"),
        _ => format!("Are there any {plural}?"),
    }
}

pub(crate) fn existence(scene: &Scene, rng: &mut WorldRng) -> Qa {
    let want = rng.chance(0.5);
    let kind = rng.weighted(&[0.45, 0.15, 0.15, 0.15, 0.10]).unwrap_or(0);
    let present = |c: Option<Colour>, s: Option<Shape>, z: Option<Size>| scene.count(c, s, z) > 0;
    let o = rng.choose(&scene.objects).copied();
    let question_for =
        |rng: &mut WorldRng, c: Option<Colour>, s: Option<Shape>, z: Option<Size>| {
            let mut words: Vec<&str> = Vec::new();
            words.extend(z.map(|z| z.name()));
            words.extend(c.map(|c| c.name()));
            let singular = format!("{} {}", words.join(" "), s.map_or("object", |s| s.name()));
            let plural = format!(
                "{} {}",
                words.join(" "),
                s.map_or("objects", |s| s.plural())
            );
            existence_question(rng, singular.trim(), plural.trim())
        };
    // Fields used by the kind: (colour, shape, size).
    let fields = match kind {
        0 => (true, true, false),
        1 => (false, true, false),
        2 => (true, false, false),
        3 => (true, true, true),
        _ => {
            let t = pick(
                rng,
                &[
                    "Is there a sign?",
                    "Is there a sign in the image?",
                    "Can you see a sign?",
                    "Does the image contain a sign?",
                ],
            );
            let yes = scene.sign.is_some();
            return Qa::new(Family::Existence, t, if yes { "yes" } else { "no" });
        }
    };
    let sel = |c: Colour, s: Shape, z: Size| {
        (
            fields.0.then_some(c),
            fields.1.then_some(s),
            fields.2.then_some(z),
        )
    };
    let (c, s, z) = match (want, o) {
        (true, Some(o)) => sel(o.colour, o.shape, o.size),
        _ => {
            // Near misses first: change one field of a present object; else any absent combination.
            let mut near = Vec::new();
            let mut far = Vec::new();
            for c in Colour::ALL {
                for s in Shape::ALL {
                    for z in Size::ALL {
                        let (qc, qs, qz) = sel(*c, *s, *z);
                        if present(qc, qs, qz)
                            || near.contains(&(qc, qs, qz))
                            || far.contains(&(qc, qs, qz))
                        {
                            continue;
                        }
                        let close = scene.objects.iter().any(|p| {
                            let d = [
                                qc.is_some_and(|v| v != p.colour),
                                qs.is_some_and(|v| v != p.shape),
                                qz.is_some_and(|v| v != p.size),
                            ];
                            d.iter().filter(|x| **x).count() == 1
                        });
                        if close {
                            near.push((qc, qs, qz))
                        } else {
                            far.push((qc, qs, qz))
                        }
                    }
                }
            }
            let pool = if !near.is_empty() && (far.is_empty() || rng.chance(0.7)) {
                &near
            } else {
                &far
            };
            match rng.choose(pool) {
                Some(v) => *v,
                None => {
                    // Everything asked about is present (cannot happen with ≤ 6 objects): say yes.
                    let Some(o) = o else {
                        return Qa::new(
                            Family::Existence,
                            "Is there a sign?",
                            if scene.sign.is_some() { "yes" } else { "no" },
                        );
                    };
                    let (c, s, z) = sel(o.colour, o.shape, o.size);
                    let q = question_for(rng, c, s, z);
                    return Qa::new(Family::Existence, q, "yes");
                }
            }
        }
    };
    let q = question_for(rng, c, s, z);
    let yes = present(c, s, z);
    Qa::new(Family::Existence, q, if yes { "yes" } else { "no" })
}

pub(crate) fn sign(scene: &Scene, rng: &mut WorldRng) -> Option<Qa> {
    let s = scene.sign?;
    let t = pick(
        rng,
        &[
            "What number is on the sign?",
            "What does the sign say?",
            "Read the number on the sign.",
            "Which number is written on the sign?",
            "What number does the sign show?",
        ],
    );
    Some(Qa::new(Family::Sign, t, s.number.to_string()))
}

pub(crate) fn description_qa(scene: &Scene, rng: &mut WorldRng) -> Qa {
    let t = pick(
        rng,
        &[
            "Describe the image in detail.",
            "Describe the image.",
            "Describe every object in the image.",
            "List all the objects in the image.",
            "Give a detailed description of the image.",
            "Describe all the objects and their positions.",
            "What is in the image? Describe each object.",
        ],
    );
    Qa::new(Family::Description, t, describe::describe(scene, rng))
}

/// A standalone question about one uniquely identifiable object followed by 1–3 follow-ups that
/// refer to it as "it". Empty if no object can be referred to uniquely without its position.
pub(crate) fn follow_up_chain(scene: &Scene, rng: &mut WorldRng) -> Vec<Qa> {
    let mut chain = Vec::new();
    let i = rng.below(scene.objects.len());
    let Some(&o) = scene.objects.get(i) else {
        return chain;
    };
    let mut asked = (false, false, false, false); // colour, shape, size, position known
    if rng.chance(0.5) {
        let t = pick(
            rng,
            &["What is in the {p}?", "What can you see in the {p}?"],
        );
        chain.push(Qa::new(
            Family::Spatial,
            t.replace("{p}", o.position.name()),
            with_article(&o.phrase()),
        ));
        asked = (true, true, true, true);
    } else {
        let Some(r) = refer(
            scene,
            i,
            Allow {
                position: false,
                ..ALL_FIELDS
            },
            rng,
        ) else {
            return chain;
        };
        let phrase = r.trim_start_matches("the ").to_string();
        let t = pick(
            rng,
            &[
                "Is there {x}?",
                "Can you see {x}?",
                "Is there {x} in the image?",
            ],
        );
        chain.push(Qa::new(
            Family::Existence,
            t.replace("{x}", &with_article(&phrase)),
            "yes",
        ));
        asked.0 = r.contains(o.colour.name());
        asked.1 = r.contains(o.shape.name());
        asked.2 = r.contains(o.size.name());
    }
    let mut options: Vec<Qa> = Vec::new();
    if !asked.3 {
        let t = pick(
            rng,
            &[
                "Where is it?",
                "Where is it located?",
                "In which part of the image is it?",
            ],
        );
        options.push(Qa::follow(Family::Spatial, t, o.position.name()));
    }
    if !asked.0 {
        let t = pick(rng, &["What colour is it?", "What color is it?"]);
        options.push(Qa::follow(Family::Attribute, t, o.colour.name()));
    }
    if !asked.1 {
        options.push(Qa::follow(
            Family::Attribute,
            "What shape is it?",
            o.shape.name(),
        ));
    }
    if !asked.2 {
        let t = pick(
            rng,
            &[
                "Is it large or small?",
                "What size is it?",
                "How big is it?",
            ],
        );
        options.push(Qa::follow(Family::Attribute, t, o.size.name()));
    }
    let others = scene.count(None, Some(o.shape), None) > 1;
    let t = pick(rng, &["Are there any other {s}?", "Is there another {x}?"]);
    let q = t
        .replace("{s}", o.shape.plural())
        .replace("{x}", o.shape.name());
    options.push(Qa::follow(
        Family::Existence,
        q,
        if others { "yes" } else { "no" },
    ));
    let same = scene.count(Some(o.colour), None, None).saturating_sub(1);
    let t = pick(
        rng,
        &[
            "How many other objects have the same colour?",
            "How many other objects share its colour?",
        ],
    );
    options.push(Qa::follow(Family::Counting, t, same.to_string()));
    rng.shuffle(&mut options);
    let n = 1 + rng.below(3.min(options.len()));
    chain.extend(options.into_iter().take(n));
    chain
}
