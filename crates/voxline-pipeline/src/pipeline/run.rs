//! The run: the pipeline built from its topology, the source fed on the
//! calling thread, everything joined into a [`RunResult`].

use std::time::Instant;

use voxline_audio::VadStage;
use voxline_core::{
    AudioFrame, Clock, Pipeline, PipelineEvent, RunOutcome, ShutdownHandle, Stage, StartStage,
    TimedEvent, Topology, Transcript, Utterance,
};
use voxline_llm::{LlmOut, TurnComplete};

use super::live::live_source;
use super::options::{lock, Observer, SharedObserver};
use super::sink::EventSink;
use super::speaker::Voice;
use super::{Extras, Input, InputSpan, LiveReport, Pace, PushedAudio, RunOptions, Source};
use crate::topology::{self, AudioEdge};
use crate::BadInput;

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

impl RunError {
    /// Whose fault it is: something the user gave (an input, a device), or
    /// the system.
    #[must_use]
    pub fn fault(&self) -> voxline_core::Fault {
        match self {
            Self::BadInput(_) | Self::Capture(_) => voxline_core::Fault::Input,
            Self::Runtime(_) | Self::Thread(_) | Self::Topology(_) => voxline_core::Fault::System,
        }
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
    /// How the engines shared the cores.
    pub cpu_share: crate::settings::CpuShare,
    /// The most engine threads that computed at once.
    pub engine_threads_peak: usize,
    /// The live capture's figures, for a live session.
    pub live: Option<LiveReport>,
}

/// What a live or pushed session without an observer does with its spans
/// and events: nothing (they are not kept either).
struct Discard;

impl Observer for Discard {
    fn start(&mut self, _: Clock, _: &voxline_core::Topology) {}
    fn span(&mut self, _: &voxline_core::Span) {}
    fn event(&mut self, _: &voxline_core::TimedEvent) {}
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
    if let Some((model, policy)) = &opts.semantic_turn {
        vad = vad
            .with_turn_model(model.clone(), *policy)
            .map_err(BadInput::from_display)?;
    }
    if opts.pace == Pace::Fast && matches!(source, Source::Replay(_)) {
        // the audio runs ahead of the recogniser: its words are placed
        // where they would have come in real time
        vad = vad.with_words_in_stream_time();
    }
    let clock = Clock::start();
    let audio = match &source {
        // pushed audio was queued (and any loss counted) by whoever pushed it
        Source::Replay(_) | Source::Pushed(_) => AudioEdge::Replay,
        Source::Live(l) => AudioEdge::Live(l.audio_queue_frames),
    };
    let mut topology = extras.topology(audio, opts.queue_capacity)?;
    // a live pipeline that speaks takes its voice out of the microphone
    let aec = opts
        .echo_cancellation
        .filter(|_| matches!(source, Source::Live(_)) && extras.speaks());
    if aec.is_some() {
        topology = topology::with_echo_cancellation(topology);
    }
    let (audio_tx, audio_rx) = topology.channel::<AudioFrame>(&topology::AUDIO)?;
    // drops are counted in 16 kHz frames, like the capture ring's
    let audio_tx = audio_tx.measure_drops(|f| f.samples.len() as u64);
    // live: spans and events go to the observer as they happen, not kept
    let observer: Option<SharedObserver> = match &source {
        Source::Live(_) | Source::Pushed(_) => {
            let o = opts
                .observer
                .clone()
                .unwrap_or_else(|| std::sync::Arc::new(std::sync::Mutex::new(Discard)));
            lock(&o).start(clock, &topology);
            Some(o)
        }
        Source::Replay(_) => None,
    };
    // Open the device first: if it cannot be opened nothing else starts (and nothing is written).
    let replaying = matches!(source, Source::Replay(_));
    let mut pushed = None;
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
        Source::Pushed(p) => {
            pushed = Some(p);
            (Vec::new(), None)
        }
    };
    // a live pipeline that speaks plays on an output device, opened before any audio too
    let speaker = match (&live, extras.speaks()) {
        (Some((l, _)), true) => Some(Voice::open(
            l.output_device.as_deref(),
            clock,
            shutdown.clone(),
        )?),
        _ => None,
    };
    // speech over the voice stops it (barge-in)
    let barge = speaker
        .as_ref()
        .zip(opts.barge_in)
        .map(|(v, options)| (v.barge.clone(), options));
    if let Some((b, options)) = &barge {
        vad = vad.with_barge_in(b.clone(), *options);
    }
    let mut sink = EventSink::new(clock, opts.console, opts.events.as_ref())?;
    let mut builder = Pipeline::builder(clock);
    if let Some(o) = &observer {
        let spans = o.clone();
        let hook = opts.on_span.clone();
        builder = builder.observe_spans(move |s| {
            if let Some(h) = &hook {
                h(&s);
            }
            lock(&spans).span(&s);
        });
        sink.observer = Some(o.clone());
    }
    if let (true, Some(stop)) = (replaying, &shutdown) {
        // Ctrl-C during replay: stop feeding, cancel what is queued, finish what runs.
        builder = builder.cancel_queued_on(stop.clone());
    }
    if let (true, Some(stop)) = (opts.cancel_on_stop, &shutdown) {
        // Ctrl-C cancels the answer in flight and the turns queued behind it
        builder = builder
            .cancel_calls_on(stop.clone())
            .cancel_queued_on(stop.clone());
    }
    if let Some(drain) = &opts.drain {
        builder = builder.drain_on(drain.clone());
    }
    if let Some((board, _)) = &opts.speculation {
        builder = builder.speculation(board.clone());
    }
    builder = builder
        .meter(opts.meter.clone())
        .inject_fault(opts.fault.clone());
    if let Some((b, _)) = barge {
        builder = builder.barge_in(b);
    }
    let mut p = builder.build();
    if let Some(v) = &speaker {
        v.publish_to(p.event_bus());
    }
    // every edge as the topology declares it: the one each stage writes
    let (utt_tx, utt_rx) = topology.channel_from::<Utterance>(topology::VAD.as_str())?;
    // the echo canceller, between the capture and the VAD
    let audio_rx = match (aec, &speaker) {
        (Some(options), Some(v)) => {
            let (tx, rx) = topology.channel_from::<AudioFrame>(topology::AEC.as_str())?;
            p.spawn_stage(v.echo_canceller(options), audio_rx, tx)?;
            rx
        }
        _ => audio_rx,
    };
    let (tr_tx, mut tr_rx) = topology.channel_from::<Transcript>(topology::STT.as_str())?;
    for stage in extras.after_stt {
        let (tx, rx) = topology.channel_from::<Transcript>(stage.name())?;
        p.spawn_stage(stage, tr_rx, tx)?;
        tr_rx = rx;
    }
    let (out_tx, out_rx) = topology.channel_from::<LlmOut>(topology::LLM.as_str())?;
    let mut lease = None;
    if opts.cpu_share.takes_turns() {
        // fast replay measures service times: no call is interrupted by a yield
        let shared = match &opts.lease {
            Some(l) => l.clone(),
            None if opts.pace == Pace::Fast && replaying => {
                voxline_core::CpuLease::non_preemptive()
            }
            None => voxline_core::CpuLease::new(),
        };
        // the VAD does not take the lease, but its end-of-turn model uses
        // the cores while the engines leave them free
        p.spawn_stage_leased(vad, audio_rx, utt_tx, shared.clone())?;
        p.spawn_stage_leased(stt, utt_rx, tr_tx, shared.clone())?;
        p.spawn_stage_leased(llm, tr_rx, out_tx, shared.clone())?;
        lease = Some(shared);
    } else {
        p.spawn_stage(vad, audio_rx, utt_tx)?;
        p.spawn_stage(stt, utt_rx, tr_tx)?;
        p.spawn_stage(llm, tr_rx, out_tx)?;
    }
    match extras.voice {
        Some(voice) => {
            // the voice is a third engine on the same cores: under a lease it
            // takes turns with the others (its first chunk before an answer's decoding)
            let (voice_tx, voice_rx) =
                topology.channel_from::<voxline_tts::VoiceOut>(topology::TTS.as_str())?;
            match lease {
                Some(l) => p.spawn_stage_leased(voice, out_rx, voice_tx, l)?,
                None => p.spawn_stage(voice, out_rx, voice_tx)?,
            }
            match &speaker {
                // the sink is the loudspeaker
                Some(v) => {
                    let v = v.clone();
                    p.spawn_sink(topology::SINK.as_str(), voice_rx, move |env| {
                        v.play(env.item);
                        Ok(())
                    })?;
                }
                None => p.spawn_sink(topology::SINK.as_str(), voice_rx, |_| Ok(()))?,
            }
        }
        None => p.spawn_sink(topology::SINK.as_str(), out_rx, |_| Ok(()))?,
    }
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
                        h(&ev);
                    }
                    // a clock gap is said by the capture's watch (`live_source`)
                    if ev
                        .event
                        .engine::<voxline_audio::CaptureDeviceChanged>()
                        .is_some_and(|c| c.cause == voxline_audio::DeviceChange::VoiceHeard)
                    {
                        eprintln!(
                            "voxline: warning: capture device changed? the microphone began to hear the voice \
                             mid-answer, its level following the voice's (the capture moved to the loudspeaker's \
                             monitor, or headphones came off); the echo path is judged again"
                        );
                    }
                    // a turn of no words (a sound, a backchannel over the
                    // voice) is no turn: it does not count towards the limit
                    if matches!(ev.event, PipelineEvent::TurnError(_))
                        || ev
                            .event
                            .engine::<TurnComplete>()
                            .is_some_and(|c| !voxline_core::non_speech(&c.transcript))
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
    // A live or pushed source streams until it is stopped or its senders are gone.
    let streamed = if let Some((live, capture)) = live {
        let ((report, samples), stopped) =
            live_source(&live, capture, &turns_done, &watched, &|| stop(&shutdown));
        Some((samples, stopped, Some(report)))
    } else if let Some(audio) = pushed {
        let samples = push_source(&audio, &audio_tx, &|| stop(&shutdown));
        Some((samples, false, None))
    } else {
        None
    };
    if let Some((samples, stopped, report)) = streamed {
        // the end of input (a live capture holds a sender of its own, now gone)
        drop(audio_tx);
        let run = finish_run(
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
            report,
            speaker,
        );
        return Ok(run);
    }
    let mut pos: u64 = 0;
    let mut spans = Vec::new();
    let mut input_errors = Vec::new();
    let mut input_warnings = Vec::new();
    let mut interrupted = false;
    let send = |frame_samples: Vec<f32>, pos: u64, new_recording: bool| -> bool {
        let captured = match opts.pace {
            Pace::Realtime | Pace::Live => {
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
                end_of_stream: false,
            })
            .is_ok()
    };
    // the gap lets the endpointer close the last utterance of a file
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
        None,
    ))
}

