//! The timeline (`timeline.svg`): every turn's speech, endpointing and
//! stage work as bars on the report's clock.

use plotters::prelude::*;

use super::schema::Report;
use crate::topology::{LLM, STT, VAD};

/// Each turn's bars, one per row of `rows`: `(row, start, end)` in ms on
/// the report's clock. The STT and the LLM are where the report's clock put
/// them; a stage added to the pipeline is where it ran on the wall clock, or
/// on the virtual clock right after the row before it, for its busy time.
fn timeline_bars(r: &Report, rows: &[&str]) -> Vec<(usize, f64, f64)> {
    let mut bars = Vec::new();
    for t in &r.turns {
        let tl = t.timeline;
        let start_speech = tl.end_of_speech_ms - t.audio_ms.min(tl.end_of_speech_ms);
        let mut previous_end = tl.closed_ms;
        for (row, name) in rows.iter().enumerate() {
            let span = match *name {
                "speech" => Some([start_speech, tl.end_of_speech_ms]),
                "endpoint" => Some([tl.end_of_speech_ms, tl.closed_ms]),
                n if n == STT => tl.stt_ms,
                n if n == LLM => tl.llm_ms,
                n => t.work.get(n).map(|w| {
                    if r.clock == "wall" {
                        [w.start_ms, w.end_ms]
                    } else {
                        [previous_end, previous_end + w.busy_ms]
                    }
                }),
            };
            if let Some([a, b]) = span {
                bars.push((row, a, b));
                previous_end = b;
            }
        }
    }
    bars
}

/// Draws the timeline: a row for the speech, one for the endpointer's
/// delay, then one per stage of the topology (the VAD and the sink aside),
/// a bar per turn on the report's clock; the throughput bottleneck's row is
/// red.
///
/// # Errors
/// A message when the SVG cannot be drawn or written.
pub fn timeline_svg(r: &Report) -> Result<String, String> {
    let mut svg = String::new();
    let mut rows = vec!["speech", "endpoint"];
    rows.extend(
        r.topology
            .stages()
            .iter()
            .filter(|s| s.id != VAD && !s.is_sink())
            .map(|s| s.id.as_str()),
    );
    let bars = timeline_bars(r, &rows);
    let end = bars
        .iter()
        .map(|(_, _, b)| *b)
        .fold(r.summary.audio_s * 1000.0, f64::max)
        .max(1.0);
    let bottleneck = r.summary.bottleneck.throughput.clone().unwrap_or_default();
    draw_timeline(r, &rows, &bars, end, &bottleneck, &mut svg)?;
    Ok(svg)
}

fn draw_timeline(
    r: &Report,
    rows: &[&str],
    bars: &[(usize, f64, f64)],
    end: f64,
    bottleneck: &str,
    svg: &mut String,
) -> Result<(), String> {
    let root = SVGBackend::with_string(svg, (1200, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "voxline timeline ({} clock) — throughput bottleneck: {} · latency bottleneck: {}",
        r.clock,
        if bottleneck.is_empty() {
            "–"
        } else {
            &bottleneck
        },
        r.summary.bottleneck.latency.as_deref().unwrap_or("–")
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..end / 1000.0, (0..rows.len()).into_segmented())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("seconds")
        .y_labels(rows.len())
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => rows.get(*i).map_or(String::new(), |s| (*s).to_string()),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| e.to_string())?;
    // the endpoint row is the VAD's work: a VAD bottleneck colours it
    let is_bottleneck = |row: &str| row == bottleneck || (row == "endpoint" && VAD == bottleneck);
    let colour = |row: &str| {
        if is_bottleneck(row) {
            RGBColor(214, 39, 40)
        } else {
            match row {
                "speech" => RGBColor(150, 150, 150),
                "endpoint" => RGBColor(188, 189, 34),
                n if n == STT => RGBColor(31, 119, 180),
                n if n == LLM => RGBColor(44, 160, 44),
                _ => RGBColor(255, 127, 14),
            }
        }
    };
    chart
        .draw_series(bars.iter().map(|&(row, a, b)| {
            Rectangle::new(
                [
                    (a / 1000.0, SegmentValue::Exact(row)),
                    (b.max(a + 1.0) / 1000.0, SegmentValue::Exact(row + 1)),
                ],
                colour(rows[row]).mix(0.85).filled(),
            )
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
