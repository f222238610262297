//! Question generators: every family is produced, answers are balanced, descriptions parse back
//! to exactly the scene's objects, and answers agree with the scene.

use std::collections::BTreeMap;

use glance_world::qa::{dialogue, generate, question_set};
use glance_world::score::{description_prf, normalize, parse_objects};
use glance_world::{sample, Colour, Family, Scene, Shape, Size, Split, WorldRng};

fn histogram(scenes: u64, family: Family) -> (BTreeMap<String, usize>, usize) {
    let mut h = BTreeMap::new();
    let mut total = 0;
    for i in 0..scenes {
        let seed = Split::Train.seed(i).unwrap();
        let scene = Scene::generate(seed);
        let mut rng = WorldRng::derive(seed, 77);
        if let Some(qa) = generate(&scene, family, &mut rng) {
            *h.entry(qa.answer).or_insert(0) += 1;
            total += 1;
        }
    }
    (h, total)
}

fn show(name: &str, h: &BTreeMap<String, usize>, total: usize) -> f64 {
    let mut v: Vec<_> = h.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    let top: Vec<String> = v
        .iter()
        .take(10)
        .map(|(k, n)| format!("{k}={:.1}%", 100.0 * **n as f64 / total as f64))
        .collect();
    let max = v.first().map_or(0.0, |(_, n)| **n as f64 / total as f64);
    println!(
        "{name}: {total} questions, {} distinct answers, top: {}",
        h.len(),
        top.join(" ")
    );
    max
}

#[test]
fn counting_is_not_dominated_by_one_answer() {
    let (h, total) = histogram(6000, Family::Counting);
    let max = show("counting", &h, total);
    assert!(max < 0.35, "most common counting answer has {max:.2}");
    assert!(
        h.len() >= 6,
        "counting answers should range over 0..=6: {h:?}"
    );
}

#[test]
fn existence_is_balanced() {
    let (h, total) = histogram(6000, Family::Existence);
    show("existence", &h, total);
    let yes = *h.get("yes").unwrap_or(&0) as f64 / total as f64;
    assert!((0.4..=0.6).contains(&yes), "existence yes-rate {yes:.3}");
    assert_eq!(h.len(), 2);
}

#[test]
fn other_families_are_spread() {
    for (family, limit) in [
        (Family::Attribute, 0.2),
        (Family::Spatial, 0.35),
        (Family::Sign, 0.05),
    ] {
        let (h, total) = histogram(6000, family);
        let max = show(family.name(), &h, total);
        assert!(max < limit, "{family}: most common answer {max:.2}");
    }
    let (_, spatial) = histogram(6000, Family::Spatial);
    assert_eq!(spatial, 6000, "spatial questions must always be answerable");
    let (_, signs) = histogram(6000, Family::Sign);
    let rate = signs as f64 / 6000.0;
    assert!((0.45..=0.55).contains(&rate), "sign rate {rate}");
}

#[test]
fn every_family_is_produced_and_descriptions_are_exact() {
    let mut seen = BTreeMap::new();
    let mut follow_ups = 0;
    for i in 0..3000 {
        let ex = sample(Split::Validation, i).unwrap();
        for qa in ex.questions.iter().chain(&ex.dialogue.turns) {
            *seen.entry(qa.family).or_insert(0usize) += 1;
            follow_ups += qa.follow_up as usize;
            assert!(!qa.question.is_empty() && !qa.answer.is_empty());
            if qa.family == Family::Description {
                let prf = description_prf(&qa.answer, &ex.scene.objects);
                assert_eq!(
                    prf.f1,
                    1.0,
                    "{}\n{:?}\n{:?}",
                    qa.answer,
                    parse_objects(&qa.answer),
                    ex.scene.objects
                );
            }
        }
        assert!(ex.questions.iter().all(|q| !q.follow_up));
        assert!(ex.dialogue.turns.len() >= 2, "{:?}", ex.dialogue);
        let first = &ex.dialogue.turns[0];
        assert!(!first.follow_up);
    }
    println!("family counts over 3000 examples: {seen:?}, follow-ups: {follow_ups}");
    for f in Family::ALL {
        assert!(
            seen.get(&f).copied().unwrap_or(0) > 100,
            "{f} rarely produced: {seen:?}"
        );
    }
    assert!(follow_ups > 500);
}

#[test]
fn dialogues_open_with_descriptions_sometimes() {
    let opens = (0..2000u64)
        .filter(|i| {
            let seed = Split::Train.seed(*i).unwrap();
            let d = dialogue(&Scene::generate(seed), &mut WorldRng::derive(seed, 5));
            d.turns[0].family == Family::Description
        })
        .count();
    assert!(
        opens > 100,
        "only {opens} of 2000 dialogues open with a description"
    );
}

/// Cross-check answers against the scene with an independent reading of the question.
#[test]
fn answers_agree_with_the_scene() {
    for i in 0..3000 {
        let seed = Split::Test.seed(i).unwrap();
        let scene = Scene::generate(seed);
        for qa in question_set(&scene, &mut WorldRng::derive(seed, 9)) {
            let q = normalize(&qa.question);
            match qa.family {
                Family::Sign => assert_eq!(qa.answer, scene.sign.unwrap().number.to_string()),
                Family::Counting
                    if q.starts_with("how many objects") || q == "count objects in image" =>
                {
                    assert_eq!(qa.answer, scene.objects.len().to_string())
                }
                Family::Existence if q.contains("sign") => {
                    assert_eq!(qa.answer == "yes", scene.sign.is_some())
                }
                Family::Spatial if q.starts_with("where is") && !q.contains("sign") => {
                    // Resolve the referent from its words; it must be unique.
                    let words: Vec<&str> = q.split(' ').collect();
                    let colour = words.iter().find_map(|w| Colour::from_name(w));
                    let shape = words.iter().find_map(|w| Shape::from_word(w));
                    let size = words.iter().find_map(|w| Size::from_name(w));
                    let hits = scene.matching(colour, shape, size);
                    assert_eq!(hits.len(), 1, "referent not unique: {}", qa.question);
                    assert_eq!(qa.answer, hits[0].position.name());
                }
                _ => {}
            }
        }
    }
}

#[test]
fn relation_questions_are_balanced_yes_no_about_two_objects() {
    let (mut yes, mut asked, mut many) = (0, 0, 0);
    for i in 0..2000u64 {
        let ex = sample(Split::Validation, i).unwrap();
        many += usize::from(ex.scene.objects.len() >= 2);
        let Some(qa) = &ex.relation else {
            continue;
        };
        assert!(ex.scene.objects.len() >= 2, "{qa:?}");
        assert_eq!(qa.family, Family::Spatial);
        assert!(!qa.follow_up);
        assert!(qa.question.starts_with("Is the "), "{}", qa.question);
        assert!(
            ["above", "below", "left of", "right of"]
                .iter()
                .any(|r| qa.question.contains(r)),
            "{}",
            qa.question
        );
        asked += 1;
        yes += usize::from(match qa.answer.as_str() {
            "yes" => true,
            "no" => false,
            other => panic!("answer {other:?}"),
        });
    }
    // Objects with an identical twin cannot be named without their position: 85% here.
    assert!(
        asked * 5 >= many * 4,
        "{asked} of {many} scenes with two objects"
    );
    let share = yes as f64 / asked as f64;
    assert!((0.4..0.6).contains(&share), "yes share {share}");
}
