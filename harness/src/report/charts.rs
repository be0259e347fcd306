//! The charts of `report.html`, drawn by `plotters` into inline SVG strings.
//!
//! Charts never decide anything: they draw figures computed in `stats`. They must never reference
//! anything outside the SVG (no fonts to fetch, no scripts), so the page works offline. Text that
//! comes from a report goes through plotters' SVG backend, which escapes it.

use std::error::Error;

use plotters::coord::ranged1d::SegmentValue;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::stats::PerSecond;
use crate::check::EventKind;

type Drawn = Result<(), Box<dyn Error>>;

const FONT: &str = "sans-serif";
const INK: RGBColor = RGBColor(0x33, 0x3a, 0x44);

/// Colour of a channel's series.
pub(crate) fn channel_color(channel: &str) -> RGBColor {
    match channel {
        "line" => RGBColor(0x06, 0xa8, 0x4a),
        "email" => RGBColor(0x25, 0x63, 0xeb),
        "sms" => RGBColor(0xea, 0x8a, 0x0c),
        _ => RGBColor(0x64, 0x74, 0x8b),
    }
}

/// Colour of a timeline marker: chaos actions loud, run milestones grey.
pub(crate) fn event_color(kind: EventKind) -> RGBColor {
    use EventKind::*;
    match kind {
        Sigkill => RGBColor(0xdc, 0x26, 0x26),
        Sigterm | RestartBegin => RGBColor(0xf5, 0x9e, 0x0b),
        Sigstop | Sigcont => RGBColor(0x93, 0x33, 0xea),
        Restart => RGBColor(0x08, 0x91, 0xb2),
        ApiSignal => RGBColor(0xbe, 0x18, 0x5d),
        ProviderOutage | ProviderOutageEnd => RGBColor(0x0f, 0x76, 0x6e),
        k if k.starts_provider_link_fault() || k == ProviderLinkHeal => RGBColor(0x0e, 0x74, 0x90),
        k if k.is_database() => RGBColor(0x92, 0x40, 0x0e),
        _ => RGBColor(0x94, 0xa3, 0xb8),
    }
}

fn render(
    width: u32,
    height: u32,
    draw: impl FnOnce(DrawingArea<SVGBackend, plotters::coord::Shift>) -> Drawn,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        draw(root).map_err(|e| format!("chart: {e}"))?;
    }
    Ok(svg)
}

/// A marker on the timeline: seconds since the ledger clock's zero, event kind, label.
pub(crate) struct Marker {
    pub at_s: f64,
    pub kind: EventKind,
    pub label: String,
}

/// Accepted sends per second per channel, injected faults as red bars, and a vertical line for
/// every marker (chaos actions and run milestones).
pub(crate) fn timeline(ps: &PerSecond, markers: &[Marker]) -> Result<String, String> {
    let last_marker = markers.iter().map(|m| m.at_s).fold(0.0, f64::max);
    let x_max = (ps.seconds as f64).max(last_marker + 1.0).max(1.0);
    let peak = ps
        .accepted
        .values()
        .flatten()
        .chain(&ps.faults)
        .copied()
        .max()
        .unwrap_or(0);
    // Head room above the peak for the marker labels.
    let y_max = (f64::from(peak) * 1.3).max(5.0);
    render(1100, 380, |root| {
        root.fill(&WHITE)?;
        let (plot, legend_area) = root.split_horizontally(950);
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(38)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(0xee, 0xf0, 0xf3))
            .bold_line_style(RGBColor(0xdd, 0xe1, 0xe6))
            .x_desc("seconds since the run started")
            .y_desc("per second")
            .label_style((FONT, 13).into_font().color(&INK))
            .axis_desc_style((FONT, 13).into_font().color(&INK))
            .draw()?;
        // (label, colour, drawn as a filled box rather than a line)
        let mut legend: Vec<(String, RGBColor, bool)> = Vec::new();
        let red = RGBColor(0xef, 0x44, 0x44);
        if ps.faults.iter().any(|f| *f > 0) {
            chart.draw_series(ps.faults.iter().enumerate().filter(|(_, f)| **f > 0).map(
                |(s, f)| {
                    let s = s as f64;
                    Rectangle::new(
                        [(s + 0.15, 0.0), (s + 0.85, f64::from(*f))],
                        red.mix(0.35).filled(),
                    )
                },
            ))?;
            legend.push(("injected faults".into(), red, true));
        }
        for (channel, counts) in &ps.accepted {
            let color = channel_color(channel);
            let points = counts
                .iter()
                .enumerate()
                .map(|(s, c)| (s as f64 + 0.5, f64::from(*c)));
            chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?;
            legend.push((format!("{channel} accepted"), color, false));
        }
        // Chaos that lasts (a provider outage, the API down) is a shaded span start–heal.
        for (from, to, kind) in spans(markers, x_max) {
            let color = event_color(kind);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(from, 0.0), (to, y_max)],
                color.mix(0.12).filled(),
            )))?;
        }
        for (i, m) in markers.iter().enumerate() {
            let color = event_color(m.kind);
            let line = DashedPathElement::new(
                vec![(m.at_s, 0.0), (m.at_s, y_max)],
                5,
                3,
                color.stroke_width(2),
            );
            chart.draw_series(std::iter::once(line))?;
            let name = m.kind.label();
            if !legend.iter().any(|l| l.0 == name) {
                legend.push((name.to_string(), color, false));
            }
            // Stagger labels over three rows so neighbouring events stay readable.
            let row = (i % 3) as f64;
            let y = y_max * (0.985 - 0.06 * row);
            let style = (FONT, 12).into_font().color(&color);
            chart.draw_series(std::iter::once(Text::new(
                format!(" {}", m.label),
                (m.at_s, y),
                style,
            )))?;
        }
        // The legend sits beside the plot so it never hides data or markers.
        for (i, (label, color, filled)) in legend.iter().enumerate() {
            let y = 20 + 20 * i as i32;
            if *filled {
                legend_area.draw(&Rectangle::new(
                    [(4, y - 5), (22, y + 5)],
                    color.mix(0.35).filled(),
                ))?;
            } else {
                legend_area.draw(&PathElement::new(
                    vec![(4, y), (22, y)],
                    color.stroke_width(3),
                ))?;
            }
            let style = (FONT, 12)
                .into_font()
                .color(&INK)
                .pos(Pos::new(HPos::Left, VPos::Center));
            legend_area.draw(&Text::new(label.clone(), (28, y), style))?;
        }
        root.present()?;
        Ok(())
    })
}

