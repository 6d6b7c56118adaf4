//! The bottleneck analysis: the stage that limits throughput (the busiest)
//! and the term that limits latency (the largest mean of the response
//! latency's terms, as the topology declares them), each with one line of
//! numbers.

use std::collections::BTreeMap;

use voxline_core::Topology;

use super::schema::{Bottleneck, StageReport, TurnReport};

/// The latency terms of the counted turns, summed by name (for their
/// means); a turn counts when it has every term the topology declares (the
/// terms then add up to its response latency exactly).
#[derive(Debug, Clone, Default)]
pub(crate) struct TermTotals {
    sums: BTreeMap<String, f64>,
    n: usize,
}

impl TermTotals {
    /// Adds a turn's terms, if it has them all.
    pub(crate) fn add(&mut self, t: &TurnReport, topology: &Topology) {
        let terms = topology.latency_terms();
        if terms.is_empty() || !terms.iter().all(|x| t.terms_ms.contains_key(&x.name)) {
            return;
        }
        for x in terms {
            *self.sums.entry(x.name.clone()).or_default() += t.terms_ms[&x.name];
        }
        self.n += 1;
    }
}

/// The server a stage's engine, or a latency term's, runs on, when it is
/// remote: the stage is the one the topology says owns the term (its
/// service or first output; the queue in front of it and the commit gate
/// are voxline's own).
fn server_of<'a>(name: &str, topology: &Topology, config: &'a crate::RunConfig) -> Option<&'a str> {
    use voxline_core::TermPart;
    use voxline_pipeline::topology::{LLM, STT};
    let stage = match topology
        .latency_terms()
        .into_iter()
        .find(|x| x.name == name)
    {
        Some(t) if matches!(t.part, TermPart::Service | TermPart::FirstOutput) => t.stage,
        Some(_) => return None,
        None => voxline_core::StageId::owned(name.to_owned()),
    };
    if stage == STT {
        config.stt_server.as_deref()
    } else if stage == LLM {
        config.llm_server.as_deref()
    } else {
        None
    }
}

/// `name`, with the server its engine runs on when it is remote.
fn named(name: &str, server: Option<&str>) -> String {
    match server {
        Some(s) => format!("{name} (remote, {s})"),
        None => name.to_owned(),
    }
}

