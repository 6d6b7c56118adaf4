//! The run report: per turn, per stage, the summary with its percentiles,
//! the bottlenecks and the budget verdict. `report.json` is this structure
//! serialised (schema documented in docs/report.md; [`SCHEMA_VERSION`] changes
//! when a field changes meaning or disappears).
//!
//! Definitions (DESIGN.md §3): endpoint delay = true end of speech →
//! utterance closed; STT latency = utterance closed → transcript, less
//! the time queued; LLM TTFT = transcript ready → first token; response
//! latency = end of speech → first token = the sum of the terms the
//! topology declares ([`voxline_core::Topology::latency_terms`]: the
//! endpoint, each stage's queue wait and service, the LLM's time to its
//! first token, the commit wait), exactly.
//!
//! With `--pace realtime` the terms are read off the wall clock. With
//! `--pace fast` audio arrives faster than real time, so the terms are
//! computed on a virtual clock: each utterance closes at its audio time and
//! each stage serves turns in order, taking the service time it was
//! measured to take — what a live user would have felt, deterministically.
//!
//! The parts: `schema` (what `report.json` holds; a remote language
//! model's own figures in `server`), `gather`
//! (one utterance's events and spans made into its turn), `clocks` (a
//! turn's terms on the wall clock, or placed on the virtual one),
//! `simulate` (the virtual clock's simulator), `stages` (per-stage totals
//! and rows), `bottleneck`, and the renderers: `markdown`, `csv`,
//! `timeline` (SVG). [`build`] puts them together.
//!
//! Around it: a live session's report kept in bounded memory ([`tally`]),
//! budgets ([`budget`]), the percentiles ([`stats`]) and the bench's outputs
//! (the baseline comparison and the trace, [`bench`](mod@bench)).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod bench;
pub mod budget;
pub use budget::HostScale;
pub mod conversation;
pub mod host;
pub mod stats;
pub mod tally;

use std::collections::BTreeMap;

use voxline_core::{Clock, PipelineEvent, SpanKind};

use crate::stats::Percentiles;
use voxline_pipeline::pipeline::{Pace, RunResult};

mod bottleneck;
mod clocks;
mod config;
mod csv;
mod gather;
mod markdown;
mod schema;
mod server;
mod simulate;
mod stages;
mod timeline;

pub(crate) use bottleneck::{bottleneck, TermTotals};
pub use csv::to_csv;
pub(crate) use gather::{finish_turn, turn_report, Gathered, TurnContext};
pub use markdown::to_markdown;
pub use schema::{
    BaselineResult, Bottleneck, BudgetCheck, BudgetResult, ColdStart, Report, ReportClock,
    RunConfig, ServerSummary, ServerTurnReport, SpecSummary, StageReport, StageWork, Summary,
    Thrown, TurnReport, TurnTimeline, SCHEMA_VERSION,
};
pub(crate) use stages::{dropped_total, in_flow_order, stage_report, StageTotals, TokenTotals};
pub use timeline::timeline_svg;

use simulate::{simulate, with_virtual_waits, SimCores, SimJob};
use stages::stage_reports;

