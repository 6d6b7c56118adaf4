//! The timeline (`timeline.svg`): every turn's speech, endpointing and
//! stage work as bars on the report's clock.

use plotters::prelude::*;

use super::schema::{Report, ReportClock};
use voxline_pipeline::topology::{LLM, STT, VAD};

/// Each turn's bars, one per row of `rows`: `(row, start, end)` in ms on
/// the report's clock. A stage on the response's path is where the report's
/// clock put it; any other is where it ran on the wall clock, or on the
/// virtual clock right after the row before it, for its busy time.
fn timeline_bars(r: &Report, rows: &[&str]) -> Vec<(usize, f64, f64)> {
    let mut bars = Vec::new();
    for t in &r.turns {
        let tl = &t.timeline;
        let start_speech = tl.end_of_speech_ms - t.audio_ms.min(tl.end_of_speech_ms);
        let mut previous_end = tl.closed_ms;
        for (row, name) in rows.iter().enumerate() {
            let span = match *name {
                "speech" => Some([start_speech, tl.end_of_speech_ms]),
                "endpoint" => Some([tl.end_of_speech_ms, tl.closed_ms]),
                n if tl.stages.contains_key(n) => tl.stages.get(n).copied(),
                n => t.work.get(n).map(|w| {
                    if r.clock == ReportClock::Wall {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StageWork, TurnReport};

    /// A report of one turn: speech 1000–2000 ms, closed at 2700, STT
    /// 2700–3200, `upper` (5 ms busy) 3200–3210 on the wall clock, LLM 3300–3600.
    fn report(clock: ReportClock) -> Report {
        let mut t = TurnReport {
            audio_ms: 1000.0,
            ..TurnReport::default()
        };
        t.timeline.end_of_speech_ms = 2000.0;
        t.timeline.closed_ms = 2700.0;
        t.timeline.stages.insert("stt".into(), [2700.0, 3200.0]);
        t.timeline.stages.insert("llm".into(), [3300.0, 3600.0]);
        t.work.insert(
            "upper".into(),
            StageWork {
                start_ms: 3200.0,
                end_ms: 3210.0,
                busy_ms: 5.0,
            },
        );
        let mut r = Report {
            clock,
            turns: vec![t],
            ..Report::default()
        };
        r.summary.audio_s = 4.0;
        r.summary.bottleneck.throughput = Some("stt".into());
        r
    }

    const ROWS: [&str; 5] = ["speech", "endpoint", "stt", "upper", "llm"];

    #[test]
    fn an_added_stage_is_where_it_ran_on_the_wall_clock() {
        let bars = timeline_bars(&report(ReportClock::Wall), &ROWS);
        assert_eq!(
            bars,
            [
                (0, 1000.0, 2000.0),
                (1, 2000.0, 2700.0),
                (2, 2700.0, 3200.0),
                (3, 3200.0, 3210.0),
                (4, 3300.0, 3600.0),
            ]
        );
    }

    #[test]
    fn an_added_stage_follows_the_row_before_it_on_the_virtual_clock() {
        let bars = timeline_bars(&report(ReportClock::Virtual), &ROWS);
        assert_eq!(bars[3], (3, 3200.0, 3205.0));
        assert_eq!(bars.len(), 5);
        // a stage with no work on the turn has no bar
        let bars = timeline_bars(&report(ReportClock::Virtual), &["speech", "tts"]);
        assert_eq!(bars, [(0, 1000.0, 2000.0)]);
    }

    #[test]
    fn the_svg_names_the_bottlenecks_and_colours_the_throughput_one_red() {
        let mut r = report(ReportClock::Virtual);
        r.topology =
            voxline_pipeline::topology::standard(voxline_pipeline::topology::AudioEdge::Replay, 4);
        let svg = timeline_svg(&r).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains(
            "voxline timeline (virtual clock) — throughput bottleneck: stt · latency bottleneck: –"
        ));
        for row in ["speech", "endpoint", "stt", "llm"] {
            assert!(svg.contains(&format!("\n{row}\n")), "no {row} label");
        }
        assert!(!svg.contains("\nvad\n") && !svg.contains("\nsink\n"));
        // the STT's bar in red, the LLM's in green
        assert!(svg.contains("#D62728"), "{svg}");
        assert!(svg.contains("#2CA02C"));
        assert!(
            !svg.contains("#1F77B4"),
            "the STT is not drawn in its own colour"
        );
    }
}
