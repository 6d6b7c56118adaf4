//! Fault injection for chaos tests.
//!
//! `VOXLINE_FAULT=KIND:STAGE:ID` makes stage `STAGE` (`stt` or `llm`) fail on
//! utterance `ID`: `KIND` is `panic` (the stage panics: the pipeline shuts
//! down in order, the report records the failure, exit code 3) or `error`
//! (the turn fails with an error event and the next turns go on). Unset, the
//! runtime calls every stage as it is. It exists so the failure paths are
//! tested on the real binary with the real engines.
//!
//! The runtime injects the fault around the stage's call
//! ([`PipelineBuilder::inject_fault`](voxline_core::PipelineBuilder::inject_fault)):
//! no stage is wrapped, so no wrapper can forget to forward a hook (a
//! wrapper that did not forward `interrupted` once kept whole answers the
//! user talked over in the conversation).

use crate::BadInput;

/// What to inject: the runtime's [`InjectedFault`](voxline_core::InjectedFault).
pub type Fault = voxline_core::InjectedFault;

/// Reads `VOXLINE_FAULT`.
///
/// # Errors
/// [`BadInput`] when it is set but malformed.
pub fn from_env() -> Result<Option<Fault>, BadInput> {
    let Ok(spec) = std::env::var("VOXLINE_FAULT") else {
        return Ok(None);
    };
    let bad = || {
        BadInput(format!(
            "VOXLINE_FAULT={spec}: expected KIND:STAGE:ID, e.g. panic:stt:2 or error:llm:1"
        ))
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let [kind, stage, id] = parts.as_slice() else {
        return Err(bad());
    };
    let panic = match *kind {
        "panic" => true,
        "error" => false,
        _ => return Err(bad()),
    };
    Ok(Some(Fault {
        panic,
        stage: (*stage).to_string(),
        id: id.parse().map_err(|_| bad())?,
    }))
}