/// Builds the report of a run and checks it against `budget`, if given.
/// `config.warmup` turns (the first ones) are excluded
/// from the summary; `model_load_ms` is the cold-start load time.
#[must_use]
pub fn build(
    run: &RunResult,
    config: RunConfig,
    model_load_ms: f64,
    budget: Option<&crate::budget::Budget>,
) -> Report {
    let warmup = config.warmup;
    let clock = run.clock;
    let mut by_id: BTreeMap<u64, Gathered> = BTreeMap::new();
    let mut spec = SpecSummary::default();
    let mut cancelled_ids = std::collections::BTreeSet::new();
    let mut merged = std::collections::BTreeSet::new();
    for ev in &run.events {
        match &ev.event {
            PipelineEvent::SpecStart { .. } => spec.started += 1,
            PipelineEvent::SpecCancel { id, .. } => {
                spec.cancelled += 1;
                cancelled_ids.insert(*id);
            }
            PipelineEvent::Commit { id, .. } => {
                spec.committed += 1;
                by_id.entry(*id).or_default().event(ev);
            }
            PipelineEvent::Merged { id, .. } => {
                // taken back: its work was for nothing, and it is no turn
                merged.insert(*id);
                cancelled_ids.insert(*id);
            }
            PipelineEvent::Utterance(_)
            | PipelineEvent::Transcript(_)
            | PipelineEvent::Engine(_)
            | PipelineEvent::TurnError(_) => {
                if let Some(id) = ev.event.utterance_id() {
                    by_id.entry(id).or_default().event(ev);
                }
            }
            _ => {}
        }
    }
    for s in &run.outcome.spans {
        if s.utterance.is_some_and(|id| cancelled_ids.contains(&id)) {
            let mut thrown = crate::schema::Thrown::default();
            thrown.add(s);
            spec.throw_away(&s.stage, thrown);
        }
    }
    for s in &run.outcome.spans {
        let (Some(id), SpanKind::Process) = (s.utterance, s.kind) else {
            continue;
        };
        by_id.entry(id).or_default().span(s);
    }

    let mut turns = Vec::new();
    let mut jobs: Vec<SimJob> = Vec::new();
    let audio_ms = Clock::samples_to_ms(run.audio_samples);
    let cx = TurnContext {
        warmup,
        inputs: &run.inputs,
        failed: run.outcome.failed.as_deref(),
        pace: run.pace,
        clock,
        topology: &run.topology,
    };
    // turns counted for the warm-up: cancelled attempts (spans, no utterance) are not turns
    let mut n = 0;
    for (id, g) in by_id {
        if merged.contains(&id) {
            continue;
        }
        let Some((t, job)) = turn_report(n, id, &g, &cx) else {
            continue;
        };
        n += 1;
        if let Some(mut job) = job {
            job.turn = turns.len();
            jobs.push(job);
        }
        turns.push(t);
    }

    let session_ms = match run.pace {
        Pace::Realtime | Pace::Live => clock.ms_since_origin(run.outcome.finished),
        Pace::Fast => {
            let cores = SimCores::of(run.cpu_share);
            audio_ms.max(simulate(&jobs, cores, &mut turns, &run.topology))
        }
    };
    for t in &mut turns {
        finish_turn(t, &run.topology);
    }
    let stages = stage_reports(run, &turns, session_ms);
    let stages = if run.pace == Pace::Fast {
        with_virtual_waits(stages, &turns, &run.topology)
    } else {
        stages
    };
    let counted: Vec<&TurnReport> = turns
        .iter()
        .filter(|t| !t.warmup && !t.non_speech)
        .collect();
    let pick = |f: &dyn Fn(&TurnReport) -> Option<f64>| -> Option<Percentiles> {
        Percentiles::of(&counted.iter().filter_map(|t| f(t)).collect::<Vec<_>>())
    };
    let wers: Vec<f64> = counted.iter().filter_map(|t| t.wer).collect();
    let mut summary = Summary {
        turns: turns.iter().filter(|t| !t.non_speech).count(),
        non_speech: turns.iter().filter(|t| t.non_speech).count(),
        echoes: turns.iter().filter(|t| t.is_echo()).count(),
        completed: turns.iter().filter(|t| t.response.is_some()).count(),
        errors: turns.iter().filter(|t| t.error.is_some()).count(),
        warmup_turns: turns.iter().filter(|t| t.warmup).count(),
        audio_s: audio_ms / 1000.0,
        session_s: session_ms / 1000.0,
        response_latency_ms: pick(&|t| t.response_latency_ms),
        processing_ms: pick(&|t| t.processing_ms),
        speculation: spec,
        end_of_turn: crate::schema::EndOfTurnSummary::of(counted.iter().copied(), merged.len()),
        llm_server: crate::schema::ServerSummary::of(counted.iter().copied()),
        endpoint_delay_ms: pick(&|t| t.endpoint_delay_ms),
        terms_ms: run
            .topology
            .latency_terms()
            .into_iter()
            .filter_map(|x| Some((x.name.clone(), pick(&|t| t.terms_ms.get(&x.name).copied())?)))
            .collect(),
        stt_ms: pick(&|t| t.stt_ms),
        stt_rtfx: pick(&|t| t.stt_rtfx),
        llm_ttft_ms: pick(&|t| t.llm_ttft_ms),
        llm_decode_tps: pick(&|t| t.llm_decode_tps),
        llm_prefill_tps: pick(&|t| t.llm_prefill_tps),
        voice_latency_ms: pick(&|t| t.voice_latency_ms),
        tts_first_audio_ms: pick(&|t| t.tts_first_audio_ms),
        tts_rtfx: pick(&|t| t.tts_rtfx),
        barge_in_ms: pick(&|t| t.barge_in_ms),
        false_interruptions: turns.iter().map(|t| t.false_interruptions).sum(),
        wer: (!wers.is_empty()).then(|| wers.iter().sum::<f64>() / wers.len() as f64),
        engine_threads_peak: run.engine_threads_peak,
        dropped: dropped_total(run),
        ..Default::default()
    };
    let mut terms = TermTotals::default();
    for t in &counted {
        terms.add(t, &run.topology);
    }
    summary.bottleneck = bottleneck(&stages, &terms, &run.topology, &config);
    summary.budget = BudgetResult {
        given: false,
        passed: true,
        ..Default::default()
    };
    let first_latency = turns.first().and_then(|t| t.response_latency_ms);
    let clock = match run.pace {
        Pace::Realtime | Pace::Live => ReportClock::Wall,
        Pace::Fast => ReportClock::Virtual,
    };
    let cold_start = ColdStart {
        model_load_ms,
        first_turn_response_latency_ms: first_latency,
    };
    assemble(
        run, clock, config, summary, cold_start, turns, stages, budget,
    )
}

