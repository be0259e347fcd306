//! Where a benchmark's figures go besides the terminal: `<root>/<name>-<UTC stamp>/bench.json`
//! and `chart.svg` (throughput against worker count, one line per system and batch size, drawn
//! with plotters on log–log axes so a 100× gap and a 2× slope are both readable).
//!
//! It writes what it is given and never measures anything itself; it must never draw a point it
//! was not given.

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;

/// One line of a chart: (worker count, per second) points.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed: a ceiling or a peer, not the system under test.
    pub reference: bool,
}

const FONT: &str = "sans-serif";
const INK: RGBColor = RGBColor(0x33, 0x3a, 0x44);
const PALETTE: [RGBColor; 8] = [
    RGBColor(0x25, 0x63, 0xeb),
    RGBColor(0x06, 0xa8, 0x4a),
    RGBColor(0xea, 0x8a, 0x0c),
    RGBColor(0xdc, 0x26, 0x26),
    RGBColor(0x93, 0x33, 0xea),
    RGBColor(0x08, 0x91, 0xb2),
    RGBColor(0x92, 0x40, 0x0e),
    RGBColor(0x64, 0x74, 0x8b),
];

/// Writes `bench.json` (pretty) and, when there are points, `chart.svg` into a fresh
/// `<root>/<name>-<stamp>/`; returns that directory.
pub fn write(
    root: &Path,
    name: &str,
    json: &serde_json::Value,
    chart_title: &str,
    y_desc: &str,
    series: &[Series],
) -> anyhow::Result<PathBuf> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let dir = root.join(format!("{name}-{stamp}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = serde_json::to_string_pretty(json).context("serializing bench.json")?;
    std::fs::write(dir.join("bench.json"), text + "\n").context("writing bench.json")?;
    if series.iter().any(|s| !s.points.is_empty()) {
        let svg = chart(chart_title, y_desc, series).map_err(|e| anyhow::anyhow!("chart: {e}"))?;
        std::fs::write(dir.join("chart.svg"), svg).context("writing chart.svg")?;
    }
    Ok(dir)
}

/// The SVG: x = workers (log2), y = `y_desc` (log10).
pub fn chart(title: &str, y_desc: &str, series: &[Series]) -> Result<String, String> {
    let pts = || series.iter().flat_map(|s| &s.points).filter(|p| p.1 > 0.0);
    let x_max = pts().map(|p| p.0).fold(1.0, f64::max).max(2.0);
    let y_min = pts().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = pts().map(|p| p.1).fold(0.0, f64::max);
    let (y_min, y_max) = if y_max > 0.0 {
        (y_min / 1.5, y_max * 1.5)
    } else {
        (1.0, 10.0)
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 480)).into_drawing_area();
        let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
            root.fill(&WHITE)?;
            let (plot, legend) = root.split_horizontally(740);
            let mut c = ChartBuilder::on(&plot)
                .caption(title, (FONT, 16).into_font().color(&INK))
                .margin(12)
                .x_label_area_size(38)
                .y_label_area_size(64)
                .build_cartesian_2d(
                    (1f64..x_max).log_scale(),
                    (y_min.max(0.1)..y_max).log_scale(),
                )?;
            c.configure_mesh()
                .light_line_style(RGBColor(0xee, 0xf0, 0xf3))
                .bold_line_style(RGBColor(0xdd, 0xe1, 0xe6))
                .x_desc("workers (connections)")
                .y_desc(y_desc)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.0}"))
                .label_style((FONT, 12).into_font().color(&INK))
                .axis_desc_style((FONT, 13).into_font().color(&INK))
                .draw()?;
            for (i, s) in series.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                let points: Vec<(f64, f64)> =
                    s.points.iter().copied().filter(|p| p.1 > 0.0).collect();
                if s.reference {
                    c.draw_series(DashedLineSeries::new(
                        points.clone(),
                        6,
                        4,
                        color.stroke_width(2),
                    ))?;
                } else {
                    c.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
                }
                c.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
                let y = 24 + 20 * i as i32;
                let stroke = color.stroke_width(3);
                if s.reference {
                    legend.draw(&PathElement::new(vec![(4, y), (10, y)], stroke))?;
                    legend.draw(&PathElement::new(vec![(16, y), (22, y)], stroke))?;
                } else {
                    legend.draw(&PathElement::new(vec![(4, y), (22, y)], stroke))?;
                }
                let style = (FONT, 12)
                    .into_font()
                    .color(&INK)
                    .pos(Pos::new(HPos::Left, VPos::Center));
                legend.draw(&Text::new(s.name.clone(), (28, y), style))?;
            }
            root.present()?;
            Ok(())
        })();
        drawn.map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_one_path_per_series_and_escapes_names() {
        let series = vec![
            Series {
                name: "stack batch 1".into(),
                points: vec![(1.0, 1000.0), (2.0, 1800.0)],
                reference: false,
            },
            Series {
                name: "pgbench <batch 1>".into(),
                points: vec![(1.0, 1100.0), (2.0, 0.0)],
                reference: true,
            },
        ];
        let svg = chart("claims", "rows/s", &series).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("stack batch 1"));
        assert!(svg.contains("pgbench &lt;batch 1&gt;"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn writes_json_and_svg_into_a_fresh_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let s = [Series {
            name: "x".into(),
            points: vec![(1.0, 5.0)],
            reference: false,
        }];
        let dir = write(
            tmp.path(),
            "t",
            &serde_json::json!({"a": 1}),
            "t",
            "r/s",
            &s,
        )
        .unwrap();
        let back: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("bench.json")).unwrap()).unwrap();
        assert_eq!(back["a"], 1);
        assert!(dir.join("chart.svg").is_file());
        assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("t-"));
    }
}
