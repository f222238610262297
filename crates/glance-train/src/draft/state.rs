//! Draft-training checkpoints: one safetensors file holding every head parameter
//! (`param.<name>`), the AdamW moments (`optim.m.<name>`, `optim.v.<name>`) and, in the header
//! metadata, the [`DraftState`] as JSON (settings, step — which is also the data cursor —,
//! schedule length). Written atomically (temporary file, fsync, rename), so a crash leaves the
//! previous checkpoint.

use super::DraftTrainConfig;
use crate::checkpoint::{read_state_file, write_state_file};
use crate::optim::AdamW;
use crate::params::Param;
use crate::{Result, TrainError};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Format tag of draft checkpoints.
pub const FORMAT: &str = "glance-draft-checkpoint/1";
const META_KEY: &str = "glance_draft_state";

/// Where a run stands: enough to continue it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftState {
    pub format: String,
    pub config: DraftTrainConfig,
    /// Optimiser steps done (also the data cursor).
    pub step: u64,
    /// Steps of the run once known (a time budget fixes it after the probe steps).
    pub total: Option<u64>,
    /// Seconds spent training so far (informational).
    pub seconds: f64,
}

/// Writes `state`, `params` and `optim`'s moments to `path` atomically.
pub fn save_checkpoint(
    path: &Path,
    state: &DraftState,
    params: &[Param],
    optim: &AdamW,
) -> Result<()> {
    let mut tensors: Vec<(String, Tensor)> = params
        .iter()
        .map(|p| (format!("param.{}", p.name), p.var.as_tensor().clone()))
        .collect();
    tensors.extend(optim.state_tensors()?);
    write_state_file(path, META_KEY, state, &tensors)
}

/// Reads a checkpoint written by [`DraftTrainer::save_checkpoint`].
pub fn load_checkpoint(path: &Path) -> Result<(DraftState, HashMap<String, Tensor>)> {
    let (state, tensors): (DraftState, _) =
        read_state_file(path, META_KEY, "draft-training state", &Device::Cpu)?;
    if state.format != FORMAT {
        return Err(TrainError::Checkpoint {
            path: path.to_path_buf(),
            reason: format!("format {:?}, this build reads {FORMAT:?}", state.format),
        });
    }
    Ok((state, tensors))
}
