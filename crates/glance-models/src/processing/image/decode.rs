//! Decoding PNG / JPEG / WebP bytes into a [`DynamicImage`] with the checks a server needs: known
//! format, pixel limit checked from the header before decoding, zero-sized images, corrupt and
//! truncated data (the JPEG decoder fills a truncated scan with grey instead of failing, so JPEGs
//! must end with an end-of-image marker, as Pillow requires by default: "image file is truncated").

use std::io::Cursor;
use std::path::Path;

use image::{DynamicImage, ImageReader};

use glance_core::io::{read_capped_with, MAX_IMAGE_FILE_BYTES};
use glance_core::{Error, Result};

/// Largest decoded image accepted by [`load_image`] / [`decode_image`] (64 Mi pixels = 8192²).
pub const DEFAULT_MAX_PIXELS: u64 = 64 * 1024 * 1024;

/// Reads and decodes an image file (PNG, JPEG or WebP) with the default pixel limit. The file's first
/// bytes must carry a PNG, JPEG or WebP signature (checked before anything else is read, so
/// `/dev/zero` or a text file fails at once) and the file may hold at most
/// [`MAX_IMAGE_FILE_BYTES`] ([`Error::TooLarge`] otherwise).
pub fn load_image(path: &Path) -> Result<DynamicImage> {
    let bytes = read_image_bytes(path)?;
    decode_image(&bytes).map_err(|e| named(path, e))
}

/// Reads an image file's bytes without decoding them, with [`load_image`]'s checks: a PNG, JPEG
/// or WebP signature first, then at most [`MAX_IMAGE_FILE_BYTES`].
pub fn read_image_bytes(path: &Path) -> Result<Vec<u8>> {
    read_capped_with(path, MAX_IMAGE_FILE_BYTES, "an image", check_signature)
        .map_err(|e| named(path, e))
}

/// An image error with the file's name in front.
fn named(path: &Path, e: Error) -> Error {
    match e {
        Error::Image(msg) => Error::Image(format!("{}: {msg}", path.display())),
        other => other,
    }
}

/// The formats glance decodes, for messages.
pub const IMAGE_FORMATS: &str = "PNG, JPEG or WebP";

/// Whether glance decodes `f` (the `image` crate's decoders built in: PNG, JPEG, WebP).
fn supported(f: image::ImageFormat) -> bool {
    matches!(
        f,
        image::ImageFormat::Png | image::ImageFormat::Jpeg | image::ImageFormat::WebP
    )
}

/// Accepts the leading bytes of a PNG, JPEG or WebP file (signature only).
fn check_signature(head: &[u8]) -> Result<()> {
    if head.is_empty() {
        return Err(Error::Image("no image data (0 bytes)".into()));
    }
    match image::guess_format(head) {
        Ok(f) if supported(f) => Ok(()),
        Ok(f) => Err(Error::Image(format!(
            "unsupported image format {f:?} (expected {IMAGE_FORMATS})"
        ))),
        Err(_) => Err(Error::Image(format!(
            "not a {IMAGE_FORMATS} image (starts {:02x?})",
            &head[..head.len().min(8)]
        ))),
    }
}

/// Decodes PNG, JPEG or WebP bytes with the default pixel limit ([`DEFAULT_MAX_PIXELS`]).
pub fn decode_image(bytes: &[u8]) -> Result<DynamicImage> {
    decode_image_with_limit(bytes, DEFAULT_MAX_PIXELS)
}

