//! The binary's subcommands, one module each; what they share (the
//! arguments, the engine factory, outputs, signals, the report's end) stays
//! in `main.rs`.

pub(crate) mod bench;
pub(crate) mod live;
pub(crate) mod models;
pub(crate) mod replay;
pub(crate) mod serve;
