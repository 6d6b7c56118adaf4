//! The run report: per turn, per stage, the summary with its percentiles,
//! the bottlenecks and the budget verdict. `report.json` is this structure
//! serialised (schema documented in the README; [`SCHEMA_VERSION`] changes
//! when a field changes meaning or disappears).
//!
//! Definitions (DESIGN.md §3): endpoint delay = true end of speech →
//! utterance closed; STT latency = utterance closed → transcript, less
//! the time queued; LLM TTFT = transcript ready → first token; response
//! latency = end of speech → first token = endpoint delay + STT queue wait +
//! STT + LLM queue wait + LLM time to first token (exactly; the report checks).
//!
//! With `--pace realtime` the terms are read off the wall clock. With
//! `--pace fast` audio arrives faster than real time, so the terms are
//! computed on a virtual clock: each utterance closes at its audio time and
//! each stage serves turns in order, taking the service time it was
//! measured to take — what a live user would have felt, deterministically.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use voxline_core::{
    Clock, EdgeStatsSnapshot, PipelineEvent, Span, SpanKind, StopReason, TimedEvent, Transcript,
    TurnComplete, UtteranceInfo,
};

use crate::pipeline::{Pace, RunResult};
use crate::stats::Percentiles;
use crate::topology::{LLM, STT, VAD};

/// Version of the report schema.
pub const SCHEMA_VERSION: u32 = 2;

/// One turn: an utterance and what became of it.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TurnReport {
    /// Utterance id (from 1).
    pub id: u64,
    /// Excluded from the summary as warm-up.
    pub warmup: bool,
    /// The recording it came from.
    pub file: Option<PathBuf>,
    /// What whisper heard.
    pub transcript: Option<String>,
    /// What the sidecar says was said.
    pub expected: Option<String>,
    /// Word error rate against `expected`.
    pub wer: Option<f64>,
    /// The answer.
    pub response: Option<String>,
    /// Stream position of the utterance start (16 kHz).
    pub start_sample: u64,
    /// End of speech as the VAD saw it.
    pub end_sample: u64,
    /// End of speech per the sidecar (else the VAD's).
    pub true_end_sample: u64,
    /// Where the VAD closed the utterance (confirmed the end, for a speculative turn).
    pub closed_sample: u64,
    /// Where the speculative attempt that became this turn was sent.
    pub spec_sample: Option<u64>,
    /// Utterance length.
    pub audio_ms: f64,
    /// True end of speech → utterance closed (for a speculative turn: its end confirmed, the commit).
    pub endpoint_delay_ms: Option<f64>,
    /// Speculative turns: true end of speech → the attempt was sent downstream.
    pub spec_delay_ms: Option<f64>,
    /// Speculative turns: the first token was ready this long before the commit released it.
    pub commit_wait_ms: Option<f64>,
    /// Utterance committed (closed) → first token shown: the processing the user waits for after the endpointer decided.
    pub processing_ms: Option<f64>,
    /// Utterance closed → STT started.
    pub stt_queue_ms: Option<f64>,
    /// STT started → transcript.
    pub stt_ms: Option<f64>,
    /// Audio seconds per STT second.
    pub stt_rtfx: Option<f64>,
    /// Transcript tokens.
    pub stt_tokens: Option<u32>,
    /// Transcript tokens per STT second.
    pub stt_tps: Option<f64>,
    /// Transcript ready → LLM started.
    pub llm_queue_ms: Option<f64>,
    /// Transcript ready → first token (queue wait included).
    pub llm_ttft_ms: Option<f64>,
    /// LLM started → first token (prefill and first sample).
    pub llm_first_token_ms: Option<f64>,
    /// Tokens of the rendered prompt.
    pub llm_prompt_tokens: Option<u32>,
    /// Prompt tokens evaluated this turn (the rest came from the KV cache), per llama.cpp.
    pub llm_prefill_tokens: Option<u32>,
    /// Prefill tokens per second.
    pub llm_prefill_tps: Option<f64>,
    /// Tokens sampled (end-of-generation included).
    pub llm_generated_tokens: Option<u32>,
    /// Tokens streamed as text.
    pub llm_streamed_tokens: usize,
    /// Decode tokens per second: (n − 1) / (t_last − t_first).
    pub llm_decode_tps: Option<f64>,
    /// Gaps between streamed tokens.
    pub inter_token_ms: Option<Percentiles>,
    /// LLM started → turn complete.
    pub llm_ms: Option<f64>,
    /// End of speech → first token.
    pub response_latency_ms: Option<f64>,
    /// Why generation stopped.
    pub stop: Option<StopReason>,
    /// Earlier turns of the conversation the LLM dropped from this turn's
    /// prompt to fit its context (0: the whole history was kept).
    pub llm_history_dropped: Option<u32>,
    /// The error that ended the turn, as `stage: message`.
    pub error: Option<String>,
    /// Why a figure of this turn was left out (e.g. a latency that came out
    /// negative because the recorded end of speech is after the answer began).
    pub note: Option<String>,
    /// When things happened, in ms on the report's clock (for timelines).
    pub timeline: TurnTimeline,
    /// Each stage's measured work on this turn, by stage (not in the JSON;
    /// the CSV and the timeline show it for every stage of the topology).
    #[serde(skip)]
    pub work: BTreeMap<String, StageWork>,
}

