//! The speech-to-text stage: utterances in, transcripts out.

use crate::{implausibly_short, join_continuation, normalise, SttEngine, SttError};

/// The speech-to-text stage: one [`Utterance`](voxline_core::Utterance) in,
/// one [`Transcript`](voxline_core::Transcript) out. An engine failure on one
/// utterance becomes a turn error for that id; the stage goes on.
///
/// Long speech arrives in chunks the endpointer cut at its maximum length:
/// each continuation's transcript leaves out the words its lead-in repeats
/// from the chunk it continues ([`join_continuation`]), so the chunks'
/// transcripts read one after another as the whole. A transcript
/// [`implausibly_short`] for its audio is a turn error.
pub struct SttStage {
    engine: SttEngine,
    board: Option<voxline_core::SpecBoard>,
    governor: Option<voxline_core::CpuGovernor>,
    meter: Option<voxline_core::ThreadMeter>,
    /// The latest forced-split chunk and its transcript's normalised words
    /// (`None` when it failed: its continuation is then kept whole).
    carry: Option<(voxline_core::UtteranceId, Vec<String>)>,
}

impl SttStage {
    /// Wraps a loaded engine.
    #[must_use]
    pub fn new(engine: SttEngine) -> Self {
        Self {
            engine,
            board: None,
            governor: None,
            meter: None,
            carry: None,
        }
    }

    /// Each transcription runs with the threads `governor` grants (the cores
    /// other processes leave free), counted on `meter`.
    #[must_use]
    pub fn with_cpu(
        mut self,
        governor: Option<voxline_core::CpuGovernor>,
        meter: voxline_core::ThreadMeter,
    ) -> Self {
        self.governor = governor;
        self.meter = Some(meter);
        self
    }

    /// Speculative attempts cancelled on `board` are skipped, or aborted
    /// mid-transcription, and produce nothing.
    #[must_use]
    pub fn with_speculation(mut self, board: voxline_core::SpecBoard) -> Self {
        self.board = Some(board);
        self
    }
}

/// The stage's name in the pipeline.
pub const STAGE_NAME: &str = "stt";

/// The stage's identity in the pipeline's topology.
pub const STAGE: voxline_core::StageId = voxline_core::StageId::new(STAGE_NAME);

impl voxline_core::Stage for SttStage {
    type In = voxline_core::Utterance;
    type Out = voxline_core::Transcript;

    fn name(&self) -> &str {
        STAGE_NAME
    }

    fn priority(&self, u: &Self::In) -> voxline_core::Priority {
        match self.board.as_ref().map(|b| b.state(u.id)) {
            Some(voxline_core::SpecState::Pending) => voxline_core::Priority::Speculative,
            _ => voxline_core::Priority::Committed,
        }
    }

    fn process(
        &mut self,
        u: Self::In,
        out: &mut voxline_core::Emitter<'_, Self::Out>,
    ) -> Result<(), voxline_core::StageError> {
        let board = self.board.clone();
        let cancelled = || board.as_ref().is_some_and(|b| b.is_cancelled(u.id));
        if cancelled() {
            return Ok(());
        }
        if let Some(g) = &self.governor {
            self.engine.set_threads(g.threads());
        }
        let running = self
            .meter
            .as_ref()
            .map(|m| m.enter(self.engine.config().threads));
        let result = if u.forced_split || u.continues.is_some() {
            self.engine
                .transcribe_chunk_abortable(&u.samples, &cancelled)
        } else {
            self.engine.transcribe_abortable(&u.samples, &cancelled)
        };
        // computing is over (a send that waits for room downstream is not)
        drop(running);
        let t = match result {
            Ok(t) => t,
            Err(SttError::Aborted) => return Ok(()),
            Err(e) => {
                if u.forced_split {
                    self.carry = None;
                }
                return Err(voxline_core::StageError::turn(u.id, e.to_string()).caused_by(e));
            }
        };
        if let Some(why) = implausibly_short(&t.text, t.audio_ms / 1000.0) {
            if u.forced_split {
                self.carry = None;
            }
            return Err(voxline_core::StageError::turn(u.id, why));
        }
        let text = match (&self.carry, u.continues) {
            (Some((id, previous)), Some(continues)) if *id == continues => {
                join_continuation(previous, &t.text).0
            }
            _ => t.text.clone(),
        };
        // A speculative attempt is never a forced split: only real chunks are carried.
        if u.forced_split {
            self.carry = Some((u.id, normalise(&t.text)));
        }
        out.emit(voxline_core::Transcript {
            id: u.id,
            text,
            n_tokens: t.n_tokens,
            audio_ms: t.audio_ms,
            start_sample: u.start_sample,
            end_sample: u.end_sample,
            end_wall: u.end_wall,
        });
        Ok(())
    }
}
