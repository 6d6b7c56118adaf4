//! The pipeline, assembled: replay source → VAD → STT → LLM → sinks.
//!
//! Every stage runs on its own thread (voxline-core's runtime), joined by
//! bounded edges. Replay never loses audio: every edge blocks when full, so
//! a slow stage slows the source instead of dropping speech.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use voxline_audio::{VadConfig, VadStage, WavSource};
use voxline_core::{
    AudioFrame, Clock, FullPolicy, Pipeline, PipelineEvent, RunOutcome, ShutdownHandle, Stage,
    StageId, StartStage, TimedEvent, Topology, Transcript, Utterance,
};
use voxline_llm::{LlmOut, Token, TurnComplete};

use crate::sidecar::Sidecar;
use crate::topology::{self, AudioEdge};
use crate::BadInput;

/// How recorded audio is released into the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// At the rate a microphone would deliver it; latencies are what a live user feels.
    Realtime,
    /// As fast as the pipeline accepts it; latencies are computed on a
    /// virtual clock (what a live user would have felt) from measured service times.
    Fast,
}

impl std::str::FromStr for Pace {
    type Err = BadInput;
    fn from_str(s: &str) -> Result<Self, BadInput> {
        match s {
            "realtime" => Ok(Self::Realtime),
            "fast" => Ok(Self::Fast),
            _ => Err(BadInput(format!(
                "--pace {s:?}: expected `realtime` or `fast`"
            ))),
        }
    }
}

/// A recording to replay.
pub struct Input {
    /// The file.
    pub path: PathBuf,
    /// Its sidecar, if it has one.
    pub sidecar: Option<Sidecar>,
    source: WavSource,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Where the audio comes from.
#[derive(Debug)]
pub enum Source {
    /// Recorded files, played one after another (nothing is ever dropped).
    Replay(Vec<Input>),
    /// A live input device (a microphone).
    Live(LiveOptions),
}

/// How a live session runs and when it ends.
#[derive(Debug, Clone, Default)]
pub struct LiveOptions {
    /// The input device (`None` = the default one).
    pub device: Option<String>,
    /// End after this many turns.
    pub max_turns: Option<u64>,
    /// End after this long.
    pub max_duration: Option<std::time::Duration>,
    /// Frames the audio edge holds before dropping the oldest.
    pub audio_queue_frames: usize,
    /// The capture period to ask the device for, in ms (`None`: the smallest
    /// it supports from 10 ms up).
    pub capture_buffer_ms: Option<u32>,
    /// Leading turns left out of the summary's figures.
    pub warmup: usize,
}

/// What the live capture did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LiveReport {
    /// The device opened.
    pub device: String,
    /// Its native format: rate, channels, sample format.
    pub format: String,
    /// Device frames captured.
    pub frames_captured: u64,
    /// Device frames dropped because the capture ring was full.
    pub frames_dropped_in_ring: u64,
    /// The same drops in 16 kHz frames (the unit of `summary.dropped`).
    #[serde(skip)]
    pub frames_dropped_in_ring_16k: u64,
    /// Why capture ended.
    pub end: String,
    /// Stream errors reported by the device.
    pub stream_errors: Vec<String>,
    /// The capture period asked for, in device frames (null: the device's default).
    pub buffer_requested_frames: Option<u32>,
    /// The period the device granted, in device frames (null: the host cannot say).
    pub buffer_frames: Option<u32>,
    /// The granted period in ms.
    pub buffer_ms: Option<f64>,
    /// Why the period asked for differs from the one wanted, if it does.
    pub buffer_note: Option<String>,
    /// Capture placement: blocks timed by the device or by arrival, the
    /// device latency (capture → callback) and clock gaps.
    pub timing: voxline_audio::CaptureTiming,
}

