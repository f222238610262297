//! Where glance's models come from.
//!
//! - **Shipped models.** glance-tiny (with its draft heads) and glance-tiny-dvlm are embedded in
//!   the binary and installed, on first use, to `models/<name>` under the glance home
//!   ([`home`]: `$GLANCE_HOME`, else the platform data directory): the loaders read model
//!   directories (memory-mapped safetensors, JSON, templates), so a plain copy on disk lets every
//!   path of the engine work unchanged, and users can see and copy the files. A stamp file marks
//!   the copy; a binary with different embedded files installs them again.
//! - **Names.** `--model NAME`: a directory that exists, a shipped model, a directory under the
//!   glance home's `models/`, or a Hugging Face repo id (`org/name`) found in the local HF cache
//!   ([`hub`]).
//!
//! [`locate`] resolves one; [`list`] shows everything found (`glance models`).

pub mod hub;
mod locate;
mod shipped;

pub use locate::{list, locate, Found, Located, Source};
pub use shipped::{install, shipped_names, DEFAULT_MODEL};

use glance_core::{Error, Result};
use std::path::PathBuf;

/// The environment variable naming the glance home.
pub const HOME_ENV: &str = "GLANCE_HOME";

/// The glance home: `$GLANCE_HOME`, else `glance` in the platform data directory
/// (`$XDG_DATA_HOME` or `~/.local/share` on Linux, `~/Library/Application Support` on macOS,
/// `%APPDATA%` on Windows).
pub fn home() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    dirs::data_dir().map(|d| d.join("glance")).ok_or_else(|| {
        Error::Config(format!(
            "no data directory for the glance home on this system: set {HOME_ENV}"
        ))
    })
}

/// glance's cache directory (measured cost models, `--decode auto`): `cache/` under
/// `$GLANCE_HOME` when that is set, else `glance` in the platform cache directory
/// (`$XDG_CACHE_HOME` or `~/.cache` on Linux); `None` on a system without one.
pub fn cache_root() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h).join("cache"));
    }
    dirs::cache_dir().map(|d| d.join("glance"))
}

/// `models/` under the glance home.
pub fn models_dir() -> Result<PathBuf> {
    Ok(home()?.join("models"))
}
