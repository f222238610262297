//! Unit tests of decoding and of `preprocessor_config.json` parsing / validation.

use image::{DynamicImage, ImageBuffer, Rgb};
use serde_json::json;

use super::config::{CropSize, PreprocessorConfig, ResizeTo};
use super::tests::{is_config_err, is_image_err, jpeg_bytes, png_bytes};
use super::*;

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

#[test]
fn decodes_png_and_jpeg() {
    let img = DynamicImage::ImageRgb8(ImageBuffer::from_fn(16, 8, |x, y| {
        Rgb([x as u8 * 10, y as u8 * 20, 7])
    }));
    let back = decode_image(&png_bytes(&img)).unwrap();
    assert_eq!(back, img);
    let j = decode_image(&jpeg_bytes(&img)).unwrap();
    assert_eq!((j.width(), j.height()), (16, 8));
}

/// Lossless WebP (the encoder the `image` crate ships) decodes to the same pixels, under the same
/// pixel limit as the other formats.
#[test]
fn decodes_webp_under_the_pixel_limit() {
    let img = DynamicImage::ImageRgb8(ImageBuffer::from_fn(16, 8, |x, y| {
        Rgb([x as u8 * 10, y as u8 * 20, 7])
    }));
    let mut webp = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut webp)
        .encode(img.as_bytes(), 16, 8, image::ExtendedColorType::Rgb8)
        .unwrap();
    assert_eq!(decode_image(&webp).unwrap().to_rgb8(), img.to_rgb8());
    let msg = is_image_err(decode_image_with_limit(&webp, 100));
    assert!(msg.contains("128"), "{msg}");
    // Truncated WebP data is an error, not a partial image.
    is_image_err(decode_image(&webp[..webp.len() / 2]));
}

