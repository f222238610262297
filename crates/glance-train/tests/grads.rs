//! Every trainable tensor receives a non-zero gradient in every stage, and frozen tensors none.
//! This is what catches a fused op without a backward pass in the training graph (it fails
//! silently: the step runs, only the layers after it learn).

mod common;

use glance_train::step::{qa_loss, vision_loss};
use glance_train::Stage;

#[test]
fn every_trainable_tensor_gets_a_gradient_in_every_stage() {
    let (model, data, _dir) = common::tiny("grads");
    let mut cursor = 0;
    let images = data.next_images(&mut cursor, 2, 6).unwrap();
    for stage in Stage::ALL {
        let batch = match stage {
            Stage::Vision => vision_loss(&model, &data, &images).unwrap(),
            s => qa_loss(&model, &data, s, &images, 4).unwrap(),
        };
        let grads = batch.loss.backward().unwrap();
        // Note: CLIP's `k_proj.bias` has an exactly-zero true gradient (softmax ignores a shift
        // shared by a query's scores); what it gets is rounding noise, which still shows the
        // tensor is wired into the graph.
        let trainable = model.stage_params(stage);
        assert!(!trainable.is_empty());
        let mut zero = Vec::new();
        for p in &trainable {
            match grads.get(p.var.as_tensor()) {
                None => zero.push(format!("{} (no gradient)", p.name)),
                Some(g) => {
                    let m: f32 = g.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                    if !(m > 0.0 && m.is_finite()) {
                        zero.push(format!("{} (max |g| = {m})", p.name));
                    }
                }
            }
        }
        assert!(
            zero.is_empty(),
            "stage {stage}: {} of {} tensors without gradient: {zero:#?}",
            zero.len(),
            trainable.len()
        );
        // Frozen parameters must not be reached at all (the vision tower in the LLaVA stage).
        let names: Vec<&str> = trainable.iter().map(|p| p.name.as_str()).collect();
        for p in model.all_params() {
            if !names.contains(&p.name.as_str()) && stage == Stage::Llava {
                assert!(
                    grads.get(p.var.as_tensor()).is_none(),
                    "stage {stage}: frozen {} got a gradient",
                    p.name
                );
            }
        }
    }
}

/// Splitting a batch over worker threads gives the whole batch's gradient (parts are scaled by
/// their share of the supervised units), for every stage's loss normalisation.
#[test]
fn worker_split_sums_to_the_whole_batch_gradient() {
    use glance_train::step::{batch_grads, pack_images, Batch};
    let (model, data, _dir) = common::tiny("split");
    let mut cursor = 0;
    let images = data.next_images(&mut cursor, 3, 6).unwrap();
    let pixels: Vec<&candle_core::Tensor> = images.iter().map(|im| &im.pixels).collect();
    let targets: Vec<_> = images
        .iter()
        .map(|im| data.vision_targets(&im.scene).unwrap())
        .collect();
    let packed = pack_images(&data, &images, 4).unwrap();
    for stage in Stage::ALL {
        let input = match stage {
            Stage::Vision => Batch::Vision {
                pixels: pixels.clone(),
                targets: &targets,
            },
            _ => Batch::Qa {
                items: pixels.iter().copied().zip(&packed).collect(),
                drops: &[],
                align: None,
            },
        };
        let one = batch_grads(&model, stage, &input, 1).unwrap();
        let three = batch_grads(&model, stage, &input, 3).unwrap();
        assert_eq!(three.stores.len(), 3);
        assert!(
            (one.loss - three.loss).abs() < 1e-5 * one.loss.abs(),
            "{stage}: {} vs {}",
            one.loss,
            three.loss
        );
        for p in model.stage_params(stage) {
            let sum = |stores: &[candle_core::backprop::GradStore]| -> Vec<f32> {
                let mut acc = vec![0f32; p.var.as_tensor().elem_count()];
                for s in stores {
                    if let Some(g) = s.get(p.var.as_tensor()) {
                        let g: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
                        acc.iter_mut().zip(g).for_each(|(a, b)| *a += b);
                    }
                }
                acc
            };
            let (a, b) = (sum(&one.stores), sum(&three.stores));
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
            let diff = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            // The absolute floor covers tensors whose exact gradient is 0 and whose computed one is
            // rounding noise: CLIP's k_proj bias (softmax is invariant to a per-query shift).
            assert!(
                diff <= 1e-4 * scale + 1e-8,
                "{stage} {}: max diff {diff} (scale {scale})",
                p.name
            );
        }
    }
}