/// Where a replayed file sits in the pipeline's stream (16 kHz positions).
#[derive(Debug, Clone)]
pub struct InputSpan {
    /// The file.
    pub path: PathBuf,
    /// Its sidecar.
    pub sidecar: Option<Sidecar>,
    /// Stream position of its first sample.
    pub start: u64,
    /// Stream position one past its last sample.
    pub end: u64,
}

/// Opens every recording up front, so a bad file is reported before any work starts.
///
/// The path `-` is standard input (at most once; it has no sidecar).
///
/// # Errors
/// [`BadInput`] naming the first file that cannot be replayed (or whose
/// sidecar is malformed, or does not match its audio: another sample rate, a
/// turn past the end).
pub fn open_inputs(paths: &[PathBuf]) -> Result<Vec<Input>, BadInput> {
    if paths.is_empty() {
        return Err(BadInput(
            "no input files: give one or more WAV files".into(),
        ));
    }
    let is_stdin = |p: &Path| p.as_os_str() == "-";
    if paths.iter().filter(|p| is_stdin(p)).count() > 1 {
        return Err(BadInput(
            "`-` (standard input) is given more than once; it can be read only once".into(),
        ));
    }
    paths
        .iter()
        .map(|p| {
            let source = if is_stdin(p) {
                WavSource::stdin()
            } else {
                WavSource::open(p)
            }
            .map_err(BadInput::from_display)?;
            if source.spec().duration_frames == Some(0) {
                return Err(BadInput(format!(
                    "{}: holds no audio (0 samples); record or export it again",
                    p.display()
                )));
            }
            let sidecar = if is_stdin(p) {
                None
            } else {
                Sidecar::load_for(p)?
            };
            if let Some(sc) = &sidecar {
                let spec = source.spec();
                sc.check_against(spec.sample_rate, spec.duration_frames)
                    .map_err(|e| BadInput(format!("{}: {e}", Sidecar::path_for(p).display())))?;
            }
            Ok(Input {
                path: p.clone(),
                sidecar,
                source,
            })
        })
        .collect()
}

/// Called with every event as the sinks see it (e.g. to drive a progress bar).
pub type EventHook = std::sync::Arc<dyn Fn(&PipelineEvent) + Send + Sync>;

/// How to run.
#[derive(Clone)]
pub struct RunOptions {
    /// Pacing of the replay.
    pub pace: Pace,
    /// Endpointer settings.
    pub vad: VadConfig,
    /// Silence inserted between files, in ms (lets the endpointer close the last utterance).
    pub gap_ms: u32,
    /// Write every event as JSON lines here (checked by [`crate::output::plan`]).
    pub events: Option<crate::output::Output>,
    /// Print transcripts and streamed answers to stdout.
    pub console: bool,
    /// Capacity of the utterance and transcript edges.
    pub queue_capacity: usize,
    /// Called with every event.
    pub on_event: Option<EventHook>,
    /// The two engines share the cores and take turns on them (one CPU
    /// lease) instead of each owning a part of them.
    pub cpu_shared: bool,
    /// Speculative turn-taking: the board the STT and LLM stages were given
    /// (see their `with_speculation`) and the silence, in ms, after which
    /// the VAD sends an utterance early. `None`: off.
    pub speculation: Option<(voxline_core::SpecBoard, u32)>,
    /// The meter the engine stages count their threads on (see their `with_meter`/`with_cpu`).
    pub meter: voxline_core::ThreadMeter,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("pace", &self.pace)
            .field("vad", &self.vad)
            .field("gap_ms", &self.gap_ms)
            .field("events", &self.events)
            .field("console", &self.console)
            .field("queue_capacity", &self.queue_capacity)
            .field("cpu_shared", &self.cpu_shared)
            .field("speculation", &self.speculation.as_ref().map(|(_, ms)| ms))
            .finish_non_exhaustive()
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            pace: Pace::Fast,
            vad: VadConfig::default(),
            gap_ms: 1000,
            events: None,
            console: false,
            queue_capacity: 16,
            on_event: None,
            cpu_shared: false,
            speculation: None,
            meter: voxline_core::ThreadMeter::new(),
        }
    }
}

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Something the user gave is wrong.
    #[error(transparent)]
    BadInput(#[from] BadInput),
    /// The runtime could not start a stage (its thread, or its start-up).
    #[error("could not start the pipeline: {0}")]
    Runtime(#[from] voxline_core::RuntimeError),
    /// A thread of the session itself could not start.
    #[error("could not start the pipeline: {0}")]
    Thread(#[source] std::io::Error),
    /// The pipeline's topology does not hold together (an edge undeclared).
    #[error("could not build the pipeline: {0}")]
    Topology(#[from] voxline_core::TopologyError),
    /// The input device could not be opened.
    #[error(transparent)]
    Capture(voxline_audio::AudioError),
}

/// A transcript stage added to the pipeline (see [`Extras`]).
pub type TranscriptStage = Box<dyn Stage<In = Transcript, Out = Transcript> + Send>;

/// Stages added to the standard pipeline, each on its own thread with its
/// own queue, and its own row in the report, the timeline and the CSV.
#[derive(Default)]
pub struct Extras {
    after_stt: Vec<TranscriptStage>,
}

impl std::fmt::Debug for Extras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.after_stt.iter().map(|s| s.name().to_owned()))
            .finish()
    }
}

