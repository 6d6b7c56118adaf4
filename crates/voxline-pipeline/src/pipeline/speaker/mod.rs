//! The loudspeaker of a live pipeline that speaks, and barge-in.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use voxline_audio::playback::STALL_AFTER;
use voxline_core::{Clock, PipelineEvent, ShutdownHandle, TimedEvent};

use super::run::RunError;

mod answers;
mod device;
use answers::{Answers, Sounded};
pub(crate) use device::PLAY_OUT_LIMIT;
use device::{PlayOut, Stalls};
pub use device::{SpeakerRecovered, SpeakerStalled};

/// One chunk of the voice queued on the device.
struct Queued {
    turn: u64,
    text: Arc<str>,
    /// Its first sample, in the speaker's count of samples pushed.
    at: u64,
}

/// The loudspeaker of a live pipeline that speaks: the sink plays each block
/// of the voice as it comes, and the first sample of each answer, as it
/// reaches the device, is published as [`voxline_tts::VoicePlayed`].
///
/// Barge-in: a watcher thread serves the endpointer's requests
/// ([`voxline_core::BargeIn`]): it pauses the playback (a fade, what is
/// queued kept) until the words heard over it decide. A backchannel plays
/// on where it paused (a false interruption, `voice_resumed`). A real
/// interruption stops it: what is queued is dropped, the user heard the
/// chunks whose playback began, and the turn is marked interrupted, which
/// the runtime carries to every stage; the rest of the turn's audio still
/// arriving is dropped here.
///
/// Each answer ends with `voice_ended` (played to its end) or
/// `voice_interrupted`; [`Answers`] keeps which one is playing.
///
/// The device: no wait on it is unbounded. A loudspeaker that takes no
/// audio for [`STALL_AFTER`] while the voice is queued on it has stalled
/// (`speaker_stalled`, a warning): the answer playing is dropped, and so is
/// every block of the voice until it takes audio again (`speaker_recovered`).
/// A stop asked for (Ctrl-C, SIGTERM) ends the playback at once, and the
/// play-out once the run has ended lasts [`PLAY_OUT_LIMIT`] at most.
#[derive(Clone)]
pub(super) struct Voice {
    feed: Arc<Mutex<voxline_audio::Speaker>>,
    control: voxline_audio::SpeakerControl,
    /// Each chunk queued, oldest first.
    log: Arc<Mutex<VecDeque<Queued>>>,
    bus: Arc<Mutex<Option<voxline_core::EventBus>>>,
    pub(super) barge: voxline_core::BargeIn,
    /// Which answers are complete (their `VoiceDone` came: until then an
    /// answer is still being spoken, pauses between chunks included), and
    /// one queued behind the answer playing.
    answers: Arc<Mutex<Answers>>,
    /// The last turn whose first block was queued: the next turn's first
    /// block is marked (its `VoicePlayed`), whichever chunk it comes from
    /// (a first chunk that gave no audio, or failed, leaves none of its own).
    marked: Arc<Mutex<Option<u64>>>,
    stop: Arc<AtomicBool>,
    watcher: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
    /// The echo canceller's figures, when one takes this voice out of the
    /// microphone ([`Voice::echo_canceller`]).
    aec: Arc<Mutex<Option<voxline_audio::AecMeter>>>,
    /// The output device's id.
    device: Arc<str>,
    /// A stop asked for ends the playback at once.
    cut: Option<ShutdownHandle>,
    /// When the play-out must end, once the run has ended.
    play_out_by: Arc<Mutex<Option<Instant>>>,
    /// Why the playback was closed, once it was.
    closed: Arc<Mutex<Option<PlayOut>>>,
    /// The device's stalls.
    stalls: Arc<Mutex<Stalls>>,
}

use voxline_core::sync::lock as locked;

