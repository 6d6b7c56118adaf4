//! `voxline bench` outputs: a Chrome/Perfetto trace and the comparison
//! with a baseline report. The CSV and the SVG timeline are the report's
//! renderers ([`crate`]), re-exported here.

use std::path::Path;

use serde::Serialize;
use voxline_core::SpanKind;

use voxline_pipeline::pipeline::RunResult;
use voxline_pipeline::BadInput;

pub use crate::{timeline_svg, to_csv, to_markdown};

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
    /// Better, worse or the same (within ±5 %), knowing which direction is good.
    pub verdict: Verdict,
}

/// One metric against the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// More than 5 % better.
    Better,
    /// More than 5 % worse.
    Worse,
    /// Within ±5 %.
    Same,
}

/// The run against the baseline: regressed when any metric is worse,
/// improved when none is worse and one is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Overall {
    /// Some metric is better, none worse.
    Improved,
    /// Every metric within ±5 %.
    #[default]
    Unchanged,
    /// Some metric is worse.
    Regressed,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::Same => "same",
        })
    }
}

impl std::fmt::Display for Overall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Overall::Improved => "improved",
            Overall::Unchanged => "unchanged",
            Overall::Regressed => "regressed",
        })
    }
}

/// The metrics compared, with whether higher is better.
/// (the voice's only where both runs spoke).
const COMPARED: [(&str, bool); 12] = [
    ("summary.response_latency_ms.p50", false),
    ("summary.response_latency_ms.p95", false),
    ("summary.endpoint_delay_ms.p50", false),
    ("summary.stt_ms.p50", false),
    ("summary.stt_rtfx.p50", true),
    ("summary.llm_ttft_ms.p50", false),
    ("summary.llm_prefill_tps.p50", true),
    ("summary.llm_decode_tps.p50", true),
    ("summary.wer", false),
    ("summary.voice_latency_ms.p50", false),
    ("summary.voice_latency_ms.p95", false),
    ("summary.tts_first_audio_ms.p50", false),
];

fn lookup(v: &serde_json::Value, path: &str) -> Option<f64> {
    path.split('.').try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// The oldest report schema a baseline may have: the figures compared
/// (the summary's percentiles, rates and WER) mean in it what they mean now
/// (version 3 added the latency terms and moved the timeline's stage spans,
/// version 2 changed only `summary.dropped`, which is not compared).
pub const BASELINE_SINCE: u32 = 2;

/// Loads a baseline report.json.
///
/// # Errors
/// [`BadInput`] when the baseline is unreadable, not a report, or of a
/// schema version before [`BASELINE_SINCE`] or after this one.
pub fn load_baseline(baseline_path: &Path) -> Result<serde_json::Value, BadInput> {
    let text = std::fs::read(baseline_path).map_err(|e| {
        BadInput(format!(
            "{}: cannot read the baseline ({}); check the path given to --baseline",
            baseline_path.display(),
            voxline_pipeline::io_reason(&e)
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
    let comparable = u64::from(BASELINE_SINCE)..=u64::from(crate::SCHEMA_VERSION);
    if !version.is_some_and(|v| comparable.contains(&v)) {
        let found = version.map_or_else(
            || "has no schema_version (is it a voxline report.json?)".to_string(),
            |v| format!("is a report of schema version {v}"),
        );
        return Err(BadInput(format!(
            "{}: {found}, this voxline writes version {} and compares with versions {BASELINE_SINCE} to {}; re-run the baseline with this version",
            baseline_path.display(),
            crate::SCHEMA_VERSION,
            crate::SCHEMA_VERSION
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
) -> (Vec<Comparison>, Overall) {
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
            Verdict::Better
        } else if worse {
            Verdict::Worse
        } else {
            Verdict::Same
        };
        out.push(Comparison {
            metric: metric.into(),
            baseline: b,
            current: c,
            ratio,
            verdict,
        });
    }
    let overall = if out.iter().any(|c| c.verdict == Verdict::Worse) {
        Overall::Regressed
    } else if out.iter().any(|c| c.verdict == Verdict::Better) {
        Overall::Improved
    } else {
        Overall::Unchanged
    };
    (out, overall)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baseline_of_an_earlier_comparable_schema_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let write = |v: u32| {
            let p = dir.path().join(format!("v{v}.json"));
            std::fs::write(&p, format!(r#"{{"schema_version": {v}, "summary": {{}}}}"#)).unwrap();
            p
        };
        for v in BASELINE_SINCE..=crate::SCHEMA_VERSION {
            assert!(load_baseline(&write(v)).is_ok(), "version {v}");
        }
        for v in [BASELINE_SINCE - 1, crate::SCHEMA_VERSION + 1] {
            let e = load_baseline(&write(v)).unwrap_err().0;
            assert!(
                e.contains(&format!("schema version {v}"))
                    && e.contains("re-run the baseline with this version"),
                "{e}"
            );
        }
    }

    #[test]
    fn baseline_ratios_and_verdicts() {
        let base = serde_json::json!({"summary": {"response_latency_ms": {"p50": 1000.0, "p95": 2000.0}, "llm_decode_tps": {"p50": 80.0}, "wer": 0.0}});
        let cur = serde_json::json!({"summary": {"response_latency_ms": {"p50": 500.0, "p95": 2050.0}, "llm_decode_tps": {"p50": 60.0}, "wer": 0.0}});
        let (c, overall) = compare_values(&cur, &base);
        let get = |m: &str| c.iter().find(|x| x.metric == m).unwrap().clone();
        assert_eq!(get("summary.response_latency_ms.p50").ratio, 0.5);
        assert_eq!(
            get("summary.response_latency_ms.p50").verdict,
            Verdict::Better
        );
        assert_eq!(
            get("summary.response_latency_ms.p95").verdict,
            Verdict::Same
        );
        assert_eq!(get("summary.llm_decode_tps.p50").ratio, 0.75);
        assert_eq!(get("summary.llm_decode_tps.p50").verdict, Verdict::Worse);
        assert_eq!(get("summary.wer").ratio, 1.0);
        assert_eq!(overall, Overall::Regressed);
        assert_eq!(c.len(), 4, "metrics absent from either side are skipped");
        let (_, overall) = compare_values(&base, &base);
        assert_eq!(overall, Overall::Unchanged);
    }
}
