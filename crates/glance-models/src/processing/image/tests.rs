//! Unit tests of resampling, `convert_rgb` and the pipeline (decoding and config: `tests_io.rs`).
//! Expected pixels were produced with Pillow 13.0.0 / transformers 5.24 (`CLIPImageProcessorPil`);
//! the fixture-wide parity test is `tests/image_parity.rs`.

use std::io::Cursor;

use image::{DynamicImage, ImageBuffer, Luma, LumaA, Rgb, Rgba};

use super::config::{CropSize, PreprocessorConfig, ResizeTo};
use super::convert::composite_on_white;
use super::resample::{resize_u8, Coeffs, Filter, PRECISION_BITS};
use super::*;

const ONE: i64 = 1 << PRECISION_BITS;

pub(super) fn png_bytes(img: &DynamicImage) -> Vec<u8> {
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

pub(super) fn jpeg_bytes(img: &DynamicImage) -> Vec<u8> {
    let mut out = Vec::new();
    img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Jpeg)
        .unwrap();
    out
}

/// 4 x 12 RGB, sample `i` = `(i * 37) % 256` (row-major, interleaved).
fn pattern_4x12() -> Vec<u8> {
    (0..12 * 4 * 3).map(|i| ((i * 37) % 256) as u8).collect()
}

pub(super) fn is_image_err<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(Error::Image(msg)) => msg,
        other => panic!("expected Error::Image, got {other:?}"),
    }
}

pub(super) fn is_config_err<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(Error::Config(msg)) => msg,
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Resampling
// ---------------------------------------------------------------------------------------------

#[test]
fn coefficients_sum_to_one_in_fixed_point() {
    let filters = [
        Filter::Bicubic,
        Filter::Bilinear,
        Filter::Lanczos,
        Filter::Box,
        Filter::Hamming,
    ];
    for filter in filters {
        for (inp, out) in [
            (4000, 448),
            (3000, 336),
            (37, 17),
            (17, 37),
            (1, 5),
            (5, 1),
            (336, 336),
            (2, 3),
        ] {
            let c = Coeffs::new(inp, out, filter);
            for i in 0..out {
                let n = c.count[i];
                assert!(
                    n >= 1 && n <= c.ksize,
                    "{filter:?} {inp}->{out} #{i}: {n} taps"
                );
                assert!(c.start[i] + n <= inp);
                let sum: i64 = c.weights[i * c.ksize..][..n]
                    .iter()
                    .map(|&w| w as i64)
                    .sum();
                // Each weight is rounded to the nearest 1/2^22: the sum is off by at most n/2.
                assert!(
                    (sum - ONE).abs() <= n as i64 / 2 + 1,
                    "{filter:?} {inp}->{out} #{i}: sum {sum} vs {ONE}"
                );
            }
        }
    }
}

#[test]
fn same_size_coefficients_are_the_identity() {
    for filter in [
        Filter::Bicubic,
        Filter::Bilinear,
        Filter::Lanczos,
        Filter::Box,
        Filter::Hamming,
    ] {
        let c = Coeffs::new(9, 9, filter);
        for i in 0..9 {
            let taps = &c.weights[i * c.ksize..][..c.count[i]];
            for (j, &w) in taps.iter().enumerate() {
                let expected = if c.start[i] + j == i { ONE as i32 } else { 0 };
                assert_eq!(w, expected, "{filter:?} output {i} tap {j}");
            }
        }
    }
}

#[test]
fn identity_resize_is_a_no_op() {
    let src = pattern_4x12();
    assert_eq!(
        resize_u8(&src, 4, 12, 3, 4, 12, Filter::Bicubic).unwrap(),
        src
    );
    let gray: Vec<u8> = (0..35).map(|i| (i * 7) as u8).collect();
    assert_eq!(
        resize_u8(&gray, 5, 7, 1, 5, 7, Filter::Bilinear).unwrap(),
        gray
    );
    // The whole pipeline without rescale / normalise gives the pixels back.
    let img = DynamicImage::ImageRgb8(ImageBuffer::from_raw(4, 12, src.clone()).unwrap());
    let cfg = PreprocessorConfig {
        size: ResizeTo::Exact {
            height: 12,
            width: 4,
        },
        do_center_crop: false,
        do_rescale: false,
        do_normalize: false,
        ..PreprocessorConfig::default()
    };
    let out = ImageProcessor::new(cfg).unwrap().preprocess(&img).unwrap();
    for (i, &v) in src.iter().enumerate() {
        let (p, c) = (i / 3, i % 3);
        assert_eq!(out[c * 48 + p], v as f32);
    }
}

