//! SVG line plots (a line and markers per series, axes, ticks, legend) for benchmark and training
//! reports, drawn with `plotters`' SVG backend (text stays SVG `<text>`: no font files needed).
//!
//! Any input terminates and gives a plot: non-finite points are skipped, values are clamped to
//! ±[`LIMIT`], degenerate ranges (one point, no point) are widened, and the ticks are computed
//! here with a bounded count rather than by the plotting library.

use anyhow::{anyhow, Context, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use std::path::Path;

/// One line of a plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Axis set-up of a plot.
pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Positions and labels of the x ticks (they also widen the x range to cover them); empty:
    /// round ticks chosen from the data.
    pub x_ticks: &'a [(f64, String)],
    /// Plot x on a log₂ scale (budgets halving each step); x ≤ 0 is not drawn.
    pub log2_x: bool,
}

/// Largest magnitude drawn; larger finite values are drawn at ±`LIMIT`.
pub const LIMIT: f64 = 1e100;
/// Most ticks on an axis.
const MAX_TICKS: usize = 12;
const SIZE: (u32, u32) = (760, 440);
/// The narrowest legend; it widens for long series names, up to half the plot.
const LEGEND_WIDTH: u32 = 180;

/// Legend width for `series`' names (about 8 px per character of the 15 px font).
fn legend_width(series: &[Series]) -> u32 {
    let chars = series
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(0);
    (44 + 8 * chars as u32).clamp(LEGEND_WIDTH, SIZE.0 / 2)
}

/// Renders `series` and writes the SVG document to `path`, creating parent directories.
pub fn write_line_plot(path: &Path, axes: &Axes, series: &[Series]) -> Result<()> {
    let svg = line_plot(axes, series)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}

/// Renders `series` as an SVG document.
pub fn line_plot(axes: &Axes, series: &[Series]) -> Result<String> {
    let fx = |x: f64| if axes.log2_x { x.log2() } else { x };
    // Drawable points per series: finite after the x transform, clamped, sorted by x.
    let lines: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|s| {
            let mut pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(x, y)| (fx(x), y))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(x, y)| (clamp(x), clamp(y)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            pts
        })
        .collect();
    let ticks: Vec<(f64, &str)> = axes
        .x_ticks
        .iter()
        .map(|(x, label)| (fx(*x), label.as_str()))
        .filter(|(x, _)| x.is_finite())
        .map(|(x, label)| (clamp(x), label))
        .collect();
    let (x0, x1) = range(
        lines
            .iter()
            .flatten()
            .map(|p| p.0)
            .chain(ticks.iter().map(|t| t.0)),
        false,
    );
    let (y0, y1) = range(lines.iter().flatten().map(|p| p.1), true);
    let x_keys: Vec<f64> = if ticks.is_empty() {
        nice_ticks(x0, x1)
    } else {
        ticks.iter().map(|t| t.0).collect()
    };
    let y_keys = nice_ticks(y0, y1);
    let x_step = key_step(&x_keys, x0, x1);
    let y_step = key_step(&y_keys, y0, y1);
    let x_label = |x: &f64| match ticks.iter().find(|t| t.0 == *x) {
        Some(t) => t.1.to_string(),
        None => fmt_tick(*x, x_step),
    };
    let y_label = |y: &f64| fmt_tick(*y, y_step);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - legend_width(series));
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(axes.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(
                Axis {
                    lo: x0,
                    hi: x1,
                    keys: x_keys,
                },
                Axis {
                    lo: y0,
                    hi: y1,
                    keys: y_keys,
                },
            )
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc(axes.x_label)
            .y_desc(axes.y_label)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .bold_line_style(RGBColor(225, 225, 225))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(draw_err)?;
        for (k, pts) in lines.iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(draw_err)?;
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(draw_err)?;
        }
        // The legend beside the plot, so it never covers data.
        for (k, s) in series.iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            let y = 50 + 20 * k as i32;
            legend_area
                .draw(&PathElement::new(
                    vec![(8, y), (30, y)],
                    color.stroke_width(3),
                ))
                .map_err(draw_err)?;
            legend_area
                .draw(&Text::new(
                    s.name.as_str(),
                    (36, y - 7),
                    ("sans-serif", 15).into_font(),
                ))
                .map_err(draw_err)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// A linear axis over a finite, non-empty range with the tick positions given (the plotting
/// library's own tick search is not bounded for extreme ranges).
#[derive(Clone)]
struct Axis {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let t = ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0);
        limit.0 + ((limit.1 - limit.0) as f64 * t).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

fn draw_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

fn clamp(v: f64) -> f64 {
    v.clamp(-LIMIT, LIMIT)
}

/// A drawable range covering the finite `values` (already clamped): padded by 5 %, widened
/// when it is a single value or too narrow for its magnitude, `0..1` without values.
fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let magnitude = lo.abs().max(hi.abs());
    if hi - lo <= magnitude * 1e-9 {
        let pad = (magnitude * 0.05).max(0.5);
        (lo, hi) = (lo - pad, hi + pad);
    } else {
        let pad = (hi - lo) * 0.05;
        (lo, hi) = (if from_zero && lo == 0.0 { lo } else { lo - pad }, hi + pad);
    }
    (lo, hi)
}

/// Round ticks (1, 2 or 5 times a power of ten apart) inside `lo..=hi`, at most [`MAX_TICKS`].
fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let step = nice_step((hi - lo) / 6.0);
    let first = (lo / step).ceil();
    (0..MAX_TICKS)
        .map(|i| (first + i as f64) * step)
        .take_while(|&v| v <= hi)
        .collect()
}

