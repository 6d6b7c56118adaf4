//! The pipeline, assembled: replay source → VAD → STT → LLM → sinks.
//!
//! Every stage runs on its own thread (voxline-core's runtime), joined by
//! bounded edges. Replay never loses audio: every edge blocks when full, so
//! a slow stage slows the source instead of dropping speech.
//!
//! Where the audio comes from is in `input` (recordings) and `live` (a
//! device); where the voice goes live, and barge-in, in `speaker`; how to
//! run in `options`; the stages added to the standard pipeline and the
//! topology they make in `assembly`; the event sink in `sink`; the run
//! itself and its result in `run`.

mod assembly;
mod config;
mod input;
mod live;
mod options;
mod run;
mod sink;
mod speaker;

pub use assembly::{Extras, TranscriptStage};
pub use config::{hangover_judged, PipelineConfig};
pub use input::{
    open_inputs, open_inputs_until, Input, InputSpan, Pace, Pushed, PushedAudio, Source,
};
pub use live::{LiveOptions, LiveReport, VoiceOutputReport};
pub use options::{EventHook, Observer, RunOptions, SemanticTurn, SharedObserver, SpanHook};
pub use run::{run, run_source, run_source_with, run_with, RunError, RunResult};
pub use speaker::{SpeakerRecovered, SpeakerStalled};
