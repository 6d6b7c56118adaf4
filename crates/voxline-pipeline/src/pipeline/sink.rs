//! The event sink: every event to the console, the event log (JSON lines)
//! and the run's result, or a live session's observer.

use std::io::Write;

use voxline_core::{Clock, PipelineEvent, TimedEvent};
use voxline_llm::{Token, TurnComplete};

use crate::BadInput;

use super::options::{lock, SharedObserver};

/// Writes events to the console and an optional JSONL output (a regular
/// file is written under a partial name and moved into place at the end).
pub(super) struct EventSink {
    clock: Clock,
    console: bool,
    file: Option<(crate::output::Output, crate::output::Writer)>,
    /// Every event, for the report (replay: a file ends).
    events: Vec<TimedEvent>,
    /// Live: events go to the observer instead and are not kept.
    pub(super) observer: Option<SharedObserver>,
    write_error: Option<String>,
}

impl EventSink {
    pub(super) fn new(
        clock: Clock,
        console: bool,
        output: Option<&crate::output::Output>,
    ) -> Result<Self, BadInput> {
        let file = match output {
            None => None,
            Some(o) => {
                let w = o.open().map_err(|e| {
                    BadInput(format!(
                        "{}; choose a writable path for --events",
                        o.describe(&e)
                    ))
                })?;
                Some((o.clone(), w))
            }
        };
        Ok(Self {
            clock,
            // the event log on standard output must not be interleaved with the console
            console: console && !output.is_some_and(crate::output::Output::is_stdout),
            file,
            events: Vec::new(),
            observer: None,
            write_error: None,
        })
    }

    pub(super) fn handle(&mut self, ev: TimedEvent) {
        if let Some((o, w)) = &mut self.file {
            let line = ev.to_json_line(&self.clock).unwrap_or_default();
            if let Err(e) = writeln!(w, "{line}") {
                self.write_error.get_or_insert(o.describe(&e));
            }
        }
        if self.console {
            use crate::shown::{continued, escaped, one_line};
            let mut out = std::io::stdout().lock();
            match &ev.event {
                PipelineEvent::Transcript(t) => {
                    let _ = writeln!(out, "[{}] you: {}", t.id, escaped(&t.text, false));
                }
                PipelineEvent::Engine(e) => {
                    if let Some(t) = e.downcast_ref::<Token>() {
                        if t.index == 0 {
                            let _ = write!(out, "[{}] voxline: ", t.id);
                        }
                        // a new line inside the answer is indented under
                        // its prefix: no line of it reads as voxline's own
                        let indent = " ".repeat(format!("[{}] voxline: ", t.id).len());
                        let _ = write!(out, "{}", continued(&t.text, &indent));
                        let _ = out.flush();
                    } else if let Some(c) = e.downcast_ref::<TurnComplete>() {
                        if c.n_generated == 0 {
                            let _ = writeln!(out, "[{}] voxline: (nothing to answer)", c.id);
                        } else {
                            let _ = writeln!(out);
                        }
                    }
                }
                PipelineEvent::TurnError(e) => {
                    let _ = writeln!(out);
                    eprintln!("[{}] error in {}: {}", e.id, e.stage, one_line(&e.message));
                }
                PipelineEvent::Merged { id, .. } => {
                    let _ = writeln!(out, "\n[{id}] (you went on: merged into the next turn)");
                }
                PipelineEvent::StageFailed { stage, message } => {
                    eprintln!("stage {stage} failed: {}", one_line(message));
                }
                PipelineEvent::StageError { stage, message } => {
                    eprintln!("{stage}: {}", one_line(message));
                }
                _ => {}
            }
        }
        match &self.observer {
            Some(o) => lock(o).event(&ev),
            None => self.events.push(ev),
        }
    }

    /// Finishes the event log; returns the events and any write error.
    pub(super) fn finish(mut self) -> (Vec<TimedEvent>, Option<String>) {
        if let Some((o, w)) = self.file.take() {
            if let Err(e) = w.finish() {
                self.write_error.get_or_insert(o.describe(&e));
            }
        }
        (self.events, self.write_error)
    }
}