impl Voice {
    /// Opens output device `device` (the default when `None`) and the
    /// barge-in watcher; `cut`, once requested, ends the playback at once.
    pub(super) fn open(
        device: Option<&str>,
        clock: Clock,
        cut: Option<ShutdownHandle>,
    ) -> Result<Self, RunError> {
        let bus: Arc<Mutex<Option<voxline_core::EventBus>>> = Arc::default();
        let barge = voxline_core::BargeIn::new();
        let answers: Arc<Mutex<Answers>> = Arc::default();
        let (publish, turns, on) = (bus.clone(), barge.clone(), answers.clone());
        let speaker = voxline_audio::Speaker::open(
            device,
            clock,
            Box::new(move |mark, at| {
                let bus = locked(&publish);
                let say = |event| {
                    if let Some(b) = bus.as_ref() {
                        b.publish(TimedEvent { at, event });
                    }
                };
                let sounded = locked(&on).sounded(mark.tag);
                match sounded {
                    // stopped with the answer before it: it never played
                    Sounded::Unheard => return,
                    // it waited behind an answer, which ends here
                    Sounded::Followed => {
                        tracing::debug!(
                            turn = mark.tag,
                            "an answer that waited behind another begins"
                        );
                        if let Some(before) = turns.playing().filter(|p| *p != mark.tag) {
                            say(PipelineEvent::engine_event(voxline_tts::VoiceEnded {
                                id: before,
                            }));
                        }
                        turns.set_playing(Some(mark.tag));
                    }
                    Sounded::Began => {}
                }
                say(PipelineEvent::engine_event(voxline_tts::VoicePlayed {
                    id: mark.tag,
                }));
            }),
        )
        .map_err(RunError::Capture)?;
        let voice = Self {
            device: speaker.format().device.as_str().into(),
            control: speaker.control(),
            feed: Arc::new(Mutex::new(speaker)),
            log: Arc::default(),
            bus,
            barge,
            answers,
            marked: Arc::default(),
            stop: Arc::default(),
            watcher: Arc::default(),
            aec: Arc::default(),
            cut,
            play_out_by: Arc::default(),
            closed: Arc::default(),
            stalls: Arc::default(),
        };
        let w = voice.clone();
        let handle = std::thread::Builder::new()
            .name("barge-in".into())
            .spawn(move || w.watch())
            .map_err(RunError::Thread)?;
        *locked(&voice.watcher) = Some(handle);
        Ok(voice)
    }

    /// An echo canceller that takes this voice, as it played, out of the
    /// microphone; its figures go in the voice's report.
    pub(super) fn echo_canceller(
        &self,
        options: voxline_audio::AecOptions,
    ) -> voxline_audio::AecStage {
        let meter = voxline_audio::AecMeter::default();
        *locked(&self.aec) = Some(meter.clone());
        voxline_audio::AecStage::new(self.control.echo_reference(), meter, options)
            .with_echo_guard(self.barge.clone())
    }

    pub(super) fn publish_to(&self, bus: voxline_core::EventBus) {
        *locked(&self.bus) = Some(bus);
    }

    pub(super) fn play(&self, item: voxline_tts::VoiceOut) {
        let a = match item {
            voxline_tts::VoiceOut::Audio(a) => a,
            voxline_tts::VoiceOut::Done(d) => {
                locked(&self.answers).done(d.id);
                return;
            }
        };
        if self.control.is_closed() {
            // the play-out is over: nothing more is played
            return;
        }
        if locked(&self.stalls).current.is_some() {
            // the device takes no audio: the block is lost, not waited on
            locked(&self.stalls).lost_s += a.samples.len() as f64 / f64::from(a.sample_rate.max(1));
            return;
        }
        if self.barge.is_interrupted(a.id) || locked(&self.answers).halted(a.id) {
            // the user spoke over it: what is still coming is not played
            return;
        }
        let mut s = locked(&self.feed);
        if let Some(text) = &a.text {
            self.barge.said(text);
            let mut log = locked(&self.log);
            log.push_back(Queued {
                turn: a.id,
                text: text.clone(),
                at: s.pushed(),
            });
            while log.len() > 256 {
                log.pop_front();
            }
        }
        // its first block that is queued is marked (its `VoicePlayed`)
        let first = (*locked(&self.marked) != Some(a.id)).then_some(a.id);
        let playing_now = locked(&self.answers).queued(a.id, self.barge.playing());
        if playing_now {
            self.barge.set_playing(Some(a.id));
        } else if first.is_some() {
            tracing::debug!(turn = a.id, "queued behind the answer playing");
        }
        let rate = s.format().sample_rate;
        match s.play(&a.samples, a.sample_rate, first) {
            Ok(fed) => {
                if fed.queued > 0 || fed.cut.is_none() {
                    *locked(&self.marked) = Some(a.id);
                }
                if fed.queued == 0 && fed.cut.is_some() && a.text.is_some() {
                    // none of the chunk was queued: none of it was heard
                    let mut log = locked(&self.log);
                    if log.back().is_some_and(|q| q.turn == a.id) {
                        log.pop_back();
                    }
                }
                if fed.cut == Some(voxline_audio::Cut::Stalled) {
                    // the watcher says so, and drops the answer
                    locked(&self.stalls).lost_s += fed.left_out as f64 / f64::from(rate.max(1));
                }
            }
            Err(e) => tracing::warn!(error = %e, "the voice could not be played"),
        }
    }

