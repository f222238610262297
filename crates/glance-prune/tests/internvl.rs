//! Pruning an InternVL prompt (`fixtures/internvl/`): every pre-LLM policy keeps, per image,
//! tokens that sit at their own position ids (selecting policies: with their own rows); text rows
//! keep theirs.

use candle_core::{Device, Tensor};
use glance_models::internvl::{InternVl, InternVlConfig, InternVlProcessor};
use glance_models::llava::{PromptFormat, SegmentKind};
use glance_models::processing::image::load_image;
use glance_models::processing::sized::SizedPrompts;
use glance_prune::{transform_internvl, Budget, Policy, PruneSpec, Stage};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/internvl")
}

fn rows_equal(a: &Tensor, b: &Tensor) -> bool {
    let d: f32 = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    d == 0.0
}

#[test]
fn kept_tokens_keep_their_own_positions_and_rows() {
    let dir = root().join("models/internvl-llama");
    let config = InternVlConfig::from_dir(&dir).unwrap();
    let proc = InternVlProcessor::from_dir(&dir, &config).unwrap();
    let model = InternVl::load(&dir, &Device::Cpu).unwrap();
    let encodings: Vec<_> = ["astronaut.png", "square_small.png"]
        .iter()
        .map(|n| {
            let img = load_image(&root().join("images").join(n)).unwrap();
            model
                .encode_image(&proc.image.preprocess(&img, &Device::Cpu).unwrap())
                .unwrap()
        })
        .collect();
    let tokens: Vec<usize> = encodings
        .iter()
        .map(|e| e.features.dim(0).unwrap())
        .collect();
    assert_eq!(tokens, [28, 4]);
    let prompt = proc
        .prepare("Compare the two pictures.", &tokens, PromptFormat::Chat)
        .unwrap();
    let refs: Vec<_> = encodings.iter().collect();
    let query = proc.text.encode_plain("Compare the two pictures.").unwrap();
    let mut ran = 0;
    for policy in Policy::ALL {
        if policy.stage() != Stage::PreLlm {
            continue;
        }
        let plan = model.plan(&prompt.ids, &refs).unwrap();
        let before = plan.clone();
        let spec = PruneSpec::new(policy, Budget::Ratio(0.5));
        let pruned = transform_internvl(&model, plan, &refs, &query, &spec).unwrap();
        let mut kept = 0;
        for (seg, orig) in pruned.plan.segments.iter().zip(&before.segments) {
            match seg.kind {
                SegmentKind::Text => assert_eq!(seg.positions, orig.positions, "{policy}"),
                SegmentKind::Image { index } => {
                    let n = tokens[index];
                    assert_eq!(
                        seg.positions.len(),
                        Budget::Ratio(0.5).resolve(n),
                        "{policy}"
                    );
                    assert!(seg.positions.windows(2).all(|w| w[0] < w[1]), "{policy}");
                    for (r, &p) in seg.positions.iter().enumerate() {
                        let i = p as usize - orig.source.start;
                        assert!(i < n && orig.positions[i] == p, "{policy}");
                        // Selecting policies keep the token's own row; merging ones (pool,
                        // hier) put a merged row at a member's position.
                        if !matches!(policy, Policy::Pool | Policy::Hier) {
                            let got = seg.rows.get(r).unwrap();
                            let want = encodings[index].features.get(i).unwrap();
                            assert!(
                                rows_equal(&got, &want),
                                "{policy}: row {r} is not token {i}"
                            );
                        }
                    }
                    kept += seg.positions.len();
                }
            }
        }
        assert_eq!(pruned.stats.kept_visual_tokens, kept, "{policy}");
        ran += 1;
    }
    assert!(ran >= 6, "{ran} pre-LLM policies");
}
