//! A small hand-built run (events and spans as the runtime records them) for
//! the report's unit tests: no engine runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use voxline_core::{
    Clock, EdgeStatsSnapshot, FullPolicy, PipelineEvent, RunOutcome, Span, SpanKind, StageId,
    TimedEvent, Transcript, TurnError, UtteranceInfo,
};
use voxline_llm::{LlmCounters, Stop, Token, TurnComplete};

use voxline_pipeline::pipeline::{InputSpan, Pace, RunResult};
use voxline_pipeline::sidecar::{Sidecar, SidecarTurn};
use voxline_pipeline::topology::{self, AudioEdge, LLM, SINK, STT, VAD};

/// The stage the fixture adds between the STT and the LLM.
pub(crate) const UPPER: &str = "upper";

/// `origin + ms`.
pub(crate) fn at(origin: Instant, ms: u64) -> Instant {
    origin + Duration::from_millis(ms)
}

/// A span of `stage` on utterance `id`, from `start` to `end` ms, enqueued
/// at `enqueued` ms, its first output at `first` ms.
pub(crate) fn span(
    origin: Instant,
    stage: &str,
    id: Option<u64>,
    [enqueued, start, end]: [u64; 3],
    first: Option<u64>,
) -> Span {
    Span {
        stage: stage.to_string(),
        utterance: id,
        kind: SpanKind::Process,
        enqueued: at(origin, enqueued),
        started: at(origin, start),
        finished: at(origin, end),
        emitted: 1,
        first_emit: first.map(|f| at(origin, f)),
        last_emit: first.map(|_| at(origin, end)),
        emit_blocked: Duration::ZERO,
        queue_depth_at_start: 0,
        // the engines compute on two threads, the other stages on their own
        threads: if matches!(stage, "stt" | "llm") { 2 } else { 0 },
    }
}

fn edge(name: &str, capacity: usize, max_depth: usize) -> EdgeStatsSnapshot {
    EdgeStatsSnapshot {
        name: name.to_string(),
        capacity,
        policy: FullPolicy::Block,
        sent: 4,
        received: 4,
        dropped: 0,
        dropped_units: 0,
        max_depth,
    }
}

fn ev(origin: Instant, ms: u64, event: PipelineEvent) -> TimedEvent {
    TimedEvent {
        at: at(origin, ms),
        event,
    }
}

fn utterance(origin: Instant, id: u64, start: u64, end: u64, closed: u64) -> UtteranceInfo {
    UtteranceInfo {
        id,
        start_sample: start,
        end_sample: end,
        end_wall: at(origin, end / 16),
        forced_split: false,
        closed_sample: closed,
        continues: None,
        overlap_samples: 0,
    }
}

fn transcript(u: &UtteranceInfo, text: &str, n_tokens: u32) -> Transcript {
    Transcript {
        id: u.id,
        text: text.to_string(),
        heard: voxline_core::Heard::Words,
        n_tokens,
        audio_ms: u.duration_ms(),
        start_sample: u.start_sample,
        end_sample: u.end_sample,
        end_wall: u.end_wall,
    }
}

fn done(id: u64, transcript: &str, response: &str) -> TurnComplete {
    TurnComplete {
        id,
        transcript: transcript.to_string(),
        response: response.to_string(),
        n_prompt_tokens: 40,
        n_generated: 5,
        engine: LlmCounters {
            n_prefill_tokens: 20,
            n_decode_tokens: 4,
        },
        stop: Stop::EndOfGeneration,
        history_dropped: 0,
    }
}

fn token(id: u64, index: u32) -> PipelineEvent {
    PipelineEvent::engine_event(Token {
        id,
        index,
        text: format!("t{index}"),
    })
}