    /// The watcher: serves barge-in requests and verdicts, and says when
    /// nothing plays.
    fn watch(&self) {
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(2));
            self.watch_device();
            if let Some(r) = self.barge.take_request() {
                tracing::debug!(ask = ?r.ask, playing = ?self.barge.playing(), "barge-in request");
                if let Some(id) = self.barge.playing() {
                    match r.ask {
                        voxline_core::barge::Ask::Hold => {
                            self.control.pause();
                            let silent = Instant::now() + self.control.output_latency();
                            self.barge.hold(id, r, silent);
                        }
                        voxline_core::barge::Ask::Stop => {
                            self.interrupt(id, r.speech_start, r.detected, None);
                        }
                    }
                }
            }
            match self.barge.take_verdict() {
                Some(voxline_core::barge::Verdict::Stop(h)) => {
                    let r = h.request;
                    self.interrupt(h.turn, r.speech_start, r.detected, Some(h.stopped));
                }
                Some(voxline_core::barge::Verdict::Resume(h, words)) => self.resume(&h, words),
                None => {}
            }
            // when and how loud the voice sounds, for what the microphone
            // hears of it
            for l in self.control.take_levels() {
                self.barge.played(l.at, l.duration, l.mean_square);
            }
            let stalled = locked(&self.stalls).current.is_some();
            if self.control.is_playing() && !self.control.is_paused() && !stalled {
                let now = Instant::now();
                self.barge
                    .sounding(now, now + self.control.output_latency());
            }
            // an answer plays until all of it has been synthesised and played
            let playing = self.barge.playing();
            if let Some(id) =
                playing.filter(|p| locked(&self.answers).ended(*p, self.control.is_playing()))
            {
                self.barge.set_playing(None);
                self.publish(Instant::now(), voxline_tts::VoiceEnded { id });
            }
        }
    }

    /// Ends the playback for good (`why`, the first reason kept): what is
    /// queued is dropped and nothing more is queued, a wait for room included.
    fn close(&self, why: PlayOut) {
        locked(&self.closed).get_or_insert(why);
        self.control.close();
    }

    /// The device's side of the watch: a stop asked for or the end of the
    /// play-out closes the playback; a device that stopped taking audio is
    /// a stall, until it asks for audio again.
    fn watch_device(&self) {
        let now = Instant::now();
        if !self.control.is_closed() {
            if self.cut.as_ref().is_some_and(ShutdownHandle::is_requested) {
                self.close(PlayOut::Stopped);
            } else if locked(&self.play_out_by).is_some_and(|by| now >= by) {
                self.close(PlayOut::TimeLimit);
                if self.control.is_playing() {
                    eprintln!(
                        "voxline: warning: the voice still played {} s after the session ended: the rest is not played",
                        PLAY_OUT_LIMIT.as_secs()
                    );
                }
            }
        }
        let silent = self.control.silent_for();
        let mut stalls = locked(&self.stalls);
        if stalls.current.is_some() {
            if silent < STALL_AFTER {
                // it asked for audio again
                let took = stalls.end(now).unwrap_or_default();
                drop(stalls);
                eprintln!(
                    "voxline: the loudspeaker takes audio again (it took none for {:.1} s)",
                    took.as_secs_f64()
                );
                self.publish(
                    now,
                    SpeakerRecovered {
                        stalled_ms: took.as_secs_f64() * 1000.0,
                    },
                );
            } else if self.barge.playing().is_some() {
                // a block that raced the stall: no answer sounds
                self.barge.set_playing(None);
            }
            return;
        }
        if self.control.is_closed() || !self.control.is_stalled() {
            // (once closed nothing more is played: a stall no longer matters)
            return;
        }
        let rate = f64::from(self.control.sample_rate().max(1));
        let queued_s = self.control.queued() as f64 / rate;
        stalls.begin(now.checked_sub(silent).unwrap_or(now), queued_s);
        drop(stalls);
        // the answer playing is over: none of the rest of it, nor of the
        // one queued behind it, is queued; what is queued is dropped once
        // the device takes audio again, not played late
        let turn = self.barge.playing();
        if let Some(id) = turn {
            let _behind = locked(&self.answers).halt(id);
        }
        self.barge.set_playing(None);
        self.control.interrupt();
        eprintln!(
            "voxline: warning: the loudspeaker ({}) has taken no audio for {:.1} s: {} \
             no voice plays until it takes audio again (a suspended or stalled output)",
            self.device,
            silent.as_secs_f64(),
            if turn.is_some() {
                "the rest of the answer is dropped, and"
            } else {
                ""
            }
        );
        self.publish(
            now,
            SpeakerStalled {
                id: turn,
                silent_ms: silent.as_secs_f64() * 1000.0,
                queued_ms: queued_s * 1000.0,
            },
        );
    }

    /// A false interruption: the answer plays on where it paused.
    fn resume(&self, h: &voxline_core::barge::Hold, words: Option<String>) {
        self.control.resume();
        let resumed = Instant::now() + self.control.output_latency();
        match &words {
            Some(w) => {
                tracing::info!(turn = h.turn, words = %w.escape_debug(), "a false interruption: the answer plays on")
            }
            None => tracing::info!(
                turn = h.turn,
                "a false interruption (no words came): the answer plays on"
            ),
        }
        self.publish(
            Instant::now(),
            voxline_tts::VoiceResumed {
                id: h.turn,
                words,
                speech_start: h.request.speech_start,
                stopped: h.stopped,
                resumed,
            },
        );
    }

    /// Drops what the device has queued (the callback does, at its next
    /// buffer), waiting up to 200 ms for it; not at all for a device that
    /// has stalled (it drops it when it takes audio again).
    fn drop_queued(&self) {
        let before = self.control.interrupts();
        self.control.interrupt();
        let deadline = Instant::now() + std::time::Duration::from_millis(200);
        while self.control.interrupts() == before
            && Instant::now() < deadline
            && !self.control.is_stalled()
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Stops turn `id`'s answer for the user's speech: silent at once (or
    /// since `silent`, when it was paused), what is queued dropped, and
    /// nothing more of it played.
    fn interrupt(
        &self,
        id: u64,
        speech_start: Instant,
        detected: Instant,
        silent: Option<Instant>,
    ) {
        let dropped_before = self.control.dropped();
        // no block of it (or of one queued behind it) is queued from now:
        // the sink lets go of the feed once the one it pushes is dropped
        let unheard = locked(&self.answers).halt(id);
        // silent first, so nothing plays while what is queued is dropped
        self.control.pause();
        let stopped = silent.unwrap_or_else(|| Instant::now() + self.control.output_latency());
        self.drop_queued();
        let mut tries = 0;
        let heard = loop {
            // A block being pushed (or waiting for room in the paused ring)
            // holds the feed: drop again, which also ends its wait, until it
            // is let go. Then no block is being pushed, one pushed after the
            // first drop goes too, and from the mark on the rest of the turn
            // is not played. A device that stopped taking audio never lets
            // it go: after 2 s of drops the turn is stopped without it.
            let feed = match self.feed.try_lock() {
                Ok(f) => Some(f),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if tries < 10 => {
                    tries += 1;
                    self.drop_queued();
                    continue;
                }
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            if self.control.is_playing() {
                self.drop_queued();
            }
            let played_to = self.control.taken() - (self.control.dropped() - dropped_before);
            let heard: Vec<String> = locked(&self.log)
                .iter()
                .filter(|q| q.turn == id && q.at < played_to)
                .map(|q| q.text.to_string())
                .collect();
            let heard = heard.join(" ");
            tracing::debug!(
                turn = id,
                tries,
                fed = feed.is_some(),
                "the answer is stopped"
            );
            self.barge.interrupt(id, heard.clone());
            // an answer queued behind it is dropped with it, unheard
            if let Some(n) = unheard {
                self.barge.interrupt(n, String::new());
            }
            drop(feed);
            break heard;
        };
        self.control.resume();
        for (id, heard) in std::iter::once((id, heard)).chain(unheard.map(|n| (n, String::new()))) {
            self.publish(
                Instant::now().max(stopped),
                voxline_tts::VoiceInterrupted {
                    id,
                    heard,
                    speech_start,
                    detected,
                    stopped,
                },
            );
        }
    }

    fn publish(&self, at: Instant, event: impl voxline_core::EngineEvent + PartialEq) {
        if let Some(b) = locked(&self.bus).as_ref() {
            b.publish(TimedEvent {
                at,
                event: PipelineEvent::engine_event(event),
            });
        }
    }

    /// The run has ended: the play-out lasts until `by` at most.
    pub(super) fn play_out_by(&self, by: Instant) {
        locked(&self.play_out_by).get_or_insert(by);
    }

    /// Lets what is queued play out (when `drain`; until the time given to
    /// [`play_out_by`](Self::play_out_by), [`PLAY_OUT_LIMIT`] from now if
    /// none was; not on a stalled device, nor once a stop is asked for),
    /// stops the device and the watcher, and says what it did; the event
    /// bus is let go.
    pub(super) fn finish(self, drain: bool) -> crate::pipeline::VoiceOutputReport {
        // an answer still held plays on
        self.control.resume();
        let by = *locked(&self.play_out_by).get_or_insert(Instant::now() + PLAY_OUT_LIMIT);
        let ended = loop {
            if let Some(why) = *locked(&self.closed) {
                break why;
            }
            if !drain || self.cut.as_ref().is_some_and(ShutdownHandle::is_requested) {
                break PlayOut::Stopped;
            }
            if !self.control.is_playing() {
                break PlayOut::Played;
            }
            if locked(&self.stalls).current.is_some() || self.control.is_stalled() {
                break PlayOut::Stalled;
            }
            if Instant::now() >= by {
                break PlayOut::TimeLimit;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        if ended != PlayOut::Played {
            self.close(ended);
            tracing::debug!(ended = ended.name(), "the play-out ended");
        }
        // the last mark reported
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.stop.store(true, Ordering::Release);
        if let Some(w) = locked(&self.watcher).take() {
            let _ = w.join();
        }
        let s = locked(&self.feed);
        let f = s.format();
        let stalls = locked(&self.stalls);
        let report = crate::pipeline::VoiceOutputReport {
            device: f.device.clone(),
            format: format!(
                "{} Hz, {} ch, {}",
                f.sample_rate, f.channels, f.sample_format
            ),
            output_latency_ms: self.control.output_latency().as_secs_f64() * 1000.0,
            underruns: self.control.underruns(),
            stalls: stalls.count,
            stalled_ms: stalls.total(Instant::now()).as_secs_f64() * 1000.0,
            stalled_voice_ms: stalls.lost_s * 1000.0,
            play_out: ended.name().to_owned(),
            echo_cancellation: locked(&self.aec)
                .as_ref()
                .map(voxline_audio::AecMeter::summary),
        };
        drop(stalls);
        drop(s);
        locked(&self.bus).take();
        report
    }
}
