//! Log-log line charts (SVG) of values by copy size, for `cargo xtask bench`'s plots.

use std::path::Path;

use anyhow::{ensure, Result};
use plotters::prelude::*;

/// One line of a chart: x = log2(size in bytes), y > 0.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub color: RGBColor,
    pub dashed: bool,
}

pub const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// A log-log chart: x is log2 of the size (labelled in bytes), y on a log scale.
pub fn line_chart(path: &Path, title: &str, y_desc: &str, series: &[Series]) -> Result<()> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    ensure!(x0 <= x1, "nothing to plot");
    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x0 - 0.25)..(x1 + 0.25),
            ((y0 / 1.5)..(y1 * 1.5)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc(y_desc)
        // Enough labels that plotters steps by 1 or 2 powers of two (never 5).
        .x_labels(((x1 - x0).ceil() as usize) / 2 + 2)
        .x_label_formatter(&|x| size_label(*x))
        .y_label_formatter(&|y| number_label(*y))
        .draw()?;
    for s in series.iter().filter(|s| !s.points.is_empty()) {
        let color = s.color;
        let style = color.stroke_width(2);
        let drawn = if s.dashed {
            chart.draw_series(DashedLineSeries::new(s.points.iter().copied(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(s.points.iter().copied(), style))?
        };
        // Three segments either way (one element type): gapped when dashed, touching when not.
        let gap = if s.dashed { 3 } else { 0 };
        drawn.label(s.label.clone()).legend(move |(x, y)| {
            let style = color.stroke_width(2);
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (7, 0)], style)
                + PathElement::new(vec![(7 + gap, 0), (17 - gap, 0)], style)
                + PathElement::new(vec![(17, 0), (24, 0)], style)
        });
        if !s.dashed {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

/// `2^x` bytes as `1`, `512`, `4K`, `16M`; empty between powers of two.
pub fn size_label(x: f64) -> String {
    if (x - x.round()).abs() > 1e-6 || !(0.0..=62.0).contains(&x) {
        return String::new();
    }
    let n = 1u64 << x.round() as u32;
    match n {
        n if n >= 1 << 30 => format!("{}G", n >> 30),
        n if n >= 1 << 20 => format!("{}M", n >> 20),
        n if n >= 1 << 10 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// A tick value without float noise: 1500, 12.5, 0.03.
pub fn number_label(y: f64) -> String {
    let s = if y >= 100.0 {
        format!("{y:.0}")
    } else if y >= 1.0 {
        format!("{y:.1}")
    } else {
        format!("{y:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(size_label(0.0), "1");
        assert_eq!(size_label(9.0), "512");
        assert_eq!(size_label(12.0), "4K");
        assert_eq!(size_label(24.0), "16M");
        assert_eq!(size_label(2.5), "");
        assert_eq!(number_label(1500.0), "1500");
        assert_eq!(number_label(12.5), "12.5");
        assert_eq!(number_label(0.03), "0.03");
        assert_eq!(number_label(10.0), "10");
    }

    #[test]
    fn plots_render_without_fonts() {
        let dir = std::env::temp_dir().join(format!("xtask-benchmarks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let series = [Series {
            label: "write".into(),
            points: vec![(0.0, 0.5), (10.0, 500.0), (20.0, 1800.0)],
            color: COLORS[0],
            dashed: false,
        }];
        line_chart(&path, "t", "MiB/s", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<text") && svg.contains("1M"), "{svg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
