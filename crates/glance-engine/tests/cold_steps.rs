//! Manual measurement (`cargo test --release -p glance-engine --test cold_steps -- --ignored
//! --nocapture`): how long glance-tiny's first decode steps after a prefill take, against the
//! steps after a prompt run row by row. glance-tiny's weights (12.8 MB in f32) live in the CPU's
//! caches between decode steps; a prefill's GEMMs and temporaries evict them, and the steps
//! after it run slower until the caches hold the weights again (docs/auto.md, "The bench's
//! order"). Each mode: the mean over 20 prompts of 265 rows of each of the first 12 steps.

use glance_engine::{Engine, EngineOptions};
use glance_nn::{AttnMask, CausalLm, KvCache};
use std::path::PathBuf;
use std::time::Instant;

const PROMPT_ROWS: u32 = 265;
const STEPS: u32 = 12;
const PROMPTS: u32 = 20;

#[test]
#[ignore]
fn decode_steps_after_a_prefill() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny");
    let e = Engine::load(&dir, EngineOptions::default()).unwrap();
    let text = e.model().text();
    for row_by_row in [false, true] {
        let mut mean = vec![0.0; STEPS as usize];
        for prompt in 0..PROMPTS {
            let ids: Vec<u32> = (0..PROMPT_ROWS).map(|i| 3 + (i + prompt) % 50).collect();
            let steps = e.install(|| {
                let mut cache = text.new_cache();
                // As the engine does: room for the answer, so no step grows the buffers.
                cache.reserve((PROMPT_ROWS + STEPS) as usize + 64);
                if row_by_row {
                    for (p, &id) in ids.iter().enumerate() {
                        forward(text, &mut cache, id, p as u32);
                    }
                } else {
                    let positions: Vec<u32> = (0..PROMPT_ROWS).collect();
                    let x = text.embed_tokens(&ids).unwrap();
                    text.forward(&x, &positions, &AttnMask::causal(), &mut cache)
                        .unwrap();
                }
                (0..STEPS)
                    .map(|s| {
                        let clock = Instant::now();
                        forward(text, &mut cache, 5 + s, PROMPT_ROWS + s);
                        clock.elapsed().as_secs_f64()
                    })
                    .collect::<Vec<_>>()
            });
            for (m, s) in mean.iter_mut().zip(steps) {
                *m += s / PROMPTS as f64;
            }
        }
        let ms: Vec<String> = mean.iter().map(|s| format!("{:.2}", s * 1e3)).collect();
        println!(
            "after a prompt run {}: decode steps {} ms",
            if row_by_row {
                "row by row"
            } else {
                "as one prefill"
            },
            ms.join(", ")
        );
    }
}

/// One decode step: `id` at `pos`, its logits read back.
fn forward(text: &dyn CausalLm, cache: &mut KvCache, id: u32, pos: u32) {
    let x = text.embed_tokens(&[id]).unwrap();
    let h = text
        .forward(&x, &[pos], &AttnMask::causal(), cache)
        .unwrap();
    let logits: Vec<Vec<f32>> = text.logits(&h).unwrap().to_vec2().unwrap();
    std::hint::black_box(logits);
}