/// The report of `run` from its parts (a replay's gathered at the end, a
/// live session's tallied), its budget verdict given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble(
    run: &RunResult,
    clock: ReportClock,
    config: RunConfig,
    summary: Summary,
    cold_start: ColdStart,
    turns: Vec<TurnReport>,
    stages: Vec<StageReport>,
    budget: Option<&budget::Budget>,
) -> Report {
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        voxline_version: env!("CARGO_PKG_VERSION").into(),
        clock,
        config,
        summary,
        cold_start,
        turns,
        stages,
        edges: run.outcome.edges.clone(),
        input_errors: run.input_errors.clone(),
        input_warnings: run.input_warnings.clone(),
        failed: run.outcome.failed.clone(),
        interrupted: run.interrupted,
        baseline: None,
        host: None,
        live: run.live.clone(),
        topology: run.topology.clone(),
    };
    if let Some(b) = budget {
        report.summary.budget = b.evaluate(&report);
    }
    report
}

impl Report {
    /// Records the host's speed, probed beside the run, and judges the
    /// report against `budget` again with it (a budget with `[host]` scales
    /// its limits by it).
    pub fn set_host(&mut self, host: host::HostSpeed, budget: Option<&budget::Budget>) {
        self.host = Some(host);
        if let Some(b) = budget {
            self.summary.budget = b.evaluate(self);
        }
    }
}

#[cfg(test)]
mod fixture;

#[cfg(test)]
mod tests {
    use super::*;
    use voxline_pipeline::settings::CpuShare;

    fn report(pace: Pace, cpu_share: CpuShare) -> Report {
        let config = RunConfig {
            cpu_share,
            warmup: 1,
            ..RunConfig::default()
        };
        build(&fixture::run(pace, cpu_share), config, 12.5, None)
    }

    fn latencies(r: &Report) -> Vec<(u64, Option<f64>)> {
        r.turns
            .iter()
            .map(|t| (t.id, t.response_latency_ms))
            .collect()
    }

