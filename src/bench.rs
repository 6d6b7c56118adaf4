//! `voxline bench` outputs: CSV, the SVG timeline, a Chrome/Perfetto trace,
//! and the comparison with a baseline report.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;
use voxline_core::SpanKind;

use crate::pipeline::RunResult;
use crate::report::Report;
use crate::topology::{LLM, SINK, STT, VAD};
use crate::BadInput;

/// The stages of `r`'s topology that the fixed columns and rows do not
/// cover (any stage added to the standard pipeline), in flow order.
fn added_stages(r: &Report) -> Vec<&str> {
    r.topology
        .stages()
        .iter()
        .filter(|s| ![VAD, STT, LLM, SINK].contains(&s.id) && !s.is_sink())
        .map(|s| s.id.as_str())
        .collect()
}

/// One row per turn; a `<stage>_busy_ms` column for each stage added to
/// the standard pipeline (its measured busy time on the turn).
#[must_use]
pub fn to_csv(r: &Report) -> String {
    let added = added_stages(r);
    let mut s = String::from("id,warmup,file,transcript,expected,wer,response_chars,endpoint_delay_ms,stt_queue_ms,stt_ms,stt_rtfx,stt_tokens,llm_queue_ms,llm_ttft_ms,llm_first_token_ms,llm_prefill_tokens,llm_prefill_tps,llm_generated_tokens,llm_decode_tps,response_latency_ms,error");
    for stage in &added {
        let _ = write!(s, ",{stage}_busy_ms");
    }
    s.push('\n');
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    let q =
        |v: Option<&str>| v.map_or(String::new(), |x| format!("\"{}\"", x.replace('"', "\"\"")));
    for t in &r.turns {
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            t.id,
            t.warmup,
            q(t.file.as_ref().map(|p| p.display().to_string()).as_deref()),
            q(t.transcript.as_deref()),
            q(t.expected.as_deref()),
            f(t.wer),
            t.response.as_ref().map_or(0, String::len),
            f(t.endpoint_delay_ms),
            f(t.stt_queue_ms),
            f(t.stt_ms),
            f(t.stt_rtfx),
            t.stt_tokens.map_or(String::new(), |n| n.to_string()),
            f(t.llm_queue_ms),
            f(t.llm_ttft_ms),
            f(t.llm_first_token_ms),
            t.llm_prefill_tokens
                .map_or(String::new(), |n| n.to_string()),
            f(t.llm_prefill_tps),
            t.llm_generated_tokens
                .map_or(String::new(), |n| n.to_string()),
            f(t.llm_decode_tps),
            f(t.response_latency_ms),
            q(t.error.as_deref()),
        );
        for stage in &added {
            let _ = write!(s, ",{}", f(t.work.get(*stage).map(|w| w.busy_ms)));
        }
        s.push('\n');
    }
    s
}

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

#[derive(Serialize)]
struct TraceEvent<'a> {
    name: String,
    cat: &'a str,
    ph: &'a str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: usize,
    args: serde_json::Value,
}

/// Every runtime span as a Chrome/Perfetto trace (`chrome://tracing`, ui.perfetto.dev), on the wall clock.
#[must_use]
pub fn chrome_trace(run: &RunResult) -> String {
    let mut stages: Vec<&str> = Vec::new();
    for s in &run.outcome.spans {
        if !stages.contains(&s.stage.as_str()) {
            stages.push(&s.stage);
        }
    }
    let us = |i: std::time::Instant| run.clock.ms_since_origin(i) * 1000.0;
    let mut events: Vec<TraceEvent<'_>> = Vec::new();
    for s in &run.outcome.spans {
        let tid = stages.iter().position(|n| *n == s.stage).unwrap_or(0) + 1;
        let name = match (s.kind, s.utterance) {
            (SpanKind::Finish, _) => format!("{} finish", s.stage),
            (_, Some(id)) => format!("{} #{id}", s.stage),
            _ => s.stage.clone(),
        };
        events.push(TraceEvent {
            name,
            cat: "stage",
            ph: "X",
            ts: us(s.started),
            dur: s.elapsed().as_secs_f64() * 1e6,
            pid: 1,
            tid,
            args: serde_json::json!({ "queue_wait_ms": s.queue_wait().as_secs_f64() * 1000.0, "emitted": s.emitted, "queue_depth_at_start": s.queue_depth_at_start }),
        });
    }
    let names: Vec<serde_json::Value> = stages
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": i + 1, "args": {"name": n}}))
        .collect();
    let mut all: Vec<serde_json::Value> = names;
    all.extend(events.iter().filter_map(|e| serde_json::to_value(e).ok()));
    serde_json::json!({ "traceEvents": all, "displayTimeUnit": "ms" }).to_string()
}

