//! voxline-core: the pieces of the voxline pipeline that know nothing of
//! audio devices or models.
//!
//! - [`clock`]: the one clock of a session ([`Clock`], [`StreamTime`]);
//! - [`message`]: what travels between stages and what sinks see
//!   ([`PipelineEvent`]);
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
//! use voxline_core::{edge, Clock, Emitter, FullPolicy, Pipeline, Stage, StageError, Token};
//!
//! /// Upper-cases token text.
//! struct Shout;
//!
//! impl Stage for Shout {
//!     type In = Token;
//!     type Out = Token;
//!     fn name(&self) -> &str { "shout" }
//!     fn process(&mut self, t: Token, out: &mut Emitter<'_, Token>) -> Result<(), StageError> {
//!         out.emit(Token { text: t.text.to_uppercase(), ..t });
//!         Ok(())
//!     }
//! }
//!
//! let mut pipeline = Pipeline::new(Clock::start());
//! let (source, rx) = edge::<Token>("in", 8, FullPolicy::Block);
//! let (tx, results) = edge::<Token>("out", 8, FullPolicy::Block);
//! pipeline.spawn_stage(Shout, rx, tx).unwrap();
//! let (collected_tx, collected) = std::sync::mpsc::channel();
//! pipeline.spawn_sink("collect", results, move |env| {
//!     let _ = collected_tx.send(env.item.text);
//!     Ok(())
//! }).unwrap();
//! source.send(Token { id: 1, index: 0, text: "hi".into() }).unwrap();
//! drop(source); // end of input
//! let outcome = pipeline.join();
//! assert!(outcome.failed.is_none());
//! assert_eq!(collected.recv().unwrap(), "HI");
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod clock;
pub mod cpu;
pub mod edge;
pub mod files;
pub mod message;
pub mod runtime;
pub mod span;
pub mod spec;
pub mod stage;
pub mod topology;

pub use clock::{Clock, StreamTime, SAMPLE_RATE};
pub use cpu::{CpuGovernor, LeaseGuard, Priority, ThreadMeter};
pub use edge::{
    edge, try_edge, Disconnected, EdgeError, EdgeReceiver, EdgeSender, EdgeStats,
    EdgeStatsSnapshot, Envelope, FullPolicy, RecvTimeoutError, TryRecvError, TrySend,
};
pub use message::{
    AudioFrame, LlmEngineTimings, LlmOut, Message, PipelineEvent, StopReason, TimedEvent, Token,
    Transcript, TurnComplete, TurnError, Utterance, UtteranceId, UtteranceInfo,
};
pub use runtime::{
    CpuLease, EventBus, EventReceiver, Pipeline, PipelineBuilder, RunOutcome, RuntimeError,
    ShutdownHandle,
};
pub use span::{Span, SpanKind, SpanRecord};
pub use spec::{SpecBoard, SpecGate, SpecState};
pub use stage::{drive, on_thread, Emitter, OnThread, Stage, StageError, StartError, StartStage};
pub use topology::{EdgeId, EdgeSpec, StageId, StageSpec, Topology, TopologyError};
