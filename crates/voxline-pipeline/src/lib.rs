//! voxline's pipeline, assembled from the library crates: the engine
//! settings validated from the command line ([`settings`]: which backend
//! each stage runs, the CPU thread budget), the engines of every backend
//! ([`engines`]: in this process, shared, or on a remote server), the pipeline's shape declared
//! once ([`topology`]), the run from a recording, a device or pushed audio
//! ([`pipeline`]), many conversations on shared engines ([`sessions`]), the
//! voice that speaks the answers ([`voice`]), the fixtures' sidecars ([`sidecar`]), outputs written safely ([`output`])
//! and fault injection for the chaos tests ([`fault`]).
//!
//! The report is `voxline-report`'s, the server `voxline-serve`'s, the
//! capacity bench `voxline-capacity`'s; the `voxline` binary is the command
//! line over them all.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod engines;
pub mod fault;
pub mod output;
pub mod pipeline;
pub mod sessions;
pub mod settings;
pub mod shown;
pub mod sidecar;
pub mod topology;
pub mod voice;

/// An error in what the user gave (a file, a flag, a model): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

impl BadInput {
    /// Wraps any displayable error.
    pub fn from_display(e: impl std::fmt::Display) -> Self {
        Self(e.to_string())
    }
}

/// The operating system's reason for an I/O error, without Rust's
/// "(os error N)" suffix: what a user reads.
#[must_use]
pub fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}
