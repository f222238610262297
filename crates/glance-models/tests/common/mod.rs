//! Helpers shared by the model integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use candle_core::Tensor;
use std::path::PathBuf;

/// The committed golden fixtures at the repository root.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// Largest absolute element-wise difference of two tensors of the same shape.
pub fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shape");
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// A fixture's integer tensor (stored as i64, e.g. `input_ids`, `greedy_ids`) as token ids.
pub fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect()
}
