//! A packed load holds at most one weight in f32 at a time: the heap a q4 load of a random
//! decoder ever has in use stays within what the loaded model holds plus its largest tensor in
//! f32. The embeddings are the largest tensor of a Llama; a load that kept their f32 copy beside
//! the layers, or copied a matrix's f32 values again to pack them, exceeds the bound.
//!
//! Counted by this test binary's allocator (bytes live on the heap, deterministic), not by the
//! resident set, which the allocator's retention of freed blocks and the machine move. One test
//! in this file: every allocation of the process is counted.

use candle_core::Device;
use glance_models::random::random_var_builder;
use glance_models::text::{TextConfig, TextModel};
use glance_nn::{Mode, WeightFormat, WeightLoad};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live and their most since [`reset_peak`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::SeqCst) + bytes;
    PEAK.fetch_max(live, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to `System` unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            // Counted as held twice for the move: the larger of the two is what realloc may need.
            grew(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn reset_peak() -> usize {
    let live = LIVE.load(Ordering::SeqCst);
    PEAK.store(live, Ordering::SeqCst);
    live
}

/// A small Llama whose embeddings `(vocab, hidden)` are its largest tensor, as in Llama-2-7B.
fn config(tied: bool) -> TextConfig {
    TextConfig::from_value(&serde_json::json!({
        "model_type": "llama", "vocab_size": 8192, "hidden_size": 256,
        "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "max_position_embeddings": 512,
        "tie_word_embeddings": tied,
    }))
    .unwrap()
}

/// (heap bytes in use at the peak of the load, after it), both above what was live before.
fn load_q4(config: &TextConfig) -> (usize, usize, TextModel) {
    let vb = random_var_builder(0, &Device::Cpu);
    let load = WeightLoad::new(WeightFormat::Q4);
    let base = reset_peak();
    let model = TextModel::load_as(&vb, &vb.pp("lm_head"), config, Mode::Infer, &load).unwrap();
    let (peak, after) = (PEAK.load(Ordering::SeqCst), LIVE.load(Ordering::SeqCst));
    (peak - base, after.saturating_sub(base), model)
}

#[test]
fn a_q4_load_holds_one_f32_tensor_at_a_time() {
    // A first load outside the count: the thread pool and other one-time state.
    drop(load_q4(&config(false)));
    for tied in [false, true] {
        let c = config(tied);
        let (peak, after, model) = load_q4(&c);
        assert!(
            model.linear_weight_bytes() < after,
            "the model is on the heap"
        );
        let largest_f32 = c.vocab_size * c.hidden_size * 4;
        // Slack for the small vectors (norms, rope tables, names) allocated beside.
        let slack = 1 << 20;
        assert!(
            peak <= after + largest_f32 + slack,
            "tied {tied}: {peak} bytes in use at the peak of the load, {after} after it, the \
             largest tensor {largest_f32} bytes in f32"
        );
    }
}
