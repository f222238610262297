//! Pixel parity with transformers' `CLIPImageProcessor` (PIL backend) on the golden fixtures
//! (`fixtures/manifest.json`, `"pixels"`: made by `scripts/make_fixtures.py` with transformers 5.24
//! and Pillow 13.0.0).
//!
//! * PNG inputs must match to 1e-4 (in practice they are bit-identical: the uint8 resize is
//!   Pillow's to the bit, the float steps are NumPy's operations in the same order).
//! * JPEG inputs are decoded by the `image` crate (zune-jpeg), Pillow uses libjpeg-turbo: the
//!   decoded pixels differ by up to 3 levels (on `chelsea.jpg`, 17.5% of the samples differ, mean
//!   0.24 level), and the bicubic resize can amplify a difference slightly (its weights sum to 1 but
//!   include negative lobes). Measured on the fixtures (42, 56, 70 px): max 0.0292 / 0.0292 /
//!   0.0427 (≤ 2.84 levels, a level being 1 / 255 / std with the smallest CLIP std 0.2613), mean
//!   0.0036–0.0039 (≈ 0.26 level); at 224 and 336 px the same image gave max 0.058 (3.9 levels).
//!   We bound the max at 5 levels (≈ 0.075) and the mean at 0.5 level (≈ 0.0075) so a real
//!   regression (a wrong filter, an off-by-one crop, a missed alpha composite) still fails.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use glance_models::processing::image::{load_image, ImageProcessor};

/// One uint8 level after rescale + normalisation by the smallest CLIP std.
const LEVEL: f32 = 1.0 / 255.0 / 0.261_302_6;
const PNG_MAX_ABS: f32 = 1e-4;
const JPEG_MAX_ABS: f32 = 5.0 * LEVEL;
const JPEG_MEAN_ABS: f32 = 0.5 * LEVEL;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

#[test]
fn pixels_match_transformers() {
    let root = fixtures();
    let manifest_path = root.join("manifest.json");
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&manifest_path)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest_path.display())),
    )
    .expect("manifest.json is JSON");
    let entries = manifest["pixels"]
        .as_array()
        .expect("manifest has a `pixels` list");
    assert!(!entries.is_empty());

    let mut failures = Vec::new();
    for entry in entries {
        let field = |k: &str| {
            root.join(
                entry[k]
                    .as_str()
                    .unwrap_or_else(|| panic!("{entry}: no `{k}`")),
            )
        };
        let (pre, image, tensor) = (field("preprocessor"), field("image"), field("tensor"));

        let processor = ImageProcessor::from_file(&pre).unwrap();
        let img = load_image(&image).unwrap();
        let ours = processor.preprocess_tensor(&img, &Device::Cpu).unwrap();
        let expected = candle_core::safetensors::load(&tensor, &Device::Cpu).unwrap();
        let expected: &Tensor = expected
            .get("pixel_values")
            .expect("pixel_values in the fixture");
        assert_eq!(ours.dims(), expected.dims(), "{}", tensor.display());

        let diff = (&ours - expected)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap();
        let max = diff.max(0).unwrap().to_scalar::<f32>().unwrap();
        let mean = diff.mean(0).unwrap().to_scalar::<f32>().unwrap();
        let is_jpeg = matches!(
            image
                .extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("jpg" | "jpeg")
        );
        println!(
            "{:<45} {:?} max {max:.3e} ({:.2} levels) mean {mean:.3e}",
            tensor.file_name().unwrap().to_string_lossy(),
            ours.dims(),
            max / LEVEL
        );
        let ok = if is_jpeg {
            max <= JPEG_MAX_ABS && mean <= JPEG_MEAN_ABS
        } else {
            max <= PNG_MAX_ABS
        };
        if !ok {
            failures.push(format!("{}: max {max:e}, mean {mean:e}", tensor.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "pixel parity failures:\n{}",
        failures.join("\n")
    );
}
