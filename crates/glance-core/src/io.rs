//! Reading user-supplied files through a size cap.
//!
//! A model directory and an image path are user input: `--image /dev/zero`, a multi-gigabyte file
//! named `config.json`, or a FIFO must fail with a clear error instead of reading without bound.
//! Every small file glance reads (configs, tokenizers, chat templates, images) goes through
//! [`read_capped`] / [`read_capped_with`]: the first bytes are checked first (so a file of the
//! wrong kind is named before anything large is read), then the size reported by the file system,
//! then the read itself stops at the cap (non-regular files such as `/dev/zero` report a size of
//! 0, so the cap is enforced on the bytes actually read).

use crate::{Error, Result};
use std::io::Read;
use std::path::Path;

/// Largest JSON or template file of a model directory glance reads (`config.json`,
/// `tokenizer_config.json`, `generation_config.json`, `preprocessor_config.json`, chat templates,
/// `model.safetensors.index.json`): real ones are kilobytes to a few megabytes.
pub const MAX_JSON_FILE_BYTES: u64 = 16 << 20;

/// Largest `tokenizer.json` glance reads (the largest published ones are ~35 MB).
pub const MAX_TOKENIZER_FILE_BYTES: u64 = 64 << 20;

/// Largest image file glance reads (a PNG or JPEG at the decoder's pixel limit fits easily).
pub const MAX_IMAGE_FILE_BYTES: u64 = 128 << 20;

/// How many leading bytes [`read_capped_with`] hands to its check before reading the rest.
pub const HEAD_BYTES: usize = 16;

/// Reads `path` whole, failing with [`Error::TooLarge`] (naming the file, `what` it should be and
/// the limit) when it holds more than `limit` bytes.
pub fn read_capped(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    read_capped_with(path, limit, what, |_| Ok(()))
}

/// [`read_capped`] as UTF-8 text (invalid UTF-8 is an [`Error::Io`] naming the file).
pub fn read_to_string_capped(path: &Path, limit: u64, what: &str) -> Result<String> {
    let bytes = read_capped(path, limit, what)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not UTF-8 text ({e})"),
            ),
        )
    })
}

/// [`read_capped`] that first hands the leading [`HEAD_BYTES`] bytes (fewer if the file is
/// shorter) to `check_head`, and fails with its error before reading further: a signature check
/// rejects `/dev/zero` or a text file named `.png` after 16 bytes.
pub fn read_capped_with(
    path: &Path,
    limit: u64,
    what: &str,
    check_head: impl FnOnce(&[u8]) -> Result<()>,
) -> Result<Vec<u8>> {
    let too_large = || Error::TooLarge {
        path: path.to_path_buf(),
        what: what.to_string(),
        limit,
    };
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return Err(Error::io(
            path,
            std::io::Error::other(format!("is a directory, not {what}")),
        ));
    }
    let mut reader = file.take(limit.saturating_add(1));
    let mut bytes = Vec::new();
    (&mut reader)
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    check_head(&bytes)?;
    if meta.is_file() && meta.len() > limit {
        return Err(too_large());
    }
    if meta.is_file() {
        // Regular files: one allocation of the right size (the length may still change under us;
        // the `take` above bounds the read either way).
        bytes.reserve(meta.len().saturating_sub(bytes.len() as u64) as usize);
    }
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("glance-core-io-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_small_files_and_refuses_large_ones() {
        let d = scratch("sizes");
        let p = d.join("config.json");
        std::fs::write(&p, b"{\"a\": 1}").unwrap();
        assert_eq!(read_capped(&p, 8, "a JSON file").unwrap(), b"{\"a\": 1}");
        assert_eq!(read_to_string_capped(&p, 100, "x").unwrap(), "{\"a\": 1}");
        let e = read_capped(&p, 7, "a JSON file").unwrap_err();
        assert!(matches!(e, Error::TooLarge { limit: 7, .. }), "{e}");
        assert!(e.to_string().contains("config.json"), "{e}");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_to_string_capped(&p, 100, "x"),
            Err(Error::Io { .. })
        ));
        assert!(matches!(read_capped(&d, 100, "x"), Err(Error::Io { .. })));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn endless_devices_stop_at_the_cap_or_the_head_check() {
        let zero = Path::new("/dev/zero");
        if !zero.exists() {
            return;
        }
        let e = read_capped(zero, 1 << 20, "a JSON file").unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
        let e = read_capped_with(zero, 1 << 40, "an image", |head| {
            assert_eq!(head.len(), HEAD_BYTES);
            Err(Error::Image("not an image".into()))
        })
        .unwrap_err();
        assert!(matches!(e, Error::Image(_)), "{e}");
    }
}
