//! OpenAI chat messages (JSON) → a conversation the engine answers: `glance run --messages FILE`
//! and the server's `/v1/chat/completions` both parse with [`parse_messages`].
//!
//! Accepted shapes: a list of messages, or an object with a `messages` list (a request body).
//! A message is `{"role": "system" | "user" | "assistant", "content": …}` where `content` is a
//! string or a list of parts:
//!
//! * `{"type": "text", "text": "…"}`;
//! * `{"type": "image_url", "image_url": {"url": URL}}` (or `"image_url": URL`), and the Hugging
//!   Face processor form `{"type": "image", "url" | "path" | "image": URL}`.
//!
//! An image URL is a `data:image/png;base64,…` (or `image/jpeg`, `image/webp`) URL, a `file://` URL or a plain
//! path — files only where the [`ImageSources`] policy allows them. `http(s)://` is refused:
//! glance runs offline.
//!
//! The number of images is checked before any image is read or decoded
//! ([`check_image_count`]): `--image`, `--messages` and the server's request bodies all count
//! their image parts first.

use crate::request::{ImageInput, Message, Part, Role};
use base64::Engine as _;
use glance_core::io::{read_capped, MAX_IMAGE_FILE_BYTES};
use glance_core::{Error, Result};
use glance_models::processing::image::read_image_bytes;
use serde_json::Value;
use std::path::{Component, Path, PathBuf};

/// The largest messages file accepted, in bytes.
pub const MAX_MESSAGES_FILE_BYTES: u64 = 64 << 20;

/// Where image parts may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSources {
    /// `data:` URLs only.
    DataOnly,
    /// `data:` URLs and any local file (the CLI: the user names their own files).
    AnyFile,
    /// `data:` URLs and files under this directory only (a server's `--allow-local-files`).
    FilesUnder(PathBuf),
}

/// Refuses `count` images in one request when it is more than `max` (the engine's
/// [`crate::EngineOptions::max_images`]). Every surface calls it with the count of image parts
/// before reading any of them: a conversation naming one large file 500 times is refused
/// without reading it once.
pub fn check_image_count(count: usize, max: usize) -> Result<()> {
    if count > max {
        return Err(Error::Input(format!(
            "{count} images in one request; at most {max} are accepted"
        )));
    }
    Ok(())
}

/// Reads image files in order, after checking their count against `max_images` (see
/// [`check_image_count`]).
pub fn read_image_files(paths: &[PathBuf], max_images: usize) -> Result<Vec<ImageInput>> {
    check_image_count(paths.len(), max_images)?;
    paths.iter().map(|p| read_image_file(p)).collect()
}

/// Parses OpenAI chat messages holding at most `max_images` image parts (counted before any is
/// read or decoded).
pub fn parse_messages(
    json: &Value,
    sources: &ImageSources,
    max_images: usize,
) -> Result<Vec<Message>> {
    let list = match json {
        Value::Array(list) => list,
        Value::Object(o) => match o.get("messages") {
            Some(Value::Array(list)) => list,
            _ => {
                return Err(Error::Input(
                    "expected a list of messages or an object with a `messages` list".into(),
                ))
            }
        },
        _ => return Err(Error::Input("expected a list of chat messages".into())),
    };
    if list.is_empty() {
        return Err(Error::Input("the conversation has no message".into()));
    }
    check_image_count(list.iter().map(image_parts).sum(), max_images)?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            parse_message(m, sources).map_err(|e| match e {
                Error::Input(msg) => Error::Input(format!("message {i}: {msg}")),
                other => other,
            })
        })
        .collect()
}

/// Image parts of one message, counted from their `type` alone (nothing read or decoded).
fn image_parts(message: &Value) -> usize {
    match message.get("content") {
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| {
                matches!(
                    p.get("type").and_then(Value::as_str),
                    Some("image_url" | "image")
                )
            })
            .count(),
        _ => 0,
    }
}

/// Reads and parses a messages file (size-capped) holding at most `max_images` images. Relative
/// image paths are taken from the current directory, as `--image` paths are.
pub fn read_messages_file(
    path: &Path,
    sources: &ImageSources,
    max_images: usize,
) -> Result<Vec<Message>> {
    let bytes = read_capped(path, MAX_MESSAGES_FILE_BYTES, "a messages file")?;
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Input(format!("{}: not valid JSON: {e}", path.display())))?;
    parse_messages(&json, sources, max_images).map_err(|e| match e {
        Error::Input(msg) => Error::Input(format!("{}: {msg}", path.display())),
        other => other,
    })
}

/// Reads an image file (PNG, JPEG or WebP signature checked first, size-capped: a device such as
/// /dev/zero or a huge file fails fast instead of filling memory).
pub fn read_image_file(path: &Path) -> Result<ImageInput> {
    Ok(ImageInput::bytes(read_image_bytes(path)?))
}