/// A run of one 4 s file (a sidecar with two spoken turns) through VAD →
/// STT → `upper` → LLM → sink, all times in ms since the clock's origin:
///
/// - turn 1: "hello there", spoken 0–1000 ms; the VAD ends it at 1031 ms and
///   closes it at 1700 ms; STT 1710–2500, `upper` 2500–2505, LLM 2510–3000,
///   tokens at 2700, 2750, 2800, 2850.
/// - utterance 2: a speculative attempt sent at 2600 ms and cancelled (its
///   STT ran 2610–2900).
/// - turn 3: "what time is it", spoken 2000–3000 ms; sent early at 3250 ms,
///   committed at 3700 ms; STT 3260–3800, `upper` 3800–3802, LLM 3810–4100,
///   tokens at 3900, 3950, 4000.
/// - turn 4: spoken 3500–3900 ms (no sidecar turn overlaps it), closed at
///   4000 ms; its STT failed.
pub(crate) fn run(pace: Pace, cpu_share: voxline_pipeline::settings::CpuShare) -> RunResult {
    let origin = Instant::now();
    let clock = Clock::with_origin(origin);
    let upper = StageId::owned(UPPER.to_string());
    let topology = topology::standard(AudioEdge::Replay, 4)
        .edge(topology::edge_into(&upper), 4, FullPolicy::Block)
        .insert_after(&STT, upper.clone(), topology::edge_into(&upper));

    let u1 = utterance(origin, 1, 0, 16_500, 27_200);
    let u3 = utterance(origin, 3, 32_000, 48_300, 59_200);
    let u4 = utterance(origin, 4, 56_000, 62_400, 64_000);
    let t1 = transcript(&u1, "hello there", 3);
    let t3 = transcript(&u3, "what time is it", 5);
    let events = vec![
        ev(origin, 1700, PipelineEvent::Utterance(u1)),
        ev(origin, 2500, PipelineEvent::Transcript(t1)),
        ev(
            origin,
            2600,
            PipelineEvent::SpecStart {
                id: 2,
                sample: 41_600,
            },
        ),
        ev(origin, 2700, token(1, 0)),
        ev(origin, 2750, token(1, 1)),
        ev(origin, 2800, token(1, 2)),
        ev(origin, 2850, token(1, 3)),
        ev(
            origin,
            2950,
            PipelineEvent::SpecCancel {
                id: 2,
                sample: 44_800,
            },
        ),
        ev(
            origin,
            3000,
            PipelineEvent::engine_event(done(1, "hello there", "Hi! How are you?")),
        ),
        ev(
            origin,
            3250,
            PipelineEvent::SpecStart {
                id: 3,
                sample: 52_000,
            },
        ),
        ev(origin, 3250, PipelineEvent::Utterance(u3)),
        ev(
            origin,
            3700,
            PipelineEvent::Commit {
                id: 3,
                spec_sample: 52_000,
                sample: 59_200,
            },
        ),
        ev(origin, 3800, PipelineEvent::Transcript(t3)),
        ev(origin, 3900, token(3, 0)),
        ev(origin, 3950, token(3, 1)),
        ev(origin, 4000, token(3, 2)),
        ev(origin, 4000, PipelineEvent::Utterance(u4)),
        ev(
            origin,
            4050,
            PipelineEvent::TurnError(TurnError {
                id: 4,
                stage: STT.to_string(),
                message: "whisper failed".to_string(),
            }),
        ),
        ev(
            origin,
            4100,
            PipelineEvent::engine_event(done(3, "what time is it", "It is noon.")),
        ),
    ];
    let mut spans = vec![
        span(origin, VAD.as_str(), None, [0, 5, 25], None),
        span(origin, VAD.as_str(), None, [1000, 1000, 1040], None),
        span(origin, VAD.as_str(), None, [2000, 2030, 2050], None),
        span(
            origin,
            STT.as_str(),
            Some(1),
            [1700, 1710, 2500],
            Some(2500),
        ),
        span(origin, UPPER, Some(1), [2500, 2500, 2505], Some(2505)),
        span(
            origin,
            LLM.as_str(),
            Some(1),
            [2505, 2510, 3000],
            Some(2700),
        ),
        span(
            origin,
            STT.as_str(),
            Some(2),
            [2600, 2610, 2900],
            Some(2900),
        ),
        span(origin, SINK.as_str(), Some(1), [2700, 2700, 2701], None),
        span(
            origin,
            STT.as_str(),
            Some(3),
            [3250, 3260, 3800],
            Some(3800),
        ),
        span(origin, UPPER, Some(3), [3800, 3800, 3802], Some(3802)),
        span(
            origin,
            LLM.as_str(),
            Some(3),
            [3802, 3810, 4100],
            Some(3900),
        ),
        span(origin, STT.as_str(), Some(4), [4000, 4010, 4050], None),
    ];
    let mut finish = span(origin, SINK.as_str(), None, [4200, 4200, 4210], None);
    finish.kind = SpanKind::Finish;
    spans.push(finish);
    let edges = vec![
        edge("audio", 64, 3),
        edge("utterances", 4, 1),
        edge("to_upper", 4, 1),
        edge("transcripts", 4, 1),
        edge("responses", 1024, 4),
    ];
    RunResult {
        topology,
        clock,
        pace,
        outcome: RunOutcome {
            spans,
            edges,
            failed: None,
            events: Vec::new(),
            finished: at(origin, 4300),
            startup: Duration::ZERO,
        },
        events,
        inputs: vec![InputSpan {
            path: PathBuf::from("two.wav"),
            sidecar: Some(Sidecar {
                sample_rate: 16_000,
                turns: vec![
                    SidecarTurn {
                        text: "hello there".to_string(),
                        start_sample: 0,
                        end_sample: 16_000,
                    },
                    SidecarTurn {
                        text: "what time is it".to_string(),
                        start_sample: 32_000,
                        end_sample: 48_000,
                    },
                ],
            }),
            start: 0,
            end: 64_000,
        }],
        input_errors: Vec::new(),
        input_warnings: Vec::new(),
        interrupted: false,
        audio_samples: 64_000,
        cpu_share,
        engine_threads_peak: 2,
        live: None,
    }
}

/// Utterance `id`'s events and process spans in `run`, gathered as
/// [`super::build`] gathers them.
pub(crate) fn gathered(run: &RunResult, id: u64) -> super::Gathered {
    let mut g = super::Gathered::default();
    for ev in &run.events {
        let ours = match &ev.event {
            PipelineEvent::Commit { id: c, .. } => *c == id,
            e => e.utterance_id() == Some(id),
        };
        if ours {
            g.event(ev);
        }
    }
    for s in &run.outcome.spans {
        if s.utterance == Some(id) && s.kind == SpanKind::Process {
            g.span(s);
        }
    }
    g
}

/// The context `run`'s turns are reported in.
pub(crate) fn context(run: &RunResult) -> super::TurnContext<'_> {
    super::TurnContext {
        warmup: 1,
        inputs: &run.inputs,
        failed: run.outcome.failed.as_deref(),
        pace: run.pace,
        clock: run.clock,
        topology: &run.topology,
    }
}
