//! SVG plots of benchmark results (plotters, SVG backend: no fonts or native libraries needed):
//! the TTFT distribution of each router as a CDF on a log axis, and a latency percentile
//! against offered load.

use std::path::Path;

use plotters::prelude::*;
use thiserror::Error;

/// A plot could not be drawn or written.
#[derive(Debug, Error)]
#[error("drawing {path}: {message}")]
pub struct PlotError {
    pub path: String,
    pub message: String,
}

/// One line: a label and its points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Turns samples into CDF points (x = value, y = fraction ≤ x).
pub fn cdf(mut samples: Vec<f64>) -> Vec<(f64, f64)> {
    samples.sort_by(f64::total_cmp);
    let n = samples.len() as f64;
    samples
        .iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

/// TTFT CDF per router; x on a log axis (ms).
pub fn ttft_cdf(path: &Path, title: &str, series: &[Series]) -> Result<(), PlotError> {
    draw(
        path,
        title,
        "TTFT (ms, log scale)",
        "fraction of requests",
        series,
        true,
    )
}

/// A latency figure (y, ms) against offered load (x, requests/s), one line per router.
pub fn latency_vs_load(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    draw(
        path,
        title,
        "offered load (requests/s)",
        y_label,
        series,
        false,
    )
}

fn draw(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    cdf_plot: bool,
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let all = || series.iter().flat_map(|s| s.points.iter());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max) * 1.1;
    let x_min = all()
        .map(|p| p.0)
        .filter(|x| *x > 0.0)
        .fold(f64::INFINITY, f64::min);
    let y_max = if cdf_plot {
        1.0
    } else {
        all().map(|p| p.1).fold(1.0, f64::max) * 1.1
    };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64);
    if cdf_plot {
        let lo = if x_min.is_finite() { x_min * 0.8 } else { 1.0 };
        let mut chart = builder
            .build_cartesian_2d((lo..x_max).log_scale(), 0.0..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(|e| err(&e))?;
        lines(&mut chart, series).map_err(|e| err(&e))?;
    } else {
        // Latency on a log axis: cache-aware routers (hundreds of ms) and cache-blind ones (tens
        // of seconds) differ by two orders of magnitude; a linear axis flattens the former.
        let y_min = all()
            .map(|p| p.1)
            .filter(|y| *y > 0.0)
            .fold(f64::INFINITY, f64::min);
        let lo = if y_min.is_finite() { y_min * 0.8 } else { 1.0 };
        let mut chart = builder
            .build_cartesian_2d(0.0..x_max, (lo..y_max).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(|e| err(&e))?;
        lines(&mut chart, series).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;

fn lines<X, Y>(
    chart: &mut Chart<'_, X, Y>,
    series: &[Series],
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_rises_to_one_in_value_order() {
        assert_eq!(
            cdf(vec![3.0, 1.0, 2.0, 4.0]),
            vec![(1.0, 0.25), (2.0, 0.5), (3.0, 0.75), (4.0, 1.0)]
        );
    }

    #[test]
    fn both_plots_write_svg_files() {
        let dir = std::env::temp_dir().join(format!("epp-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = vec![Series {
            label: "a".into(),
            points: cdf(vec![10.0, 20.0, 400.0]),
        }];
        ttft_cdf(&dir.join("cdf.svg"), "t", &s).unwrap();
        let l = vec![
            Series {
                label: "b".into(),
                points: vec![(1.0, 10.0), (2.0, 30.0)],
            },
            Series {
                label: "c".into(),
                points: vec![(1.0, 20.0), (2.0, 25_000.0)],
            },
        ];
        latency_vs_load(&dir.join("load.svg"), "t", "TTFT p90 (ms)", &l).unwrap();
        let load = std::fs::read_to_string(dir.join("load.svg")).unwrap();
        assert!(
            load.contains("TTFT p90 (ms)") && load.matches("<polyline").count() >= 2,
            "both series drawn on the log axis"
        );
        let text = std::fs::read_to_string(dir.join("cdf.svg")).unwrap();
        assert!(text.starts_with("<svg") && text.contains("TTFT"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
