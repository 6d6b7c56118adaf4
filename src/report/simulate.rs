//! The virtual clock's discrete-event simulator. At fast pace each turn's
//! measured service times ([`SimJob`]) are replayed from its audio time, the
//! engines serving turns as the cores were shared ([`SimCores`]): what a
//! live user would have waited, deterministically.

use super::schema::{StageReport, TurnReport};
use crate::stats::Percentiles;
use crate::topology::{LLM, STT, VAD};

/// One turn's measured service times, for the virtual clock.
pub(crate) struct SimJob {
    /// Index into the turns.
    pub(super) turn: usize,
    /// When the utterance was sent downstream (virtual ms).
    pub(super) ready: f64,
    /// When its end was confirmed (= `ready` unless speculative).
    pub(super) commit: f64,
    /// Sent early, before `commit`.
    pub(super) speculative: bool,
    /// STT busy time and its time to the transcript.
    pub(super) stt: Option<(f64, Option<f64>)>,
    /// LLM busy time and its time to the first token.
    pub(super) llm: Option<(f64, Option<f64>)>,
}

/// How the engines share the cores on the virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SimCores {
    /// Each stage is its own server.
    Split,
    /// One server, jobs in the order they asked.
    Shared,
    /// One server, the most urgent job first (STT > first token > decode),
    /// and a streaming answer yields at every token boundary.
    Priority,
}

impl SimCores {
    /// How the run shared its cores: `cpu_shared` when the engines took one
    /// lease, `cpu_share` the policy configured (`priority`, `shared`, …).
    pub(crate) fn of(cpu_shared: bool, cpu_share: &str) -> Self {
        match (cpu_shared, cpu_share) {
            (false, _) => Self::Split,
            (true, "priority") => Self::Priority,
            (true, _) => Self::Shared,
        }
    }
}

