//! The speech-to-text stage: utterances in, transcripts out.

use crate::{
    compact_pauses, hesitation_only, implausibly_short, join_continuation, normalise, not_words,
    pieces, sounding_s, SpeechToText, SttEngine, SttError, Transcription, MAX_PIECE_S,
};
use voxline_core::Heard;

/// The speech-to-text stage: one [`Utterance`](voxline_core::Utterance) in,
/// one [`Transcript`](voxline_core::Transcript) out. An engine failure on one
/// utterance becomes a turn error for that id; the stage goes on.
///
/// Long speech arrives in chunks the endpointer cut at its maximum length:
/// each continuation's transcript leaves out the words its lead-in repeats
/// from the chunk it continues ([`join_continuation`]), so the chunks'
/// transcripts read one after another as the whole. Whisper reads each
/// utterance with its pauses over [`crate::LONG_PAUSE_MS`] shortened
/// ([`compact_pauses`]). A transcript [`implausibly_short`] for the audio
/// that sounds ([`sounding_s`]) is transcribed again in pieces cut at its
/// quietest points ([`pieces`]), and the reading with more words is passed
/// on: sparse speech (digits read slowly, fillers, a question over babble)
/// is what it heard, never a turn error. A transcript of hesitations alone
/// ([`hesitation_only`]) becomes `[hesitation: …]`, which nothing answers.
///
/// The stage is generic over its engine ([`SpeechToText`]); the runtime
/// skips a cancelled speculative attempt and the stage aborts one that is
/// cancelled while it is transcribed (its call's
/// [`cancel_probe`](voxline_core::Emitter::cancel_probe)).
pub struct SttStage<E: SpeechToText = SttEngine> {
    engine: E,
    governor: Option<voxline_core::CpuGovernor>,
    /// The latest forced-split chunk and its transcript's normalised words
    /// (`None` when it failed: its continuation is then kept whole).
    carry: Option<(voxline_core::UtteranceId, Vec<String>)>,
}

impl<E: SpeechToText> SttStage<E> {
    /// Wraps an engine.
    #[must_use]
    pub fn new(engine: E) -> Self {
        Self {
            engine,
            governor: None,
            carry: None,
        }
    }

    /// Each transcription runs with the threads `governor` grants (the cores
    /// other processes leave free).
    #[must_use]
    pub fn with_governor(mut self, governor: Option<voxline_core::CpuGovernor>) -> Self {
        self.governor = governor;
        self
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &E {
        &self.engine
    }
}

impl<E: SpeechToText> SttStage<E> {
    /// `samples` transcribed piece by piece ([`pieces`] of at most
    /// [`MAX_PIECE_S`]), the texts joined: the second reading of a
    /// transcript too short for its audio. Its confidence is the most
    /// speech-like piece's no-speech probability and the pieces' mean token
    /// log-probability, weighted by their tokens.
    fn in_pieces(
        &mut self,
        samples: &[f32],
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        let mut whole = Transcription {
            text: String::new(),
            n_tokens: 0,
            audio_ms: samples.len() as f64 * 1000.0 / f64::from(crate::SAMPLE_RATE),
            audio_ctx: 0,
            confidence: None,
        };
        let mut logprob = 0.0f64;
        for piece in pieces(samples, MAX_PIECE_S) {
            let t = self.engine.transcribe(piece, false, abort)?;
            if !t.text.is_empty() && !voxline_core::non_speech(&t.text) {
                if !whole.text.is_empty() {
                    whole.text.push(' ');
                }
                whole.text.push_str(t.text.trim());
            }
            whole.n_tokens += t.n_tokens;
            whole.audio_ctx = whole.audio_ctx.max(t.audio_ctx);
            if let Some(c) = t.confidence {
                logprob += f64::from(c.avg_logprob) * f64::from(t.n_tokens);
                let no_speech = whole
                    .confidence
                    .map_or(c.no_speech, |w| w.no_speech.min(c.no_speech));
                whole.confidence = Some(crate::Confidence {
                    no_speech,
                    avg_logprob: 0.0,
                });
            }
        }
        if let Some(c) = whole.confidence.as_mut() {
            if whole.n_tokens > 0 {
                c.avg_logprob = (logprob / f64::from(whole.n_tokens)) as f32;
            }
        }
        Ok(whole)
    }
}

/// The stage's name in the pipeline.
pub const STAGE_NAME: &str = "stt";

/// The stage's identity in the pipeline's topology.
pub const STAGE: voxline_core::StageId = voxline_core::StageId::new(STAGE_NAME);

impl<E: SpeechToText> voxline_core::Stage for SttStage<E> {
    type In = voxline_core::Utterance;
    type Out = voxline_core::Transcript;