/// One stage's work on one turn, as measured: its calls for the turn, from
/// the first start to the last end on the session clock (ms since its
/// origin), and the time they computed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageWork {
    /// The first call's start.
    pub start_ms: f64,
    /// The last call's end.
    pub end_ms: f64,
    /// Busy time (waits for room downstream or for the cores excluded).
    pub busy_ms: f64,
}

/// A turn's moments on the report's clock (ms since the session origin; the
/// virtual clock at fast pace).
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct TurnTimeline {
    /// True end of speech.
    pub end_of_speech_ms: f64,
    /// Utterance closed by the VAD.
    pub closed_ms: f64,
    /// STT started / finished.
    pub stt_ms: Option<[f64; 2]>,
    /// LLM started / finished.
    pub llm_ms: Option<[f64; 2]>,
    /// First token.
    pub first_token_ms: Option<f64>,
}

/// One stage over the whole run.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// Stage name.
    pub name: String,
    /// Items processed.
    pub items: usize,
    /// Time busy (blocked output excluded).
    pub busy_ms: f64,
    /// busy / session time: above 1.0 the stage cannot keep up with real time.
    pub utilization: f64,
    /// Tokens produced (STT: transcript tokens; LLM: tokens streamed as
    /// text, the end-of-generation token excluded).
    pub tokens: Option<u64>,
    /// STT: tokens per busy second. LLM: decode tokens/s, the definition of
    /// `llm_decode_tps` ((n − 1) / (t_last − t_first) over a turn's streamed
    /// tokens) pooled over the turns: their gaps over their decode time.
    pub tokens_per_s: Option<f64>,
    /// Time items waited in the stage's input queue.
    pub queue_wait_ms: Option<Percentiles>,
    /// Deepest the input queue got.
    pub queue_max_depth: usize,
    /// Input queue capacity.
    pub queue_capacity: usize,
    /// Items dropped from the input queue.
    pub dropped: u64,
}

/// The stages that limit the pipeline.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Bottleneck {
    /// Stage with the highest utilisation (limits throughput).
    pub throughput: Option<String>,
    /// Largest term of the response latency (limits latency): endpoint, stt_queue, stt, llm_queue or llm_first_token.
    pub latency: Option<String>,
    /// One line on each, with the numbers.
    pub reason: String,
    /// Mean of each latency term over the counted turns, ms.
    pub latency_terms_ms: BTreeMap<String, f64>,
}

/// One limit checked against a budget.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetCheck {
    /// The limit, e.g. `response_latency_ms.p95 <= 3000`.
    pub limit: String,
    /// The measured value (null when there was nothing to measure).
    pub measured: Option<f64>,
    /// Whether it held.
    pub passed: bool,
}

/// The budget verdict.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BudgetResult {
    /// Whether a budget was given.
    pub given: bool,
    /// True when every limit held (or no budget was given).
    pub passed: bool,
    /// Every limit checked.
    pub checks: Vec<BudgetCheck>,
    /// The limits that failed.
    pub violations: Vec<BudgetCheck>,
}

/// Cold start: what the first turn costs beyond a warm one.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ColdStart {
    /// Loading both models (and evaluating the system prompt).
    pub model_load_ms: f64,
    /// Response latency of the first turn.
    pub first_turn_response_latency_ms: Option<f64>,
}

