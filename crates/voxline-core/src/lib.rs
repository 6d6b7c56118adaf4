//! voxline-core: the pieces of the voxline pipeline that know nothing of
//! audio devices or models.
//!
//! - [`clock`]: the one clock of a session ([`Clock`], [`StreamTime`]);
//! - [`message`]: what travels between stages ([`Message`]) and is shared
//!   by several of them (audio, utterances, transcripts);
//! - [`event`]: what sinks and the event log see ([`PipelineEvent`]), with
//!   room for an engine's own events ([`EngineEvent`]);
//! - [`cpu`]: the CPU budget: a priority lease, a thread meter, a governor;
//! - [`mod@edge`]: bounded channels with a declared full-queue policy
//!   ([`FullPolicy`]) and counters;
//! - [`stage`]: the [`Stage`] trait and the [`Emitter`] it writes to;
//! - [`runtime`]: the threaded [`Pipeline`] that times stages from outside
//!   and shuts down in order;
//! - [`span`]: the runtime's record of each call ([`Span`]);
//! - [`spec`]: speculative turns ([`SpecBoard`], [`SpecGate`]);
//! - [`topology`]: the pipeline's shape declared once ([`Topology`],
//!   [`StageId`], [`EdgeId`]);
//! - [`files`]: atomic file writing, with partial files removed on abort.
//!
//! ```
//! use voxline_core::{
//!     edge, Clock, Emitter, FullPolicy, Message, Pipeline, Stage, StageError, UtteranceId,
//! };
//!
//! /// A message: some text of one turn.
//! struct Words {
//!     id: UtteranceId,
//!     text: String,
//! }
//!
//! impl Message for Words {
//!     fn utterance_id(&self) -> Option<UtteranceId> { Some(self.id) }
//! }
//!
//! /// Upper-cases the text.
//! struct Shout;
//!
//! impl Stage for Shout {
//!     type In = Words;
//!     type Out = Words;
//!     fn name(&self) -> &str { "shout" }
//!     fn process(&mut self, w: Words, out: &mut Emitter<'_, Words>) -> Result<(), StageError> {
//!         out.emit(Words { text: w.text.to_uppercase(), ..w });
//!         Ok(())
//!     }
//! }
//!
//! let mut pipeline = Pipeline::new(Clock::start());
//! let (source, rx) = edge::<Words>("in", 8, FullPolicy::Block);
//! let (tx, results) = edge::<Words>("out", 8, FullPolicy::Block);
//! pipeline.spawn_stage(Shout, rx, tx).unwrap();
//! let (collected_tx, collected) = std::sync::mpsc::channel();
//! pipeline.spawn_sink("collect", results, move |env| {
//!     let _ = collected_tx.send(env.item.text);
//!     Ok(())
//! }).unwrap();
//! source.send(Words { id: 1, text: "hi".into() }).unwrap();
//! drop(source); // end of input
//! let outcome = pipeline.join();
//! assert!(outcome.failed.is_none());
//! assert_eq!(collected.recv().unwrap(), "HI");
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod answer;
pub mod barge;
pub mod clock;
pub mod cpu;
pub mod edge;
mod emitter;
pub mod event;
pub mod fault;
pub mod files;
pub mod message;
pub mod runtime;
pub mod span;
pub mod spec;
pub mod stage;
pub mod sync;
pub mod topology;

pub use barge::{backchannel, BargeIn};
pub use clock::{Clock, StreamTime, SAMPLE_RATE};
pub use cpu::{CpuGovernor, FreeCores, LeaseGuard, MeterGuard, Priority, ThreadMeter};
pub use edge::{
    edge, try_edge, Disconnected, EdgeError, EdgeReceiver, EdgeSender, EdgeStats,
    EdgeStatsSnapshot, Envelope, FullPolicy, RecvTimeoutError, TryRecvError, TrySend,
};
pub use event::{AnyEngineEvent, EngineEvent, PipelineEvent, TimedEvent};
pub use fault::{Fault, InjectedFault};
pub use message::{
    non_speech, AudioFrame, Heard, Message, Transcript, TurnError, Utterance, UtteranceId,
    UtteranceInfo,
};
pub use runtime::{
    CpuLease, DrainHandle, EventBus, EventReceiver, Pipeline, PipelineBuilder, RunOutcome,
    RuntimeError, ShutdownHandle,
};
pub use span::{Span, SpanKind, SpanRecord};
pub use spec::{SpecBoard, SpecGate, SpecState};
pub use stage::{
    drive, on_thread, CancelProbe, Emitter, OnThread, Stage, StageError, StageErrorSource,
    StartError, StartStage,
};
pub use topology::{
    EdgeId, EdgeSpec, Latency, LatencyTerm, StageId, StageSpec, TermPart, Topology, TopologyError,
};