    fn name(&self) -> &str {
        STAGE_NAME
    }

    fn leased(&self) -> bool {
        self.engine.computes_here()
    }

    fn threads(&mut self) -> usize {
        if let Some(g) = &self.governor {
            self.engine.set_threads(g.threads());
        }
        self.engine.threads()
    }

    fn process(
        &mut self,
        u: Self::In,
        out: &mut voxline_core::Emitter<'_, Self::Out>,
    ) -> Result<(), voxline_core::StageError> {
        let probe = out.cancel_probe();
        let chunk = u.forced_split || u.continues.is_some();
        // a server's reply is waited on only briefly once the run stops
        let outside = !self.engine.computes_here();
        // whisper reads the utterance with its long pauses shortened
        let heard = compact_pauses(&u.samples);
        let result = self.engine.transcribe(&heard, chunk, &|| {
            probe.is_cancelled() || (outside && probe.outside_wait_over())
        });
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
        // the assistant's own voice heard back through the microphone (its
        // levels follow the voice's as it played) is not the user: no turn
        let audio = std::time::Duration::from_secs_f64(
            u.end_sample.saturating_sub(u.start_sample) as f64
                / f64::from(voxline_core::SAMPLE_RATE),
        );
        let start = u.end_wall.checked_sub(audio).unwrap_or(u.end_wall);
        let likeness = probe.echo_likeness(&u.samples, u.end_wall);
        if let Some(l) = likeness {
            tracing::debug!(turn = u.id, likeness = l, "heard while the voice played");
        }
        let heard_back = likeness.is_some_and(|l| l >= voxline_core::barge::ECHO_MIN_LIKENESS);
        // an annotation of a sound ("(dramatic music)" for 6 s of a buzz) is
        // no words, not too few of them: it goes on, and nothing answers it;
        // nor is the voice heard back (whisper hears a word or two of 5 s
        // of the voice under the room's sound): it goes on as an echo
        let words_expected = !voxline_core::non_speech(&t.text) && !heard_back;
        // held to a speaking rate over the audio that sounds, not the pauses
        let sounding = if words_expected {
            sounding_s(&u.samples)
        } else {
            0.0
        };
        let t = match implausibly_short(&t.text, sounding).filter(|_| words_expected) {
            None => t,
            // whisper may have stopped early on a long window, or the speech
            // is sparse: read again in pieces, the reading with more words kept
            Some(why) => match self.in_pieces(&heard, &|| {
                probe.is_cancelled() || (outside && probe.outside_wait_over())
            }) {
                Ok(p) => {
                    let (before, after) = (normalise(&t.text).len(), normalise(&p.text).len());
                    tracing::info!(
                        turn = u.id,
                        words_before = before,
                        words_after = after,
                        "{why}: transcribed again in pieces of at most {MAX_PIECE_S} s"
                    );
                    if after > before {
                        p
                    } else {
                        t
                    }
                }
                Err(SttError::Aborted) => return Ok(()),
                Err(e) => {
                    tracing::warn!(turn = u.id, "{why}; reading it again in pieces failed: {e}");
                    t
                }
            },
        };
        let text = match (&self.carry, u.continues) {
            (Some((id, previous)), Some(continues)) if *id == continues => {
                join_continuation(previous, &t.text).0
            }
            _ => t.text.clone(),
        };
        // What was heard is judged here, once (later judgements win), and
        // travels typed with the transcript; what is no turn is shown as an
        // annotation of its kind, which nothing answers.
        // A sound whisper wrote as one ("(buzzing)") is no words.
        let mut heard = if voxline_core::non_speech(&text) {
            Heard::Noise {
                no_speech: None,
                avg_logprob: None,
            }
        } else {
            Heard::Words
        };
        // whisper's guess at a sound (a hum heard as "How far?")
        let text = match t
            .confidence
            .and_then(|c| not_words(&text, c).map(|why| (c, why)))
        {
            Some((c, why)) => {
                tracing::info!(turn = u.id, "{why}");
                heard = Heard::Noise {
                    no_speech: Some(c.no_speech),
                    avg_logprob: Some(c.avg_logprob),
                };
                noise_annotation(&text)
            }
            None => text,
        };
        // "um… so… well…" alone is a speaker thinking aloud: not answered
        let text = if hesitation_only(&text) {
            tracing::info!(turn = u.id, words = %text.escape_debug(), "only hesitations: not a request");
            heard = Heard::Hesitation;
            annotation("hesitation", &text)
        } else {
            text
        };
        // the voice heard back, by its levels or by its words: no turn, so
        // it cannot answer itself in a loop
        let by_words = !heard_back && probe.is_echo(&text, start, u.end_wall);
        let text = if heard_back || by_words {
            tracing::warn!(turn = u.id, words = %text.escape_debug(), likeness = ?likeness, "heard the assistant's own voice (echo): not a turn");
            heard = Heard::Echo { likeness, by_words };
            echo_annotation(&text)
        } else {
            text
        };
        // a listener's "uh-huh" over the assistant's paused answer is not a
        // turn: the answer plays on (the runtime hands the verdict to the
        // barge-in state, which resumes it)
        let text = if probe.is_over_held_answer()
            && heard.is_words()
            && voxline_core::backchannel(&text)
        {
            tracing::info!(turn = u.id, words = %text.escape_debug(), "a backchannel over the answer: it plays on");
            heard = Heard::Backchannel;
            backchannel_annotation(&text)
        } else {
            text
        };
        // A speculative attempt is never a forced split: only real chunks are carried.
        if u.forced_split {
            self.carry = Some((u.id, normalise(&t.text)));
        }
        out.emit(voxline_core::Transcript {
            id: u.id,
            text,
            heard,
            n_tokens: t.n_tokens,
            // the utterance's own length, whatever whisper was given of it
            audio_ms: u.samples.len() as f64 * 1000.0 / f64::from(crate::SAMPLE_RATE),
            start_sample: u.start_sample,
            end_sample: u.end_sample,
            end_wall: u.end_wall,
        });
        Ok(())
    }
}

/// The annotation a transcript judged noise ([`not_words`]) becomes:
/// `[noise: what whisper guessed]`, with the guess's own brackets and stars
/// taken out so that the whole reads as an annotation
/// ([`voxline_core::non_speech`]) and the report still shows the guess.
#[must_use]
pub fn noise_annotation(text: &str) -> String {
    annotation("noise", text)
}

/// The annotation a backchannel heard over the assistant's held answer
/// ([`voxline_core::backchannel`]) becomes: `[backchannel: what was
/// said]`, which nothing answers (the answer plays on).
#[must_use]
pub fn backchannel_annotation(text: &str) -> String {
    annotation("backchannel", text)
}

/// The annotation the assistant's own voice heard back becomes
/// ([`voxline_core::BargeIn::is_echo`]): `[echo: what was heard]`, which
/// nothing answers.
#[must_use]
pub fn echo_annotation(text: &str) -> String {
    annotation(voxline_core::barge::ECHO_ANNOTATION, text)
}

/// `[kind: text]`, with the text's own brackets and stars taken out so
/// that the whole reads as an annotation ([`voxline_core::non_speech`]).
fn annotation(kind: &str, text: &str) -> String {
    let guess: String = text
        .chars()
        .filter(|c| !matches!(c, '[' | ']' | '(' | ')' | '{' | '}' | '*'))
        .collect();
    format!("[{kind}: {}]", guess.trim())
}

#[cfg(test)]
mod tests {
    use super::{backchannel_annotation, noise_annotation};

    #[test]
    fn a_noise_annotation_is_non_speech_and_keeps_the_guess() {
        for guess in ["How far?", "(laughs) yes [sic] *no*", "", "a ] b ) c"] {
            let a = noise_annotation(guess);
            assert!(voxline_core::non_speech(&a), "{a:?}");
            assert!(a.starts_with("[noise:"), "{a:?}");
        }
        assert_eq!(noise_annotation("How far?"), "[noise: How far?]");
        let a = backchannel_annotation("Uh-huh.");
        assert!(
            voxline_core::non_speech(&a) && a == "[backchannel: Uh-huh.]",
            "{a:?}"
        );
    }
}
