//! Scene description: colours, shapes, sizes, grid positions, objects, the sign, the background,
//! and the seeded generator [`Scene::generate`].
//!
//! A [`Scene`] fully describes one image (the renderer needs nothing else) and serialises with
//! serde. Layout: a 3×3 grid of cells over a 224×224 canvas; every object (and the sign) owns one
//! cell and is centred in it with at most [`JITTER`] px of jitter, so nothing ever overlaps.
//! Scenes deliberately reuse a small per-scene palette of colours and shapes so that counts above
//! one are common (counting questions are then not dominated by "1").

use serde::{Deserialize, Serialize};

use crate::rng::WorldRng;

/// Image side in pixels.
pub const IMAGE_SIZE: u32 = 224;
/// Grid cells per side.
pub const GRID: usize = 3;
/// Maximum absolute jitter of an object / sign centre from its cell centre, in pixels.
pub const JITTER: i64 = 4;
/// Bounding-box side of a large object, in pixels (≈ 4.4 patches of 14 px).
pub const LARGE_PX: f32 = 62.0;
/// Bounding-box side of a small object, in pixels (≈ 2.6 patches of 14 px).
pub const SMALL_PX: f32 = 36.0;
/// Maximum number of objects in a scene.
pub const MAX_OBJECTS: usize = 6;

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($var:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($var),+ }

        impl $name {
            /// Every value, in id order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            /// Number of values (the size of a classification head over them).
            pub const COUNT: usize = Self::ALL.len();
            /// Dense id in `0..COUNT`.
            pub fn id(self) -> usize { self as usize }
            /// Value with dense id `id`, if any.
            pub fn from_id(id: usize) -> Option<Self> { Self::ALL.get(id).copied() }
            /// The word(s) used in questions and answers.
            pub fn name(self) -> &'static str { match self { $($name::$var => $text),+ } }
            /// Parse the name used in questions and answers.
            pub fn from_name(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.name() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum!(
    /// Object colour: six saturated hues, far apart in RGB and from the pale backgrounds.
    Colour { Red = "red", Orange = "orange", Yellow = "yellow", Green = "green", Blue = "blue", Purple = "purple" }
);
named_enum!(
    /// Object shape; all five differ in outline at the scale of a 14-px patch.
    Shape { Circle = "circle", Square = "square", Triangle = "triangle", Star = "star", Cross = "cross" }
);
named_enum!(
    /// Object size.
    Size { Small = "small", Large = "large" }
);
named_enum!(
    /// A cell of the 3×3 grid, row-major (id = row·3 + column).
    Position {
        TopLeft = "top left", TopCenter = "top center", TopRight = "top right",
        MiddleLeft = "middle left", Center = "center", MiddleRight = "middle right",
        BottomLeft = "bottom left", BottomCenter = "bottom center", BottomRight = "bottom right",
    }
);

impl Colour {
    /// sRGB fill colour.
    pub fn rgb(self) -> [u8; 3] {
        match self {
            Colour::Red => [220, 30, 35],
            Colour::Orange => [250, 135, 20],
            Colour::Yellow => [245, 215, 25],
            Colour::Green => [35, 160, 60],
            Colour::Blue => [35, 75, 225],
            Colour::Purple => [140, 50, 185],
        }
    }
}

impl Shape {
    /// Plural noun ("circles", "crosses").
    pub fn plural(self) -> &'static str {
        match self {
            Shape::Circle => "circles",
            Shape::Square => "squares",
            Shape::Triangle => "triangles",
            Shape::Star => "stars",
            Shape::Cross => "crosses",
        }
    }

    /// Parse a singular or plural shape noun.
    pub fn from_word(w: &str) -> Option<Shape> {
        Shape::ALL
            .iter()
            .copied()
            .find(|s| s.name() == w || s.plural() == w)
    }
}

impl Size {
    /// Bounding-box side in pixels.
    pub fn pixels(self) -> f32 {
        match self {
            Size::Small => SMALL_PX,
            Size::Large => LARGE_PX,
        }
    }
}

impl Position {
    /// Grid row, 0 = top.
    pub fn row(self) -> usize {
        self.id() / GRID
    }
    /// Grid column, 0 = left.
    pub fn col(self) -> usize {
        self.id() % GRID
    }
    /// The cell at `row`, `col` (both `< 3`).
    pub fn at(row: usize, col: usize) -> Option<Position> {
        if row < GRID && col < GRID {
            Position::from_id(row * GRID + col)
        } else {
            None
        }
    }
    /// Centre of the cell in pixels.
    pub fn cell_center(self) -> (f32, f32) {
        let cell = IMAGE_SIZE as f32 / GRID as f32;
        (
            (self.col() as f32 + 0.5) * cell,
            (self.row() as f32 + 0.5) * cell,
        )
    }
}

/// One object: what it is, which cell it is in, and where exactly it is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Object {
    pub colour: Colour,
    pub shape: Shape,
    pub size: Size,
    pub position: Position,
    /// Drawn centre in pixels (cell centre + jitter).
    pub cx: f32,
    pub cy: f32,
}

