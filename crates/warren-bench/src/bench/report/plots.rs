//! The report's plots as SVG text, drawn with plotters' SVG backend. Text is emitted as SVG
//! `<text>` (plotters' built-in font estimate lays it out), so no font file is read.
//!
//! Each line series is one `<polyline>`; legend entries are small rectangles, so the polylines
//! of a plot are its series. Each bar is a `<rect>` filled with [`BAR`].

use std::ops::Range;

use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;

/// Plot size in pixels.
const SIZE: (u32, u32) = (800, 480);

/// The colours of successive series (the first is Warren's own).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The fill of every bar (`#1F77B4` in the SVG).
pub const BAR: RGBColor = COLOURS[0];

/// Where a CDF's legend goes: curves rise to the right, so the upper left is free.
const UPPER_LEFT: SeriesLabelPosition = SeriesLabelPosition::UpperLeft;

/// When the largest x over the smallest exceeds this, a CDF's x axis is logarithmic.
const LOG_RATIO: f64 = 20.0;

/// A named line: (x, y) points in drawing order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// The CDF of evenly spaced quantiles (the first at fraction 0, the last at 1).
    pub fn cdf(name: &str, quantiles: &[f64]) -> Series {
        let last = quantiles.len().saturating_sub(1).max(1) as f64;
        Series {
            name: name.to_string(),
            points: quantiles
                .iter()
                .enumerate()
                .map(|(i, &q)| (q, i as f64 / last))
                .collect(),
        }
    }
}

fn drawing_error(what: &str, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot {what:?}: {e}")
}

/// The smallest and largest of `xs`, `None` when there is none that is finite.
fn span(xs: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    xs.filter(|x| x.is_finite()).fold(None, |acc, x| match acc {
        None => Some((x, x)),
        Some((lo, hi)) => Some((lo.min(x), hi.max(x))),
    })
}

/// An axis label: `0.5`, `10`, `2500` (no `.0` on whole numbers, at most three decimals).
fn compact(v: &f64) -> String {
    let t = format!("{v:.3}");
    let t = t.trim_end_matches('0').trim_end_matches('.');
    if t == "-0" {
        "0".into()
    } else {
        t.to_string()
    }
}

/// A range around `lo..hi` that is never empty.
fn padded(lo: f64, hi: f64) -> Range<f64> {
    if hi > lo {
        lo..hi + (hi - lo) * 0.05
    } else {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        lo - d..hi + d
    }
}

/// Latency CDFs: x in milliseconds (logarithmic when the range is wide), y the fraction of
/// samples at or below it.
pub fn cdf(title: &str, series: &[Series]) -> anyhow::Result<String> {
    let (lo, hi) =
        span(series.iter().flat_map(|s| s.points.iter().map(|p| p.0))).unwrap_or((0.0, 1.0));
    let lo_pos = lo.max(1e-3);
    if hi / lo_pos > LOG_RATIO {
        let range = (lo_pos * 0.9..hi * 1.1).log_scale();
        draw_lines(
            title,
            "ms (log scale)",
            "fraction",
            range,
            0.0..1.0,
            series,
            UPPER_LEFT,
        )
    } else {
        let range = padded(0.0, hi);
        draw_lines(title, "ms", "fraction", range, 0.0..1.0, series, UPPER_LEFT)
    }
}

/// Lines on linear axes from 0.
pub fn lines(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> anyhow::Result<String> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (_, xhi) = span(all().map(|p| p.0)).unwrap_or((0.0, 1.0));
    let (ylo, yhi) = span(all().map(|p| p.1)).unwrap_or((0.0, 1.0));
    draw_lines(
        title,
        x_desc,
        y_desc,
        padded(0.0, xhi),
        padded(ylo.min(0.0), yhi),
        series,
        SeriesLabelPosition::LowerRight,
    )
}

fn draw_lines<X>(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x: X,
    y: Range<f64>,
    series: &[Series],
    legend: SeriesLabelPosition,
) -> anyhow::Result<String>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut svg = String::new();
    {
        let err = |e| drawing_error(title, e);
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&compact)
            .y_label_formatter(&compact)
            .light_line_style(WHITE)
            .draw()
            .map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let style = ShapeStyle::from(colour).stroke_width(2);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(err)?
                .label(s.name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 4), (x + 16, y + 4)], colour.filled())
                });
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .position(legend)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// One bar per (name, value), named under the x axis (some names are left out when there are
/// many bars).
pub fn bars(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    bars: &[(String, f64)],
) -> anyhow::Result<String> {
    let n = bars.len().max(1);
    let (_, hi) = span(bars.iter().map(|b| b.1)).unwrap_or((0.0, 1.0));
    let top = if hi > 0.0 { hi * 1.1 } else { 1.0 };
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut svg = String::new();
    {
        let err = |e| drawing_error(title, e);
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top)
            .map_err(err)?;
        let label = |v: &f64| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n.min(12))
            .x_label_formatter(&label)
            .y_label_formatter(&compact)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .light_line_style(WHITE)
            .draw()
            .map_err(err)?;
        let width = if n > 40 { 0.42 } else { 0.35 };
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                let x = i as f64;
                Rectangle::new([(x - width, 0.0), (x + width, *v)], BAR.filled())
            }))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_and_ranges() {
        let labels: Vec<String> = [0.0, -0.0, 0.5, 10.0, 2500.0, 0.125, 1.0 / 3.0]
            .iter()
            .map(compact)
            .collect();
        assert_eq!(labels, ["0", "0", "0.5", "10", "2500", "0.125", "0.333"]);
        assert_eq!(padded(0.0, 0.0), -1.0..1.0);
        assert_eq!(padded(0.0, 10.0), 0.0..10.5);
        assert_eq!(span([f64::NAN, 3.0, 1.0].into_iter()), Some((1.0, 3.0)));
        assert_eq!(span(std::iter::empty()), None);
        // A single point still draws (the range is widened), as one series.
        let svg = lines(
            "one",
            "x",
            "y",
            &[Series {
                name: "p".into(),
                points: vec![(1.0, 1.0)],
            }],
        );
        assert!(svg.unwrap().contains("<polyline"));
    }
}
