//! How to run: pacing, endpointing, outputs, queue sizes, CPU sharing,
//! speculation ([`RunOptions`]).

use voxline_audio::VadConfig;
use voxline_core::{Clock, Span, TimedEvent, Topology};

use super::Pace;

/// Called with every event as the sinks see it (e.g. to drive a progress bar).
pub type EventHook = std::sync::Arc<dyn Fn(&TimedEvent) + Send + Sync>;

/// Called with every span as the runtime records it, from the stage threads.
pub type SpanHook = std::sync::Arc<dyn Fn(&Span) + Send + Sync>;

/// Where a live or pushed session's spans and events go as they happen.
/// Such a session may run for weeks, so the run keeps none of them (its
/// result's `outcome.spans` and `events` stay empty); an observer that
/// keeps bounded totals (the report's tally) stands in for them.
pub trait Observer: Send {
    /// The run is about to start, on `clock`, shaped as `topology`.
    fn start(&mut self, clock: Clock, topology: &Topology);
    /// A span, as the runtime records it (from a stage thread).
    fn span(&mut self, span: &Span);
    /// An event, as the sinks see it (after the speculation gate).
    fn event(&mut self, event: &TimedEvent);
}

/// An [`Observer`] the stage threads and the event thread share.
pub type SharedObserver = std::sync::Arc<std::sync::Mutex<dyn Observer>>;

pub(crate) use voxline_core::sync::lock;

/// How to run.
#[derive(Clone)]
pub struct RunOptions {
    /// Pacing of the replay.
    pub pace: Pace,
    /// Endpointer settings.
    pub vad: VadConfig,
    /// Silence inserted between files, in ms (lets the endpointer close the
    /// last utterance); with the semantic end of turn, at least its wait
    /// after an incomplete pause plus 500 ms.
    pub gap_ms: u32,
    /// Write every event as JSON lines here (checked by [`crate::output::plan`]).
    pub events: Option<crate::output::Output>,
    /// Print transcripts and streamed answers to stdout.
    pub console: bool,
    /// Capacity of the utterance and transcript edges.
    pub queue_capacity: usize,
    /// Called with every event.
    pub on_event: Option<EventHook>,
    /// Called with every span (a replay's are kept for the report as well).
    pub on_span: Option<SpanHook>,
    /// A live or pushed session's spans and events (not kept), as they
    /// happen; ignored for a replay, whose are kept.
    pub observer: Option<SharedObserver>,
    /// How the two engines share the cores: taking turns on them (one CPU
    /// lease) or each owning a part of them.
    pub cpu_share: crate::settings::CpuShare,
    /// Speculative turn-taking: the board the runtime settles attempts on
    /// and the silence, in ms, after which the VAD sends an utterance early.
    /// `None`: off.
    pub speculation: Option<(voxline_core::SpecBoard, u32)>,
    /// The lease the engines share when they take turns (`None`: one of the
    /// run's own); given, the run shares the cores with engines outside it.
    pub lease: Option<voxline_core::CpuLease>,
    /// The meter the runtime counts the engine stages' threads on.
    pub meter: voxline_core::ThreadMeter,
    /// A stop (Ctrl-C) cancels the answer in flight and the turns queued
    /// behind it, instead of letting them finish.
    pub cancel_on_stop: bool,
    /// Once requested, the turns queued before that moment are dropped
    /// (each a `cancelled` turn error) while those in flight finish: a
    /// server stopping where it is.
    pub drain: Option<voxline_core::DrainHandle>,
    /// A live pipeline that speaks: how speech over the voice stops it
    /// (`None`: it never does).
    pub barge_in: Option<voxline_audio::BargeInOptions>,
    /// A live pipeline that speaks: the echo canceller in front of the VAD,
    /// which takes what the loudspeaker played out of the microphone
    /// (`None`: off, `--no-aec`).
    pub echo_cancellation: Option<voxline_audio::AecOptions>,
    /// The semantic end of turn: the model that judges each pause and the
    /// policy (`None`: the hangover alone ends a turn).
    pub semantic_turn: Option<SemanticTurn>,
    /// Chaos tests (`VOXLINE_FAULT`): the call the runtime fails instead of
    /// running it (see [`crate::fault`]).
    pub fault: Option<crate::fault::Fault>,
}

/// The semantic end of turn a run's VAD consults: the model (shared by
/// every conversation of the process) and the policy.
pub type SemanticTurn = (
    voxline_audio::turn::SharedTurnModel,
    voxline_audio::turn::TurnPolicy,
);

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("pace", &self.pace)
            .field("vad", &self.vad)
            .field("gap_ms", &self.gap_ms)
            .field("events", &self.events)
            .field("console", &self.console)
            .field("queue_capacity", &self.queue_capacity)
            .field("cpu_share", &self.cpu_share)
            .field("cancel_on_stop", &self.cancel_on_stop)
            .field("drain", &self.drain)
            .field("speculation", &self.speculation.as_ref().map(|(_, ms)| ms))
            .field(
                "semantic_turn",
                &self.semantic_turn.as_ref().map(|(_, p)| p),
            )
            .field("fault", &self.fault)
            .finish_non_exhaustive()
    }
}

impl Default for RunOptions {
    /// The command line's defaults ([`super::PipelineConfig::default`]).
    fn default() -> Self {
        super::PipelineConfig::default().run_options()
    }
}

impl RunOptions {
    /// Every option at its default and the configuration's own (VAD,
    /// speculation, semantic end of turn, CPU share) bare: the base that
    /// [`super::PipelineConfig::run_options`] fills in.
    pub(crate) fn bare() -> Self {
        Self {
            pace: Pace::Fast,
            vad: VadConfig::default(),
            gap_ms: 1000,
            events: None,
            console: false,
            queue_capacity: 16,
            on_event: None,
            on_span: None,
            observer: None,
            cpu_share: crate::settings::CpuShare::Priority,
            speculation: None,
            lease: None,
            meter: voxline_core::ThreadMeter::new(),
            cancel_on_stop: false,
            drain: None,
            barge_in: Some(voxline_audio::BargeInOptions::default()),
            echo_cancellation: Some(voxline_audio::AecOptions::default()),
            semantic_turn: None,
            fault: None,
        }
    }
}
