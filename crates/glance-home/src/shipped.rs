//! The shipped models, embedded at build time (`build.rs`), and their installation under the
//! glance home.

use glance_core::{Error, Result};
use std::path::{Path, PathBuf};

/// A shipped file: its path relative to the model directory, and its bytes.
type ShippedFile = (&'static str, &'static [u8]);

include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

/// The default model.
pub const DEFAULT_MODEL: &str = "glance-tiny";

/// The file marking a directory installed from the embedded copy; it holds the build's stamp.
pub(crate) const STAMP_FILE: &str = ".glance-shipped";

/// The names of the shipped models.
pub fn shipped_names() -> impl Iterator<Item = &'static str> {
    MODELS.iter().map(|(name, _)| *name)
}

/// Whether `dir` holds this build's copy of a shipped model.
pub(crate) fn is_current(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(STAMP_FILE)).is_ok_and(|s| s.trim() == STAMP)
}

/// The shipped model `name` under `models` (the glance home's `models/`), installed from the
/// embedded copy if it is missing or from another build. `None` when `name` is not shipped.
/// A directory of that name without the stamp file is the user's own and is used as it is.
/// Installing writes a temporary directory and renames it into place, so concurrent first uses
/// (and an interrupted one) never leave a partial model.
pub fn install(models: &Path, name: &str) -> Result<Option<PathBuf>> {
    let Some((_, files)) = MODELS.iter().find(|(n, _)| *n == name) else {
        return Ok(None);
    };
    let target = models.join(name);
    if is_current(&target) || (target.is_dir() && !target.join(STAMP_FILE).exists()) {
        return Ok(Some(target));
    }
    std::fs::create_dir_all(models).map_err(|e| home_error(models, e))?;
    let unique = format!(
        ".{name}.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let tmp = models.join(format!("{unique}.new"));
    let write = || -> std::io::Result<()> {
        for (rel, bytes) in files.iter() {
            let path = tmp.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, bytes)?;
        }
        std::fs::write(tmp.join(STAMP_FILE), STAMP)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(home_error(&tmp, e));
    }
    // An older install moves aside first (a directory cannot be renamed over a non-empty one).
    if target.exists() && !is_current(&target) {
        let old = models.join(format!("{unique}.old"));
        if std::fs::rename(&target, &old).is_ok() {
            let _ = std::fs::remove_dir_all(&old);
        }
    }
    match std::fs::rename(&tmp, &target) {
        Ok(()) => {
            eprintln!("installed {name} to {} (first use)", target.display());
            Ok(Some(target))
        }
        // Another process installed it meanwhile.
        Err(_) if is_current(&target) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(Some(target))
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(home_error(&target, e))
        }
    }
}

fn home_error(path: &Path, cause: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        cause: std::io::Error::new(
            cause.kind(),
            format!(
                "{cause} (installing a shipped model in the glance home; set {} to a writable \
                 directory)",
                crate::HOME_ENV
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("glance-home-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn shipped_models_install_once_and_again_when_stale() {
        let models = scratch("install");
        assert!(shipped_names().any(|n| n == DEFAULT_MODEL));
        assert_eq!(install(&models, "no-such-model").unwrap(), None);
        let dir = install(&models, DEFAULT_MODEL).unwrap().unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "draft-vispec/config.json",
            "draft-eagle/model.safetensors",
        ] {
            assert!(dir.join(f).is_file(), "{f}");
        }
        assert!(is_current(&dir));
        // A stale stamp (another build) is replaced; a file removed comes back.
        std::fs::write(dir.join(STAMP_FILE), "old").unwrap();
        std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
        install(&models, DEFAULT_MODEL).unwrap().unwrap();
        assert!(is_current(&dir) && dir.join("tokenizer.json").is_file());
        // No temporary directories are left behind.
        let left: Vec<_> = std::fs::read_dir(&models)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec![DEFAULT_MODEL.to_string()]);
        // A user's own directory of that name (no stamp) is used as it is.
        std::fs::remove_file(dir.join(STAMP_FILE)).unwrap();
        std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
        install(&models, DEFAULT_MODEL).unwrap().unwrap();
        assert!(!dir.join("tokenizer.json").exists());
        std::fs::remove_dir_all(&models).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn installed_files_are_readable_by_all() {
        use std::os::unix::fs::PermissionsExt;
        let models = scratch("mode");
        let dir = install(&models, "glance-tiny-dvlm").unwrap().unwrap();
        let mode = std::fs::metadata(dir.join("model.safetensors"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o044, 0o044, "{mode:o}");
        std::fs::remove_dir_all(&models).unwrap();
    }
}