/// Decodes PNG, JPEG or WebP bytes; rejects empty input, unknown formats, corrupt or truncated data,
/// zero-sized images and images of more than `max_pixels` pixels (checked from the header,
/// before the pixels are decoded) with [`Error::Image`].
pub fn decode_image_with_limit(bytes: &[u8], max_pixels: u64) -> Result<DynamicImage> {
    if bytes.is_empty() {
        return Err(Error::Image("no image data (0 bytes)".into()));
    }
    let reader = || -> Result<ImageReader<Cursor<&[u8]>>> {
        let r = ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| Error::Image(format!("cannot read image data: {e}")))?;
        match r.format() {
            Some(f) if supported(f) => Ok(r),
            Some(f) => Err(Error::Image(format!(
                "unsupported image format {f:?} (expected {IMAGE_FORMATS})"
            ))),
            None => Err(Error::Image(format!(
                "not a {IMAGE_FORMATS} image ({} bytes starting {:02x?})",
                bytes.len(),
                &bytes[..bytes.len().min(8)]
            ))),
        }
    };
    let (w, h) = reader()?
        .into_dimensions()
        .map_err(|e| Error::Image(format!("invalid image header: {e}")))?;
    check_dims(w as u64, h as u64, max_pixels)?;
    if is_jpeg(bytes) && !jpeg_is_complete(bytes) {
        return Err(Error::Image(
            "truncated JPEG: the data ends before the end-of-image marker".into(),
        ));
    }
    let mut r = reader()?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(w);
    limits.max_image_height = Some(h);
    limits.max_alloc = Some((max_pixels.saturating_mul(8)).max(512 << 20));
    r.limits(limits);
    let img = r
        .decode()
        .map_err(|e| Error::Image(format!("cannot decode image: {e}")))?;
    check_dims(img.width() as u64, img.height() as u64, max_pixels)?;
    Ok(img)
}

fn check_dims(w: u64, h: u64, max_pixels: u64) -> Result<()> {
    if w == 0 || h == 0 {
        return Err(Error::Image(format!("image is {w}x{h}: it has no pixels")));
    }
    if w * h > max_pixels {
        return Err(Error::Image(format!(
            "image is {w}x{h} = {} pixels, over the limit of {max_pixels}",
            w * h
        )));
    }
    Ok(())
}

fn is_jpeg(bytes: &[u8]) -> bool {
    image::guess_format(bytes).ok() == Some(image::ImageFormat::Jpeg)
}

/// Whether JPEG data reaches its end-of-image marker: walks the marker segments and the
/// entropy-coded scans (byte stuffing `FF 00`, restart markers `FF D0..D7`, fill bytes `FF FF`).
pub(crate) fn jpeg_is_complete(b: &[u8]) -> bool {
    if !b.starts_with(&[0xFF, 0xD8]) {
        return false;
    }
    let mut i = 2;
    loop {
        // Find the next marker (tolerating garbage between segments, as libjpeg does).
        while i < b.len() && b[i] != 0xFF {
            i += 1;
        }
        while i < b.len() && b[i] == 0xFF {
            i += 1;
        }
        let Some(&marker) = b.get(i) else {
            return false;
        };
        i += 1;
        match marker {
            0xD9 => return true,
            0x01 | 0xD0..=0xD8 => {}
            _ => {
                let Some(len) = b
                    .get(i..i + 2)
                    .map(|l| u16::from_be_bytes([l[0], l[1]]) as usize)
                else {
                    return false;
                };
                if len < 2 {
                    return false;
                }
                i += len;
                if i > b.len() {
                    return false;
                }
                if marker == 0xDA {
                    // Entropy-coded data runs to the next marker other than FF00 / RSTn.
                    loop {
                        while i < b.len() && b[i] != 0xFF {
                            i += 1;
                        }
                        match b.get(i + 1) {
                            None => return false,
                            Some(0x00) | Some(0xD0..=0xD7) => i += 2,
                            Some(0xFF) => i += 1,
                            Some(_) => break,
                        }
                    }
                }
            }
        }
    }
}

/// A PNG claiming `w x h` RGB 8-bit: signature, IHDR, a tiny IDAT (one empty stored zlib
/// block: far too little data) and IEND, all with valid CRCs — what a client that lies about an
/// image's size sends. The tests of the pixel limit (here and against the binary) use it.
pub fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let body: Vec<u8> = kind.iter().chain(data).copied().collect();
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(
        &mut out,
        b"IDAT",
        &[
            0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
        ],
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