/// The spans of chaos that lasts, from its start marker to the next marker that heals it (or
/// `x_max` when none did): a provider outage until its end, a fault on a worker's link to a
/// provider until its heal, the API from its signal until a new API was ready.
fn spans(markers: &[Marker], x_max: f64) -> Vec<(f64, f64, EventKind)> {
    use EventKind::*;
    let heals = |start: EventKind, k: EventKind| {
        matches!(
            (start, k),
            (ProviderOutage, ProviderOutageEnd) | (ApiSignal, ApiReady)
        ) || (start.starts_provider_link_fault() && k == ProviderLinkHeal)
    };
    markers
        .iter()
        .filter(|m| {
            matches!(m.kind, ProviderOutage | ApiSignal) || m.kind.starts_provider_link_fault()
        })
        .map(|m| {
            let end = markers
                .iter()
                .filter(|e| e.at_s >= m.at_s && heals(m.kind, e.kind))
                .map(|e| e.at_s)
                .fold(f64::INFINITY, f64::min);
            (m.at_s, if end.is_finite() { end } else { x_max }, m.kind)
        })
        .collect()
}

/// A bar chart over named categories (histogram buckets, attempt counts, workers).
pub(crate) fn bars(
    bars: &[(String, u64)],
    color: RGBColor,
    x_desc: &str,
    y_desc: &str,
    width: u32,
) -> Result<String, String> {
    // A segmented range includes its end, so `0..n - 1` gives exactly n bars.
    let last = bars.len().saturating_sub(1) as u32;
    let y_max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    let y_max = y_max + y_max / 10 + 1;
    render(width, 300, |root| {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(52)
            .build_cartesian_2d((0u32..last).into_segmented(), 0u64..y_max)?;
        let label = |v: &SegmentValue<u32>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                .get(*i as usize)
                .map(|b| b.0.clone())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(0xee, 0xf0, 0xf3))
            .bold_line_style(RGBColor(0xdd, 0xe1, 0xe6))
            // About one label per 70 px, so labels of a narrow chart do not run into each other.
            .x_labels(bars.len().min(24).min((width / 70) as usize).max(2))
            .x_label_formatter(&label)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style((FONT, 12).into_font().color(&INK))
            .axis_desc_style((FONT, 13).into_font().color(&INK))
            .draw()?;
        chart.draw_series(
            Histogram::vertical(&chart)
                .style(color.mix(0.85).filled())
                .margin(3)
                .data(bars.iter().enumerate().map(|(i, b)| (i as u32, b.1))),
        )?;
        root.present()?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lasting_chaos_is_a_span_from_start_to_heal() {
        let m = |at_s: f64, kind: EventKind| Marker {
            at_s,
            kind,
            label: String::new(),
        };
        let markers = [
            m(1.0, EventKind::ApiReady),
            m(2.0, EventKind::ApiSignal),
            m(2.5, EventKind::ProviderOutage),
            m(3.0, EventKind::ApiReady),
            m(9.0, EventKind::ProviderOutageEnd),
            m(10.0, EventKind::ApiSignal),
        ];
        let got: Vec<(f64, f64)> = spans(&markers, 12.0).iter().map(|s| (s.0, s.1)).collect();
        assert_eq!(got, [(2.0, 3.0), (2.5, 9.0), (10.0, 12.0)]);
    }
}