#[test]
fn resize_matches_pillow() {
    // `Image.fromarray(a).resize((w, h), f)` in Pillow 13.0.0 for `a` = `pattern_4x12()`.
    let src = pattern_4x12();
    // 4x12 -> 5x3 bicubic: height shrinks by 9 > 2 * (4 - 5): Pillow 13 resizes vertically first.
    let expected_5x3: [u8; 45] = [
        114, 129, 96, 126, 107, 129, 134, 106, 140, 123, 123, 123, 100, 134, 102, 144, 108, 151,
        129, 141, 138, 105, 153, 119, 113, 139, 123, 155, 123, 157, 110, 100, 140, 110, 139, 122,
        119, 134, 105, 132, 111, 118, 143, 115, 155,
    ];
    assert_eq!(
        resize_u8(&src, 4, 12, 3, 5, 3, Filter::Bicubic).unwrap(),
        expected_5x3
    );
    assert!(vertical_first(4, 12, 5, 3));
    // 4x12 -> 2x7 bicubic: 5 > 2 * 2, vertical first again.
    let expected_2x7: [u8; 42] = [
        97, 115, 99, 117, 87, 127, 140, 114, 131, 116, 142, 117, 138, 112, 139, 119, 143, 117, 123,
        163, 143, 154, 134, 154, 117, 112, 122, 87, 134, 125, 115, 124, 128, 138, 116, 112, 109,
        133, 118, 150, 119, 146,
    ];
    assert_eq!(
        resize_u8(&src, 4, 12, 3, 2, 7, Filter::Bicubic).unwrap(),
        expected_2x7
    );
    // 4x12 -> 3x20 bilinear (upscale in height: horizontal first).
    assert!(!vertical_first(4, 12, 3, 20));
    let out = resize_u8(&src, 4, 12, 3, 3, 20, Filter::Bilinear).unwrap();
    assert_eq!(
        &out[..12],
        &[33, 70, 107, 167, 76, 113, 120, 81, 118, 78, 115, 80]
    );
    assert_eq!(
        &out[out.len() - 9..],
        &[53, 90, 127, 187, 96, 133, 140, 101, 138]
    );
    // 5x3 gray -> 8x5 bicubic (upscale, overshoot clipped to 0 / 255).
    let gray = [0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 10, 20, 30, 40, 50];
    let expected_8x5: [u8; 40] = [
        0, 112, 255, 49, 49, 255, 112, 0, 100, 129, 164, 115, 114, 163, 128, 99, 255, 141, 3, 196,
        196, 3, 141, 255, 107, 59, 4, 92, 96, 15, 81, 134, 0, 3, 22, 14, 21, 42, 40, 36,
    ];
    assert_eq!(
        resize_u8(&gray, 5, 3, 1, 8, 5, Filter::Bicubic).unwrap(),
        expected_8x5
    );
}

#[test]
fn windowed_resize_equals_the_full_resize() {
    let (w, h) = (53, 41);
    let src: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
    for (ow, oh) in [(20, 13), (80, 60), (53, 20), (20, 41), (90, 9)] {
        let full = resize_u8(&src, w, h, 3, ow, oh, Filter::Bicubic).unwrap();
        let (rows, cols) = (oh / 4..oh - oh / 5, ow / 3..ow - 1);
        let win = resample::resize_window::<3>(
            &src,
            (w, h),
            (ow, oh),
            Filter::Bicubic,
            rows.clone(),
            cols.clone(),
        );
        assert_eq!((win.width, win.height), (cols.len(), rows.len()));
        for (i, y) in rows.enumerate() {
            let expect = &full[(y * ow + cols.start) * 3..(y * ow + cols.end) * 3];
            assert_eq!(
                &win.data[i * cols.len() * 3..(i + 1) * cols.len() * 3],
                expect,
                "{ow}x{oh} row {y}"
            );
        }
    }
}

#[test]
fn resize_rejects_bad_arguments() {
    is_image_err(resize_u8(&[], 0, 3, 3, 4, 4, Filter::Bicubic));
    is_image_err(resize_u8(&[0; 12], 2, 2, 3, 0, 4, Filter::Bicubic));
    is_image_err(resize_u8(&[0; 11], 2, 2, 3, 4, 4, Filter::Bicubic));
    is_image_err(resize_u8(&[0; 8], 2, 2, 2, 4, 4, Filter::Bicubic));
}

// ---------------------------------------------------------------------------------------------
// convert_rgb
// ---------------------------------------------------------------------------------------------

