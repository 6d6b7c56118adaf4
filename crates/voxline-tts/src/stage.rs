//! The speech-synthesis stage: the language model's streamed answer in,
//! blocks of spoken audio out.

use std::sync::Arc;

use voxline_core::answer::LlmOut;
use voxline_core::{Emitter, Priority, Stage, StageError, StageId, TurnError, UtteranceId};

use crate::chunk::{leave_out, Chunker, LeftOut};
use crate::message::{VoiceAudio, VoiceDone, VoiceOut};
use crate::{TextToSpeech, TtsError, Until, CHUNK_LIMIT};

/// The stage's name in the pipeline.
pub const STAGE_NAME: &str = "tts";

/// The stage's identity in the pipeline's topology.
pub const STAGE: StageId = StageId::new(STAGE_NAME);

/// Audio blocks: this many milliseconds each, so the first reaches the
/// loudspeaker while the rest of the chunk is still on its way.
pub const BLOCK_MS: u32 = 40;

/// The speech-synthesis stage.
///
/// It takes committed input only ([`Stage::committed_only`]): a speculative
/// attempt's tokens wait at the runtime's commit gate and are dropped if the
/// attempt is cancelled, so no word of it is ever spoken. Each chunk the
/// [`Chunker`] completes is spoken at once and sent on in
/// [`BLOCK_MS`] blocks; the answer's end flushes the rest and sends
/// [`VoiceDone`]. A chunk the voice fails on is a turn error; the rest of
/// the answer is still spoken. Characters the voice cannot read
/// ([`TextToSpeech::cannot_read`]) are left out before the text is cut,
/// with one warning an answer.
pub struct TtsStage<V: TextToSpeech + 'static> {
    voice: V,
    turn: Option<Turn>,
}

/// The answer being spoken.
struct Turn {
    id: UtteranceId,
    chunker: Chunker,
    chars: u32,
    samples: u64,
    failed: u32,
    /// What the voice could not read and left out.
    left_out: LeftOut,
}

impl Turn {
    fn new(id: UtteranceId) -> Self {
        Self {
            id,
            chunker: Chunker::new(),
            chars: 0,
            samples: 0,
            failed: 0,
            left_out: LeftOut::default(),
        }
    }
}

impl<V: TextToSpeech> TtsStage<V> {
    /// Speaks with `voice`.
    #[must_use]
    pub fn new(voice: V) -> Self {
        Self { voice, turn: None }
    }

    /// The voice.
    #[must_use]
    pub fn voice(&self) -> &V {
        &self.voice
    }

    /// Speaks `text`, chunk `chunk` of the current turn, block by block.
    fn speak(
        &mut self,
        chunk: u32,
        text: String,
        out: &mut Emitter<'_, VoiceOut>,
    ) -> Result<(), StageError> {
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        let id = turn.id;
        if out.input_cancelled() {
            // the user spoke over this answer (or the run stops): nothing
            // more of it is synthesised
            return Ok(());
        }
        let rate = self.voice.sample_rate();
        // a cut answer's synthesis stops at once, not at the chunk's end
        let probe = out.cancel_probe();
        let cancelled = move || probe.is_cancelled();
        let until = Until {
            cancelled: &cancelled,
            limit: CHUNK_LIMIT,
        };
        match self.voice.synthesize_until(&text, &until) {
            Err(TtsError::Cancelled) => Ok(()),
            Ok(samples) => {
                turn.chars += text.chars().count() as u32;
                turn.samples += samples.len() as u64;
                let block = (rate * BLOCK_MS / 1000).max(1) as usize;
                let text: Arc<str> = text.into();
                for (i, b) in samples.chunks(block).enumerate() {
                    // checked before each block: a chunk whose synthesis
                    // ended as the user spoke over it is not given out
                    if out.is_closed() || out.input_cancelled() {
                        break;
                    }
                    out.emit(VoiceOut::Audio(VoiceAudio {
                        id,
                        chunk,
                        block: i as u32,
                        sample_rate: rate,
                        samples: b.into(),
                        text: (i == 0).then(|| text.clone()),
                    }));
                }
                Ok(())
            }
            Err(e) => {
                turn.failed += 1;
                tracing::warn!(id, chunk, error = %e, "a chunk could not be spoken");
                out.publish(voxline_core::PipelineEvent::TurnError(TurnError {
                    id,
                    stage: STAGE_NAME.into(),
                    message: e.to_string(),
                }));
                Ok(())
            }
        }
    }

