//! Rendering is deterministic (golden hash), and per-patch labels agree with the pixels.

use glance_world::labels::PatchIds;
use glance_world::{patch_labels, pixel_hash, render, sample, PatchContent, Scene, Split};

#[test]
fn rendering_is_deterministic_with_a_golden_hash() {
    let scene = Scene::generate(42);
    let a = render(&scene);
    let b = render(&Scene::generate(42));
    assert_eq!(a.dimensions(), (224, 224));
    assert_eq!(a, b);
    // Golden value: changes only if the scene generator or the renderer changes (which also
    // changes every dataset built from the world; update deliberately).
    assert_eq!(
        pixel_hash(&a),
        GOLDEN_SEED_42,
        "pixel hash of seed 42 changed"
    );
    assert_ne!(pixel_hash(&render(&Scene::generate(43))), pixel_hash(&a));
}

const GOLDEN_SEED_42: u64 = 11774613445661337929;

#[test]
fn scenes_serialise_round_trip() {
    for i in 0..50 {
        let ex = sample(Split::Train, i).unwrap();
        let json = serde_json::to_string(&ex.scene).unwrap();
        let back: Scene = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ex.scene);
        assert_eq!(pixel_hash(&render(&back)), pixel_hash(&ex.image));
    }
}

#[test]
fn patch_labels_agree_with_pixels() {
    let mut digit_patches = 0;
    let mut signs = 0;
    for i in 0..300 {
        let ex = sample(Split::Train, i).unwrap();
        let labels = patch_labels(&ex.scene, 14).unwrap();
        assert_eq!((labels.grid, labels.labels.len()), (16, 256));
        let mut per_object = vec![0usize; ex.scene.objects.len()];
        for (k, l) in labels.labels.iter().enumerate() {
            let (row, col) = (k / 16, k % 16);
            match l.content {
                PatchContent::Object { index, colour, .. } => {
                    per_object[index] += 1;
                    // A mostly covered patch has the object's colour at its centre.
                    if l.coverage > 0.9 {
                        let px = ex
                            .image
                            .get_pixel(col as u32 * 14 + 7, row as u32 * 14 + 7)
                            .0;
                        assert_eq!(px, colour.rgb(), "seed {} patch {row},{col}", ex.seed);
                    }
                }
                PatchContent::SignDigit { place, digit } => {
                    digit_patches += 1;
                    assert_eq!(digit, ex.scene.sign.unwrap().digits()[place as usize]);
                }
                PatchContent::SignPlate => assert!(ex.scene.sign.is_some()),
                PatchContent::Background => {}
            }
        }
        for (k, n) in per_object.iter().enumerate() {
            let o = &ex.scene.objects[k];
            // Small objects cover ≥ 2 patches, large ones ≥ 8 (at the default threshold).
            let min = if o.size == glance_world::Size::Small {
                2
            } else {
                8
            };
            assert!(
                *n >= min,
                "seed {} object {k} ({}) labels only {n} patches",
                ex.seed,
                o.phrase()
            );
        }
        if let Some(sign) = ex.scene.sign {
            signs += 1;
            let ids = labels.ids();
            let digits: std::collections::BTreeSet<u32> = ids
                .iter()
                .filter(|i| i.kind == 3)
                .map(|i| i.digit)
                .collect();
            for d in sign.digits() {
                assert!(
                    digits.contains(&(d as u32)),
                    "seed {} digit {d} of {} unlabelled",
                    ex.seed,
                    sign.number
                );
            }
        }
        assert!(labels
            .ids()
            .iter()
            .all(|i| (i.kind as usize) < PatchIds::KINDS && (i.digit as usize) < PatchIds::DIGITS));
    }
    assert!(
        signs > 100 && digit_patches > signs * 4,
        "{digit_patches} digit patches in {signs} signs"
    );
}

#[test]
fn bad_patch_sizes_are_errors() {
    let s = Scene::generate(1);
    assert!(patch_labels(&s, 0).is_err());
    assert!(patch_labels(&s, 15).is_err());
    assert!(glance_world::patch_labels_with(&s, 14, 1.5).is_err());
    assert_eq!(patch_labels(&s, 28).unwrap().grid, 8);
}

#[test]
fn images_are_mostly_background() {
    let mut bg = 0usize;
    let n = 500;
    for i in 0..n {
        let ex = sample(Split::Train, i).unwrap();
        bg += patch_labels(&ex.scene, 14)
            .unwrap()
            .ids()
            .iter()
            .filter(|i| i.kind == 0)
            .count();
    }
    let frac = bg as f64 / (n as f64 * 256.0);
    println!("background patch fraction: {frac:.3}");
    assert!(frac > 0.6, "background fraction {frac}");
}

#[test]
fn hostile_scenes_do_not_panic() {
    use glance_world::{
        dialogue, question_set, Background, Colour, Object, Position, Shape, Sign, Size, WorldRng,
    };
    let weird = Object {
        colour: Colour::Red,
        shape: Shape::Star,
        size: Size::Large,
        position: Position::Center,
        cx: f32::NAN,
        cy: 1e30,
    };
    let scenes = [
        Scene {
            seed: 0,
            background: Background::Plain { rgb: [0, 0, 0] },
            objects: vec![],
            sign: None,
        },
        Scene {
            seed: 1,
            background: Background::Textured {
                rgb: [255, 255, 255],
                cell: 0,
                amplitude: 255,
                noise_seed: 3,
            },
            objects: vec![weird, weird],
            sign: Some(Sign {
                number: 255,
                position: Position::Center,
                x: u32::MAX,
                y: u32::MAX - 3,
            }),
        },
        Scene {
            seed: 2,
            background: Background::Gradient {
                from: [0, 0, 0],
                to: [255, 255, 255],
                dx: 0,
                dy: 0,
            },
            objects: vec![],
            sign: Some(Sign {
                number: 7,
                position: Position::TopLeft,
                x: 200,
                y: 200,
            }),
        },
    ];
    for s in &scenes {
        let img = render(s);
        assert_eq!(img.dimensions(), (224, 224));
        patch_labels(s, 14).unwrap();
        let mut rng = WorldRng::new(5);
        let _ = question_set(s, &mut rng);
        let _ = dialogue(s, &mut rng);
        let _ = glance_world::describe::describe(s, &mut rng);
    }
}