/// Pushed audio enters the pipeline in frames of at most this many
/// samples (32 ms, the VAD's window), so that the audio edge's frames hold
/// about two seconds whatever the size of the pushes: the rest waits in the
/// pusher's queue, where a stopping server can still drop it.
const PUSHED_FRAME: usize = 512;

/// Plays pushed audio into the pipeline as it arrives, until every sender
/// is gone or `stop` holds; returns the samples played.
fn push_source(
    pushed: &super::Pushed,
    tx: &voxline_core::EdgeSender<AudioFrame>,
    stop: &dyn Fn() -> bool,
) -> u64 {
    let mut pos = 0u64;
    let mut send = |samples: Vec<f32>, captured: Instant, end: bool| {
        let n = samples.len() as u64;
        let frame = AudioFrame {
            start_sample: pos,
            new_recording: pos == 0 && !end,
            end_of_stream: end,
            samples,
            captured,
        };
        pos += n;
        tx.send(frame).is_ok()
    };
    while !stop() {
        let sent = match pushed
            .audio
            .recv_timeout(std::time::Duration::from_millis(50))
        {
            Ok(PushedAudio::Samples(samples, at)) => {
                let n = samples.len() as u64;
                pushed
                    .queued
                    .fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
                samples
                    .chunks(PUSHED_FRAME)
                    .all(|c| !stop() && send(c.to_vec(), at, false))
            }
            Ok(PushedAudio::End) => send(Vec::new(), Instant::now(), true),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        };
        if !sent {
            break;
        }
    }
    pos
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
    mut live: Option<LiveReport>,
    speaker: Option<Voice>,
) -> RunResult {
    if let Some(v) = &speaker {
        // the run has ended: what is still to be said plays out for a bounded time
        v.play_out_by(Instant::now() + super::speaker::PLAY_OUT_LIMIT);
    }
    let outcome = p.join();
    if let Some(v) = speaker {
        // what was said is heard to its end, unless the session was stopped
        let stopped = stop_requested.is_some_and(ShutdownHandle::is_requested);
        let played = v.finish(!stopped);
        if let Some(l) = live.as_mut() {
            l.device_changes += played
                .echo_cancellation
                .as_ref()
                .map_or(0, |a| a.voice_heard);
            l.voice_output = Some(played);
        }
    }
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
        cpu_share: opts.cpu_share,
        engine_threads_peak: opts.meter.peak(),
        live,
    }
}
