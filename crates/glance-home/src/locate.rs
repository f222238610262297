//! `--model` resolution and the listing of `glance models`.

use crate::{hub, models_dir, shipped};
use glance_core::{Error, Result};
use std::path::{Path, PathBuf};

/// Where a model was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A directory (or file) given by path.
    Path,
    /// A shipped model, installed under the glance home.
    Shipped,
    /// A directory under the glance home's `models/`.
    Home,
    /// A repo in the Hugging Face cache.
    HfCache,
}

impl Source {
    pub fn label(&self) -> &'static str {
        match self {
            Source::Path => "path",
            Source::Shipped => "shipped",
            Source::Home => "glance home",
            Source::HfCache => "HF cache",
        }
    }
}

/// A resolved `--model`.
#[derive(Debug, Clone)]
pub struct Located {
    /// The model directory.
    pub dir: PathBuf,
    /// The model's name: the repo id of a Hugging Face model (also of a cache snapshot given by
    /// path), else the directory's name.
    pub name: String,
    pub source: Source,
}

/// Resolves `--model` (and `--revision`, which only a repo id takes). In order:
/// an existing path; a shipped model (installed on first use); a directory under the glance
/// home's `models/`; a Hugging Face repo id in the HF cache ([`hub::cache_dir`]). No `--model`
/// is the shipped [`shipped::DEFAULT_MODEL`].
///
/// This is the one place a `--model` argument becomes a source; every command (run, eval, serve,
/// quantize, the trainers' `--from`) goes through it, and the server's model name is
/// [`Located::name`].
pub fn locate(model: Option<&str>, revision: Option<&str>) -> Result<Located> {
    let model = model.unwrap_or(shipped::DEFAULT_MODEL);
    if revision.is_some() && !hub::is_repo_id(model) {
        return Err(Error::InvalidParam(format!(
            "--revision applies to a Hugging Face repo id (org/name), not `{model}`"
        )));
    }
    let path = Path::new(model);
    // A path is used as it is: a directory, or a GGUF text model (llama.cpp's LLaVA layout),
    // whose reader the loader picks by the file (`ModelArgs::engine` in
    // crates/glance-cli/src/args.rs).
    if revision.is_none() && path.exists() {
        let name = hub::repo_of_snapshot(path).unwrap_or_else(|| dir_name(path));
        return Ok(Located {
            dir: path.to_path_buf(),
            name,
            source: Source::Path,
        });
    }
    let plain_name = !model.contains(['/', '\\']) && !model.is_empty();
    if plain_name {
        let models = models_dir()?;
        if let Some(dir) = shipped::install(&models, model)? {
            return Ok(Located {
                dir,
                name: model.to_string(),
                source: Source::Shipped,
            });
        }
        let dir = models.join(model);
        if dir.is_dir() || is_gguf_model(&dir) {
            return Ok(Located {
                dir,
                name: model.to_string(),
                source: Source::Home,
            });
        }
    }
    if hub::is_repo_id(model) {
        if let Some(cache) = hub::cache_dir() {
            let dir = hub::snapshot(&cache, model, revision).map_err(|e| match e {
                Error::MissingFile { dir, what } => Error::MissingFile {
                    dir,
                    what: format!("{what}; `{model}` is not a directory either"),
                },
                other => other,
            })?;
            return Ok(Located {
                dir,
                name: model.to_string(),
                source: Source::HfCache,
            });
        }
    }
    let shipped: Vec<&str> = shipped::shipped_names().collect();
    Err(Error::MissingFile {
        dir: path.to_path_buf(),
        what: format!(
            "model directory (no such directory, and `{model}` is not a shipped model ({}), a \
             directory under the glance home's models/ or a Hugging Face repo id (org/name); \
             `glance models` lists what is found)",
            shipped.join(", ")
        ),
    })
}

/// A GGUF text model (a `.gguf` file that is not a vision tower's `mmproj`).
fn is_gguf_model(path: &Path) -> bool {
    let name = dir_name(path).to_ascii_lowercase();
    path.is_file() && name.ends_with(".gguf") && !name.contains("mmproj")
}

/// A directory's last component (`.` and `..` resolved when possible).
fn dir_name(path: &Path) -> String {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    name(path)
        .or_else(|| path.canonicalize().ok().as_deref().and_then(name))
        .unwrap_or_else(|| "glance".into())
}

/// One model [`list`] found.
#[derive(Debug, Clone)]
pub struct Found {
    pub name: String,
    pub source: Source,
    pub dir: PathBuf,
    /// For a shipped model, whether it is installed yet.
    pub note: String,
}

/// Every model glance can find by name: the shipped ones (installed or not), the directories
/// and GGUF text models under the glance home's `models/`, and the repos of the HF cache.
pub fn list() -> Result<Vec<Found>> {
    let models = models_dir()?;
    let mut found = Vec::new();
    for name in shipped::shipped_names() {
        let dir = models.join(name);
        let note = if shipped::is_current(&dir) {
            "installed"
        } else if dir.join(shipped::STAMP_FILE).exists() {
            "from another build; re-installed on next use"
        } else if dir.is_dir() {
            "your own copy (used as it is)"
        } else {
            "embedded; installed on first use"
        };
        found.push(Found {
            name: name.to_string(),
            source: Source::Shipped,
            dir,
            note: note.to_string(),
        });
    }
    let mut own: Vec<PathBuf> = std::fs::read_dir(&models)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = dir_name(p);
            !n.starts_with('.')
                && !shipped::shipped_names().any(|s| s == n)
                && (p.join("config.json").is_file() || is_gguf_model(p))
        })
        .collect();
    own.sort();
    for dir in own {
        let note = if is_gguf_model(&dir) {
            "GGUF (with the mmproj file beside it)"
        } else {
            ""
        };
        found.push(Found {
            name: dir_name(&dir),
            source: Source::Home,
            dir,
            note: note.to_string(),
        });
    }
    if let Some(cache) = hub::cache_dir() {
        for (name, dir) in hub::repos(&cache) {
            found.push(Found {
                name,
                source: Source::HfCache,
                dir,
                note: String::new(),
            });
        }
    }
    Ok(found)
}