#[test]
fn alpha_is_composited_on_white_like_pillow() {
    // Image.alpha_composite(white, (v, v, v, a)) in Pillow 13.
    for (v, a, expected) in [
        (0, 128, 127),
        (200, 1, 255),
        (37, 255, 37),
        (255, 0, 255),
        (100, 77, 208),
    ] {
        assert_eq!(composite_on_white(v, a), expected, "v={v} a={a}");
    }
    // Opaque keeps the colour, transparent is white, whatever the colour underneath.
    for v in 0..=255u8 {
        assert_eq!(composite_on_white(v, 255), v);
        assert_eq!(composite_on_white(v, 0), 255);
    }
}

fn raw_pixels(img: &DynamicImage) -> Vec<f32> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let cfg = PreprocessorConfig {
        do_resize: false,
        do_center_crop: false,
        do_rescale: false,
        do_normalize: false,
        ..PreprocessorConfig::default()
    };
    let out = ImageProcessor::new(cfg).unwrap().preprocess(img).unwrap();
    assert_eq!(out.len(), 3 * w * h);
    out
}

#[test]
fn convert_rgb_follows_pillow_modes() {
    // Gray is replicated.
    let g = DynamicImage::ImageLuma8(ImageBuffer::from_raw(2, 1, vec![7, 200]).unwrap());
    assert_eq!(raw_pixels(&g), [7.0, 200.0, 7.0, 200.0, 7.0, 200.0]);
    // Gray + alpha: composited, then replicated.
    let la = DynamicImage::ImageLumaA8(
        ImageBuffer::<LumaA<u8>, _>::from_raw(1, 1, vec![0, 128]).unwrap(),
    );
    assert_eq!(raw_pixels(&la), [127.0; 3]);
    // RGBA: composited per channel.
    let rgba = DynamicImage::ImageRgba8(
        ImageBuffer::<Rgba<u8>, _>::from_raw(2, 1, vec![10, 20, 30, 255, 10, 20, 30, 0]).unwrap(),
    );
    assert_eq!(raw_pixels(&rgba), [10.0, 255.0, 20.0, 255.0, 30.0, 255.0]);
    // 16-bit gray opens as `I;16`, whose RGB conversion clips at 255.
    let g16 = DynamicImage::ImageLuma16(
        ImageBuffer::<Luma<u16>, _>::from_raw(3, 1, vec![0, 255, 40000]).unwrap(),
    );
    assert_eq!(raw_pixels(&g16)[..3], [0.0, 255.0, 255.0]);
    // 16-bit RGB keeps the high byte.
    let c16 = DynamicImage::ImageRgb16(
        ImageBuffer::<Rgb<u16>, _>::from_raw(1, 1, vec![0x12ff, 0xff00, 0x00ff]).unwrap(),
    );
    assert_eq!(raw_pixels(&c16), [18.0, 255.0, 0.0]);
}

#[test]
fn do_convert_rgb_false_needs_rgb() {
    let cfg = PreprocessorConfig {
        do_convert_rgb: false,
        ..PreprocessorConfig::default()
    };
    let p = ImageProcessor::new(cfg).unwrap();
    let g = DynamicImage::ImageLuma8(ImageBuffer::from_raw(2, 2, vec![1, 2, 3, 4]).unwrap());
    is_image_err(p.preprocess(&g));
    let rgb = DynamicImage::ImageRgb8(ImageBuffer::from_raw(2, 2, vec![9; 12]).unwrap());
    assert_eq!(p.preprocess(&rgb).unwrap().len(), 3 * 224 * 224);
}

// ---------------------------------------------------------------------------------------------
// Pipeline: sizes, crop, padding, values
// ---------------------------------------------------------------------------------------------

#[test]
fn shortest_edge_sizes_truncate_like_transformers() {
    let cfg = PreprocessorConfig {
        size: ResizeTo::ShortestEdge(336),
        ..PreprocessorConfig::default()
    };
    assert_eq!(cfg.resize_target(3000, 4000), (336, 448));
    assert_eq!(cfg.resize_target(4000, 3000), (448, 336));
    assert_eq!(cfg.resize_target(500, 500), (336, 336));
    // int(336 * 1000 / 999) = int(336.336…) = 336; int(336 * 701 / 300) = int(785.12) = 785.
    assert_eq!(cfg.resize_target(999, 1000), (336, 336));
    assert_eq!(cfg.resize_target(701, 300), (785, 336));
    let two = PreprocessorConfig {
        size: ResizeTo::ShortestEdge(2),
        ..PreprocessorConfig::default()
    };
    assert_eq!(two.resize_target(7, 3), (4, 2)); // int(2 * 7 / 3) = 4
    let exact = PreprocessorConfig {
        size: ResizeTo::Exact {
            height: 5,
            width: 9,
        },
        ..PreprocessorConfig::default()
    };
    assert_eq!(exact.resize_target(100, 3), (5, 9));
}

