//! Whose fault an error is: what the user gave, or the system.

/// Whose fault an error is. Every library error says ([`Fault::Input`]:
/// a file, a flag, a model the user gave; [`Fault::System`]: the machine,
/// an engine, a thread), so the binary picks its exit code (2 for the
/// user's input) without knowing any crate's variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// What the user gave is wrong: they can fix it (exit code 2).
    Input,
    /// The system failed: a runtime failure (exit code 3).
    System,
}
