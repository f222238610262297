//! Shape geometry and the digit font, shared by the renderer and the per-patch labels.
//!
//! Inside tests use only `+ - * /` and comparisons on `f32` (no `sin`/`cos`/`sqrt`), so the
//! rasterisation is bit-identical on every platform. Objects are anti-aliased by 4×4
//! supersampling: [`object_coverage`] returns how many of a pixel's 16 sub-samples are inside.

use crate::scene::{sign_geometry as g, Object, Shape, Sign};

/// Sub-samples per pixel side (coverage is out of `SUPERSAMPLE²`).
pub const SUPERSAMPLE: u32 = 4;
/// Sub-samples per pixel.
pub const SAMPLES_PER_PIXEL: u32 = SUPERSAMPLE * SUPERSAMPLE;

/// Unit-circle directions at -90° + 36°·k (k = 0..10), precomputed so no libm call is needed.
const STAR_DIRS: [(f32, f32); 10] = [
    (0.0, -1.0),
    (0.587_785_25, -0.809_017),
    (0.951_056_5, -0.309_017),
    (0.951_056_5, 0.309_017),
    (0.587_785_25, 0.809_017),
    (0.0, 1.0),
    (-0.587_785_25, 0.809_017),
    (-0.951_056_5, 0.309_017),
    (-0.951_056_5, -0.309_017),
    (-0.587_785_25, -0.809_017),
];
const STAR_OUTER: f32 = 1.05;
const STAR_INNER: f32 = 0.52;
/// The star's points reach 1.05 up but only 0.85 down: shift it down to centre it.
const STAR_SHIFT: f32 = 0.1;

fn star_vertex(k: usize) -> (f32, f32) {
    let (dx, dy) = STAR_DIRS[k % 10];
    let r = if k & 1 == 0 { STAR_OUTER } else { STAR_INNER };
    (dx * r, dy * r + STAR_SHIFT)
}

/// Is the point (`u`, `v`), in units of the object's half-size and centred on it, inside `shape`?
pub fn inside(shape: Shape, u: f32, v: f32) -> bool {
    match shape {
        Shape::Circle => u * u + v * v <= 1.0,
        Shape::Square => u.abs() <= 0.86 && v.abs() <= 0.86,
        Shape::Triangle => {
            // Apex (0, -1), base from (-1.05, 0.85) to (1.05, 0.85).
            (-1.0..=0.85).contains(&v) && u.abs() <= (v + 1.0) * (1.05 / 1.85)
        }
        Shape::Cross => {
            let (a, b) = (u.abs(), v.abs());
            (a <= 0.34 && b <= 0.95) || (b <= 0.34 && a <= 0.95)
        }
        Shape::Star => {
            // Even-odd crossing test on the 10-vertex polygon.
            let mut inside = false;
            let mut j = 9;
            for i in 0..10 {
                let (xi, yi) = star_vertex(i);
                let (xj, yj) = star_vertex(j);
                if (yi > v) != (yj > v) && u < (xj - xi) * (v - yi) / (yj - yi) + xi {
                    inside = !inside;
                }
                j = i;
            }
            inside
        }
    }
}

/// Pixel bounding box `(x0, y0, x1, y1)` (exclusive ends, clipped to `size`) of an object.
pub fn object_bbox(o: &Object, size: u32) -> (u32, u32, u32, u32) {
    let h = o.size.pixels() / 2.0 + 1.0;
    let clip = |v: f32| v.floor().clamp(0.0, size as f32) as u32;
    (
        clip(o.cx - h),
        clip(o.cy - h),
        clip(o.cx + h + 1.0),
        clip(o.cy + h + 1.0),
    )
}

/// Number of the pixel (`px`, `py`)'s `SAMPLES_PER_PIXEL` sub-samples inside object `o`.
pub fn object_coverage(o: &Object, px: u32, py: u32) -> u32 {
    let h = o.size.pixels() / 2.0;
    let step = 1.0 / SUPERSAMPLE as f32;
    let mut n = 0;
    for sy in 0..SUPERSAMPLE {
        let y = py as f32 + (sy as f32 + 0.5) * step;
        let v = (y - o.cy) / h;
        for sx in 0..SUPERSAMPLE {
            let x = px as f32 + (sx as f32 + 0.5) * step;
            if inside(o.shape, (x - o.cx) / h, v) {
                n += 1;
            }
        }
    }
    n
}

