//! Per-stage figures: each stage's spans summed ([`StageTotals`]), the
//! turns' token counts summed ([`TokenTotals`]), and the stage rows of the
//! report made of them, in the topology's flow order; the audio dropped.

use voxline_core::{EdgeStatsSnapshot, Span, SpanKind};

use super::schema::{StageReport, TurnReport};
use voxline_pipeline::pipeline::RunResult;
use voxline_pipeline::topology::{LLM, STT};

/// One stage's spans, summed (what its [`StageReport`] is made of).
#[derive(Debug, Clone, Default)]
pub(crate) struct StageTotals {
    /// Stage name.
    pub name: String,
    /// Process spans.
    pub items: usize,
    /// Busy time of every span, ms.
    pub busy_ms: f64,
    /// Queue waits of the process spans, ms.
    pub waits: crate::stats::Series,
}

impl StageTotals {
    /// Adds one span of this stage.
    pub(crate) fn add(&mut self, s: &Span) {
        self.busy_ms += s.busy().as_secs_f64() * 1000.0;
        if s.kind == SpanKind::Process {
            self.items += 1;
            self.waits.record(s.queue_wait().as_secs_f64() * 1000.0);
        }
    }

    /// Adds `s` to its stage's totals in `stages`, starting them if it is the stage's first.
    pub(crate) fn add_to(stages: &mut Vec<Self>, s: &Span) {
        match stages.iter_mut().find(|t| t.name == s.stage) {
            Some(t) => t.add(s),
            None => {
                let mut t = Self {
                    name: s.stage.clone(),
                    ..Self::default()
                };
                t.add(s);
                stages.push(t);
            }
        }
    }
}

/// The token counts of a run's turns, summed for the stage reports.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TokenTotals {
    stt_tokens: u64,
    llm_tokens: u64,
    /// Decode gaps (n − 1 per turn) and the decode time they took, s.
    decode_gaps: f64,
    decode_s: f64,
}

impl TokenTotals {
    /// Adds one turn.
    pub(crate) fn add(&mut self, t: &TurnReport) {
        self.stt_tokens += t.stt_tokens.map_or(0, u64::from);
        // streamed tokens: the end-of-generation token is not text
        self.llm_tokens += t.llm_streamed_tokens as u64;
        if let Some((g, tps)) = t
            .llm_streamed_tokens
            .checked_sub(1)
            .map(|g| g as f64)
            .zip(t.llm_decode_tps)
        {
            self.decode_gaps += g;
            self.decode_s += g / tps;
        }
    }
}

/// Every stage's row, from the run's spans and the turns' tokens, utilisation
/// over `session_ms`.
pub(crate) fn stage_reports(
    run: &RunResult,
    turns: &[TurnReport],
    session_ms: f64,
) -> Vec<StageReport> {
    let mut stages: Vec<StageTotals> = Vec::new();
    for s in &run.outcome.spans {
        StageTotals::add_to(&mut stages, s);
    }
    let mut tokens = TokenTotals::default();
    for t in turns {
        tokens.add(t);
    }
    in_flow_order(&mut stages, &run.topology);
    stages
        .iter()
        .map(|st| stage_report(st, &tokens, &run.outcome.edges, &run.topology, session_ms))
        .collect()
}

/// Orders stage totals as the topology's stages flow, then any other that ran.
pub(crate) fn in_flow_order(stages: &mut [StageTotals], topology: &voxline_core::Topology) {
    let rank = |name: &str| {
        topology
            .stages()
            .iter()
            .position(|s| s.id == name)
            .unwrap_or(usize::MAX)
    };
    stages.sort_by_key(|st| rank(&st.name));
}

/// A stage's report from its totals; its input queue is the edge the topology says it reads.
pub(crate) fn stage_report(
    st: &StageTotals,
    turns: &TokenTotals,
    edges: &[EdgeStatsSnapshot],
    topology: &voxline_core::Topology,
    session_ms: f64,
) -> StageReport {
    let tokens = if st.name == STT {
        Some(turns.stt_tokens)
    } else if st.name == LLM {
        Some(turns.llm_tokens)
    } else {
        None
    };
    let busy_ms = st.busy_ms;
    // LLM: decode tokens/s as in `llm_decode_tps`, (n − 1) / (t_last − t_first)
    // per turn, pooled over the turns (prefill is not decoding)
    let tokens_per_s = if st.name == LLM {
        (turns.decode_s > 0.0).then(|| turns.decode_gaps / turns.decode_s)
    } else {
        tokens
            .filter(|_| busy_ms > 0.0)
            .map(|n| n as f64 / (busy_ms / 1000.0))
    };
    let input = topology.input_of(&st.name);
    let edge = edges.iter().find(|e| input.is_some_and(|i| e.name == *i));
    StageReport {
        items: st.items,
        busy_ms,
        utilization: if session_ms > 0.0 {
            busy_ms / session_ms
        } else {
            0.0
        },
        tokens,
        tokens_per_s,
        queue_wait_ms: st.waits.percentiles(),
        queue_max_depth: edge.map_or(0, |e| e.max_depth),
        queue_capacity: edge.map_or(0, |e| e.capacity),
        dropped: edge.map_or(0, |e| e.dropped),
        name: st.name.clone(),
    }
}

