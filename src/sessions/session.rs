//! One conversation: its handle and its own thread (VAD, then whisper,
//! then the turn to the LLM worker).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use voxline_audio::VadStage;
use voxline_core::{
    AudioFrame, Emitter, Priority, SpecBoard, SpecState, Stage, Utterance, UtteranceId,
};
use voxline_stt::{SttEngine, SttError, Transcription};

use super::{nanos, Cmd, Reply, SessionEvent, Shared};

/// One conversation on a [`Hub`](super::Hub). Dropping it leaves: its transcription
/// in progress is aborted, its answer leaves the batch, and its slot is
/// freed for the next session to join.
pub struct Session {
    pub(super) shared: Arc<Shared>,
    pub(super) slot: usize,
    pub(super) audio: Option<Sender<Input>>,
    pub(super) events: Receiver<SessionEvent>,
    pub(super) dropped: Arc<AtomicU64>,
    pub(super) refused: AtomicU64,
    pub(super) leaving: Arc<AtomicBool>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

pub(super) enum Input {
    Audio(Vec<f32>),
    End,
}

impl Session {
    /// Queues 16 kHz mono samples captured just now. Never blocks: when the
    /// session's queue is full (its thread far behind), the block is refused
    /// and counted ([`Session::refused_blocks`]); returns whether it was queued.
    pub fn push(&self, samples: Vec<f32>) -> bool {
        let Some(tx) = &self.audio else {
            return false;
        };
        let ok = tx.try_send(Input::Audio(samples)).is_ok();
        if !ok {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// The stream ends (the speaker is done): an open utterance is closed
    /// now instead of after the hangover. More audio may follow as a new stream.
    pub fn end_of_stream(&self) {
        if let Some(tx) = &self.audio {
            let _ = tx.send(Input::End);
        }
    }

    /// The session's events, in order.
    #[must_use]
    pub fn events(&self) -> &Receiver<SessionEvent> {
        &self.events
    }

    /// Events dropped because the reader did not keep up.
    #[must_use]
    pub fn dropped_events(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Audio blocks refused because the session's queue was full.
    #[must_use]
    pub fn refused_blocks(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The session's slot (its KV sequence) in the hub.
    #[must_use]
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::Relaxed);
        self.audio = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // After the session thread has stopped, so no turn of it starts
        // after this; and leaving waits for the slot to be free, so whoever
        // joins next can have it (the worker handles it between two steps).
        let (done, cleared) = crossbeam_channel::bounded(1);
        let sent = self.shared.llm.send(Cmd::Leave {
            slot: self.slot,
            done,
        });
        if sent.is_ok() {
            let _ = cleared.recv_timeout(Duration::from_secs(10));
        } else {
            // the worker is gone: free the slot here
            if let Some(s) = self
                .shared
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(self.slot)
            {
                *s = false;
            }
        }
    }
}

/// A transcribed speculative attempt: its id, its end sample, whisper's
/// result, the wait for the CPU and whisper's time.
type Attempt = (
    UtteranceId,
    u64,
    Result<Transcription, SttError>,
    Duration,
    Duration,
);

/// A session's own thread: VAD, then whisper, then the turn to the LLM worker.
///
/// With speculation, an attempt (the utterance so far, sent after a short
/// silence) is transcribed at once at the lowest priority; the VAD's
/// verdict on it comes with the audio that follows, which queues meanwhile:
/// a commit hands the transcript already made to the LLM, a cancel drops it.
pub(super) struct SessionWorker {
    pub(super) shared: Arc<Shared>,
    pub(super) slot: usize,
    pub(super) stt: SttEngine,
    pub(super) vad: VadStage,
    pub(super) board: SpecBoard,
    /// A transcribed attempt awaiting the VAD's commit or cancel.
    pub(super) attempt: Option<Attempt>,
    /// Samples pushed so far.
    pub(super) position: u64,
    pub(super) reply: Reply,
    pub(super) leaving: Arc<AtomicBool>,
    pub(super) turn: u32,
}

impl SessionWorker {
    pub(super) fn run(mut self, audio: &Receiver<Input>) {
        while let Ok(input) = audio.recv() {
            if self.leaving.load(Ordering::Relaxed) {
                return;
            }
            let mut out: Vec<Utterance> = Vec::new();
            let end = matches!(input, Input::End);
            let result = match input {
                Input::Audio(samples) => {
                    let frame = AudioFrame {
                        start_sample: self.position,
                        new_recording: self.position == 0,
                        samples,
                        captured: Instant::now(),
                    };
                    self.position += frame.samples.len() as u64;
                    self.vad.process(frame, &mut Emitter::to_vec(&mut out))
                }
                Input::End => self.vad.finish(&mut Emitter::to_vec(&mut out)),
            };
            if let Err(e) = result {
                self.reply.send(SessionEvent::TurnError {
                    turn: self.turn + 1,
                    message: e.to_string(),
                });
            }
            self.settle_attempt();
            for u in out {
                self.utterance(&u);
                self.settle_attempt();
            }
            if end {
                self.reply.send(SessionEvent::StreamEnd);
            }
        }
    }

    /// Delivers the transcribed attempt the VAD committed; drops a cancelled one.
    fn settle_attempt(&mut self) {
        let Some((id, ..)) = &self.attempt else {
            return;
        };
        match self.board.state(*id) {
            SpecState::Committed => {
                if let Some((_, end_sample, result, wait, stt)) = self.attempt.take() {
                    self.deliver(end_sample, result, wait, stt);
                }
            }
            SpecState::Cancelled => self.attempt = None,
            SpecState::Pending | SpecState::Final => {}
        }
    }

    fn utterance(&mut self, u: &Utterance) {
        let speculative = self.board.state(u.id) == SpecState::Pending;
        let priority = if speculative {
            Priority::Speculative
        } else {
            Priority::Committed
        };
        let asked = Instant::now();
        let lease = self.shared.lease.acquire(priority);
        let wait = asked.elapsed();
        let meter = self.shared.meter.enter(self.shared.threads);
        let began = Instant::now();
        let (leaving, board, id) = (&self.leaving, &self.board, u.id);
        let result = self.stt.transcribe_abortable(&u.samples, &|| {
            leaving.load(Ordering::Relaxed) || board.is_cancelled(id)
        });
        let stt = began.elapsed();
        drop(meter);
        drop(lease);
        let c = &self.shared.counters;
        c.stt_busy_ns.fetch_add(nanos(stt), Ordering::Relaxed);
        c.stt_runs.fetch_add(1, Ordering::Relaxed);
        if speculative {
            // its verdict comes with later audio (see `settle_attempt`)
            self.attempt = Some((u.id, u.end_sample, result, wait, stt));
        } else {
            self.deliver(u.end_sample, result, wait, stt);
        }
    }

    /// A committed turn: its transcript to the reader, its words to the LLM.
    fn deliver(
        &mut self,
        end_sample: u64,
        result: Result<Transcription, SttError>,
        stt_wait: Duration,
        stt: Duration,
    ) {
        self.turn += 1;
        let turn = self.turn;
        match result {
            Ok(t) => {
                let text = t.text;
                self.reply.send(SessionEvent::Transcript {
                    turn,
                    text: text.clone(),
                    end_sample,
                    stt_wait,
                    stt,
                });
                if text.is_empty() {
                    self.reply.send(SessionEvent::TurnError {
                        turn,
                        message: "nothing intelligible was heard".into(),
                    });
                    return;
                }
                let cmd = Cmd::Start {
                    slot: self.slot,
                    turn,
                    user: text,
                    reply: self.reply.clone(),
                };
                if self.shared.llm.send(cmd).is_err() {
                    self.reply.send(SessionEvent::TurnError {
                        turn,
                        message: "the language-model worker has stopped".into(),
                    });
                }
            }
            Err(SttError::Aborted) => {}
            Err(e) => self.reply.send(SessionEvent::TurnError {
                turn,
                message: e.to_string(),
            }),
        }
    }
}