/// Run-wide figures.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Summary {
    /// Utterances seen.
    pub turns: usize,
    /// Turns answered.
    pub completed: usize,
    /// Turns that ended in an error.
    pub errors: usize,
    /// Turns excluded as warm-up.
    pub warmup_turns: usize,
    /// Audio replayed, seconds.
    pub audio_s: f64,
    /// Session length on the report's clock, seconds.
    pub session_s: f64,
    /// End of speech → first token.
    pub response_latency_ms: Option<Percentiles>,
    /// Turn committed (closed) → first token.
    pub processing_ms: Option<Percentiles>,
    /// Speculative turn-taking: attempts started, committed, cancelled, and
    /// the CPU time (stage busy time) cancelled attempts cost.
    pub speculation: SpecSummary,
    /// Endpoint delay.
    pub endpoint_delay_ms: Option<Percentiles>,
    /// STT latency.
    pub stt_ms: Option<Percentiles>,
    /// STT real-time factor (audio s / STT s), per turn.
    pub stt_rtfx: Option<Percentiles>,
    /// LLM time to first token.
    pub llm_ttft_ms: Option<Percentiles>,
    /// LLM decode tokens/s, per turn.
    pub llm_decode_tps: Option<Percentiles>,
    /// LLM prefill tokens/s, per turn.
    pub llm_prefill_tps: Option<Percentiles>,
    /// Mean word error rate over turns with a sidecar.
    pub wer: Option<f64>,
    /// Audio dropped (capture ring and audio queue together), in 16 kHz
    /// frames: 16 000 is a second.
    pub dropped: u64,
    /// The most engine threads that computed at once (never above the thread budget).
    pub engine_threads_peak: usize,
    /// The bottlenecks.
    pub bottleneck: Bottleneck,
    /// The budget verdict.
    pub budget: BudgetResult,
}

/// What speculative turn-taking did over a run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SpecSummary {
    /// Attempts sent early.
    pub started: usize,
    /// Attempts that became turns.
    pub committed: usize,
    /// Attempts thrown away because speech resumed.
    pub cancelled: usize,
    /// Busy time stages spent on cancelled attempts, ms per stage.
    pub cancelled_busy_ms: BTreeMap<String, f64>,
}

/// What the run was configured with (for comparing runs).
#[derive(Debug, Clone, Serialize, Default)]
pub struct RunConfig {
    /// Pacing.
    pub pace: String,
    /// Threads in all / whisper / LLM.
    pub threads: [usize; 3],
    /// `split`, `shared` (engines take turns on all threads) or `priority` (take turns, critical path first).
    pub cpu_share: String,
    /// whisper encoder window policy.
    pub audio_ctx: String,
    /// Max tokens per answer.
    pub max_tokens: u32,
    /// LLM context.
    pub n_ctx: u32,
    /// System prompt / history KV reuse.
    pub cache_prompt: bool,
    /// Multi-turn memory.
    pub memory: bool,
    /// whisper model file name.
    pub whisper_model: String,
    /// LLM file name.
    pub llm_model: String,
    /// Inputs.
    pub inputs: Vec<PathBuf>,
    /// Warm-up turns excluded.
    pub warmup: usize,
    /// Silence that ends a turn, ms.
    pub hangover_ms: u32,
    /// Silence after which a turn is sent early (speculation), ms; `null` = off.
    pub spec_silence_ms: Option<u32>,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Sampling seed.
    pub seed: u32,
}

impl RunConfig {
    /// The configuration of a run with these engine settings.
    #[must_use]
    pub fn from_settings(
        settings: &crate::settings::EngineSettings,
        pace: &str,
        inputs: Vec<PathBuf>,
        warmup: usize,
    ) -> Self {
        let name = |p: &std::path::Path| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        };
        Self {
            pace: pace.to_string(),
            threads: [
                settings.threads.total,
                settings.threads.stt,
                settings.threads.llm,
            ],
            cpu_share: settings.threads.mode().into(),
            audio_ctx: settings.audio_ctx.to_string(),
            max_tokens: settings.max_tokens,
            n_ctx: settings.n_ctx,
            cache_prompt: settings.cache_prompt,
            memory: settings.memory,
            whisper_model: name(&settings.whisper_model),
            llm_model: name(&settings.llm_model),
            inputs,
            warmup,
            // through its shortest decimal form, so 0.7 is written 0.7, not 0.699999988
            temperature: settings
                .sampling
                .temperature
                .to_string()
                .parse()
                .unwrap_or_default(),
            seed: settings.sampling.seed,
            ..Self::default()
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// voxline's version.
    pub voxline_version: String,
    /// `wall` (realtime pace) or `virtual` (fast pace).
    pub clock: String,
    /// Configuration.
    pub config: RunConfig,
    /// The headline figures.
    pub summary: Summary,
    /// Cold start.
    pub cold_start: ColdStart,
    /// Every turn.
    pub turns: Vec<TurnReport>,
    /// Every stage.
    pub stages: Vec<StageReport>,
    /// Every edge.
    pub edges: Vec<EdgeStatsSnapshot>,
    /// Input problems.
    pub input_errors: Vec<String>,
    /// Warnings about the input (a lying header, a near-silent recording).
    pub input_warnings: Vec<String>,
    /// Set when a stage failed and the run stopped.
    pub failed: Option<String>,
    /// Set when the run was interrupted.
    pub interrupted: bool,
    /// The comparison with `--baseline`, when given.
    pub baseline: Option<BaselineResult>,
    /// The live capture's figures (live sessions only).
    pub live: Option<crate::pipeline::LiveReport>,
    /// The pipeline's stages and edges (not in the JSON: the renderers walk it).
    #[serde(skip)]
    pub topology: voxline_core::Topology,
}

/// This run against an earlier report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BaselineResult {
    /// The baseline report.
    pub path: PathBuf,
    /// `improved`, `unchanged` or `regressed`.
    pub verdict: String,
    /// Each compared metric.
    pub metrics: Vec<crate::bench::Comparison>,
}