/// The bottlenecks: the busiest stage that is not a sink (throughput) and the
/// largest mean latency term over the counted turns (latency), each named
/// with its remote server where its engine runs on one.
pub(crate) fn bottleneck(
    stages: &[StageReport],
    all: &TermTotals,
    topology: &voxline_core::Topology,
    config: &crate::RunConfig,
) -> Bottleneck {
    let mut b = Bottleneck::default();
    let mut reasons = Vec::new();
    let busiest = stages
        .iter()
        .filter(|s| !topology.is_sink(&s.name))
        .max_by(|a, b| a.utilization.total_cmp(&b.utilization));
    if let Some(s) = busiest {
        b.throughput = Some(s.name.clone());
        b.throughput_server = server_of(&s.name, topology, config).map(str::to_owned);
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
            named(&s.name, b.throughput_server.as_deref()), s.utilization, s.busy_ms, s.queue_max_depth, s.queue_capacity
        ));
    }
    if all.n > 0 {
        let n = all.n as f64;
        // in critical-path order, so a tie goes to the later term
        let means: Vec<(String, f64)> = topology
            .latency_terms()
            .into_iter()
            .filter_map(|x| Some((x.name.clone(), all.sums.get(&x.name)? / n)))
            .collect();
        let total: f64 = means.iter().map(|(_, m)| m).sum();
        b.latency_terms_ms.extend(means.iter().cloned());
        if let Some((name, m)) = means.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            b.latency = Some(name.clone());
            b.latency_server = server_of(name, topology, config).map(str::to_owned);
            let share = if total > 0.0 { 100.0 * m / total } else { 0.0 };
            let shown = named(name, b.latency_server.as_deref());
            reasons.push(format!("latency: {shown} is {share:.0}% of response latency (mean {m:.0} ms of {total:.0} ms over {} turns)", all.n));
        }
    }
    b.reason = reasons.join("; ");
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Percentiles;
    use voxline_pipeline::topology::{self, AudioEdge};

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

    /// A turn with every latency term of the standard pipeline (for a
    /// speculative one the endpoint term is the time until the attempt was
    /// sent).
    fn turn(endpoint: f64, spec: Option<f64>, stt: f64, commit_wait: Option<f64>) -> TurnReport {
        TurnReport {
            endpoint_delay_ms: Some(endpoint),
            spec_delay_ms: spec,
            terms_ms: [
                ("endpoint", spec.unwrap_or(endpoint)),
                ("stt_queue", 100.0),
                ("stt", stt),
                ("llm_queue", 10.0),
                ("llm_first_token", 200.0),
                ("commit_wait", commit_wait.unwrap_or(0.0)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
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
        let b = bottleneck(
            &stages,
            &TermTotals::default(),
            &topology,
            &crate::RunConfig::default(),
        );
        assert_eq!(b.throughput.as_deref(), Some("stt"));
        assert_eq!(
            b.reason,
            "throughput: stt cannot keep up with real time (utilisation 1.20, busy 4800 ms; input queue peaked at 3/4)"
        );
        // no turn: no latency bottleneck
        assert_eq!(b.latency, None);
        assert!(b.latency_terms_ms.is_empty());

        let b = bottleneck(
            &stages[2..],
            &TermTotals::default(),
            &topology,
            &crate::RunConfig::default(),
        );
        assert_eq!(
            b.reason,
            "throughput: llm is the busiest stage (utilisation 0.50, busy 2000 ms; input queue peaked at 3/4, queue wait p95 40 ms)"
        );
    }

    #[test]
    fn the_largest_mean_term_limits_latency() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let mut all = TermTotals::default();
        all.add(&turn(700.0, None, 500.0, None), &topology);
        // speculative: the endpoint term is the time until the attempt was sent
        all.add(&turn(700.0, Some(100.0), 400.0, Some(300.0)), &topology);
        // a turn without an answer lacks terms and is not counted
        let mut unanswered = turn(50.0, None, 9000.0, None);
        unanswered.terms_ms.remove("llm_first_token");
        all.add(&unanswered, &topology);
        let b = bottleneck(&[], &all, &topology, &crate::RunConfig::default());
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
        // an added stage's terms are counted like the engines'
        let upper = voxline_core::StageId::new("upper");
        let with_upper = topology
            .clone()
            .edge(
                topology::edge_into(&upper),
                4,
                voxline_core::FullPolicy::Block,
            )
            .insert_after(&topology::STT, upper.clone(), topology::edge_into(&upper));
        let mut slow = turn(700.0, None, 500.0, None);
        slow.terms_ms.insert("upper_queue".into(), 0.0);
        slow.terms_ms.insert("upper".into(), 900.0);
        let mut totals = TermTotals::default();
        totals.add(&slow, &with_upper);
        // a turn without the added stage's terms is not counted
        totals.add(&turn(700.0, None, 500.0, None), &with_upper);
        let b = bottleneck(&[], &totals, &with_upper, &crate::RunConfig::default());
        assert_eq!(b.latency.as_deref(), Some("upper"));
        assert_eq!(
            b.reason,
            "latency: upper is 37% of response latency (mean 900 ms of 2410 ms over 1 turns)"
        );
    }

    #[test]
    fn both_lines_are_joined() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let mut all = TermTotals::default();
        all.add(&turn(900.0, None, 100.0, None), &topology);
        let b = bottleneck(
            &[stage("vad", 0.2, None)],
            &all,
            &topology,
            &crate::RunConfig::default(),
        );
        assert_eq!(b.throughput.as_deref(), Some("vad"));
        assert_eq!(b.latency.as_deref(), Some("endpoint"));
        assert_eq!(
            b.reason,
            "throughput: vad is the busiest stage (utilisation 0.20, busy 800 ms; input queue peaked at 3/4); latency: endpoint is 69% of response latency (mean 900 ms of 1310 ms over 1 turns)"
        );
    }

    #[test]
    fn a_remote_engine_is_named_with_its_server() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let config = crate::RunConfig {
            llm_server: Some("gpu1:8000".into()),
            ..crate::RunConfig::default()
        };
        let stages = [stage("stt", 0.3, None), stage("llm", 0.8, Some(40.0))];
        let mut all = TermTotals::default();
        all.add(&turn(100.0, None, 150.0, None), &topology);
        let b = bottleneck(&stages, &all, &topology, &config);
        assert_eq!(b.throughput.as_deref(), Some("llm"));
        assert_eq!(b.throughput_server.as_deref(), Some("gpu1:8000"));
        assert!(
            b.reason
                .starts_with("throughput: llm (remote, gpu1:8000) is the busiest"),
            "{}",
            b.reason
        );
        // the largest term is the first token's, whose engine is the remote one
        assert_eq!(b.latency.as_deref(), Some("llm_first_token"));
        assert_eq!(b.latency_server.as_deref(), Some("gpu1:8000"));
        assert!(
            b.reason
                .contains("latency: llm_first_token (remote, gpu1:8000) is"),
            "{}",
            b.reason
        );
        // whisper here, the LLM remote: the STT's row is not named
        let b = bottleneck(
            &[stage("stt", 0.9, None)],
            &TermTotals::default(),
            &topology,
            &config,
        );
        assert_eq!(b.throughput_server, None);
        assert!(b.reason.starts_with("throughput: stt is"), "{}", b.reason);
    }
}
