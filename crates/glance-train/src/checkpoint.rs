//! Training checkpoints: one safetensors file holding every parameter (`param.<name>`), the
//! optimiser moments of the current stage (`optim.m.<name>`, `optim.v.<name>`) and, in the header
//! metadata, the [`TrainState`] as JSON (config, stage, step, data cursor, optimiser step count).
//! Written atomically (temporary file, fsync, rename), so a crash leaves the previous checkpoint.

use crate::config::TrainConfig;
use crate::export::{safetensors_bytes, write_atomic};
use crate::{Result, TrainError};
use candle_core::{Device, Tensor};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Format tag stored in every checkpoint.
pub const FORMAT: &str = "glance-train-checkpoint/1";
const META_KEY: &str = "glance_train_state";

/// Where a run stands: enough to continue it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    pub format: String,
    pub config: TrainConfig,
    /// Index into `config.stages` of the stage in progress (`== len` when all are done).
    pub stage_index: usize,
    /// Optimiser steps done in that stage.
    pub stage_step: u64,
    /// Steps of that stage once known (time budgets fix it after the probe steps).
    pub stage_total: Option<u64>,
    /// Next index into the world's train split.
    pub cursor: u64,
    /// Seconds spent training in each stage so far (informational).
    pub stage_seconds: Vec<f64>,
}

impl TrainState {
    pub fn new(config: TrainConfig) -> Self {
        let n = config.stages.len();
        Self {
            format: FORMAT.into(),
            config,
            stage_index: 0,
            stage_step: 0,
            stage_total: None,
            cursor: 0,
            stage_seconds: vec![0.0; n],
        }
    }

    pub fn finished(&self) -> bool {
        self.stage_index >= self.config.stages.len()
    }
}

/// Writes a checkpoint to `path` atomically.
pub fn save(
    path: &Path,
    state: &TrainState,
    params: &[(String, Tensor)],
    optim: &[(String, Tensor)],
) -> Result<()> {
    let mut tensors: Vec<(String, Tensor)> = params
        .iter()
        .map(|(n, t)| (format!("param.{n}"), t.clone()))
        .collect();
    tensors.extend(optim.iter().cloned());
    write_state_file(path, META_KEY, state, &tensors)
}

/// Writes `tensors` with `state` as JSON under `meta_key` in the header, atomically: the file
/// format of every glance training checkpoint.
pub(crate) fn write_state_file<S: Serialize>(
    path: &Path,
    meta_key: &str,
    state: &S,
    tensors: &[(String, Tensor)],
) -> Result<()> {
    let meta = HashMap::from([
        (meta_key.to_string(), serde_json::to_string(state)?),
        ("format".to_string(), "pt".to_string()),
    ]);
    write_atomic(path, &safetensors_bytes(tensors, meta)?)
}

/// Reads a file written by [`write_state_file`]: the state under `meta_key` (`what` names it in
/// errors) and every tensor. The caller checks the state's format tag.
pub(crate) fn read_state_file<S: DeserializeOwned>(
    path: &Path,
    meta_key: &str,
    what: &str,
    device: &Device,
) -> Result<(S, HashMap<String, Tensor>)> {
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
        .and_then(|m| m.get(meta_key))
        .ok_or_else(|| bad(format!("no {what} in the header")))?;
    let state: S = serde_json::from_str(json).map_err(|e| bad(format!("{what}: {e}")))?;
    let tensors =
        candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| bad(e.to_string()))?;
    Ok((state, tensors))
}

/// A loaded checkpoint.
pub struct Loaded {
    pub state: TrainState,
    /// Parameters by their model name (without the `param.` prefix).
    pub params: HashMap<String, Tensor>,
    /// Optimiser tensors by their full name (`optim.m.…`).
    pub optim: HashMap<String, Tensor>,
}

/// Reads a checkpoint written by [`save`].
pub fn load(path: &Path, device: &Device) -> Result<Loaded> {
    let (state, all): (TrainState, _) = read_state_file(
        path,
        META_KEY,
        "training state (not a glance-train checkpoint)",
        device,
    )?;
    if state.format != FORMAT {
        return Err(TrainError::Checkpoint {
            path: path.to_path_buf(),
            reason: format!("format {:?}, this build reads {FORMAT:?}", state.format),
        });
    }
    let mut params = HashMap::new();
    let mut optim = HashMap::new();
    for (name, t) in all {
        if let Some(p) = name.strip_prefix("param.") {
            params.insert(p.to_string(), t);
        } else if name.starts_with("optim.") {
            optim.insert(name, t);
        }
    }
    Ok(Loaded {
        state,
        params,
        optim,
    })
}