fn ms(a: Instant, b: Instant) -> f64 {
    if b >= a {
        (b - a).as_secs_f64() * 1000.0
    } else {
        -((a - b).as_secs_f64() * 1000.0)
    }
}

/// One utterance's events and spans, gathered for its turn report.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    utt: Option<(UtteranceInfo, Instant)>,
    transcript: Option<(Transcript, Instant)>,
    tokens: Vec<Instant>,
    done: Option<TurnComplete>,
    error: Option<String>,
    stt_span: Option<(Instant, Instant, f64)>,
    llm_span: Option<(Instant, Instant, Instant, f64)>,
    /// The attempt's commit: (sent at, confirmed at) stream positions, and when.
    commit: Option<(u64, u64, Instant)>,
    /// Every stage's calls for the turn: first start, last end, busy ms.
    work: BTreeMap<String, (Instant, Instant, f64)>,
}

impl Gathered {
    /// Takes what `ev` says about this utterance (the caller routes by id).
    pub(crate) fn event(&mut self, ev: &TimedEvent) {
        match &ev.event {
            PipelineEvent::Utterance(u) => self.utt = Some((*u, ev.at)),
            PipelineEvent::Transcript(t) => self.transcript = Some((t.clone(), ev.at)),
            PipelineEvent::Token(_) => self.tokens.push(ev.at),
            PipelineEvent::TurnComplete(c) => self.done = Some(c.clone()),
            PipelineEvent::TurnError(e) => {
                self.error
                    .get_or_insert(format!("{}: {}", e.stage, e.message));
            }
            PipelineEvent::Commit {
                spec_sample,
                sample,
                ..
            } => self.commit = Some((*spec_sample, *sample, ev.at)),
            _ => {}
        }
    }

    /// Takes a process span of this utterance.
    pub(crate) fn span(&mut self, s: &Span) {
        // service time: waits for room downstream or for the cores are not work
        let busy = s.busy().as_secs_f64() * 1000.0;
        let work = self
            .work
            .entry(s.stage.clone())
            .or_insert((s.started, s.finished, 0.0));
        *work = (work.0.min(s.started), work.1.max(s.finished), work.2 + busy);
        if s.stage == STT {
            self.stt_span = Some((s.started, s.finished, busy));
        } else if s.stage == LLM {
            self.llm_span = Some((
                s.started,
                s.first_emit.unwrap_or(s.finished),
                s.finished,
                busy,
            ));
        }
    }

    /// Whether the turn has ended: answered, or failed.
    pub(crate) fn ended(&self) -> bool {
        self.done.is_some() || self.error.is_some()
    }

    /// Whether the utterance itself was seen (a cancelled attempt's never is).
    pub(crate) fn has_utterance(&self) -> bool {
        self.utt.is_some()
    }
}

