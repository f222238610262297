//! A small self-contained SVG line plot (a line and markers per series, axes, ticks, legend) for
//! benchmark reports, instead of a plotting crate.

use anyhow::{Context, Result};
use std::fmt::Write;
use std::path::Path;

/// One line of a plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Axis set-up of a [`line_plot`].
pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Positions and labels of the x ticks (also fixes the x range).
    pub x_ticks: &'a [(f64, String)],
    /// Plot x on a log₂ scale (budgets halving each step).
    pub log2_x: bool,
}

const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders `series` as an SVG document.
pub fn line_plot(axes: &Axes, series: &[Series]) -> String {
    let (w, h) = (720.0, 440.0);
    let (left, right, top, bottom) = (70.0, 170.0, 40.0, 60.0);
    let fx = |x: f64| if axes.log2_x { x.max(1e-12).log2() } else { x };
    let xs: Vec<f64> = axes
        .x_ticks
        .iter()
        .map(|t| t.0)
        .chain(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)))
        .map(fx)
        .collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .collect();
    let (x0, x1) = bounds(&xs);
    let (y0, y1) = bounds(&ys);
    let step = nice_step((y1 - y0.min(0.0)) / 5.0);
    let (y0, y1) = (
        (y0.min(0.0) / step).floor() * step,
        (y1 / step).ceil() * step,
    );
    let sx = |x: f64| left + (fx(x) - x0) / (x1 - x0) * (w - left - right);
    let sy = |y: f64| h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        (left + w - right) / 2.0,
        esc(axes.title)
    );
    // Grid, then the axes over it.
    let (ax0, ax1, ay0, ay1) = (left, w - right, h - bottom, top);
    for (x, label) in axes.x_ticks {
        let px = sx(*x);
        let _ = write!(
            s,
            r##"<line x1="{px}" y1="{ay0}" x2="{px}" y2="{ay1}" stroke="#eee"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{px}" y="{}" text-anchor="middle">{}</text>"#,
            ay0 + 18.0,
            esc(label)
        );
    }
    let ticks = ((y1 - y0) / step).round() as usize;
    for i in 0..=ticks {
        let y = y0 + step * i as f64;
        let py = sy(y);
        let _ = write!(
            s,
            r##"<line x1="{ax0}" y1="{py}" x2="{ax1}" y2="{py}" stroke="#eee"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            ax0 - 6.0,
            py + 4.0,
            fmt_tick(y, step)
        );
    }
    let _ = write!(
        s,
        r#"<path d="M{ax0} {ay1} L{ax0} {ay0} L{ax1} {ay0}" stroke="black" fill="none"/>"#
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (ax0 + ax1) / 2.0,
        h - 18.0,
        esc(axes.x_label)
    );
    let _ = write!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
        (ay0 + ay1) / 2.0,
        (ay0 + ay1) / 2.0,
        esc(axes.y_label)
    );
    // Lines, markers, legend.
    for (k, ser) in series.iter().enumerate() {
        let c = PALETTE[k % PALETTE.len()];
        let mut pts: Vec<(f64, f64)> = ser
            .points
            .iter()
            .copied()
            .filter(|p| p.1.is_finite())
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(x, y) in &pts {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                sx(x),
                sy(y)
            );
        }
        let ly = top + 10.0 + 18.0 * k as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/>"#,
            ax1 + 15.0,
            ax1 + 35.0
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            ax1 + 40.0,
            ly + 4.0,
            esc(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Writes an SVG document to `path`, creating parent directories.
pub fn write_svg(path: &Path, svg: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}

/// About `n` evenly spaced ticks at round values covering `0..=max`.
pub fn linear_ticks(max: f64, n: usize) -> Vec<(f64, String)> {
    let step = nice_step(max / n.max(1) as f64);
    let count = (max / step).ceil().max(1.0) as usize;
    (0..=count)
        .map(|i| {
            let x = step * i as f64;
            (x, fmt_tick(x, step))
        })
        .collect()
}

fn bounds(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match (lo.is_finite(), hi.is_finite()) {
        (true, true) if hi > lo => (lo, hi),
        (true, true) => (lo, lo + 1.0),
        _ => (0.0, 1.0),
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

fn fmt_tick(y: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{y:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_and_tick() {
        let ticks = vec![(1.0, "100%".to_string()), (0.5, "50%".to_string())];
        let axes = Axes {
            title: "t <x>",
            x_label: "budget",
            y_label: "acc",
            x_ticks: &ticks,
            log2_x: true,
        };
        let series = vec![
            Series {
                name: "a".into(),
                points: vec![(1.0, 0.5), (0.5, 0.4)],
            },
            Series {
                name: "b".into(),
                points: vec![(1.0, 0.5), (0.5, f64::NAN)],
            },
        ];
        let svg = line_plot(&axes, &series);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("t &lt;x&gt;") && svg.contains("50%"));
        assert_eq!(nice_step(0.13), 0.2);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(fmt_tick(0.4, 0.1), "0.4");
    }
}
