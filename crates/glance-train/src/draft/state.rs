//! Draft-training checkpoints: one safetensors file holding every head parameter
//! (`param.<name>`), the AdamW moments (`optim.m.<name>`, `optim.v.<name>`) and, in the header
//! metadata, the [`DraftState`] as JSON (settings, step — which is also the data cursor —,
//! schedule length). Written atomically (temporary file, fsync, rename), so a crash leaves the
//! previous checkpoint.

use super::DraftTrainConfig;
use crate::export::{safetensors_bytes, write_atomic};
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
    let meta = HashMap::from([
        (META_KEY.to_string(), serde_json::to_string(state)?),
        ("format".to_string(), "pt".to_string()),
    ]);
    write_atomic(path, &safetensors_bytes(&tensors, meta)?)
}

/// Reads a checkpoint written by [`DraftTrainer::save_checkpoint`].
pub fn load_checkpoint(path: &Path) -> Result<(DraftState, HashMap<String, Tensor>)> {
    let bad = |reason: String| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let json = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(META_KEY))
        .ok_or_else(|| bad("no draft-training state in the header".into()))?;
    let state: DraftState =
        serde_json::from_str(json).map_err(|e| bad(format!("training state: {e}")))?;
    if state.format != FORMAT {
        return Err(bad(format!(
            "format {:?}, this build reads {FORMAT:?}",
            state.format
        )));
    }
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .map_err(|e| bad(e.to_string()))?;
    Ok((state, tensors))
}