/// What a turn's report is made against besides its own events.
pub(crate) struct TurnContext<'a> {
    /// Turns before this index are warm-up.
    pub warmup: usize,
    /// Where each replayed file sits in the stream (none live).
    pub inputs: &'a [crate::pipeline::InputSpan],
    /// The run's failure, if it failed (a turn it cut short says so).
    pub failed: Option<&'a str>,
    /// Pacing.
    pub pace: Pace,
    /// The session clock.
    pub clock: Clock,
}

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
    if let Some(tally) = &run.tally {
        // a live session: measured as it ran, in bounded memory
        return tally.report(run, config, model_load_ms, budget);
    }
    let warmup = config.warmup;
    let clock = run.clock;
    let mut by_id: BTreeMap<u64, Gathered> = BTreeMap::new();
    let mut spec = SpecSummary::default();
    let mut cancelled_ids = std::collections::BTreeSet::new();
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
            PipelineEvent::Utterance(_)
            | PipelineEvent::Transcript(_)
            | PipelineEvent::Token(_)
            | PipelineEvent::TurnComplete(_)
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
            *spec.cancelled_busy_ms.entry(s.stage.clone()).or_default() +=
                s.busy().as_secs_f64() * 1000.0;
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
    };
    // turns counted for the warm-up: cancelled attempts (spans, no utterance) are not turns
    let mut n = 0;
    for (id, g) in by_id {
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
        Pace::Realtime => clock.ms_since_origin(run.outcome.finished),
        Pace::Fast => {
            let cores = match (run.cpu_shared, config.cpu_share.as_str()) {
                (false, _) => SimCores::Split,
                (true, "priority") => SimCores::Priority,
                (true, _) => SimCores::Shared,
            };
            audio_ms.max(simulate(&jobs, cores, &mut turns))
        }
    };
    for t in &mut turns {
        finish_turn(t);
    }
    let stages = stage_reports(run, &turns, session_ms);
    let stages = if run.pace == Pace::Fast {
        with_virtual_waits(stages, &turns)
    } else {
        stages
    };
    let counted: Vec<&TurnReport> = turns.iter().filter(|t| !t.warmup).collect();
    let pick = |f: &dyn Fn(&TurnReport) -> Option<f64>| -> Option<Percentiles> {
        Percentiles::of(&counted.iter().filter_map(|t| f(t)).collect::<Vec<_>>())
    };
    let wers: Vec<f64> = counted.iter().filter_map(|t| t.wer).collect();
    let mut summary = Summary {
        turns: turns.len(),
        completed: turns.iter().filter(|t| t.response.is_some()).count(),
        errors: turns.iter().filter(|t| t.error.is_some()).count(),
        warmup_turns: turns.iter().filter(|t| t.warmup).count(),
        audio_s: audio_ms / 1000.0,
        session_s: session_ms / 1000.0,
        response_latency_ms: pick(&|t| t.response_latency_ms),
        processing_ms: pick(&|t| t.processing_ms),
        speculation: spec,
        endpoint_delay_ms: pick(&|t| t.endpoint_delay_ms),
        stt_ms: pick(&|t| t.stt_ms),
        stt_rtfx: pick(&|t| t.stt_rtfx),
        llm_ttft_ms: pick(&|t| t.llm_ttft_ms),
        llm_decode_tps: pick(&|t| t.llm_decode_tps),
        llm_prefill_tps: pick(&|t| t.llm_prefill_tps),
        wer: (!wers.is_empty()).then(|| wers.iter().sum::<f64>() / wers.len() as f64),
        engine_threads_peak: run.engine_threads_peak,
        dropped: dropped_total(run),
        ..Default::default()
    };
    let mut terms = TermTotals::default();
    for t in &counted {
        terms.add(t);
    }
    summary.bottleneck = bottleneck(&stages, &terms, &run.topology);
    summary.budget = BudgetResult {
        given: false,
        passed: true,
        ..Default::default()
    };
    let first_latency = turns.first().and_then(|t| t.response_latency_ms);
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        voxline_version: env!("CARGO_PKG_VERSION").into(),
        clock: match run.pace {
            Pace::Realtime => "wall".into(),
            Pace::Fast => "virtual".into(),
        },
        config,
        summary,
        cold_start: ColdStart {
            model_load_ms,
            first_turn_response_latency_ms: first_latency,
        },
        turns,
        stages,
        edges: run.outcome.edges.clone(),
        input_errors: run.input_errors.clone(),
        input_warnings: run.input_warnings.clone(),
        failed: run.outcome.failed.clone(),
        interrupted: run.interrupted,
        baseline: None,
        live: run.live.clone(),
        topology: run.topology.clone(),
    };
    if let Some(b) = budget {
        report.summary.budget = b.evaluate(&report);
    }
    report
}