#[test]
fn bad_bytes_are_clear_errors() {
    assert!(is_image_err(decode_image(b"")).contains("0 bytes"));
    let msg = is_image_err(decode_image(b"hello, this is not an image at all"));
    assert!(msg.contains("not a PNG, JPEG or WebP"), "{msg}");
    // A GIF header: a known format, but not one we decode.
    is_image_err(decode_image(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"));

    let img = DynamicImage::ImageRgb8(ImageBuffer::from_fn(64, 64, |x, y| {
        Rgb([(x * y) as u8, x as u8, y as u8])
    }));
    let png = png_bytes(&img);
    // Truncated PNG (header intact, pixel data cut).
    for cut in [png.len() / 2, png.len() - 20, 40] {
        is_image_err(decode_image(&png[..cut]));
    }
    // Corrupt PNG: garbage in the compressed data.
    let mut bad = png.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 32] {
        *b ^= 0x5a;
    }
    is_image_err(decode_image(&bad));
    // Only the signature.
    is_image_err(decode_image(&png[..8]));
    // Truncated JPEG: cut in the headers or in the scan (the decoder itself would fill the
    // missing part with grey; Pillow raises "image file is truncated").
    let jpg = jpeg_bytes(&img);
    for cut in [20, jpg.len() / 3, jpg.len() / 2, jpg.len() - 2] {
        let msg = is_image_err(decode_image(&jpg[..cut]));
        assert!(
            msg.contains("truncated") || msg.contains("header"),
            "cut {cut}: {msg}"
        );
    }
    // Bytes after the end-of-image marker are ignored, as libjpeg does.
    let mut padded = jpg.clone();
    padded.extend_from_slice(b"trailing junk");
    assert!(decode_image(&padded).is_ok());
}

#[test]
fn zero_sized_and_oversized_images_are_rejected() {
    for (w, h) in [(0, 10), (10, 0)] {
        let msg = is_image_err(decode_image(&png_header_only(w, h)));
        assert!(msg.contains("dimensions"), "{w}x{h}: {msg}");
    }
    // The header-only PNG itself is well-formed up to its (missing) pixel data.
    assert!(decode_image(&png_header_only(2, 2)).is_err());
    // 20000 x 20000 = 400 M pixels: rejected from the header, before any allocation.
    let msg = is_image_err(decode_image(&png_header_only(20000, 20000)));
    assert!(msg.contains("over the limit"), "{msg}");
    // A real small image under a smaller limit.
    let img = DynamicImage::new_rgb8(100, 100);
    let msg = is_image_err(decode_image_with_limit(&png_bytes(&img), 9999));
    assert!(msg.contains("over the limit"), "{msg}");
    assert!(decode_image_with_limit(&png_bytes(&img), 10000).is_ok());
}

#[test]
fn load_image_reports_the_path() {
    let missing = std::path::Path::new("/nonexistent/glance/cat.png");
    assert!(matches!(load_image(missing), Err(Error::Io { .. })));
    let dir = std::env::temp_dir().join(format!("glance-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("not-an-image.png");
    std::fs::write(&path, b"plain text").unwrap();
    let msg = is_image_err(load_image(&path));
    assert!(msg.contains("not-an-image.png"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn load_image_reads_through_a_size_cap() {
    let dir = std::env::temp_dir().join(format!("glance-image-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A sparse file with a PNG signature, one byte over the cap: refused from its size, unread.
    let huge = dir.join("huge.png");
    let mut head = png_header_only(10, 10);
    head.truncate(16);
    std::fs::write(&huge, &head).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&huge).unwrap();
    f.set_len(glance_core::io::MAX_IMAGE_FILE_BYTES + 1)
        .unwrap();
    drop(f);
    let e = load_image(&huge).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("huge.png") && msg.contains("MiB"), "{msg}");
    // An empty file is named as such.
    let empty = dir.join("empty.png");
    std::fs::write(&empty, b"").unwrap();
    let msg = is_image_err(load_image(&empty));
    assert!(
        msg.contains("empty.png") && msg.contains("0 bytes"),
        "{msg}"
    );
    // An endless device fails on its first bytes (no signature), not after reading it all.
    #[cfg(unix)]
    {
        let msg = is_image_err(load_image(std::path::Path::new("/dev/zero")));
        assert!(msg.contains("not a PNG, JPEG or WebP"), "{msg}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

// ---------------------------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------------------------

fn cfg(v: serde_json::Value) -> std::result::Result<PreprocessorConfig, String> {
    PreprocessorConfig::from_json(&v)
}

#[test]
fn config_parses_size_forms() {
    let c =
        cfg(json!({"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 300}}))
            .unwrap();
    assert_eq!(c.size, ResizeTo::ShortestEdge(336));
    assert_eq!(
        c.crop_size,
        CropSize {
            height: 336,
            width: 300
        }
    );
    assert_eq!(c.output_size(), (336, 300));
    let c = cfg(json!({"size": {"height": 224, "width": 256}, "do_center_crop": false})).unwrap();
    assert_eq!(
        c.size,
        ResizeTo::Exact {
            height: 224,
            width: 256
        }
    );
    assert_eq!(c.output_size(), (224, 256));
    // Legacy ints: `size` is the shortest edge, `crop_size` a square.
    let c = cfg(json!({"size": 224, "crop_size": 224})).unwrap();
    assert_eq!(c.size, ResizeTo::ShortestEdge(224));
    assert_eq!(
        c.crop_size,
        CropSize {
            height: 224,
            width: 224
        }
    );
    // Lists are (height, width).
    let c = cfg(json!({"size": [100, 200], "crop_size": [50, 60]})).unwrap();
    assert_eq!(
        c.size,
        ResizeTo::Exact {
            height: 100,
            width: 200
        }
    );
    assert_eq!(
        c.crop_size,
        CropSize {
            height: 50,
            width: 60
        }
    );
}

#[test]
fn config_defaults_nulls_and_scalars() {
    let c = cfg(json!({})).unwrap();
    let d = PreprocessorConfig::default();
    assert_eq!((c.size, c.crop_size, c.resample), (d.size, d.crop_size, 3));
    assert_eq!(c.image_mean, OPENAI_CLIP_MEAN);
    assert_eq!(c.image_std, OPENAI_CLIP_STD);
    assert_eq!(c.rescale_factor, 0.00392156862745098);
    assert!(c.do_resize && c.do_center_crop && c.do_rescale && c.do_normalize && c.do_convert_rgb);
    let c = cfg(
        json!({"do_convert_rgb": null, "resample": null, "size": null, "image_mean": 0.5,
                       "image_std": [0.5, 0.5, 0.5], "image_processor_type": "CLIPImageProcessor"}),
    )
    .unwrap();
    assert!(c.do_convert_rgb);
    assert_eq!(c.resample, 3);
    assert_eq!(c.image_mean, [0.5; 3]);
    // serde entry point (the lead may embed the config in a larger struct).
    let c: PreprocessorConfig =
        serde_json::from_value(json!({"size": {"shortest_edge": 42}})).unwrap();
    assert_eq!(c.size, ResizeTo::ShortestEdge(42));
    assert!(serde_json::from_value::<PreprocessorConfig>(json!({"size": "big"})).is_err());
}

#[test]
fn config_rejects_what_it_cannot_do() {
    assert!(cfg(json!([1, 2])).is_err());
    assert!(cfg(json!({"size": {"shortest_edge": 224, "longest_edge": 448}})).is_err());
    assert!(cfg(json!({"size": {"width": 224}})).is_err());
    assert!(cfg(json!({"size": -3})).is_err());
    assert!(cfg(json!({"crop_size": {"height": 2}})).is_err());
    assert!(cfg(json!({"do_resize": "yes"})).is_err());
    assert!(cfg(json!({"image_mean": ["a", "b", "c"]})).is_err());

    let new = |v| ImageProcessor::new(cfg(v).unwrap());
    assert!(is_config_err(new(json!({"image_std": [0.2, 0.0, 0.3]}))).contains("zero"));
    is_config_err(new(json!({"image_mean": [0.5, 0.5]})));
    is_config_err(new(json!({"image_std": [0.5, 0.5, 0.5, 0.5]})));
    is_config_err(new(json!({"resample": 0})));
    is_config_err(new(json!({"resample": 9})));
    is_config_err(new(json!({"size": 0})));
    is_config_err(new(json!({"crop_size": {"height": 0, "width": 5}})));
    is_config_err(new(json!({"size": 100000})));
    // What is switched off is not checked.
    assert!(new(json!({"do_normalize": false, "image_std": [0, 0, 0]})).is_ok());
    assert!(new(json!({"do_resize": false, "resample": 0})).is_ok());
    assert!(new(json!({"resample": 2})).is_ok());
}

#[test]
fn config_file_errors() {
    let dir = std::env::temp_dir().join(format!("glance-pp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("preprocessor_config.json");
    assert!(matches!(
        PreprocessorConfig::from_file(&path),
        Err(Error::Io { .. })
    ));
    std::fs::write(&path, "{ not json").unwrap();
    assert!(matches!(
        PreprocessorConfig::from_file(&path),
        Err(Error::Json { .. })
    ));
    std::fs::write(&path, r#"{"size": {"longest_edge": 5}}"#).unwrap();
    assert!(matches!(
        PreprocessorConfig::from_file(&path),
        Err(Error::Config(_))
    ));
    std::fs::write(&path, r#"{"size": 30, "crop_size": 30, "image_std": 0.5}"#).unwrap();
    let p = ImageProcessor::from_file(&path).unwrap();
    assert_eq!(p.config.output_size(), (30, 30));
    std::fs::remove_dir_all(&dir).ok();
}
