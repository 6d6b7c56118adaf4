//! voxline's integration tests: one test binary, shared helpers in `util`.
//! They run the real models; `voxline models fetch` must have run first
//! (`.ci/run` does it).

mod bad_input;
mod batching;
mod browser;
mod device_change;
mod engines;
mod faults;
mod ggml_guard;
mod hardening;
mod live;
mod live_soak;
mod long_speech;
mod models_cli;
mod monologue;
mod options;
mod outputs;
#[path = "../../benches/support/pauses.rs"]
#[allow(dead_code)] // the bench uses the rest
mod pauses;
mod pulse;
mod remote;
mod replay;
mod report;
mod semantic_turn;
mod serve;
mod servers;
mod sessions;
mod speculation;
mod speech_as_it_comes;
mod stalled_speaker;
mod tally;
mod topology;
mod untrusted;
mod util;
mod voice;