/// Audio the run dropped, in 16 kHz frames: the audio queue's drops (the
/// other queues block, they never drop) and the capture ring's.
pub(crate) fn dropped_total(run: &RunResult) -> u64 {
    run.outcome
        .edges
        .iter()
        .map(|e| e.dropped_units)
        .sum::<u64>()
        + run
            .live
            .as_ref()
            .map_or(0, |l| l.frames_dropped_in_ring_16k)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fixture;
    use voxline_pipeline::pipeline::Pace;
    use voxline_pipeline::topology::{self, AudioEdge};

    #[test]
    fn totals_count_process_spans_as_items_and_every_span_as_busy_time() {
        let run = fixture::run(Pace::Fast, voxline_pipeline::settings::CpuShare::Split);
        let o = run.clock.origin();
        let mut blocked = fixture::span(o, "stt", Some(1), [0, 10, 210], None);
        // waiting for room downstream is not work
        blocked.emit_blocked = Duration::from_millis(50);
        let mut finish = fixture::span(o, "stt", None, [300, 300, 320], None);
        finish.kind = SpanKind::Finish;
        let mut stages = Vec::new();
        for s in [
            fixture::span(o, "stt", Some(1), [0, 30, 130], None),
            fixture::span(o, "llm", Some(1), [130, 130, 140], None),
            blocked,
            finish,
        ] {
            StageTotals::add_to(&mut stages, &s);
        }
        let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["stt", "llm"]);
        assert_eq!(stages[0].items, 2);
        assert_eq!(stages[0].busy_ms, 100.0 + 150.0 + 20.0);
        let waits = stages[0].waits.percentiles().unwrap();
        assert_eq!((waits.n, waits.mean), (2, 20.0));
        assert_eq!(stages[1].items, 1);
    }

    #[test]
    fn stages_are_ordered_as_the_topology_flows_then_any_other() {
        let topology = topology::standard(AudioEdge::Replay, 4);
        let mut stages: Vec<StageTotals> = ["other", "sink", "llm", "vad"]
            .iter()
            .map(|n| StageTotals {
                name: (*n).to_string(),
                ..StageTotals::default()
            })
            .collect();
        in_flow_order(&mut stages, &topology);
        let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["vad", "llm", "sink", "other"]);
    }

    #[test]
    fn a_stage_row_pools_decode_rates_and_reads_its_own_input_queue() {
        let mut tokens = TokenTotals::default();
        // 4 tokens at 20/s (3 gaps in 150 ms) and 3 at 40/s (2 gaps in 50 ms)
        for (stt, streamed, tps) in [(3, 4, 20.0), (5, 3, 40.0)] {
            tokens.add(&TurnReport {
                stt_tokens: Some(stt),
                llm_streamed_tokens: streamed,
                llm_decode_tps: Some(tps),
                ..TurnReport::default()
            });
        }
        let run = fixture::run(Pace::Fast, voxline_pipeline::settings::CpuShare::Split);
        let edges = &run.outcome.edges;
        let totals = |name: &str, busy_ms: f64| StageTotals {
            name: name.to_string(),
            items: 2,
            busy_ms,
            ..StageTotals::default()
        };
        let llm = stage_report(&totals("llm", 800.0), &tokens, edges, &run.topology, 4000.0);
        assert_eq!(llm.tokens, Some(7));
        assert!(
            (llm.tokens_per_s.unwrap() - 25.0).abs() < 1e-9,
            "5 gaps in 0.2 s"
        );
        assert_eq!(llm.utilization, 0.2);
        assert_eq!((llm.queue_max_depth, llm.queue_capacity), (1, 4));
        assert_eq!(llm.queue_wait_ms, None, "no span, no wait");

        let stt = stage_report(&totals("stt", 2000.0), &tokens, edges, &run.topology, 0.0);
        assert_eq!(stt.tokens, Some(8));
        assert_eq!(stt.tokens_per_s, Some(4.0), "tokens per busy second");
        assert_eq!(stt.utilization, 0.0, "no session, no utilisation");

        // the fixture's `upper` reads `to_upper`; the sink reads `responses`
        let upper = stage_report(&totals("upper", 7.0), &tokens, edges, &run.topology, 4000.0);
        assert_eq!((upper.tokens, upper.tokens_per_s), (None, None));
        let sink = stage_report(&totals("sink", 1.0), &tokens, edges, &run.topology, 4000.0);
        assert_eq!((sink.queue_max_depth, sink.queue_capacity), (4, 1024));
    }

    #[test]
    fn the_rows_of_a_run_in_flow_order() {
        let run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        let rows = stage_reports(&run, &[], 4000.0);
        let names: Vec<&str> = rows.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["vad", "stt", "upper", "llm", "sink"]);
        let stt = &rows[1];
        // four utterances (one a cancelled attempt): 790 + 290 + 540 + 40 ms
        assert_eq!((stt.items, stt.busy_ms), (4, 1660.0));
        // the sink's finish call is busy time but no item
        assert_eq!((rows[4].items, rows[4].busy_ms), (1, 11.0));
    }

    #[test]
    fn dropped_audio_is_what_the_drop_oldest_edges_lost() {
        let mut run = fixture::run(Pace::Realtime, voxline_pipeline::settings::CpuShare::Split);
        assert_eq!(dropped_total(&run), 0);
        run.outcome.edges[0].dropped_units = 320;
        run.outcome.edges[0].dropped = 2;
        assert_eq!(dropped_total(&run), 320);
    }
}
