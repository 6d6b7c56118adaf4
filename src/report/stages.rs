//! Per-stage figures: each stage's spans summed ([`StageTotals`]), the
//! turns' token counts summed ([`TokenTotals`]), and the stage rows of the
//! report made of them, in the topology's flow order; the audio dropped.

use voxline_core::{EdgeStatsSnapshot, Span, SpanKind};

use super::schema::{StageReport, TurnReport};
use crate::pipeline::RunResult;
use crate::topology::{LLM, STT};

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