fn parse_message(m: &Value, sources: &ImageSources) -> Result<Message> {
    let obj = m
        .as_object()
        .ok_or_else(|| Error::Input("a message must be an object".into()))?;
    let role: Role = match obj.get("role") {
        Some(Value::String(r)) => r.parse()?,
        _ => return Err(Error::Input("`role` must be a string".into())),
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => vec![Part::Text(s.clone())],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| {
                parse_part(p, sources).map_err(|e| match e {
                    Error::Input(msg) => Error::Input(format!("part {j}: {msg}")),
                    other => other,
                })
            })
            .collect::<Result<Vec<_>>>()?,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => {
            return Err(Error::Input(
                "`content` must be a string or a list of parts".into(),
            ))
        }
    };
    Ok(Message {
        role,
        content,
        extra: tool_fields(obj)?,
    })
}

/// The tool fields of a message: `tool_calls` (each `function.arguments`, OpenAI's JSON text,
/// parsed into the object chat templates read), `tool_call_id` and `name`.
fn tool_fields(obj: &serde_json::Map<String, Value>) -> Result<Vec<(String, Value)>> {
    let mut extra = Vec::new();
    if let Some(calls) = obj.get("tool_calls").filter(|c| !c.is_null()) {
        let mut calls = calls.clone();
        let list = calls
            .as_array_mut()
            .ok_or_else(|| Error::Input("`tool_calls` must be a list".into()))?;
        for call in list {
            let Some(args) = call.pointer_mut("/function/arguments") else {
                return Err(Error::Input(
                    "a tool call needs `function` with `name` and `arguments`".into(),
                ));
            };
            if let Value::String(text) = args {
                let parsed = serde_json::from_str(text).map_err(|e| {
                    Error::Input(format!("a tool call's arguments are not JSON: {e}"))
                })?;
                *args = parsed;
            }
        }
        extra.push(("tool_calls".to_string(), calls));
    }
    for key in ["tool_call_id", "name"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            extra.push((key.to_string(), v.clone()));
        }
    }
    Ok(extra)
}

fn parse_part(p: &Value, sources: &ImageSources) -> Result<Part> {
    let obj = p
        .as_object()
        .ok_or_else(|| Error::Input("a content part must be an object".into()))?;
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let url = match kind {
        "text" => {
            return match obj.get("text") {
                Some(Value::String(t)) => Ok(Part::Text(t.clone())),
                _ => Err(Error::Input("a text part needs a `text` string".into())),
            }
        }
        "image_url" => match obj.get("image_url") {
            Some(Value::String(u)) => u.as_str(),
            Some(Value::Object(o)) => o
                .get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::Input("`image_url` needs a `url` string".into()))?,
            _ => return Err(Error::Input("an image_url part needs `image_url`".into())),
        },
        "image" => ["url", "path", "image"]
            .iter()
            .find_map(|k| obj.get(*k).and_then(Value::as_str))
            .ok_or_else(|| Error::Input("an image part needs a `url` or `path`".into()))?,
        other => {
            return Err(Error::Input(format!(
                "unknown content part type `{other}` (text, image_url or image)"
            )))
        }
    };
    Ok(Part::Image(resolve_image(url, sources)?))
}

/// An image URL → its bytes, under the sources policy.
pub fn resolve_image(url: &str, sources: &ImageSources) -> Result<ImageInput> {
    if let Some(rest) = url.strip_prefix("data:") {
        return decode_data_url(rest);
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(Error::Input(
            "http(s) image URLs are not fetched: glance runs offline; send the image as a \
             data: URL"
                .into(),
        ));
    }
    let path = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
    match sources {
        ImageSources::DataOnly => Err(Error::Input(
            "local image files are not allowed here; send the image as a data: URL".into(),
        )),
        ImageSources::AnyFile => read_image_file(&path),
        ImageSources::FilesUnder(dir) => {
            if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
                return Err(Error::Input(format!(
                    "image file {}: only absolute paths under {} are allowed",
                    path.display(),
                    dir.display()
                )));
            }
            let real = path.canonicalize().map_err(|e| Error::io(&path, e))?;
            let root = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
            if !real.starts_with(&root) {
                return Err(Error::Input(format!(
                    "image file {} is outside the allowed directory {}",
                    path.display(),
                    dir.display()
                )));
            }
            read_image_file(&real)
        }
    }
}

/// The media types a `data:` URL may declare (the formats glance decodes).
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/jpg", "image/webp"];

