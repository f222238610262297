//! Token-drop augmentation trains on exactly the prompt that pruned inference builds; the
//! alignment targets name what each patch shows.

mod common;

use candle_core::{Device, Tensor};
use glance_nn::{AttnMask, CausalLm};
use glance_prune::{prefill_llava, Budget, Policy, PruneSpec};
use glance_train::step::image_encoding;
use glance_train::token_drop::{apply, DropPlan};
use glance_train::Stage;

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// For subset and merging policies alike: the training sequence without the dropped rows gives,
/// at the row that predicts the answer, the logits of `prefill_llava` with the same request.
#[test]
fn a_dropped_training_sequence_is_the_pruned_inference_prompt() {
    let (model, data, _dir) = common::tiny("drop");
    let mut cursor = 0;
    let images = data.next_images(&mut cursor, 2, 6).unwrap();
    let image_id = model.config.image_token_id;
    let policies = [Policy::Adaptive, Policy::Hier, Policy::Random, Policy::Text];
    for (i, policy) in policies.into_iter().enumerate() {
        let im = &images[i % images.len()];
        let qa = data.turns(&im.scene, im.seed, 1).remove(0);
        let packed = data.pack_turns(std::slice::from_ref(&qa)).unwrap();
        let query = data.processor.query_ids(&qa.question).unwrap();
        let mut spec = PruneSpec::new(policy, Budget::Ratio(0.25));
        spec.seed = 5;
        let plan = DropPlan {
            spec: spec.clone(),
            query: query.clone(),
        };

        let enc = image_encoding(&model, Stage::Llava, &im.pixels).unwrap();
        let (feats, p) = apply(&model.train, &enc, &packed, image_id, &plan).unwrap();
        let n = enc.features.dim(0).unwrap();
        let kept = p.ids.iter().filter(|&&t| t == image_id).count();
        assert_eq!(kept, Budget::Ratio(0.25).resolve(n), "{policy}");
        assert_eq!(p.len(), packed.len() - (n - kept));
        assert_eq!(p.targets, packed.targets);
        let xs = model.train.embed_prompt(&p.ids, &[&feats]).unwrap();
        let mask = AttnMask::Custom(p.mask_tensor(&Device::Cpu).unwrap());
        let hidden = model
            .train
            .text()
            .forward_uncached(&xs, &p.positions, &mask)
            .unwrap();
        let row = p.target_rows[0] as usize;
        let train_logits = model
            .train
            .text()
            .logits(&hidden.narrow(0, row, 1).unwrap());

        let ids: Vec<u32> = data
            .prefix()
            .iter()
            .copied()
            .chain(data.prompt_tail(&qa.question).unwrap())
            .collect();
        let enc = model.infer.encode_image(&im.pixels).unwrap();
        let out = prefill_llava(&model.infer, &ids, &[&enc], &query, &spec).unwrap();
        assert_eq!(out.state.prompt_len(), row + 1, "{policy}");
        assert_eq!(out.state.last_pos(), p.positions[row], "{policy}");
        let infer_logits = model
            .infer
            .text()
            .logits(&out.state.last_hidden().unwrap())
            .unwrap();
        let d = max_abs_diff(&train_logits.unwrap(), &infer_logits);
        assert!(d < 1e-3, "{policy}: logits differ by {d}");
    }
}

/// Each patch's alignment targets are the words of its grid cell plus, on an object, its colour,
/// shape (both numbers), size and "object(s)"; function words are never targets.
#[test]
fn alignment_targets_name_what_each_patch_shows() {
    let (model, data, _dir) = common::tiny("align");
    let mut cursor = 0;
    let im = data.next_images(&mut cursor, 1, 6).unwrap().remove(0);
    let y = data.align_targets(&im.scene).unwrap();
    let words: Vec<String> = data
        .align_words()
        .iter()
        .map(|&id| data.processor.text.id_to_token(id).unwrap())
        .collect();
    let (n, v) = y.dims2().unwrap();
    assert_eq!(v, words.len());
    assert_eq!(n, model.config.image_tokens_per_image());
    let y: Vec<Vec<f32>> = y.to_vec2().unwrap();
    let named = |p: usize| -> Vec<&str> {
        (0..v)
            .filter(|&j| y[p][j] > 0.5)
            .map(|j| words[j].as_str())
            .collect()
    };
    // The top-left patch is in the top-left cell.
    assert!(
        named(0).contains(&"top") && named(0).contains(&"left"),
        "{:?}",
        named(0)
    );
    for p in 0..n {
        assert!(!named(p)
            .iter()
            .any(|w| ["what", "the", "is", "how"].contains(w)));
    }
    let labels = glance_world::patch_labels(&im.scene, model.config.vision.patch_size).unwrap();
    let mut objects = 0;
    for (p, l) in labels.labels.iter().enumerate() {
        if let glance_world::PatchContent::Object { colour, shape, .. } = l.content {
            objects += 1;
            let w = named(p);
            for want in [colour.name(), shape.name(), shape.plural(), "objects"] {
                assert!(w.contains(&want), "patch {p}: {want} missing from {w:?}");
            }
        }
    }
    assert!(objects > 0, "the scene has object patches");
}