    #[test]
    fn a_run_s_turns_summary_and_stages() {
        let r = report(Pace::Fast, CpuShare::Priority);
        assert_eq!(r.schema_version, SCHEMA_VERSION);
        assert_eq!(r.clock, ReportClock::Virtual);
        // the cancelled attempt (2) is no turn
        let ids: Vec<u64> = r.turns.iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 3, 4]);
        let s = &r.summary;
        assert_eq!(
            (s.turns, s.completed, s.errors, s.warmup_turns),
            (3, 2, 1, 1)
        );
        assert_eq!((s.speculation.started, s.speculation.committed), (2, 1));
        assert_eq!(s.speculation.cancelled, 1);
        assert_eq!(s.speculation.cancelled_busy_ms.get("stt"), Some(&290.0));
        // in calls and cores: one call of STT's two threads
        assert_eq!(
            s.speculation.thrown.get("stt"),
            Some(&Thrown {
                calls: 1,
                busy_ms: 290.0,
                core_ms: 580.0
            })
        );
        assert_eq!(s.audio_s, 4.0);
        assert_eq!(s.wer, Some(0.0));
        assert_eq!(s.engine_threads_peak, 2);
        // the warm-up turn counts in no percentile: one answered turn is left
        // (on the virtual clock `upper` takes its 2 ms before the LLM)
        assert_eq!(
            s.response_latency_ms.map(|p| (p.n, p.mean)),
            Some((1, 882.0))
        );
        assert_eq!(r.cold_start.model_load_ms, 12.5);
        assert_eq!(r.cold_start.first_turn_response_latency_ms, Some(1685.0));
        let names: Vec<&str> = r.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["vad", "stt", "upper", "llm", "sink"]);
        assert_eq!(s.bottleneck.throughput.as_deref(), Some("stt"));
        assert_eq!(s.bottleneck.latency.as_deref(), Some("stt"));
        // the mean terms of the counted turns add up to their mean latency
        let terms: f64 = s.bottleneck.latency_terms_ms.values().sum();
        assert!((terms - 882.0).abs() < 1e-9, "{terms}");
        // the decomposition has every declared term, the added stage's too
        let declared: Vec<String> = (r.topology.latency_terms().into_iter())
            .map(|x| x.name)
            .collect();
        assert_eq!(declared.len(), 8);
        for name in &declared {
            assert!(s.terms_ms.contains_key(name), "{name}");
            assert!(s.bottleneck.latency_terms_ms.contains_key(name), "{name}");
        }
        assert_eq!(s.terms_ms["upper"].mean, 2.0);
        assert!(s.budget.passed && !s.budget.given);
    }

    #[test]
    fn at_fast_pace_the_virtual_clock_gives_the_latencies() {
        let r = report(Pace::Fast, CpuShare::Split);
        // turn 1: speech ended at 1000 ms, closed at 1700, STT 790 ms,
        // `upper` 5 ms, first token 190 ms later; turn 3: sent at 3250,
        // `upper` 2 ms, first token at 3882
        assert_eq!(
            latencies(&r),
            [(1, Some(1685.0)), (3, Some(882.0)), (4, None)]
        );
        let t3 = &r.turns[1];
        assert_eq!(
            t3.timeline.stages.get("stt").copied(),
            Some([3250.0, 3790.0])
        );
        assert_eq!(
            t3.timeline.stages.get("upper").copied(),
            Some([3790.0, 3792.0])
        );
        assert_eq!(t3.timeline.first_token_ms, Some(3882.0));
        assert_eq!(t3.processing_ms, Some(182.0));
        // split cores: turn 4's STT starts when it closes, at 4000 ms, while
        // the LLM still answers turn 3 (until 4082 ms, when the session ends)
        assert_eq!(r.turns[2].stt_queue_ms, Some(0.0));
        assert_eq!(r.summary.session_s, 4.082);
        // shared cores: it waits for that answer
        let r = report(Pace::Fast, CpuShare::Shared);
        assert_eq!(
            r.turns[2].timeline.stages.get("stt").copied(),
            Some([4082.0, 4122.0])
        );
        assert_eq!(r.turns[2].stt_queue_ms, Some(82.0));
        assert_eq!(r.summary.session_s, 4.122);
        // the rates are derived once the latencies are final
        assert!((t3.stt_rtfx.unwrap() - 1018.75 / 540.0).abs() < 1e-9);
        assert!((t3.llm_prefill_tps.unwrap() - 20.0 / 0.09).abs() < 1e-9);
    }

    #[test]
    fn at_realtime_pace_the_wall_clock_gives_them() {
        let r = report(Pace::Realtime, CpuShare::Split);
        assert_eq!(r.clock, ReportClock::Wall);
        assert_eq!(r.summary.session_s, 4.3, "when the last thread was joined");
        let got: Vec<(u64, Option<f64>)> = latencies(&r)
            .into_iter()
            .map(|(id, l)| (id, l.map(|l| (l * 100.0).round() / 100.0)))
            .collect();
        assert_eq!(got, [(1, Some(1700.25)), (3, Some(900.75)), (4, None)]);
        // measured queue waits stand at realtime pace
        let stt = &r.stages[1];
        assert_eq!(stt.queue_wait_ms.map(|q| (q.n, q.mean)), Some((4, 10.0)));
    }

    #[test]
    fn a_budget_is_checked_against_the_report() {
        let budget = crate::budget::Budget {
            max: Some(crate::budget::MaxLimits {
                errors: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = build(
            &fixture::run(Pace::Fast, voxline_pipeline::settings::CpuShare::Split),
            RunConfig::default(),
            0.0,
            Some(&budget),
        );
        assert!(r.summary.budget.given);
        assert!(!r.summary.budget.passed, "{:?}", r.summary.budget);
        let failed: Vec<_> = r
            .summary
            .budget
            .violations
            .iter()
            .map(|c| c.measured)
            .collect();
        assert_eq!(failed, [Some(1.0)], "one turn failed");
    }
}
