//! Hugging Face repo ids in the local HF cache, offline: the layout `huggingface_hub` writes
//! (`models--org--name/refs/<branch>` holding a commit hash, `snapshots/<commit>/` with one
//! symbolic link per file into `blobs/`). The `hf-hub` crate's [`hf_hub::Cache`] gives the folder
//! names and the branch → snapshot lookup; this module adds what it leaves out: the cache's
//! location as `huggingface_hub` resolves it (`HF_HUB_CACHE` before `HF_HOME`), a revision given
//! as a commit hash, and errors that say what the cache holds.

use glance_core::{Error, Result};
use hf_hub::{Cache, Repo, RepoType};
use std::path::{Component, Path, PathBuf};

/// The HF hub cache: `$HF_HUB_CACHE` (or the older `$HUGGINGFACE_HUB_CACHE`), else
/// `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
/// `None` with none of these and no home directory.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return Some(d);
    }
    if std::env::var_os("HF_HOME").is_some_and(|v| !v.is_empty()) {
        return Some(Cache::from_env().path().clone());
    }
    if let Some(x) = var("XDG_CACHE_HOME") {
        return Some(x.join("huggingface").join("hub"));
    }
    dirs::home_dir().map(|_| Cache::default().path().clone())
}

/// Whether `s` reads as a repo id, `org/name`: two non-empty parts of ASCII letters, digits,
/// `-`, `_` and `.`, neither `.` nor `..`.
pub fn is_repo_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The repo id of an HF cache snapshot directory (`…/models--org--name/snapshots/<rev>`), if
/// `dir` is one.
pub fn repo_of_snapshot(dir: &Path) -> Option<String> {
    let mut names = dir
        .components()
        .rev()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let _rev = names.next()?;
    if names.next()? != "snapshots" {
        return None;
    }
    let folder = names.next()?;
    let id = folder.strip_prefix("models--")?.replacen("--", "/", 1);
    is_repo_id(&id).then_some(id)
}

/// Checks a revision: a branch or tag name (`main`, `refs/pr/1`) or a commit hash, never a path
/// that leaves the repo's folder.
fn check_revision(revision: &str) -> Result<()> {
    let p = Path::new(revision);
    let bad = revision.is_empty()
        || revision.contains('\\')
        || p.components().any(|c| !matches!(c, Component::Normal(_)));
    if bad {
        return Err(Error::InvalidParam(format!(
            "--revision {revision:?}: expected a branch, tag or commit hash"
        )));
    }
    Ok(())
}

/// The snapshot directory of `repo_id` at `revision` (default `main`) in the cache `cache`.
/// A branch or tag resolves through `refs/`; a commit hash names its snapshot directly.
pub fn snapshot(cache: &Path, repo_id: &str, revision: Option<&str>) -> Result<PathBuf> {
    if !is_repo_id(repo_id) {
        return Err(Error::InvalidParam(format!(
            "`{repo_id}` is not a Hugging Face repo id (org/name)"
        )));
    }
    let revision = revision.unwrap_or("main");
    check_revision(revision)?;
    let repo = Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string());
    let folder = cache.join(repo.folder_name());
    if !folder.is_dir() {
        return Err(Error::MissingFile {
            dir: cache.to_path_buf(),
            what: format!(
                "Hugging Face repo {repo_id} (no {} in the cache: fetch it with \
                 `huggingface-cli download {repo_id}`, or point HF_HUB_CACHE / HF_HOME at the \
                 cache that has it)",
                repo.folder_name()
            ),
        });
    }
    let by_ref = Cache::new(cache.to_path_buf())
        .repo(repo)
        .get("config.json")
        .and_then(|config| config.parent().map(Path::to_path_buf));
    let by_commit = folder.join("snapshots").join(revision);
    match by_ref {
        Some(dir) => Ok(dir),
        None if by_commit.join("config.json").is_file() => Ok(by_commit),
        None => Err(Error::MissingFile {
            dir: folder.clone(),
            what: format!(
                "revision `{revision}` of {repo_id} with a config.json (branches here: {}; \
                 snapshots: {})",
                listing(&folder.join("refs")),
                listing(&folder.join("snapshots"))
            ),
        }),
    }
}

/// The entries of `dir`, sorted and comma-separated, or `none`.
fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Every model repo in `cache` with a snapshot holding a `config.json`: repo id and the snapshot
/// directory of `main` (or, without that branch, the first snapshot).
pub fn repos(cache: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(cache).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("models--")
            .map(|r| r.replacen("--", "/", 1))
        else {
            continue;
        };
        let dir = snapshot(cache, &id, None).ok().or_else(|| {
            let mut snaps: Vec<PathBuf> = std::fs::read_dir(entry.path().join("snapshots"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("config.json").is_file())
                .collect();
            snaps.sort();
            snaps.into_iter().next()
        });
        if let Some(dir) = dir {
            found.push((id, dir));
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_snapshot_paths() {
        for ok in ["llava-hf/llava-1.5-7b-hf", "org/name", "a_b/c.d"] {
            assert!(is_repo_id(ok), "{ok}");
        }
        for bad in [
            "name", "a/b/c", "/abs", "org/", "../x", "org/..", "a b/c", "",
        ] {
            assert!(!is_repo_id(bad), "{bad}");
        }
        let snap = Path::new("/c/hub/models--llava-hf--llava-1.5-7b-hf/snapshots/abc123");
        assert_eq!(
            repo_of_snapshot(snap).as_deref(),
            Some("llava-hf/llava-1.5-7b-hf")
        );
        assert_eq!(repo_of_snapshot(Path::new("/models/glance-tiny")), None);
        for bad in ["../main", "/etc", "a/../../b", ""] {
            assert!(check_revision(bad).is_err(), "{bad}");
        }
        assert!(check_revision("refs/pr/1").is_ok());
    }
}