impl Extras {
    /// Adds `stage` between the STT and the LLM (after the ones added
    /// before it): it sees every transcript and passes on what the LLM
    /// answers. Its name must be new to the pipeline.
    #[must_use]
    pub fn after_stt(
        mut self,
        stage: impl Stage<In = Transcript, Out = Transcript> + Send,
    ) -> Self {
        self.after_stt.push(Box::new(stage));
        self
    }

    /// The pipeline's topology with these stages in it.
    fn topology(&self, audio: AudioEdge, queue_capacity: usize) -> Result<Topology, BadInput> {
        let mut t = topology::standard(audio, queue_capacity);
        let mut after = topology::STT;
        for stage in &self.after_stt {
            let id = StageId::owned(stage.name().to_owned());
            if t.stage_spec(id.as_str()).is_some() {
                return Err(BadInput(format!(
                    "a stage named `{id}` is already in the pipeline; give the added stage another name"
                )));
            }
            let into = topology::edge_into(&id);
            t = t
                .edge(into.clone(), queue_capacity.max(1), FullPolicy::Block)
                .insert_after(&after, id.clone(), into);
            after = id;
        }
        Ok(t)
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunResult {
    /// The pipeline's stages and edges, as it was built.
    pub topology: Topology,
    /// The session clock (origin = start of replay).
    pub clock: Clock,
    /// The pacing used.
    pub pace: Pace,
    /// Spans, edge statistics, failure.
    pub outcome: RunOutcome,
    /// Every event, in the order the sinks saw them.
    pub events: Vec<TimedEvent>,
    /// Where each file sits in the stream.
    pub inputs: Vec<InputSpan>,
    /// Problems reading the input (a truncated file, say), one line each.
    pub input_errors: Vec<String>,
    /// Things about the input worth knowing that are no error (a header
    /// that lies, a near-silent recording), one line each.
    pub input_warnings: Vec<String>,
    /// Whether the run was interrupted (Ctrl-C).
    pub interrupted: bool,
    /// Audio replayed, in 16 kHz samples.
    pub audio_samples: u64,
    /// Whether the engines shared the cores under one lease.
    pub cpu_shared: bool,
    /// The most engine threads that computed at once.
    pub engine_threads_peak: usize,
    /// The live capture's figures, for a live session.
    pub live: Option<LiveReport>,
    /// A live session's measurements, taken as they happened (its
    /// `outcome.spans` and `events` are then empty: a session of weeks
    /// keeps only bounded totals and the last turns; see [`crate::tally`]).
    pub tally: Option<crate::tally::Tally>,
}

/// A live session's tally, shared by the stage threads (spans) and the
/// event thread (events).
type SharedTally = std::sync::Arc<std::sync::Mutex<crate::tally::Tally>>;

fn lock_tally(t: &SharedTally) -> std::sync::MutexGuard<'_, crate::tally::Tally> {
    t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes events to the console and an optional JSONL output (a regular
/// file is written under a partial name and moved into place at the end).
struct EventSink {
    clock: Clock,
    console: bool,
    file: Option<(crate::output::Output, crate::output::Writer)>,
    /// Every event, for the report (replay: a file ends).
    events: Vec<TimedEvent>,
    /// Live: events go into the tally instead and are not kept.
    tally: Option<SharedTally>,
    write_error: Option<String>,
}

impl EventSink {
    fn new(
        clock: Clock,
        console: bool,
        output: Option<&crate::output::Output>,
    ) -> Result<Self, BadInput> {
        let file = match output {
            None => None,
            Some(o) => {
                let w = o.open().map_err(|e| {
                    BadInput(format!(
                        "{}; choose a writable path for --events",
                        o.describe(&e)
                    ))
                })?;
                Some((o.clone(), w))
            }
        };
        Ok(Self {
            clock,
            // the event log on standard output must not be interleaved with the console
            console: console && !output.is_some_and(crate::output::Output::is_stdout),
            file,
            events: Vec::new(),
            tally: None,
            write_error: None,
        })
    }

    fn handle(&mut self, ev: TimedEvent) {
        if let Some((o, w)) = &mut self.file {
            let line = ev.to_json_line(&self.clock).unwrap_or_default();
            if let Err(e) = writeln!(w, "{line}") {
                self.write_error.get_or_insert(o.describe(&e));
            }
        }
        if self.console {
            let mut out = std::io::stdout().lock();
            match &ev.event {
                PipelineEvent::Transcript(t) => {
                    let _ = writeln!(out, "[{}] you: {}", t.id, t.text);
                }
                PipelineEvent::Engine(e) => {
                    if let Some(t) = e.downcast_ref::<Token>() {
                        if t.index == 0 {
                            let _ = write!(out, "[{}] voxline: ", t.id);
                        }
                        let _ = write!(out, "{}", t.text);
                        let _ = out.flush();
                    } else if let Some(c) = e.downcast_ref::<TurnComplete>() {
                        if c.n_generated == 0 {
                            let _ = writeln!(out, "[{}] voxline: (nothing to answer)", c.id);
                        } else {
                            let _ = writeln!(out);
                        }
                    }
                }
                PipelineEvent::TurnError(e) => {
                    let _ = writeln!(out);
                    eprintln!("[{}] error in {}: {}", e.id, e.stage, e.message);
                }
                PipelineEvent::StageFailed { stage, message } => {
                    eprintln!("stage {stage} failed: {message}")
                }
                PipelineEvent::StageError { stage, message } => eprintln!("{stage}: {message}"),
                _ => {}
            }
        }
        match &self.tally {
            Some(t) => lock_tally(t).event(&ev),
            None => self.events.push(ev),
        }
    }

    /// Finishes the event log; returns the events and any write error.
    fn finish(mut self) -> (Vec<TimedEvent>, Option<String>) {
        if let Some((o, w)) = self.file.take() {
            if let Err(e) = w.finish() {
                self.write_error.get_or_insert(o.describe(&e));
            }
        }
        (self.events, self.write_error)
    }
}

/// Replays `inputs` through VAD → `stt` → `llm`, returning every event and span.
///
/// `stt` and `llm` are normally [`voxline_stt::SttStage`] and
/// [`voxline_llm::LlmStage`] (any [`StartStage`]: a stage, or what builds
/// one on its own thread); tests may wrap them (e.g. to slow one down).
/// Every stage has started before any audio is fed: one that cannot start
/// is an error here.
/// `shutdown` stops the source early (Ctrl-C); turns in flight finish.
///
/// # Errors
/// [`RunError::BadInput`] for an invalid VAD configuration or an unwritable
/// event log, [`RunError::Runtime`] when a stage cannot start.
pub fn run<S, L>(
    inputs: Vec<Input>,
    stt: S,
    llm: L,
    opts: &RunOptions,
    shutdown: Option<ShutdownHandle>,
) -> Result<RunResult, RunError>
where
    S: StartStage<Stage: Stage<In = Utterance, Out = Transcript>>,
    L: StartStage<Stage: Stage<In = Transcript, Out = LlmOut>>,
{
    run_source(Source::Replay(inputs), stt, llm, opts, shutdown)
}

/// Like [`run`], with `extras` added to the pipeline.
///
/// # Errors
/// As [`run`]; [`RunError::BadInput`] when an added stage's name is taken.
pub fn run_with<S, L>(
    inputs: Vec<Input>,
    stt: S,
    llm: L,
    extras: Extras,
    opts: &RunOptions,
    shutdown: Option<ShutdownHandle>,
) -> Result<RunResult, RunError>
where
    S: StartStage<Stage: Stage<In = Utterance, Out = Transcript>>,
    L: StartStage<Stage: Stage<In = Transcript, Out = LlmOut>>,
{
    run_source_with(Source::Replay(inputs), stt, llm, extras, opts, shutdown)
}

/// Runs the pipeline from any [`Source`]; see [`run`].
///
/// A live source captures until `shutdown` is requested, `max_turns` turns
/// completed or `max_duration` passed; turns in flight then finish. Its
/// audio edge drops the oldest frames when full (the audio callback must
/// never wait) and counts them; a stage falling behind real time is named in
/// a warning line on stderr.
///
/// # Errors
/// As [`run`], plus [`RunError::Capture`] when the device cannot be opened
/// (checked before anything else starts, so nothing is written).
pub fn run_source<S, L>(
    source: Source,
    stt: S,
    llm: L,
    opts: &RunOptions,
    shutdown: Option<ShutdownHandle>,
) -> Result<RunResult, RunError>
where
    S: StartStage<Stage: Stage<In = Utterance, Out = Transcript>>,
    L: StartStage<Stage: Stage<In = Transcript, Out = LlmOut>>,
{
    run_source_with(source, stt, llm, Extras::default(), opts, shutdown)
}

/// [`run_source`] with `extras` added to the pipeline; the pipeline is
/// built from its [`Topology`] ([`crate::topology`]).
///
/// # Errors
/// As [`run_source`]; [`RunError::BadInput`] when an added stage's name is
/// taken.
#[allow(clippy::too_many_lines)]
pub fn run_source_with<S, L>(
    source: Source,
    stt: S,
    llm: L,
    extras: Extras,
    opts: &RunOptions,
    shutdown: Option<ShutdownHandle>,
) -> Result<RunResult, RunError>
where
    S: StartStage<Stage: Stage<In = Utterance, Out = Transcript>>,
    L: StartStage<Stage: Stage<In = Transcript, Out = LlmOut>>,
{
    let mut vad = VadStage::new(opts.vad.clone()).map_err(BadInput::from_display)?;
    if let Some((board, silence_ms)) = &opts.speculation {
        vad = vad.with_speculation(board.clone(), *silence_ms);
    }
    let clock = Clock::start();
    let audio = match &source {
        Source::Replay(_) => AudioEdge::Replay,
        Source::Live(l) => AudioEdge::Live(l.audio_queue_frames),
    };
    let topology = extras.topology(audio, opts.queue_capacity)?;
    let (audio_tx, audio_rx) = topology.channel::<AudioFrame>(&topology::AUDIO)?;
    // drops are counted in 16 kHz frames, like the capture ring's
    let audio_tx = audio_tx.measure_drops(|f| f.samples.len() as u64);
    // live: spans and events are tallied as they happen, not kept
    let tally: Option<SharedTally> = match &source {
        Source::Live(l) => Some(std::sync::Arc::new(std::sync::Mutex::new(
            crate::tally::Tally::new(clock, l.warmup),
        ))),
        Source::Replay(_) => None,
    };
    // Open the device first: if it cannot be opened nothing else starts (and nothing is written).
    let replaying = matches!(source, Source::Replay(_));
    let (inputs, live) = match source {
        Source::Live(l) => {
            let capture = voxline_audio::Capture::start_with(
                l.device.as_deref(),
                &voxline_audio::CaptureOptions {
                    buffer_ms: l.capture_buffer_ms,
                },
                audio_tx.clone(),
                clock,
            )
            .map_err(RunError::Capture)?;
            (Vec::new(), Some((l, capture)))
        }
        Source::Replay(inputs) => (inputs, None),
    };
    let mut sink = EventSink::new(clock, opts.console, opts.events.as_ref())?;
    let mut builder = Pipeline::builder(clock);
    if let Some(t) = &tally {
        let spans = t.clone();
        builder = builder.observe_spans(move |s| lock_tally(&spans).span(&s));
        sink.tally = Some(t.clone());
    }
    if let (true, Some(stop)) = (replaying, &shutdown) {
        // Ctrl-C during replay: stop feeding, cancel what is queued, finish what runs.
        builder = builder.cancel_queued_on(stop.clone());
    }
    let mut p = builder.build();
    // every edge as the topology declares it: the one each stage writes
    let (utt_tx, utt_rx) = topology.channel_from::<Utterance>(topology::VAD.as_str())?;
    let (tr_tx, mut tr_rx) = topology.channel_from::<Transcript>(topology::STT.as_str())?;
    for stage in extras.after_stt {
        let (tx, rx) = topology.channel_from::<Transcript>(stage.name())?;
        p.spawn_stage(stage, tr_rx, tx)?;
        tr_rx = rx;
    }
    let (out_tx, out_rx) = topology.channel_from::<LlmOut>(topology::LLM.as_str())?;
    p.spawn_stage(vad, audio_rx, utt_tx)?;
    if opts.cpu_shared {
        // fast replay measures service times: no call is interrupted by a yield
        let lease = if opts.pace == Pace::Fast && replaying {
            voxline_core::CpuLease::non_preemptive()
        } else {
            voxline_core::CpuLease::new()
        };
        p.spawn_stage_leased(stt, utt_rx, tr_tx, lease.clone())?;
        p.spawn_stage_leased(llm, tr_rx, out_tx, lease)?;
    } else {
        p.spawn_stage(stt, utt_rx, tr_tx)?;
        p.spawn_stage(llm, tr_rx, out_tx)?;
    }
    p.spawn_sink(topology::SINK.as_str(), out_rx, |_| Ok(()))?;
    let events = p.events();
    let hook = opts.on_event.clone();
    let internal_stop = p.shutdown_handle();
    let turns_done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done_counter = turns_done.clone();
    // the queues in front of the engines: growing ones mean a stage falls behind real time
    let watched: Vec<_> = topology::watched(&topology)
        .into_iter()
        .map(|(stage, input)| (stage, p.edge_stats(input.as_str())))
        .collect();
    let sink_thread = std::thread::Builder::new()
        .name("events".into())
        .spawn(move || {
            // nothing of a speculative attempt is shown before its commit
            let mut gate = voxline_core::SpecGate::new();
            for ev in events.iter() {
                for ev in gate.push(ev) {
                    if let Some(h) = &hook {
                        h(&ev.event);
                    }
                    if matches!(ev.event, PipelineEvent::TurnError(_))
                        || ev.event.engine::<TurnComplete>().is_some()
                    {
                        done_counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    sink.handle(ev);
                }
            }
            sink.finish()
        })
        .map_err(RunError::Thread)?;

    // The source runs on this thread.
    let stop = |s: &Option<ShutdownHandle>| {
        s.as_ref().is_some_and(ShutdownHandle::is_requested) || internal_stop.is_requested()
    };
    if let Some((live, capture)) = live {
        drop(audio_tx); // the capture thread holds its own sender
        let ((report, samples), stopped) =
            live_source(&live, capture, &turns_done, &watched, &|| stop(&shutdown));
        let mut run = finish_run(
            topology,
            p,
            sink_thread,
            clock,
            opts,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            stopped,
            shutdown.as_ref(),
            samples,
            Some(report),
        );
        if let Some(t) = tally {
            // every thread is joined: nothing else holds the tally now
            let mut t = std::mem::replace(&mut *lock_tally(&t), crate::tally::Tally::new(clock, 0));
            t.close(run.outcome.failed.as_deref());
            run.tally = Some(t);
        }
        return Ok(run);
    }
    let mut pos: u64 = 0;
    let mut spans = Vec::new();
    let mut input_errors = Vec::new();
    let mut input_warnings = Vec::new();
    let mut interrupted = false;
    let send = |frame_samples: Vec<f32>, pos: u64, new_recording: bool| -> bool {
        let captured = match opts.pace {
            Pace::Realtime => {
                let due = clock.sample_due(pos);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                due
            }
            Pace::Fast => Instant::now(),
        };
        audio_tx
            .send(AudioFrame {
                start_sample: pos,
                samples: frame_samples,
                captured,
                new_recording,
            })
            .is_ok()
    };
    let gap = u64::from(opts.gap_ms) * 16;
    'files: for (i, mut input) in inputs.into_iter().enumerate() {
        if i > 0 {
            let mut left = gap;
            while left > 0 {
                let n = left.min(320);
                if stop(&shutdown) || !send(vec![0.0; n as usize], pos, false) {
                    interrupted = true;
                    break 'files;
                }
                pos += n;
                left -= n;
            }
        }
        let start = pos;
        loop {
            if stop(&shutdown) {
                interrupted = true;
                spans.push(InputSpan {
                    path: input.path.clone(),
                    sidecar: input.sidecar.take(),
                    start,
                    end: pos,
                });
                break 'files;
            }
            match input.source.next_chunk() {
                Ok(Some(chunk)) => {
                    let n = chunk.len() as u64;
                    // the file's first chunk: the pre-roll stops at it
                    if !send(chunk, pos, pos == start) {
                        interrupted = true;
                        break 'files;
                    }
                    pos += n;
                }
                Ok(None) => break,
                Err(e) => {
                    input_errors.push(e.to_string());
                    break;
                }
            }
        }
        let shown = input.path.display().to_string();
        for w in input.source.warnings() {
            input_warnings.push(format!("{shown}: {w}"));
        }
        let level = input.source.level();
        if level.samples > 0 && level.is_near_silent() {
            input_warnings.push(format!(
                "{shown}: near-silent ({level}); speech this quiet is not detected — check the recording level"
            ));
        }
        spans.push(InputSpan {
            path: input.path,
            sidecar: input.sidecar,
            start,
            end: pos,
        });
    }
    drop(audio_tx);
    let interrupted = interrupted || shutdown.is_some();
    Ok(finish_run(
        topology,
        p,
        sink_thread,
        clock,
        opts,
        spans,
        input_errors,
        input_warnings,
        interrupted,
        shutdown.as_ref(),
        pos,
        None,
    ))
}

type SinkThread = std::thread::JoinHandle<(Vec<TimedEvent>, Option<String>)>;

/// Joins the pipeline and the event sink and gathers the result.
#[allow(clippy::too_many_arguments)]
fn finish_run(
    topology: Topology,
    p: Pipeline,
    sink_thread: SinkThread,
    clock: Clock,
    opts: &RunOptions,
    inputs: Vec<InputSpan>,
    mut input_errors: Vec<String>,
    input_warnings: Vec<String>,
    interrupted: bool,
    stop_requested: Option<&ShutdownHandle>,
    audio_samples: u64,
    live: Option<LiveReport>,
) -> RunResult {
    let outcome = p.join();
    // a stop asked for at any moment of the run (even after the last audio was fed) interrupted it
    let interrupted = interrupted && stop_requested.is_some_and(ShutdownHandle::is_requested);
    let (events, write_error) = sink_thread
        .join()
        .unwrap_or_else(|_| (Vec::new(), Some("the event sink panicked".into())));
    if let Some(e) = write_error {
        input_errors.push(format!("event log: {e}"));
    }
    RunResult {
        topology,
        clock,
        pace: opts.pace,
        outcome,
        events,
        inputs,
        input_errors,
        input_warnings,
        interrupted,
        audio_samples,
        cpu_shared: opts.cpu_shared,
        engine_threads_peak: opts.meter.peak(),
        live,
        tally: None,
    }
}

/// `frames` at `rate` Hz as 16 kHz frames (rounded).
fn to_16k(frames: u64, rate: u32) -> u64 {
    let rate = u128::from(rate.max(1));
    ((u128::from(frames) * 16_000 + rate / 2) / rate) as u64
}

/// Runs live capture until it should stop; returns the capture figures, the
/// 16 kHz samples captured, and whether a stop was requested.
fn live_source(
    live: &LiveOptions,
    capture: voxline_audio::Capture,
    turns_done: &std::sync::atomic::AtomicU64,
    watched: &[(StageId, Option<std::sync::Arc<voxline_core::EdgeStats>>)],
    stop: &dyn Fn() -> bool,
) -> ((LiveReport, u64), bool) {
    let f = capture.format().clone();
    let started = Instant::now();
    let mut last_depth: Vec<usize> = vec![0; watched.len()];
    let mut growing: Vec<u32> = vec![0; watched.len()];
    let mut next_check = started + std::time::Duration::from_secs(1);
    let stopped = loop {
        if stop() {
            break true;
        }
        if live
            .max_turns
            .is_some_and(|n| turns_done.load(std::sync::atomic::Ordering::Relaxed) >= n)
            || live.max_duration.is_some_and(|d| started.elapsed() >= d)
            || capture.is_finished()
        {
            break false;
        }
        if Instant::now() >= next_check {
            next_check += std::time::Duration::from_secs(1);
            for (i, (stage, stats)) in watched.iter().enumerate() {
                let Some(st) = stats else { continue };
                let depth = st.sent().saturating_sub(st.received() + st.dropped()) as usize;
                growing[i] = if depth > last_depth[i] {
                    growing[i] + 1
                } else {
                    0
                };
                if growing[i] == 3 || (depth >= 3 && depth > last_depth[i]) {
                    eprintln!("voxline: warning: {stage} is falling behind real time ({depth} turns waiting for it)");
                }
                last_depth[i] = depth;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stats = capture.stop();
    let report = LiveReport {
        device: format!("{} ({})", f.device_id, f.device_name),
        format: format!(
            "{} Hz, {} ch, {}",
            f.sample_rate, f.channels, f.sample_format
        ),
        frames_captured: stats.frames_captured,
        frames_dropped_in_ring: stats.frames_dropped_in_ring,
        frames_dropped_in_ring_16k: to_16k(stats.frames_dropped_in_ring, f.sample_rate),
        end: format!("{:?}", stats.end),
        stream_errors: stats.stream_errors.clone(),
        buffer_requested_frames: f.buffer_requested_frames,
        buffer_frames: f.buffer_frames,
        buffer_ms: f.buffer_ms(),
        buffer_note: f.buffer_note.clone(),
        timing: stats.timing.clone(),
    };
    ((report, stats.end_sample), stopped)
}
