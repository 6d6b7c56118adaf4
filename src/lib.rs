//! The voxline application: settings validated from the command line, the
//! pipeline assembled from the library crates, and the run report.
//!
//! The binary (`src/main.rs`) is a thin shell over this crate; the
//! integration tests drive the same functions.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod bench;
pub mod budget;
pub mod capacity;
pub mod fault;
pub mod output;
pub mod pipeline;
pub mod report;
pub mod serve;
pub mod sessions;
pub mod settings;
pub mod sidecar;
pub mod stats;
pub mod tally;
pub mod topology;

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
