//! `write_sample` writes PNGs, questions.jsonl and scenes.jsonl.

use glance_world::{pixel_hash, sample, write_sample, Split};

#[test]
fn writes_pngs_and_jsonl() {
    let dir = std::env::temp_dir().join(format!("glance-world-sample-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let summary = write_sample(Split::Test, 16, &dir).unwrap();
    assert_eq!(summary.images, 16);
    for i in 0..16u64 {
        let img = image::open(dir.join(format!("{i:04}.png")))
            .unwrap()
            .to_rgb8();
        assert_eq!(
            pixel_hash(&img),
            pixel_hash(&sample(Split::Test, i).unwrap().image)
        );
    }
    let text = std::fs::read_to_string(dir.join("questions.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, summary.questions);
    let families: std::collections::HashSet<&str> = lines
        .iter()
        .map(|l| l["family"].as_str().unwrap())
        .collect();
    assert_eq!(families.len(), 6, "{families:?}");
    for l in &lines {
        for key in [
            "image",
            "seed",
            "family",
            "question",
            "answer",
            "dialogue",
            "turn",
            "follow_up",
        ] {
            assert!(l.get(key).is_some(), "missing {key} in {l}");
        }
    }
    assert!(lines.iter().any(|l| l["dialogue"].is_u64()));
    let scenes = std::fs::read_to_string(dir.join("scenes.jsonl")).unwrap();
    assert_eq!(scenes.lines().count(), 16);
    // Writing into a path that is a file fails with an error, not a panic.
    let file = dir.join("questions.jsonl");
    assert!(write_sample(Split::Test, 1, &file).is_err());
    assert!(write_sample(Split::Test, u64::MAX, &dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