#[test]
fn crop_larger_than_the_image_pads_with_zero() {
    // 3x2 image, no resize, 4x5 crop: top = (2 - 4) // 2 = -1, left = (3 - 5) // 2 = -1.
    let img = DynamicImage::ImageRgb8(ImageBuffer::from_raw(3, 2, (1..=18).collect()).unwrap());
    let cfg = PreprocessorConfig {
        do_resize: false,
        crop_size: CropSize {
            height: 4,
            width: 5,
        },
        do_rescale: false,
        do_normalize: false,
        ..PreprocessorConfig::default()
    };
    let p = ImageProcessor::new(cfg).unwrap();
    let out = p.preprocess(&img).unwrap();
    assert_eq!(out.len(), 3 * 4 * 5);
    #[rustfmt::skip]
    let red = [
        0.0, 0.0, 0.0, 0.0, 0.0,
        0.0, 1.0, 4.0, 7.0, 0.0,
        0.0, 10.0, 13.0, 16.0, 0.0,
        0.0, 0.0, 0.0, 0.0, 0.0,
    ];
    assert_eq!(out[..20], red);
    // With normalisation the padding is (0 - mean) / std.
    let p = ImageProcessor::new(PreprocessorConfig {
        do_resize: false,
        crop_size: CropSize {
            height: 4,
            width: 5,
        },
        ..PreprocessorConfig::default()
    })
    .unwrap();
    let out = p.preprocess(&img).unwrap();
    let pad = (0.0f32 - 0.48145466f64 as f32) / 0.26862954f64 as f32;
    assert_eq!(out[0], pad);
    assert_eq!(
        out[6],
        ((1.0f64 * (1.0 / 255.0)) as f32 - 0.48145466f64 as f32) / 0.26862954f64 as f32
    );
}

#[test]
fn odd_crop_offsets_floor() {
    // 1 x 6 gray strip, crop width 3, no resize: left = (6 - 3) // 2 = 1.
    let img =
        DynamicImage::ImageLuma8(ImageBuffer::from_raw(6, 1, vec![0, 1, 2, 3, 4, 5]).unwrap());
    let p = ImageProcessor::new(PreprocessorConfig {
        do_resize: false,
        crop_size: CropSize {
            height: 1,
            width: 3,
        },
        do_rescale: false,
        do_normalize: false,
        ..PreprocessorConfig::default()
    })
    .unwrap();
    assert_eq!(
        p.preprocess(&img).unwrap(),
        [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    );
}

#[test]
fn output_shape_and_tensor() {
    let img =
        DynamicImage::ImageRgb8(ImageBuffer::from_raw(40, 30, vec![100; 40 * 30 * 3]).unwrap());
    let p = ImageProcessor::new(PreprocessorConfig::default()).unwrap();
    assert_eq!(p.config.output_size(), (224, 224));
    let t = p
        .preprocess_tensor(&img, &candle_core::Device::Cpu)
        .unwrap();
    assert_eq!(t.dims(), &[3, 224, 224]);
    // A flat image stays flat through the resize.
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    let red = ((100.0f64 * (1.0 / 255.0)) as f32 - 0.48145466f64 as f32) / 0.26862954f64 as f32;
    assert!(v[..224 * 224].iter().all(|&x| x == red));

    let no_crop = PreprocessorConfig {
        do_center_crop: false,
        ..PreprocessorConfig::default()
    };
    let p = ImageProcessor::new(no_crop).unwrap();
    assert_eq!(p.output_size_for(&img), (224, 298)); // int(224 * 40 / 30) = 298
    assert_eq!(p.preprocess(&img).unwrap().len(), 3 * 224 * 298);
}

#[test]
fn zero_sized_and_extreme_images_are_errors() {
    let p = ImageProcessor::new(PreprocessorConfig::default()).unwrap();
    is_image_err(p.preprocess(&DynamicImage::new_rgb8(0, 5)));
    is_image_err(p.preprocess(&DynamicImage::new_luma8(5, 0)));
    // 1 x 60000: the long side would become 224 * 60000 = 13.4 M pixels wide (3 G pixels).
    let msg = is_image_err(p.preprocess(&DynamicImage::new_luma8(60000, 1)));
    assert!(msg.contains("aspect ratio"), "{msg}");
}