/// The spacing of `keys` (for label precision), else a sixth of the range.
fn key_step(keys: &[f64], lo: f64, hi: f64) -> f64 {
    let step = keys
        .windows(2)
        .map(|w| (w[1] - w[0]).abs())
        .filter(|d| *d > 0.0)
        .fold(f64::INFINITY, f64::min);
    if step.is_finite() {
        step
    } else {
        (hi - lo) / 6.0
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// A tick label: enough decimals for `step`, scientific notation for large or tiny magnitudes.
fn fmt_tick(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() >= 1e6 || step < 1e-4 {
        return format!("{v:.2e}");
    }
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn axes(ticks: &[(f64, String)], log2_x: bool) -> Axes<'_> {
        Axes {
            title: "t <x>",
            x_label: "budget",
            y_label: "acc",
            x_ticks: ticks,
            log2_x,
        }
    }

    /// Renders on another thread and fails (instead of hanging the suite) after a minute.
    fn render(ticks: Vec<(f64, String)>, log2_x: bool, series: Vec<Series>) -> String {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(line_plot(&axes(&ticks, log2_x), &series).map_err(|e| e.to_string()));
        });
        let svg = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("plot did not finish (hang or panic)")
            .expect("plot failed");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        svg
    }

    /// Whether the SVG has a `<text>` element reading `text`.
    fn has_text(svg: &str, text: &str) -> bool {
        svg.contains(&format!(">\n{text}\n</text>"))
    }

    fn one(points: Vec<(f64, f64)>) -> Vec<Series> {
        vec![Series {
            name: "s".into(),
            points,
        }]
    }

    #[test]
    fn renders_titles_labels_ticks_and_every_series() {
        let ticks = vec![(1.0, "100%".to_string()), (0.5, "50%".to_string())];
        let series = vec![
            Series {
                name: "alpha".into(),
                points: vec![(1.0, 0.5), (0.5, 0.4)],
            },
            Series {
                name: "beta".into(),
                points: vec![(1.0, 0.5), (0.5, f64::NAN)],
            },
        ];
        let svg = render(ticks, true, series);
        for text in [
            "t &lt;x&gt;",
            "budget",
            "acc",
            "100%",
            "50%",
            "alpha",
            "beta",
        ] {
            assert!(has_text(&svg, text), "{text} missing");
        }
        assert_eq!(svg.matches("<circle").count(), 3, "NaN point drawn");
        assert_eq!(svg.matches(r#"stroke-width="2" points"#).count(), 2);
    }

    #[test]
    fn automatic_ticks_are_round_numbers() {
        let svg = render(vec![], false, one(vec![(0.0, 0.1), (10.0, 0.9)]));
        for label in ["0", "0.2", "0.4", "0.8", "2", "8", "10"] {
            assert!(has_text(&svg, label), "{label} missing");
        }
        assert!(!has_text(&svg, "0.30000000000000004"));
    }

    #[test]
    fn extreme_and_degenerate_values_terminate() {
        let cases: Vec<Vec<(f64, f64)>> = vec![
            vec![(0.0, 1e308), (1.0, -1e308)],
            vec![(1e308, 0.0), (-1e308, 1.0)],
            vec![(0.0, f64::MAX), (1.0, f64::MIN), (2.0, f64::MIN_POSITIVE)],
            vec![
                (0.0, f64::NAN),
                (1.0, f64::INFINITY),
                (2.0, f64::NEG_INFINITY),
            ],
            vec![(f64::INFINITY, 1.0), (f64::NAN, 2.0)],
            vec![(3.0, 0.25)],
            vec![(1e300, 1e300)],
            vec![(0.0, 1e15), (1.0, 1e15 + 1.0)],
            vec![],
        ];
        for pts in cases {
            for log2_x in [false, true] {
                render(vec![], log2_x, one(pts.clone()));
            }
        }
        // Several series at once, one of them empty, and labelled ticks at extremes.
        let ticks = vec![(f64::NAN, "nan".into()), (1e308, "big".into())];
        let series = vec![
            Series {
                name: "empty".into(),
                points: vec![],
            },
            Series {
                name: "huge".into(),
                points: vec![(0.0, 1e308), (1.0, -1e308), (2.0, f64::NAN)],
            },
        ];
        let svg = render(ticks, false, series);
        assert!(svg.contains("empty") && svg.contains("huge"));
        assert!(
            svg.contains("e100"),
            "clamped range labelled in scientific notation"
        );
    }

    #[test]
    fn ranges_and_ticks_are_bounded() {
        assert_eq!(range([].into_iter(), true), (0.0, 1.0));
        let (lo, hi) = range([2.0].into_iter(), false);
        assert!(lo < 2.0 && hi > 2.0);
        let (lo, hi) = range([-LIMIT, LIMIT].into_iter(), false);
        assert!(lo.is_finite() && hi.is_finite() && (hi - lo).is_finite());
        assert!(nice_ticks(-1e100, 1e100).len() <= MAX_TICKS);
        assert_eq!(nice_ticks(0.0, 1.0).len(), 6);
        assert_eq!(nice_step(0.13), 0.2);
        assert_eq!(nice_step(f64::INFINITY), 1.0);
        assert_eq!(fmt_tick(0.4, 0.1), "0.4");
        assert_eq!(fmt_tick(2e100, 1e99), "2.00e100");
    }

    #[test]
    fn writes_the_file() {
        let dir = std::env::temp_dir().join(format!("glance-plot-{}", std::process::id()));
        let path = dir.join("sub/p.svg");
        write_line_plot(&path, &axes(&[], false), &one(vec![(0.0, 1.0)])).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().starts_with("<svg"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