impl Object {
    /// "large red circle".
    pub fn phrase(&self) -> String {
        format!("{} {} {}", self.size, self.colour, self.shape)
    }
    /// The four fields that identify an object in a description.
    pub fn key(&self) -> (Size, Colour, Shape, Position) {
        (self.size, self.colour, self.shape, self.position)
    }
}

/// A light plate with a two-digit number printed in a 5×7 pixel font scaled ×4 (glyphs 20×28 px).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sign {
    /// 10..=99.
    pub number: u8,
    pub position: Position,
    /// Top-left corner of the plate in pixels (integer, so the sign is drawn without blending).
    pub x: u32,
    pub y: u32,
}

/// Sign plate geometry (pixels).
pub mod sign_geometry {
    /// Plate width.
    pub const PLATE_W: u32 = 60;
    /// Plate height.
    pub const PLATE_H: u32 = 42;
    /// Dark border width (inside the plate).
    pub const BORDER: u32 = 3;
    /// Scale of the 5×7 font.
    pub const GLYPH_SCALE: u32 = 4;
    /// Glyph width (5 font pixels).
    pub const GLYPH_W: u32 = 5 * GLYPH_SCALE;
    /// Glyph height (7 font pixels).
    pub const GLYPH_H: u32 = 7 * GLYPH_SCALE;
    /// Gap between the two glyphs.
    pub const GLYPH_GAP: u32 = 6;
    /// Offset of the first glyph from the plate's left edge.
    pub const GLYPH_X0: u32 = (PLATE_W - 2 * GLYPH_W - GLYPH_GAP) / 2;
    /// Offset of the glyphs from the plate's top edge.
    pub const GLYPH_Y0: u32 = (PLATE_H - GLYPH_H) / 2;
}

impl Sign {
    /// The two digits, tens first.
    pub fn digits(&self) -> [u8; 2] {
        [self.number / 10, self.number % 10]
    }
}

/// Background style. Colours are pale and desaturated so every object colour stands out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Background {
    Plain {
        rgb: [u8; 3],
    },
    /// Linear blend from `from` to `to` along the unit direction (`dx`, `dy`) ∈ {axis, diagonal}.
    Gradient {
        from: [u8; 3],
        to: [u8; 3],
        dx: i8,
        dy: i8,
    },
    /// `rgb` plus low-amplitude value noise (lattice of `cell` px, amplitude ±`amplitude`)
    /// keyed by `noise_seed`.
    Textured {
        rgb: [u8; 3],
        cell: u32,
        amplitude: u8,
        noise_seed: u64,
    },
}

/// Everything in one image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scene {
    pub seed: u64,
    pub background: Background,
    /// 1..=6 objects, each in its own cell, sorted by position.
    pub objects: Vec<Object>,
    pub sign: Option<Sign>,
}

fn pale_colour(rng: &mut WorldRng) -> [u8; 3] {
    let grey = rng.range(170, 228);
    let mut c = [0u8; 3];
    for ch in c.iter_mut() {
        *ch = (grey + rng.range(-14, 14)).clamp(0, 255) as u8;
    }
    c
}

fn jittered(rng: &mut WorldRng, v: f32) -> f32 {
    v + rng.range(-JITTER, JITTER) as f32
}

/// `k` distinct values from `all`, then `n` draws from those `k` covering each at least once.
fn palette_draw<T: Copy>(rng: &mut WorldRng, all: &[T], n: usize, max_k: usize) -> Vec<T> {
    let k = 1 + rng.below(max_k.min(n).max(1));
    let mut pool: Vec<T> = all.to_vec();
    rng.shuffle(&mut pool);
    pool.truncate(k);
    let mut out: Vec<T> = pool.clone();
    while out.len() < n {
        if let Some(v) = rng.choose(&pool) {
            out.push(*v);
        }
    }
    rng.shuffle(&mut out);
    out
}