/// The report of utterance `id` (turn `n`, from 0), and at fast pace the
/// service times the virtual clock replays for it; `None` when its
/// utterance was never seen (a cancelled attempt). At fast pace the queue
/// waits and latencies are left for [`simulate`]; then [`finish_turn`].
pub(crate) fn turn_report(
    n: usize,
    id: u64,
    g: &Gathered,
    cx: &TurnContext<'_>,
) -> Option<(TurnReport, Option<SimJob>)> {
    let mut job = None;
    let (u, utt_at) = g.utt?;
    let mut t = TurnReport {
        id,
        warmup: n < cx.warmup,
        start_sample: u.start_sample,
        end_sample: u.end_sample,
        closed_sample: u.closed_sample,
        spec_sample: g.commit.map(|(sent, _, _)| sent),
        audio_ms: u.duration_ms(),
        work: g
            .work
            .iter()
            .map(|(stage, (a, b, busy))| {
                let work = StageWork {
                    start_ms: cx.clock.ms_since_origin(*a),
                    end_ms: cx.clock.ms_since_origin(*b),
                    busy_ms: *busy,
                };
                (stage.clone(), work)
            })
            .collect(),
        ..Default::default()
    };
    // Truth from the sidecar: the spoken turn overlapping this utterance most.
    t.true_end_sample = u.end_sample;
    if let Some(input) = cx
        .inputs
        .iter()
        .find(|i| u.end_sample > i.start && u.start_sample < i.end.max(i.start + 1))
    {
        t.file = Some(input.path.clone());
        if let Some(sc) = &input.sidecar {
            let best = sc
                .turns
                .iter()
                .map(|st| {
                    let (s, e) = (
                        input.start + sc.to_16k(st.start_sample),
                        input.start + sc.to_16k(st.end_sample),
                    );
                    let overlap = e.min(u.end_sample).saturating_sub(s.max(u.start_sample));
                    (overlap, st, e)
                })
                .filter(|(o, _, _)| *o > 0)
                .max_by_key(|(o, _, _)| *o);
            if let Some((_, st, e)) = best {
                t.expected = Some(st.text.clone());
                t.true_end_sample = e;
            }
        }
    }
    t.error = g.error.clone().or_else(|| {
        // a turn the failure cut short must not vanish silently
        (g.done.is_none())
            .then(|| cx.failed.map(|f| format!("not finished: {f}")))
            .flatten()
    });
    if let Some((tr, _)) = &g.transcript {
        t.transcript = Some(tr.text.clone());
        t.stt_tokens = Some(tr.n_tokens);
        if let Some(exp) = &t.expected {
            t.wer = Some(voxline_stt::word_error_rate(exp, &tr.text));
        }
    }
    if let Some(d) = &g.done {
        t.response = Some(d.response.clone());
        t.llm_prompt_tokens = Some(d.n_prompt_tokens);
        t.llm_prefill_tokens = Some(d.engine.n_prefill_tokens);
        t.llm_generated_tokens = Some(d.n_generated);
        t.stop = Some(d.stop);
        t.llm_history_dropped = Some(d.history_dropped);
    }
    t.llm_streamed_tokens = g.tokens.len();
    if g.tokens.len() >= 2 {
        let span = ms(g.tokens[0], *g.tokens.last().unwrap_or(&g.tokens[0]));
        if span > 0.0 {
            t.llm_decode_tps = Some((g.tokens.len() - 1) as f64 / (span / 1000.0));
        }
        let gaps: Vec<f64> = g.tokens.windows(2).map(|w| ms(w[0], w[1])).collect();
        t.inter_token_ms = Percentiles::of(&gaps);
    }

    // The latency terms, on the wall clock or the virtual one.
    let stt_service = g
        .stt_span
        .zip(g.transcript.as_ref())
        .map(|((st, _, _), (_, tr_at))| ms(st, *tr_at));
    let llm_first = g
        .llm_span
        .filter(|_| !g.tokens.is_empty())
        .map(|(st, _, _, _)| ms(st, g.tokens[0]));
    match cx.pace {
        Pace::Realtime => {
            // The wall time the true end of speech was captured (or due): the
            // VAD's end-of-speech instant, moved by the sidecar's correction.
            let t_end = if t.true_end_sample >= u.end_sample {
                u.end_wall + Clock::samples_to_duration(t.true_end_sample - u.end_sample)
            } else {
                u.end_wall
                    .checked_sub(Clock::samples_to_duration(u.end_sample - t.true_end_sample))
                    .unwrap_or(u.end_wall)
            };
            let at = |i: Instant| cx.clock.ms_since_origin(i);
            // a speculative turn was sent at `utt_at` and confirmed at its commit
            let closed_at = g.commit.map_or(utt_at, |(_, _, c)| c);
            t.timeline = TurnTimeline {
                end_of_speech_ms: at(t_end),
                closed_ms: at(closed_at),
                stt_ms: g.stt_span.map(|(a, b, _)| [at(a), at(b)]),
                llm_ms: g.llm_span.map(|(a, _, b, _)| [at(a), at(b)]),
                first_token_ms: g.tokens.first().map(|f| at(*f)),
            };
            t.endpoint_delay_ms = Some(ms(t_end, closed_at));
            if g.commit.is_some() {
                t.spec_delay_ms = Some(ms(t_end, utt_at));
            }
            if let Some((st, _, _)) = g.stt_span {
                t.stt_queue_ms = Some(ms(utt_at, st));
            }
            t.stt_ms = stt_service;
            if let (Some((_, tr_at)), Some((st, _, fin, _))) = (&g.transcript, g.llm_span) {
                t.llm_queue_ms = Some(ms(*tr_at, st));
                t.llm_ms = Some(ms(st, fin));
                if let Some(first) = g.tokens.first() {
                    t.llm_ttft_ms = Some(ms(*tr_at, *first));
                    // shown when computed, or at the commit if it was computed earlier
                    let shown = (*first).max(closed_at);
                    t.response_latency_ms = Some(ms(t_end, shown));
                    t.processing_ms = Some(ms(closed_at, shown));
                    if g.commit.is_some() {
                        t.commit_wait_ms = Some(ms(*first, shown));
                    }
                }
            }
            t.llm_first_token_ms = llm_first;
        }
        Pace::Fast => {
            let v_end = Clock::samples_to_ms(t.true_end_sample);
            let v_utt = Clock::samples_to_ms(t.closed_sample);
            t.endpoint_delay_ms = Some(v_utt - v_end);
            t.timeline.end_of_speech_ms = v_end;
            t.timeline.closed_ms = v_utt;
            t.llm_first_token_ms = llm_first;
            if let Some((sent, _, _)) = g.commit {
                t.spec_delay_ms = Some(Clock::samples_to_ms(sent) - v_end);
            }
            job = Some(SimJob {
                turn: 0,
                ready: g
                    .commit
                    .map_or(v_utt, |(sent, _, _)| Clock::samples_to_ms(sent)),
                commit: v_utt,
                speculative: g.commit.is_some(),
                stt: g.stt_span.map(|(_, _, busy)| (busy, stt_service)),
                llm: g.llm_span.map(|(_, _, _, busy)| (busy, llm_first)),
            });
        }
    }
    Some((t, job))
}