/// Replays the measured service times on the virtual clock: utterances
/// close at their audio time; STT and LLM each serve turns in order. With
/// shared cores (one CPU lease) the two stages are one server: in `Shared`
/// it takes whichever waiting job asked first; in `Priority` the most
/// urgent, and an answer's decoding is cut into its tokens, so a turn's STT
/// runs between two tokens of the previous answer, as it does live. Fills
/// each turn's queue waits, TTFT, response latency and timeline; returns
/// when the last job finished.
pub(crate) fn simulate(jobs: &[SimJob], cores: SimCores, turns: &mut [TurnReport]) -> f64 {
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Kind {
        /// The rest of an answer, `left` tokens of `each` ms (lowest priority).
        Decode { left: usize },
        /// Prefill and first token.
        Llm,
        /// Transcription (most urgent).
        Stt,
    }
    // (ready time, job index, kind) waiting to run
    let mut pending: Vec<(f64, usize, Kind)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.stt.is_some())
        .map(|(i, j)| (j.ready, i, Kind::Stt))
        .collect();
    let shared = cores != SimCores::Split;
    let (mut stt_free, mut llm_free, mut end) = (0.0f64, 0.0f64, 0.0f64);
    while !pending.is_empty() {
        let start_of = |(ready, _, kind): &(f64, usize, Kind)| -> f64 {
            let free = if shared {
                stt_free.max(llm_free)
            } else {
                match kind {
                    Kind::Stt => stt_free,
                    Kind::Llm | Kind::Decode { .. } => llm_free,
                }
            };
            ready.max(free)
        };
        // the job that can start first; ties go to the most urgent (priority
        // cores), then to the one that became ready first
        let Some((pos, _)) = pending.iter().enumerate().min_by(|a, b| {
            let urgency = if cores == SimCores::Priority {
                b.1 .2.cmp(&a.1 .2)
            } else {
                std::cmp::Ordering::Equal
            };
            start_of(a.1)
                .total_cmp(&start_of(b.1))
                .then(urgency)
                .then(a.1 .0.total_cmp(&b.1 .0))
                .then(a.1 .1.cmp(&b.1 .1))
        }) else {
            break;
        };
        let job = pending.remove(pos);
        let start = start_of(&job);
        let (ready, i, kind) = job;
        let j = &jobs[i];
        let t = &mut turns[j.turn];
        match kind {
            Kind::Stt => {
                let (busy, service) = j.stt.unwrap_or_default();
                stt_free = start + busy;
                end = end.max(stt_free);
                t.timeline.stt_ms = Some([start, stt_free]);
                t.stt_queue_ms = Some(start - ready);
                if let Some(service) = service {
                    t.stt_ms = Some(service);
                    if j.llm.is_some() {
                        pending.push((start + service, i, Kind::Llm));
                    }
                }
            }
            Kind::Llm => {
                let (busy, first) = j.llm.unwrap_or_default();
                let tokens = t.llm_streamed_tokens;
                // priority cores: after the first token the answer decodes token by token
                let yields = cores == SimCores::Priority && tokens > 1 && first.is_some();
                llm_free = start + if yields { first.unwrap_or(busy) } else { busy };
                end = end.max(llm_free);
                t.timeline.llm_ms = Some([start, llm_free]);
                t.llm_queue_ms = Some(start - ready);
                t.llm_ms = Some(llm_free - start);
                if yields {
                    pending.push((llm_free, i, Kind::Decode { left: tokens - 1 }));
                }
                if let Some(first) = first {
                    let computed = start + first;
                    let shown = computed.max(j.commit);
                    t.timeline.first_token_ms = Some(shown);
                    t.llm_ttft_ms = Some(start - ready + first);
                    t.response_latency_ms = Some(shown - t.timeline.end_of_speech_ms);
                    t.processing_ms = Some(shown - j.commit);
                    if j.speculative {
                        t.commit_wait_ms = Some(shown - computed);
                    }
                }
            }
            Kind::Decode { left } => {
                let (busy, first) = j.llm.unwrap_or_default();
                let tokens = t.llm_streamed_tokens.max(2);
                let each = (busy - first.unwrap_or(0.0)).max(0.0) / (tokens - 1) as f64;
                llm_free = start + each;
                end = end.max(llm_free);
                if let Some(span) = &mut t.timeline.llm_ms {
                    span[1] = llm_free;
                    t.llm_ms = Some(span[1] - span[0]);
                }
                if left > 1 {
                    pending.push((llm_free, i, Kind::Decode { left: left - 1 }));
                }
            }
        }
    }
    end
}

/// At fast pace audio arrives faster than real time, so the measured queue
/// waits of the engine stages say nothing about a live session; report the
/// virtual-clock waits instead (the VAD's input is never queued in real time).
pub(crate) fn with_virtual_waits(
    mut stages: Vec<StageReport>,
    turns: &[TurnReport],
) -> Vec<StageReport> {
    for s in &mut stages {
        // (arrival, start) of every item on the virtual clock
        let items: Vec<(f64, f64)> = if s.name == STT {
            turns
                .iter()
                .filter_map(|t| Some((t.timeline.closed_ms, t.timeline.stt_ms?[0])))
                .collect()
        } else if s.name == LLM {
            turns
                .iter()
                .filter_map(|t| {
                    Some((
                        t.timeline.llm_ms?[0] - t.llm_queue_ms?,
                        t.timeline.llm_ms?[0],
                    ))
                })
                .collect()
        } else if s.name == VAD {
            s.queue_wait_ms = Percentiles::of(&vec![0.0; s.items]);
            s.queue_max_depth = 0;
            continue;
        } else {
            continue;
        };
        s.queue_wait_ms = Percentiles::of(&items.iter().map(|(a, b)| b - a).collect::<Vec<_>>());
        // deepest queue: items arrived and not yet started, at each arrival
        s.queue_max_depth = items
            .iter()
            .map(|(t, _)| items.iter().filter(|(a, b)| a <= t && b > t).count())
            .max()
            .unwrap_or(0);
    }
    stages
}
