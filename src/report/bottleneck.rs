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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Percentiles;
    use crate::topology::{self, AudioEdge};

    fn stage(name: &str, utilization: f64, queue_wait: Option<f64>) -> StageReport {
        StageReport {
            name: name.to_string(),
            items: 4,
            busy_ms: utilization * 4000.0,
            utilization,
            tokens: None,
            tokens_per_s: None,
            queue_wait_ms: queue_wait.and_then(|w| Percentiles::of(&[w])),
            queue_max_depth: 3,
            queue_capacity: 4,
            dropped: 0,
        }
    }

    /// A turn with every latency term.
    fn turn(endpoint: f64, spec: Option<f64>, stt: f64, commit_wait: Option<f64>) -> TurnReport {
        TurnReport {
            endpoint_delay_ms: Some(endpoint),
            spec_delay_ms: spec,
            stt_queue_ms: Some(100.0),
            stt_ms: Some(stt),
            llm_queue_ms: Some(10.0),
            llm_first_token_ms: Some(200.0),
            commit_wait_ms: commit_wait,
            ..TurnReport::default()
        }
    }

    #[test]
    fn the_busiest_stage_that_is_no_sink_limits_throughput() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let stages = [
            stage("vad", 0.1, None),
            stage("stt", 1.2, None),
            stage("llm", 0.5, Some(40.0)),
            stage("sink", 5.0, None),
        ];
        let b = bottleneck(&stages, &TermTotals::default(), &topology);
        assert_eq!(b.throughput.as_deref(), Some("stt"));
        assert_eq!(
            b.reason,
            "throughput: stt cannot keep up with real time (utilisation 1.20, busy 4800 ms; input queue peaked at 3/4)"
        );
        // no turn: no latency bottleneck
        assert_eq!(b.latency, None);
        assert!(b.latency_terms_ms.is_empty());

        let b = bottleneck(&stages[2..], &TermTotals::default(), &topology);
        assert_eq!(
            b.reason,
            "throughput: llm is the busiest stage (utilisation 0.50, busy 2000 ms; input queue peaked at 3/4, queue wait p95 40 ms)"
        );
    }

    #[test]
    fn the_largest_mean_term_limits_latency() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let mut all = TermTotals::default();
        all.add(&turn(700.0, None, 500.0, None));
        // speculative: the endpoint term is the time until the attempt was sent
        all.add(&turn(700.0, Some(100.0), 400.0, Some(300.0)));
        // a turn without an answer has no terms and is not counted
        all.add(&TurnReport {
            llm_first_token_ms: None,
            ..turn(50.0, None, 9000.0, None)
        });
        let b = bottleneck(&[], &all, &topology);
        assert_eq!(b.throughput, None);
        assert_eq!(b.latency.as_deref(), Some("stt"));
        let terms: Vec<(&str, f64)> = b
            .latency_terms_ms
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            terms,
            [
                ("commit_wait", 150.0),
                ("endpoint", 400.0),
                ("llm_first_token", 200.0),
                ("llm_queue", 10.0),
                ("stt", 450.0),
                ("stt_queue", 100.0),
            ]
        );
        assert_eq!(
            b.reason,
            "latency: stt is 34% of response latency (mean 450 ms of 1310 ms over 2 turns)"
        );
    }

    #[test]
    fn both_lines_are_joined() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let mut all = TermTotals::default();
        all.add(&turn(900.0, None, 100.0, None));
        let b = bottleneck(&[stage("vad", 0.2, None)], &all, &topology);
        assert_eq!(b.throughput.as_deref(), Some("vad"));
        assert_eq!(b.latency.as_deref(), Some("endpoint"));
        assert_eq!(
            b.reason,
            "throughput: vad is the busiest stage (utilisation 0.20, busy 800 ms; input queue peaked at 3/4); latency: endpoint is 69% of response latency (mean 900 ms of 1310 ms over 1 turns)"
        );
    }
}