/// 5×7 bitmap font, one `u8` per row, bit 4 = leftmost column.
const FONT: [[u8; 7]; 10] = [
    [
        0b01110, 0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b01110,
    ], // 0
    [
        0b00100, 0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110,
    ], // 1
    [
        0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b01000, 0b11111,
    ], // 2
    [
        0b11111, 0b00010, 0b00100, 0b00010, 0b00001, 0b10001, 0b01110,
    ], // 3
    [
        0b00010, 0b00110, 0b01010, 0b10010, 0b11111, 0b00010, 0b00010,
    ], // 4
    [
        0b11111, 0b10000, 0b11110, 0b00001, 0b00001, 0b10001, 0b01110,
    ], // 5
    [
        0b00110, 0b01000, 0b10000, 0b11110, 0b10001, 0b10001, 0b01110,
    ], // 6
    [
        0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b01000, 0b01000,
    ], // 7
    [
        0b01110, 0b10001, 0b10001, 0b01110, 0b10001, 0b10001, 0b01110,
    ], // 8
    [
        0b01110, 0b10001, 0b10001, 0b01111, 0b00001, 0b00010, 0b01100,
    ], // 9
];

/// What of the sign covers pixel (`px`, `py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignPixel {
    Outside,
    Border,
    Plate,
    /// Ink of digit `place` (0 = tens, 1 = units).
    Ink {
        place: u8,
    },
}

/// Classify a pixel against the sign plate and its glyphs.
pub fn sign_pixel(s: &Sign, px: u32, py: u32) -> SignPixel {
    if px < s.x
        || py < s.y
        || px >= s.x.saturating_add(g::PLATE_W)
        || py >= s.y.saturating_add(g::PLATE_H)
    {
        return SignPixel::Outside;
    }
    let (lx, ly) = (px - s.x, py - s.y);
    if lx < g::BORDER
        || ly < g::BORDER
        || lx >= g::PLATE_W - g::BORDER
        || ly >= g::PLATE_H - g::BORDER
    {
        return SignPixel::Border;
    }
    if !(g::GLYPH_Y0..g::GLYPH_Y0 + g::GLYPH_H).contains(&ly) {
        return SignPixel::Plate;
    }
    let digits = s.digits();
    for place in 0..2u32 {
        let gx0 = g::GLYPH_X0 + place * (g::GLYPH_W + g::GLYPH_GAP);
        if lx >= gx0 && lx < gx0 + g::GLYPH_W {
            let col = (lx - gx0) / g::GLYPH_SCALE;
            let row = (ly - g::GLYPH_Y0) / g::GLYPH_SCALE;
            let bits = FONT[digits[place as usize] as usize % 10][row as usize];
            if bits & (0b10000 >> col) != 0 {
                return SignPixel::Ink { place: place as u8 };
            }
        }
    }
    SignPixel::Plate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_contain_their_centre_and_not_their_corners() {
        for s in Shape::ALL {
            assert!(inside(*s, 0.0, 0.05), "{s} centre");
            assert!(!inside(*s, 0.99, 0.99), "{s} corner");
            assert!(!inside(*s, 1.2, 0.0), "{s} outside");
        }
    }

    #[test]
    fn shapes_have_distinct_masks() {
        let mask = |s: Shape| -> Vec<bool> {
            (0..400)
                .map(|i| {
                    inside(
                        s,
                        (i % 20) as f32 / 10.0 - 0.95,
                        (i / 20) as f32 / 10.0 - 0.95,
                    )
                })
                .collect()
        };
        for a in Shape::ALL {
            for b in Shape::ALL {
                if a < b {
                    let diff = mask(*a)
                        .iter()
                        .zip(mask(*b))
                        .filter(|(x, y)| **x != *y)
                        .count();
                    assert!(diff > 40, "{a} vs {b} differ in only {diff} of 400 points");
                }
            }
        }
    }

    #[test]
    fn font_digits_are_distinct() {
        for (a, fa) in FONT.iter().enumerate() {
            assert!(
                FONT.iter().skip(a + 1).all(|fb| fb != fa),
                "digit {a} duplicated"
            );
        }
    }
}