/// `image/png;base64,AAAA…` → the decoded bytes.
fn decode_data_url(rest: &str) -> Result<ImageInput> {
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| Error::Input("a data: URL needs a `,` before its data".into()))?;
    let media = meta.split(';').next().unwrap_or_default();
    if !IMAGE_MEDIA_TYPES
        .iter()
        .any(|t| media.eq_ignore_ascii_case(t))
    {
        let shown: String = media.chars().take(64).collect();
        return Err(Error::Input(format!(
            "a data: URL must declare an image type ({}), got `{shown}`",
            IMAGE_MEDIA_TYPES.join(", ")
        )));
    }
    if !meta.ends_with(";base64") {
        return Err(Error::Input(
            "image data: URLs must be base64-encoded (data:image/png;base64,…)".into(),
        ));
    }
    // Base64 holds 3 bytes per 4 characters: refuse oversized data before decoding it.
    if data.len() as u64 / 4 * 3 > MAX_IMAGE_FILE_BYTES {
        return Err(Error::Input(format!(
            "the image data is larger than the {} MiB limit",
            MAX_IMAGE_FILE_BYTES >> 20
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| Error::Input(format!("invalid base64 in the image data: URL: {e}")))?;
    Ok(ImageInput::bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn images(m: &Message) -> Vec<Vec<u8>> {
        m.images()
            .map(|i| match i {
                ImageInput::Bytes(b) => b.to_vec(),
                ImageInput::Decoded(_) => panic!("decoded"),
            })
            .collect()
    }

    #[test]
    fn parses_openai_messages_with_data_urls_and_files() {
        let dir = std::env::temp_dir().join(format!("glance-msg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.png");
        let png = b"\x89PNG\r\n\x1a\n-not-decoded-here".to_vec();
        std::fs::write(&file, &png).unwrap();
        let body = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AQID"}},
                {"type": "image_url", "image_url": file.to_str().unwrap()},
                {"type": "text", "text": "Compare."}]},
            {"role": "assistant", "content": "Same."},
            {"role": "user", "content": [{"type": "image", "path": format!("file://{}", file.display())},
                                         {"type": "text", "text": "And this?"}]}
        ]});
        let m = parse_messages(&body, &ImageSources::AnyFile, 16).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].role, Role::System);
        assert_eq!(images(&m[1]), vec![vec![1, 2, 3], png.clone()]);
        assert!(matches!(&m[1].content[2], Part::Text(t) if t == "Compare."));
        assert_eq!(images(&m[3]), vec![png.clone()]);
        // Files only under an allowed directory.
        let under = ImageSources::FilesUnder(dir.clone());
        assert!(parse_messages(&body, &under, 16).is_ok());
        let elsewhere = ImageSources::FilesUnder(dir.join("sub"));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let e = parse_messages(&body, &elsewhere, 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the allowed directory"), "{e}");
        let e = parse_messages(&body, &ImageSources::DataOnly, 16)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("message 1: part 1") && e.contains("data: URL"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_messages_get_clear_errors() {
        let cases = [
            (json!([]), "no message"),
            (json!("hello"), "list of chat messages"),
            (
                json!([{"role": "robot", "content": "x"}]),
                "unknown message role",
            ),
            (json!([{"role": "user", "content": 5}]), "`content` must be"),
            (
                json!([{"role": "user", "content": [{"type": "audio"}]}]),
                "unknown content part",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]),
                "invalid base64",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png,abc"}]}]),
                "base64-encoded",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": "https://x/a.png"}]}]),
                "offline",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": "data:text/plain;base64,AQID"}]}]),
                "must declare an image type",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": "/no/such/file.png"}]}]),
                "/no/such/file.png",
            ),
        ];
        for (json, want) in cases {
            let e = parse_messages(&json, &ImageSources::AnyFile, 16)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{json}: {e}");
        }
    }

    #[test]
    fn image_counts_are_checked_before_any_image_is_read() {
        // 500 parts naming a file that does not exist: refused by count, never opened.
        let part = json!({"type": "image_url", "image_url": "/no/such/file.png"});
        let body = json!([{"role": "user", "content": vec![part; 500]}]);
        let e = parse_messages(&body, &ImageSources::AnyFile, 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("500 images") && e.contains("at most 16"), "{e}");
        let paths = vec![PathBuf::from("/no/such/file.png"); 300];
        let e = read_image_files(&paths, 16).unwrap_err().to_string();
        assert!(e.contains("300 images") && e.contains("at most 16"), "{e}");
        assert!(check_image_count(16, 16).is_ok());
    }

    #[test]
    fn data_urls_declare_an_image_type() {
        for ok in ["data:image/png;base64,AQID", "data:IMAGE/JPEG;base64,AQID"] {
            assert!(resolve_image(ok, &ImageSources::DataOnly).is_ok(), "{ok}");
        }
        for bad in [
            "data:text/plain;base64,AQID",
            "data:;base64,AQID",
            "data:image/svg+xml;base64,AQID",
            "data:application/octet-stream;base64,AQID",
        ] {
            let e = resolve_image(bad, &ImageSources::DataOnly)
                .unwrap_err()
                .to_string();
            assert!(e.contains("image/png"), "{bad}: {e}");
        }
    }

    #[test]
    fn reads_are_capped() {
        let e = read_image_file(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a PNG, JPEG or WebP"), "{e}");
    }
}