impl Scene {
    /// The scene of `seed`. Pure function of the seed: identical on every platform.
    pub fn generate(seed: u64) -> Scene {
        let mut rng = WorldRng::new(seed);
        let background = match rng.below(3) {
            0 => Background::Plain {
                rgb: pale_colour(&mut rng),
            },
            1 => {
                let (dx, dy) = *rng
                    .choose(&[(1i8, 0i8), (0, 1), (1, 1), (1, -1), (-1, 0), (0, -1)])
                    .unwrap_or(&(1, 0));
                Background::Gradient {
                    from: pale_colour(&mut rng),
                    to: pale_colour(&mut rng),
                    dx,
                    dy,
                }
            }
            _ => Background::Textured {
                rgb: pale_colour(&mut rng),
                cell: *rng.choose(&[8u32, 12, 16, 28]).unwrap_or(&16),
                amplitude: rng.range(6, 14) as u8,
                noise_seed: rng.next_u64(),
            },
        };
        let n = 1 + rng.below(MAX_OBJECTS);
        let has_sign = rng.chance(0.5);
        let mut cells: Vec<Position> = Position::ALL.to_vec();
        rng.shuffle(&mut cells);
        let colours = palette_draw(&mut rng, Colour::ALL, n, 4);
        let shapes = palette_draw(&mut rng, Shape::ALL, n, 4);
        let mut objects = Vec::with_capacity(n);
        for i in 0..n {
            let size = if rng.chance(0.5) {
                Size::Large
            } else {
                Size::Small
            };
            let position = cells[i];
            let (cx, cy) = position.cell_center();
            objects.push(Object {
                colour: colours[i],
                shape: shapes[i],
                size,
                position,
                cx: jittered(&mut rng, cx),
                cy: jittered(&mut rng, cy),
            });
        }
        objects.sort_by_key(|o| o.position);
        let sign = if has_sign {
            let position = cells[n];
            let (cx, cy) = position.cell_center();
            let number = rng.range(10, 99) as u8;
            let x = (jittered(&mut rng, cx) - sign_geometry::PLATE_W as f32 / 2.0)
                .round()
                .max(0.0) as u32;
            let y = (jittered(&mut rng, cy) - sign_geometry::PLATE_H as f32 / 2.0)
                .round()
                .max(0.0) as u32;
            Some(Sign {
                number,
                position,
                x,
                y,
            })
        } else {
            None
        };
        Scene {
            seed,
            background,
            objects,
            sign,
        }
    }

    /// The object in cell `p`, if any.
    pub fn object_at(&self, p: Position) -> Option<&Object> {
        self.objects.iter().find(|o| o.position == p)
    }

    /// Objects matching the optional attribute filters.
    pub fn matching(
        &self,
        colour: Option<Colour>,
        shape: Option<Shape>,
        size: Option<Size>,
    ) -> Vec<&Object> {
        self.objects
            .iter()
            .filter(|o| colour.is_none_or(|c| o.colour == c))
            .filter(|o| shape.is_none_or(|s| o.shape == s))
            .filter(|o| size.is_none_or(|s| o.size == s))
            .collect()
    }

    /// Number of objects matching the filters.
    pub fn count(&self, colour: Option<Colour>, shape: Option<Shape>, size: Option<Size>) -> usize {
        self.matching(colour, shape, size).len()
    }

    /// What occupies each of the 9 cells (row-major): a per-scene target for a `[CLS]` head.
    pub fn cells(&self) -> [CellContent; 9] {
        let mut out = [CellContent::Empty; 9];
        for o in &self.objects {
            out[o.position.id()] = CellContent::Object {
                colour: o.colour,
                shape: o.shape,
                size: o.size,
            };
        }
        if let Some(s) = &self.sign {
            out[s.position.id()] = CellContent::Sign { number: s.number };
        }
        out
    }
}

/// The content of one grid cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CellContent {
    Empty,
    Object {
        colour: Colour,
        shape: Shape,
        size: Size,
    },
    Sign {
        number: u8,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenes_respect_the_ranges() {
        for seed in 0..2000u64 {
            let s = Scene::generate(seed);
            assert!((1..=MAX_OBJECTS).contains(&s.objects.len()));
            let mut cells: Vec<usize> = s.objects.iter().map(|o| o.position.id()).collect();
            if let Some(sign) = &s.sign {
                assert!((10..=99).contains(&sign.number));
                cells.push(sign.position.id());
                assert!(sign.x + sign_geometry::PLATE_W <= IMAGE_SIZE);
                assert!(sign.y + sign_geometry::PLATE_H <= IMAGE_SIZE);
            }
            let n = cells.len();
            cells.sort();
            cells.dedup();
            assert_eq!(cells.len(), n, "two things share a cell");
            for o in &s.objects {
                let h = o.size.pixels() / 2.0;
                assert!(o.cx - h >= 0.0 && o.cx + h <= IMAGE_SIZE as f32);
                assert!(o.cy - h >= 0.0 && o.cy + h <= IMAGE_SIZE as f32);
            }
            assert_eq!(s, Scene::generate(seed));
        }
    }

    #[test]
    fn enum_names_round_trip() {
        for p in Position::ALL {
            assert_eq!(Position::from_name(p.name()), Some(*p));
            assert_eq!(Position::at(p.row(), p.col()), Some(*p));
        }
        for s in Shape::ALL {
            assert_eq!(Shape::from_word(s.plural()), Some(*s));
        }
        assert_eq!(Colour::COUNT, 6);
        assert_eq!(Shape::COUNT, 5);
    }
}
