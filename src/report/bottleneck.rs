//! The bottleneck analysis: the stage that limits throughput (the busiest)
//! and the term that limits latency (the largest mean of the response
//! latency's terms), each with one line of numbers.

use super::schema::{Bottleneck, StageReport, TurnReport};

/// The latency terms of a turn, in critical-path order.
/// For a speculative turn `endpoint` is the time until the attempt was sent
/// and `commit_wait` the time a ready first token waited for the commit;
/// the terms add up to the response latency exactly.
const TERMS: [&str; 6] = [
    "endpoint",
    "stt_queue",
    "stt",
    "llm_queue",
    "llm_first_token",
    "commit_wait",
];

fn terms(t: &TurnReport) -> Option<[f64; 6]> {
    Some([
        t.spec_delay_ms.or(t.endpoint_delay_ms)?,
        t.stt_queue_ms?,
        t.stt_ms?,
        t.llm_queue_ms?,
        t.llm_first_token_ms?,
        t.commit_wait_ms.unwrap_or(0.0),
    ])
}

/// The latency terms of the counted turns, summed (for their means).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TermTotals {
    sums: [f64; 6],
    n: usize,
}

impl TermTotals {
    /// Adds a turn's terms, if it has them all.
    pub(crate) fn add(&mut self, t: &TurnReport) {
        if let Some(a) = terms(t) {
            for (s, v) in self.sums.iter_mut().zip(a) {
                *s += v;
            }
            self.n += 1;
        }
    }
}

/// The bottlenecks: the busiest stage that is not a sink (throughput) and the
/// largest mean latency term over the counted turns (latency).
pub(crate) fn bottleneck(
    stages: &[StageReport],
    all: &TermTotals,
    topology: &voxline_core::Topology,
) -> Bottleneck {
    let mut b = Bottleneck::default();
    let mut reasons = Vec::new();
    let busiest = stages
        .iter()
        .filter(|s| !topology.is_sink(&s.name))
        .max_by(|a, b| a.utilization.total_cmp(&b.utilization));
    if let Some(s) = busiest {
        b.throughput = Some(s.name.clone());
        let verdict = if s.utilization > 1.0 {
            "cannot keep up with real time"
        } else {
            "is the busiest stage"
        };
        let wait = s.queue_wait_ms.map_or(String::new(), |q| {
            format!(", queue wait p95 {:.0} ms", q.p95)
        });
        reasons.push(format!(
            "throughput: {} {verdict} (utilisation {:.2}, busy {:.0} ms; input queue peaked at {}/{}{wait})",
            s.name, s.utilization, s.busy_ms, s.queue_max_depth, s.queue_capacity
        ));
    }
    if all.n > 0 {
        let n = all.n as f64;
        let means: Vec<f64> = all.sums.iter().map(|s| s / n).collect();
        let total: f64 = means.iter().sum();
        for (name, m) in TERMS.iter().zip(&means) {
            b.latency_terms_ms.insert((*name).to_string(), *m);
        }
        if let Some((i, m)) = means.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)) {
            b.latency = Some(TERMS[i].to_string());
            let share = if total > 0.0 { 100.0 * m / total } else { 0.0 };
            reasons.push(format!("latency: {} is {share:.0}% of response latency (mean {m:.0} ms of {total:.0} ms over {} turns)", TERMS[i], all.n));
        }
    }
    b.reason = reasons.join("; ");
    b
}