/// The figures derived from a turn's latencies, once they are final.
pub(crate) fn finish_turn(t: &mut TurnReport) {
    drop_negative_latencies(t);
    if let Some(s) = t.stt_ms.filter(|s| *s > 0.0) {
        t.stt_rtfx = Some(t.audio_ms / s);
        t.stt_tps = t.stt_tokens.map(|n| f64::from(n) / (s / 1000.0));
    }
    if let (Some(first), Some(n)) = (
        t.llm_first_token_ms.filter(|f| *f > 0.0),
        t.llm_prefill_tokens,
    ) {
        t.llm_prefill_tps = Some(f64::from(n) / (first / 1000.0));
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

/// A latency is a duration: one that comes out negative measures a wrong
/// marker (a recorded end of speech after the utterance closed or the answer
/// began — e.g. a turn the VAD split), not the pipeline. Such a turn keeps
/// its other figures; its endpoint delay and response latency are left out
/// (so they count in no percentile and no budget) and a note says why.
fn drop_negative_latencies(t: &mut TurnReport) {
    let negative = [
        ("endpoint delay", t.endpoint_delay_ms),
        ("response latency", t.response_latency_ms),
    ]
    .into_iter()
    .filter_map(|(name, v)| v.filter(|v| *v < 0.0).map(|v| format!("{name} {v:.0} ms")))
    .collect::<Vec<_>>();
    if negative.is_empty() {
        return;
    }
    t.endpoint_delay_ms = None;
    t.response_latency_ms = None;
    t.note = Some(format!(
        "endpoint delay and response latency left out: {} came out negative, so the end of speech recorded for this turn (sample {}) is after the utterance closed (sample {})",
        negative.join(" and "),
        t.true_end_sample,
        t.closed_sample
    ));
}

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

fn stage_reports(run: &RunResult, turns: &[TurnReport], session_ms: f64) -> Vec<StageReport> {
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

/// One turn's measured service times, for the virtual clock.
pub(crate) struct SimJob {
    /// Index into the turns.
    turn: usize,
    /// When the utterance was sent downstream (virtual ms).
    ready: f64,
    /// When its end was confirmed (= `ready` unless speculative).
    commit: f64,
    /// Sent early, before `commit`.
    speculative: bool,
    /// STT busy time and its time to the transcript.
    stt: Option<(f64, Option<f64>)>,
    /// LLM busy time and its time to the first token.
    llm: Option<(f64, Option<f64>)>,
}

/// How the engines share the cores on the virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SimCores {
    /// Each stage is its own server.
    Split,
    /// One server, jobs in the order they asked.
    Shared,
    /// One server, the most urgent job first (STT > first token > decode),
    /// and a streaming answer yields at every token boundary.
    Priority,
}

/// Replays the measured service times on the virtual clock: utterances
/// close at their audio time; STT and LLM each serve turns in order. With
/// shared cores (one CPU lease) the two stages are one server: in `Shared`
/// it takes whichever waiting job asked first; in `Priority` the most
/// urgent, and an answer's decoding is cut into its tokens, so a turn's STT
/// runs between two tokens of the previous answer, as it does live. Fills
/// each turn's queue waits, TTFT, response latency and timeline; returns
/// when the last job finished.
fn simulate(jobs: &[SimJob], cores: SimCores, turns: &mut [TurnReport]) -> f64 {
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
fn with_virtual_waits(mut stages: Vec<StageReport>, turns: &[TurnReport]) -> Vec<StageReport> {
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

/// The report as Markdown: bottlenecks and budget first, then the tables.
#[must_use]
pub fn to_markdown(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let f = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.1}"));
    let _ = writeln!(s, "# voxline report\n");
    let _ = writeln!(
        s,
        "- **Throughput bottleneck:** {}",
        r.summary.bottleneck.throughput.as_deref().unwrap_or("–")
    );
    let _ = writeln!(
        s,
        "- **Latency bottleneck:** {}",
        r.summary.bottleneck.latency.as_deref().unwrap_or("–")
    );
    let _ = writeln!(s, "- **Why:** {}", r.summary.bottleneck.reason);
    let verdict = if !r.summary.budget.given {
        "no budget given"
    } else if r.summary.budget.passed {
        "PASS"
    } else {
        "FAIL"
    };
    let _ = writeln!(s, "- **Budget:** {verdict}");
    for c in &r.summary.budget.checks {
        let _ = writeln!(
            s,
            "  - {} {} (measured {})",
            if c.passed { "✓" } else { "✗" },
            c.limit,
            f(c.measured)
        );
    }
    if let Some(b) = &r.baseline {
        let _ = writeln!(
            s,
            "- **Against baseline** `{}`: {}",
            b.path.display(),
            b.verdict
        );
        for c in &b.metrics {
            let _ = writeln!(
                s,
                "  - {}: {:.1} → {:.1} (×{:.2}, {})",
                c.metric, c.baseline, c.current, c.ratio, c.verdict
            );
        }
    }
    let _ = writeln!(s, "\nclock: {} · turns: {} (warm-up {}, errors {}) · audio {:.1} s · session {:.1} s · threads {}/{}/{} · audio_ctx {} · max tokens {}\n",
        r.clock, r.summary.turns, r.summary.warmup_turns, r.summary.errors, r.summary.audio_s, r.summary.session_s,
        r.config.threads[0], r.config.threads[1], r.config.threads[2], r.config.audio_ctx, r.config.max_tokens);
    let _ = writeln!(
        s,
        "| metric | p50 | p90 | p95 | p99 | n |\n|---|---|---|---|---|---|"
    );
    for (name, p) in [
        ("response latency ms", r.summary.response_latency_ms),
        ("endpoint delay ms", r.summary.endpoint_delay_ms),
        ("STT ms", r.summary.stt_ms),
        ("STT RTFx", r.summary.stt_rtfx),
        ("LLM TTFT ms", r.summary.llm_ttft_ms),
        ("LLM prefill tok/s", r.summary.llm_prefill_tps),
        ("LLM decode tok/s", r.summary.llm_decode_tps),
    ] {
        if let Some(p) = p {
            let _ = writeln!(
                s,
                "| {name} | {:.1} | {:.1} | {:.1} | {:.1}{} | {} |",
                p.p50,
                p.p90,
                p.p95,
                p.p99,
                if p.p99_meaningful { "" } else { "*" },
                p.n
            );
        }
    }
    let _ = writeln!(
        s,
        "\n\\* p99 of fewer than 100 turns is close to the maximum.\n"
    );
    let _ = writeln!(s, "| stage | items | busy ms | utilisation | tokens/s | queue wait p95 ms | max queue | dropped |\n|---|---|---|---|---|---|---|---|");
    for st in &r.stages {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.3} | {} | {} | {}/{} | {} |",
            st.name,
            st.items,
            st.busy_ms,
            st.utilization,
            f(st.tokens_per_s),
            f(st.queue_wait_ms.map(|q| q.p95)),
            st.queue_max_depth,
            st.queue_capacity,
            st.dropped
        );
    }
    let _ = writeln!(s, "\n| turn | transcript | WER | endpoint | stt queue | stt | llm queue | first token | response latency | decode tok/s |\n|---|---|---|---|---|---|---|---|---|---|");
    for t in &r.turns {
        let _ = writeln!(
            s,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.id,
            if t.warmup { " (warm-up)" } else { "" },
            t.transcript
                .as_deref()
                .or(t.error.as_deref())
                .unwrap_or("")
                .replace('|', "/"),
            f(t.wer),
            f(t.endpoint_delay_ms),
            f(t.stt_queue_ms),
            f(t.stt_ms),
            f(t.llm_queue_ms),
            f(t.llm_first_token_ms),
            f(t.response_latency_ms),
            f(t.llm_decode_tps)
        );
    }
    s
}