    /// Ends the current turn: speaks what is left and says it is done.
    fn end_turn(&mut self, out: &mut Emitter<'_, VoiceOut>) -> Result<(), StageError> {
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        let n = turn.chunker.emitted() as u32;
        if let Some(rest) = turn.chunker.finish() {
            self.speak(n, rest, out)?;
        }
        if let Some(t) = self.turn.take() {
            if t.left_out.chars > 0 {
                // one warning an answer, whatever it held
                tracing::warn!(
                    id = t.id,
                    voice = self.voice.name(),
                    chars = t.left_out.chars,
                    "the voice cannot read {}: {} characters of the answer were left out of what it spoke (the text is unchanged)",
                    t.left_out.scripts.join(", "),
                    t.left_out.chars,
                );
            }
            out.emit(VoiceOut::Done(VoiceDone {
                id: t.id,
                voice: self.voice.name(),
                chunks: t.chunker.emitted() as u32,
                chars: t.chars,
                audio_samples: t.samples,
                sample_rate: self.voice.sample_rate(),
                failed_chunks: t.failed,
            }));
        }
        Ok(())
    }
}

impl<V: TextToSpeech + 'static> Stage for TtsStage<V> {
    type In = LlmOut;
    type Out = VoiceOut;

    fn name(&self) -> &str {
        STAGE_NAME
    }

    fn threads(&mut self) -> usize {
        self.voice.threads()
    }

    /// The first chunk of an answer is what the user waits for: it goes
    /// before an answer's decoding (and with a committed turn's first token);
    /// the rest only has to keep ahead of playback.
    fn priority(&self, input: &LlmOut) -> Priority {
        let id = voxline_core::Message::utterance_id(input);
        match &self.turn {
            Some(t) if Some(t.id) == id && t.samples > 0 => Priority::Streaming,
            _ => Priority::FirstToken,
        }
    }

    fn committed_only(&self) -> bool {
        true
    }

    /// The user spoke over the answer: nothing more of it is spoken (the
    /// runtime skips its tokens still queued).
    fn interrupted(&mut self, id: UtteranceId, _heard: &str) {
        if self.turn.as_ref().is_some_and(|t| t.id == id) {
            self.turn = None;
        }
    }

    fn process(
        &mut self,
        input: LlmOut,
        out: &mut Emitter<'_, VoiceOut>,
    ) -> Result<(), StageError> {
        let id = voxline_core::Message::utterance_id(&input);
        if self.turn.as_ref().map(|t| t.id) != id {
            // an answer that never ended (its turn failed): what it said is said
            self.end_turn(out)?;
            self.turn = id.map(Turn::new);
        }
        match input {
            LlmOut::Token(t) => {
                let Some(turn) = self.turn.as_mut() else {
                    return Ok(());
                };
                // a script the voice cannot read is left out, not named
                // letter by letter
                let voice = &self.voice;
                let said = leave_out(&t.text, |c| voice.cannot_read(c), &mut turn.left_out);
                let first = turn.chunker.emitted() as u32;
                let chunks = turn.chunker.push(&said);
                for (k, chunk) in chunks.into_iter().enumerate() {
                    self.speak(first + k as u32, chunk, out)?;
                }
                Ok(())
            }
            LlmOut::Done(_) => self.end_turn(out),
        }
    }

    fn finish(&mut self, out: &mut Emitter<'_, VoiceOut>) -> Result<(), StageError> {
        self.end_turn(out)
    }
}
