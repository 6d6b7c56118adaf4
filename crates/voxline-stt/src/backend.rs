//! The speech-to-text trait the pipeline's STT stage is generic over.

use crate::{SttEngine, SttError, Transcription};

/// What the STT stage asks of a speech-to-text engine: whisper.cpp in this
/// process ([`SttEngine`]) is the first; a remote server can be another.
/// Timing is the runtime's: an engine reports what it computed (the text,
/// its token count, the audio's length), never how long it took.
pub trait SpeechToText: Send + 'static {
    /// Transcribes one utterance of 16 kHz mono `samples`, polling `abort`
    /// while it works. `chunk` marks a piece of long speech cut at the
    /// endpointer's maximum length (the engine may treat it as a fragment).
    ///
    /// # Errors
    /// [`SttError::Aborted`] when `abort` stopped it; otherwise the engine's
    /// own failure.
    fn transcribe(
        &mut self,
        samples: &[f32],
        chunk: bool,
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError>;

    /// Threads of this process's CPU budget the next transcription computes
    /// with (0 for an engine that computes elsewhere).
    fn threads(&self) -> usize;

    /// Whether the engine computes on this thread (and the stage's calls
    /// take the pipeline's CPU lease); a client of a remote server does not.
    /// Default: `true`.
    fn computes_here(&self) -> bool {
        true
    }

    /// Thread adaptation, where the engine can: computes with `threads` from
    /// the next transcription on. Default: ignored.
    fn set_threads(&mut self, threads: usize) {
        let _ = threads;
    }
}

impl SpeechToText for SttEngine {
    fn transcribe(
        &mut self,
        samples: &[f32],
        chunk: bool,
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        if chunk {
            self.transcribe_chunk_abortable(samples, abort)
        } else {
            self.transcribe_abortable(samples, abort)
        }
    }

    /// 0 when offloaded to a GPU: the encoder and decoder compute there, and
    /// only the spectrogram (a few ms) on this process's threads.
    fn threads(&self) -> usize {
        if self.gpu().is_some() {
            0
        } else {
            self.config().threads
        }
    }

    /// Not when offloaded to a GPU: holding the CPU lease while the GPU
    /// computes would keep the cores from the engines that need them.
    fn computes_here(&self) -> bool {
        self.gpu().is_none()
    }

    fn set_threads(&mut self, threads: usize) {
        SttEngine::set_threads(self, threads);
    }
}
