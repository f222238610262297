//! Embeds the shipped models (`models/glance-tiny` with its draft heads, `models/glance-tiny-dvlm`)
//! in the crate: writes `$OUT_DIR/shipped.rs`, a table of every file with `include_bytes!`, and a
//! stamp that changes whenever a file does (the glance home re-installs a model whose stamp
//! differs).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The shipped models, by directory name under `models/` at the repository root.
const SHIPPED: [&str; 2] = ["glance-tiny", "glance-tiny-dvlm"];

fn files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            files(root, &p, out);
        } else if p.is_file() {
            println!("cargo:rerun-if-changed={}", p.display());
            out.push(p.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let models = manifest.join("../../models");
    let mut code =
        String::from("/// The shipped models: name, then (relative path, bytes) per file.\n");
    code.push_str("pub(crate) static MODELS: &[(&str, &[ShippedFile])] = &[\n");
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for name in SHIPPED {
        let root = models.join(name);
        assert!(
            root.join("config.json").is_file(),
            "{}: the shipped model {name} is missing (glance embeds it; build from a full \
             checkout of the repository)",
            root.display()
        );
        let mut list = Vec::new();
        files(&root, &root, &mut list);
        code.push_str(&format!("    ({name:?}, &[\n"));
        for rel in list {
            let abs = root.join(&rel).canonicalize().expect("file exists");
            let bytes = std::fs::read(&abs).expect("readable");
            let rel = rel.to_string_lossy().replace('\\', "/");
            (name, &rel, &bytes).hash(&mut hasher);
            code.push_str(&format!(
                "        ({rel:?}, include_bytes!({:?})),\n",
                abs.to_string_lossy()
            ));
        }
        code.push_str("    ]),\n");
    }
    code.push_str("];\n");
    code.push_str(&format!(
        "/// Changes whenever a shipped file does.\npub(crate) const STAMP: &str = \"{:016x}\";\n",
        hasher.finish()
    ));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("shipped.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
