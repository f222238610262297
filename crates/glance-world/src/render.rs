//! Rasterise a [`Scene`] into a 224×224 RGB image.
//!
//! Order: background (plain / gradient / value-noise texture), then objects with 4×4
//! supersampled anti-aliasing, then the sign (axis-aligned, drawn at integer pixels, no blending).
//! Only deterministic arithmetic is used, so the pixels of a seed are identical everywhere.

use image::RgbImage;

use crate::rng::mix64;
use crate::scene::{Background, Scene, IMAGE_SIZE};
use crate::shapes::{object_bbox, object_coverage, sign_pixel, SignPixel, SAMPLES_PER_PIXEL};

/// Sign plate fill.
pub const PLATE_RGB: [f32; 3] = [248.0, 246.0, 236.0];
/// Sign plate border.
pub const BORDER_RGB: [f32; 3] = [50.0, 50.0, 56.0];
/// Digit ink.
pub const INK_RGB: [f32; 3] = [18.0, 18.0, 24.0];

/// Hash of a lattice point to a value in `[-1, 1]`.
fn lattice(seed: u64, ix: i64, iy: i64) -> f32 {
    let h =
        mix64(seed ^ mix64((ix as u64).wrapping_mul(0x9E37_79B9) ^ (iy as u64).wrapping_shl(32)));
    (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

fn smooth(t: f32) -> f32 {
    t * t * (3.0 - 2.0 * t)
}

/// Value noise in `[-1, 1]` on a lattice of `cell` pixels, plus a little per-pixel grain.
fn value_noise(seed: u64, cell: u32, x: u32, y: u32) -> f32 {
    let cell = cell.max(1);
    let (ix, iy) = ((x / cell) as i64, (y / cell) as i64);
    let tx = smooth((x % cell) as f32 / cell as f32);
    let ty = smooth((y % cell) as f32 / cell as f32);
    let a = lattice(seed, ix, iy) * (1.0 - tx) + lattice(seed, ix + 1, iy) * tx;
    let b = lattice(seed, ix, iy + 1) * (1.0 - tx) + lattice(seed, ix + 1, iy + 1) * tx;
    let grain = lattice(seed ^ 0x5EED, x as i64, y as i64);
    0.85 * (a * (1.0 - ty) + b * ty) + 0.15 * grain
}

fn to_f32(c: [u8; 3]) -> [f32; 3] {
    [c[0] as f32, c[1] as f32, c[2] as f32]
}

fn background_pixel(bg: &Background, x: u32, y: u32) -> [f32; 3] {
    match *bg {
        Background::Plain { rgb } => to_f32(rgb),
        Background::Gradient { from, to, dx, dy } => {
            let last = (IMAGE_SIZE - 1) as f32;
            let (u, v) = (x as f32 / last - 0.5, y as f32 / last - 0.5);
            let norm = (dx.unsigned_abs() + dy.unsigned_abs()).max(1) as f32;
            let t = ((dx as f32 * u + dy as f32 * v) / norm + 0.5).clamp(0.0, 1.0);
            let (f, g) = (to_f32(from), to_f32(to));
            [
                f[0] + (g[0] - f[0]) * t,
                f[1] + (g[1] - f[1]) * t,
                f[2] + (g[2] - f[2]) * t,
            ]
        }
        Background::Textured {
            rgb,
            cell,
            amplitude,
            noise_seed,
        } => {
            let n = value_noise(noise_seed, cell, x, y) * amplitude as f32;
            let c = to_f32(rgb);
            [c[0] + n, c[1] + n, c[2] + n]
        }
    }
}

/// Render `scene` as a 224×224 RGB image.
pub fn render(scene: &Scene) -> RgbImage {
    let s = IMAGE_SIZE;
    let mut buf: Vec<[f32; 3]> = Vec::with_capacity((s * s) as usize);
    for y in 0..s {
        for x in 0..s {
            buf.push(background_pixel(&scene.background, x, y));
        }
    }
    for o in &scene.objects {
        let col = to_f32(o.colour.rgb());
        let (x0, y0, x1, y1) = object_bbox(o, s);
        for y in y0..y1 {
            for x in x0..x1 {
                let cov = object_coverage(o, x, y);
                if cov == 0 {
                    continue;
                }
                let a = cov as f32 / SAMPLES_PER_PIXEL as f32;
                let p = &mut buf[(y * s + x) as usize];
                for c in 0..3 {
                    p[c] = p[c] * (1.0 - a) + col[c] * a;
                }
            }
        }
    }
    if let Some(sign) = &scene.sign {
        for y in sign.y
            ..sign
                .y
                .saturating_add(crate::scene::sign_geometry::PLATE_H)
                .min(s)
        {
            for x in sign.x
                ..sign
                    .x
                    .saturating_add(crate::scene::sign_geometry::PLATE_W)
                    .min(s)
            {
                let c = match sign_pixel(sign, x, y) {
                    SignPixel::Outside => continue,
                    SignPixel::Border => BORDER_RGB,
                    SignPixel::Plate => PLATE_RGB,
                    SignPixel::Ink { .. } => INK_RGB,
                };
                buf[(y * s + x) as usize] = c;
            }
        }
    }
    let mut raw = Vec::with_capacity(buf.len() * 3);
    for p in &buf {
        for c in p {
            raw.push(c.round().clamp(0.0, 255.0) as u8);
        }
    }
    // The buffer has exactly s*s*3 bytes, so `from_raw` cannot fail; fall back to blank anyway.
    RgbImage::from_raw(s, s, raw).unwrap_or_else(|| RgbImage::new(s, s))
}

/// FNV-1a over the raw pixels: a cheap, stable fingerprint for tests and manifests.
pub fn pixel_hash(img: &RgbImage) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in img.as_raw() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}