/// One metric compared with a baseline.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Comparison {
    /// Metric path in report.json.
    pub metric: String,
    /// The baseline's value.
    pub baseline: f64,
    /// This run's value.
    pub current: f64,
    /// current / baseline.
    pub ratio: f64,
    /// `better`, `worse` or `same` (within ±5 %), knowing which direction is good.
    pub verdict: String,
}

/// The metrics compared, with whether higher is better.
const COMPARED: [(&str, bool); 9] = [
    ("summary.response_latency_ms.p50", false),
    ("summary.response_latency_ms.p95", false),
    ("summary.endpoint_delay_ms.p50", false),
    ("summary.stt_ms.p50", false),
    ("summary.stt_rtfx.p50", true),
    ("summary.llm_ttft_ms.p50", false),
    ("summary.llm_prefill_tps.p50", true),
    ("summary.llm_decode_tps.p50", true),
    ("summary.wer", false),
];

fn lookup(v: &serde_json::Value, path: &str) -> Option<f64> {
    path.split('.').try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Loads a baseline report.json.
///
/// # Errors
/// [`BadInput`] when the baseline is unreadable, not a report, or of another schema version.
pub fn load_baseline(baseline_path: &Path) -> Result<serde_json::Value, BadInput> {
    let text = std::fs::read(baseline_path).map_err(|e| {
        BadInput(format!(
            "{}: cannot read the baseline ({}); check the path given to --baseline",
            baseline_path.display(),
            crate::io_reason(&e)
        ))
    })?;
    let base: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        BadInput(format!(
            "{}: not a voxline report.json ({e})",
            baseline_path.display()
        ))
    })?;
    let version = base
        .get("schema_version")
        .and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(crate::report::SCHEMA_VERSION)) {
        let found = version.map_or_else(
            || "has no schema_version (is it a voxline report.json?)".to_string(),
            |v| format!("is a report of schema version {v}"),
        );
        return Err(BadInput(format!(
            "{}: {found}, this voxline writes version {}; re-run the baseline with this version",
            baseline_path.display(),
            crate::report::SCHEMA_VERSION
        )));
    }
    Ok(base)
}

/// Compares a report with a baseline report (both as JSON values); the
/// overall verdict is `regressed` when any compared metric got worse by
/// more than 5 %, `improved` when none got worse and one got better, else
/// `unchanged`.
#[must_use]
pub fn compare_values(
    cur: &serde_json::Value,
    base: &serde_json::Value,
) -> (Vec<Comparison>, String) {
    let mut out = Vec::new();
    for (metric, higher_better) in COMPARED {
        let (Some(b), Some(c)) = (lookup(base, metric), lookup(cur, metric)) else {
            continue;
        };
        let ratio = if b == 0.0 {
            if c == 0.0 {
                1.0
            } else {
                f64::INFINITY
            }
        } else {
            c / b
        };
        let better = if higher_better {
            ratio > 1.05
        } else {
            ratio < 0.95
        };
        let worse = if higher_better {
            ratio < 0.95
        } else {
            ratio > 1.05
        };
        let verdict = if better {
            "better"
        } else if worse {
            "worse"
        } else {
            "same"
        };
        out.push(Comparison {
            metric: metric.into(),
            baseline: b,
            current: c,
            ratio,
            verdict: verdict.into(),
        });
    }
    let overall = if out.iter().any(|c| c.verdict == "worse") {
        "regressed"
    } else if out.iter().any(|c| c.verdict == "better") {
        "improved"
    } else {
        "unchanged"
    };
    (out, overall.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_ratios_and_verdicts() {
        let base = serde_json::json!({"summary": {"response_latency_ms": {"p50": 1000.0, "p95": 2000.0}, "llm_decode_tps": {"p50": 80.0}, "wer": 0.0}});
        let cur = serde_json::json!({"summary": {"response_latency_ms": {"p50": 500.0, "p95": 2050.0}, "llm_decode_tps": {"p50": 60.0}, "wer": 0.0}});
        let (c, overall) = compare_values(&cur, &base);
        let get = |m: &str| c.iter().find(|x| x.metric == m).unwrap().clone();
        assert_eq!(get("summary.response_latency_ms.p50").ratio, 0.5);
        assert_eq!(get("summary.response_latency_ms.p50").verdict, "better");
        assert_eq!(get("summary.response_latency_ms.p95").verdict, "same");
        assert_eq!(get("summary.llm_decode_tps.p50").ratio, 0.75);
        assert_eq!(get("summary.llm_decode_tps.p50").verdict, "worse");
        assert_eq!(get("summary.wer").ratio, 1.0);
        assert_eq!(overall, "regressed");
        assert_eq!(c.len(), 4, "metrics absent from either side are skipped");
        let (_, overall) = compare_values(&base, &base);
        assert_eq!(overall, "unchanged");
    }
}
