//! The loudspeaker of a live pipeline that speaks, and barge-in.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use voxline_audio::playback::STALL_AFTER;
use voxline_audio::Played;
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
/// queued kept) until the words heard over it decide. The watcher polls
/// nothing: it sleeps until a message wakes it — what the device played
/// ([`voxline_audio::Played`], after each buffer), a request or a verdict
/// ([`voxline_core::BargeIn::changes`]), or the end of the session — or
/// until its one timer, the earliest of the hold's end, the moment a
/// device that took no audio would have stalled, and the end of the
/// play-out. A backchannel plays
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
    /// The watcher wants the feed (to stop an answer): a block waiting for
    /// room in the device's ring gives way at once.
    feed_wanted: Arc<AtomicBool>,
    /// Set by [`Voice::finish`]: the play-out, and whether to let what is
    /// queued play; the watcher ends it and returns how it ended.
    finishing: Arc<Mutex<Option<bool>>>,
    /// Wakes the watcher for [`Voice::finish`].
    wake: Sender<()>,
    watcher: Arc<Mutex<Option<std::thread::JoinHandle<PlayOut>>>>,
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
        let speaker = voxline_audio::Speaker::open(device, clock).map_err(RunError::Capture)?;
        let played = speaker.played();
        let (wake, woken) = crossbeam_channel::bounded(1);
        let voice = Self {
            device: speaker.format().device.as_str().into(),
            control: speaker.control(),
            feed: Arc::new(Mutex::new(speaker)),
            log: Arc::default(),
            bus: Arc::default(),
            barge: voxline_core::BargeIn::new(),
            answers: Arc::default(),
            marked: Arc::default(),
            feed_wanted: Arc::default(),
            finishing: Arc::default(),
            wake,
            watcher: Arc::default(),
            aec: Arc::default(),
            cut,
            play_out_by: Arc::default(),
            closed: Arc::default(),
            stalls: Arc::default(),
        };
        let watch = Watch {
            changes: voice.barge.changes(),
            voice: voice.clone(),
            played,
            woken,
            backlog: VecDeque::new(),
        };
        let handle = std::thread::Builder::new()
            .name("barge-in".into())
            .spawn(move || watch.run())
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
        // (checked with the feed held: once the watcher has held it to stop
        // an answer, no block of that answer is queued again)
        let mut s = locked(&self.feed);
        if self.barge.is_interrupted(a.id) || locked(&self.answers).halted(a.id) {
            // the user spoke over it: what is still coming is not played
            return;
        }
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
        let give_way = || self.feed_wanted.load(Ordering::Acquire);
        match s.play(&a.samples, a.sample_rate, first, &give_way) {
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

    /// The first sample of turn `tag`'s answer reached the device at `at`.
    fn mark_played(&self, tag: u64, at: Instant) {
        match locked(&self.answers).sounded(tag) {
            // stopped with the answer before it: it never played
            Sounded::Unheard => return,
            // it waited behind an answer, which ends here
            Sounded::Followed => {
                tracing::debug!(turn = tag, "an answer that waited behind another begins");
                if let Some(before) = self.barge.playing().filter(|p| *p != tag) {
                    self.publish(at, voxline_tts::VoiceEnded { id: before });
                }
                self.barge.set_playing(Some(tag));
            }
            Sounded::Began => {}
        }
        self.publish(at, voxline_tts::VoicePlayed { id: tag });
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
        locked(&self.play_out_by).get_or_insert(Instant::now() + PLAY_OUT_LIMIT);
        *locked(&self.finishing) = Some(drain);
        let _ = self.wake.try_send(());
        let ended = locked(&self.watcher)
            .take()
            .map_or(PlayOut::Stopped, |w| w.join().unwrap_or(PlayOut::Stopped));
        let lost = self.control.lost();
        if lost > 0 {
            tracing::warn!(
                lost,
                "the barge-in watcher fell behind the device: what played was not all seen"
            );
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

/// How long stopping an answer waits for the device to drop what is
/// queued (its next buffer does): not at all for a device that has stalled.
const DROP_WAIT: Duration = Duration::from_millis(200);

/// The watcher's thread: the [`Voice`] it watches, and what wakes it.
struct Watch {
    voice: Voice,
    /// What the device played, from the speaker's thread.
    played: Receiver<Played>,
    /// Barge-in requests and verdicts.
    changes: Receiver<()>,
    /// [`Voice::finish`].
    woken: Receiver<()>,
    /// What played, received and not yet acted on.
    backlog: VecDeque<Played>,
}

impl Watch {
    /// Serves barge-in requests and verdicts, says when an answer begins
    /// and ends, watches the device, and once [`Voice::finish`] asks, ends
    /// the play-out: returns how it ended.
    fn run(mut self) -> PlayOut {
        loop {
            self.wait();
            self.act_on_played();
            let v = &self.voice;
            v.watch_device();
            if let Some(r) = v.barge.take_request() {
                tracing::debug!(ask = ?r.ask, playing = ?v.barge.playing(), "barge-in request");
                if let Some(id) = v.barge.playing() {
                    match r.ask {
                        voxline_core::barge::Ask::Hold => {
                            v.control.pause();
                            let silent = Instant::now() + v.control.output_latency();
                            v.barge.hold(id, r, silent);
                        }
                        voxline_core::barge::Ask::Stop => {
                            self.interrupt(id, r.speech_start, r.detected, None);
                        }
                    }
                }
            }
            let v = &self.voice;
            match v.barge.take_verdict() {
                Some(voxline_core::barge::Verdict::Stop(h)) => {
                    let r = h.request;
                    self.interrupt(h.turn, r.speech_start, r.detected, Some(h.stopped));
                }
                Some(voxline_core::barge::Verdict::Resume(h, words)) => v.resume(&h, words),
                None => {}
            }
            self.act_on_played();
            let v = &self.voice;
            let stalled = locked(&v.stalls).current.is_some();
            if v.control.is_playing() && !v.control.is_paused() && !stalled {
                let now = Instant::now();
                v.barge.sounding(now, now + v.control.output_latency());
            }
            // an answer plays until all of it has been synthesised and played
            let playing = v.barge.playing();
            if let Some(id) =
                playing.filter(|p| locked(&v.answers).ended(*p, v.control.is_playing()))
            {
                v.barge.set_playing(None);
                v.publish(Instant::now(), voxline_tts::VoiceEnded { id });
            }
            if let Some(ended) = self.played_out() {
                return ended;
            }
        }
    }

    /// Sleeps until something wakes the watcher or its timer is due, and
    /// takes what played meanwhile.
    fn wait(&mut self) {
        let timeout = self.timer().map_or(Duration::from_secs(3600), |at| {
            at.saturating_duration_since(Instant::now())
        });
        crossbeam_channel::select! {
            recv(self.played) -> m => match m {
                Ok(m) => self.backlog.push_back(m),
                // the speaker's thread has ended: nothing more comes
                Err(_) => self.played = crossbeam_channel::never(),
            },
            recv(self.changes) -> _ => {}
            recv(self.woken) -> _ => {}
            default(timeout) => {}
        }
        self.take_played();
    }

    /// The watcher's one timer: the earliest of the hold's end, the moment
    /// the device would have stalled (it took no audio while some is
    /// queued), and the end of the play-out once the session has ended.
    fn timer(&self) -> Option<Instant> {
        let v = &self.voice;
        // once closed, neither a stall nor the play-out's end is awaited
        let open = !v.control.is_closed();
        let stall = (open && v.control.is_playing() && locked(&v.stalls).current.is_none())
            .then(|| Instant::now() + STALL_AFTER.saturating_sub(v.control.silent_for()));
        let play_out = (*locked(&v.play_out_by)).filter(|_| open);
        [v.barge.hold_ends(), stall, play_out]
            .into_iter()
            .flatten()
            .min()
    }

    /// Takes what played and is already waiting, without blocking.
    fn take_played(&mut self) {
        while let Ok(m) = self.played.try_recv() {
            self.backlog.push_back(m);
        }
    }

    /// What played, in order: a mark is an answer that begins to sound; a
    /// level, how loud the voice was, for what the microphone hears of it.
    fn act_on_played(&mut self) {
        self.take_played();
        while let Some(m) = self.backlog.pop_front() {
            match m {
                Played::Mark(mark, at) => self.voice.mark_played(mark.tag, at),
                Played::Level(l) => self.voice.barge.played(l.at, l.duration, l.mean_square),
            }
        }
    }

    /// Once [`Voice::finish`] asked: how the play-out ended, when it has
    /// (all of it played and handed on, a stop, a stall, the time limit).
    fn played_out(&mut self) -> Option<PlayOut> {
        let drain = (*locked(&self.voice.finishing))?;
        let v = &self.voice;
        let ended = if let Some(why) = *locked(&v.closed) {
            why
        } else if !drain || v.cut.as_ref().is_some_and(ShutdownHandle::is_requested) {
            PlayOut::Stopped
        } else if v.control.is_handed_on() {
            PlayOut::Played
        } else if locked(&v.stalls).current.is_some() || v.control.is_stalled() {
            PlayOut::Stalled
        } else if locked(&v.play_out_by).is_some_and(|by| Instant::now() >= by) {
            PlayOut::TimeLimit
        } else {
            return None;
        };
        if ended != PlayOut::Played {
            v.close(ended);
            tracing::debug!(ended = ended.name(), "the play-out ended");
        }
        // the marks of what played, every one handed on by now
        self.act_on_played();
        Some(ended)
    }

    /// Drops what the device has queued (the callback does, at its next
    /// buffer), waiting up to [`DROP_WAIT`] for it, woken by what it plays;
    /// not at all for a device that has stalled (it drops it when it takes
    /// audio again).
    fn drop_queued(&mut self) {
        let c = self.voice.control.clone();
        let before = c.interrupts();
        c.interrupt();
        let deadline = Instant::now() + DROP_WAIT;
        while c.interrupts() == before && !c.is_stalled() {
            match self.played.recv_deadline(deadline) {
                Ok(m) => self.backlog.push_back(m),
                Err(_) => break,
            }
        }
    }

    /// Stops turn `id`'s answer for the user's speech: silent at once (or
    /// since `silent`, when it was paused), what is queued dropped, and
    /// nothing more of it played.
    fn interrupt(
        &mut self,
        id: u64,
        speech_start: Instant,
        detected: Instant,
        silent: Option<Instant>,
    ) {
        let v = self.voice.clone();
        let dropped_before = v.control.dropped();
        // no block of it (or of one queued behind it) is queued from now
        let unheard = locked(&v.answers).halt(id);
        // silent first, so nothing plays while what is queued is dropped
        v.control.pause();
        let stopped = silent.unwrap_or_else(|| Instant::now() + v.control.output_latency());
        // a block the sink is pushing gives way (its wait for room ends)
        v.feed_wanted.store(true, Ordering::Release);
        self.drop_queued();
        let feed = locked(&v.feed);
        v.feed_wanted.store(false, Ordering::Release);
        // The sink holds the feed while it pushes, and reads whether the
        // turn was stopped once it holds it: from here nothing of the turn
        // is pushed. What it pushed after the first drop goes too.
        if v.control.is_playing() {
            self.drop_queued();
        }
        let played_to = v.control.taken() - (v.control.dropped() - dropped_before);
        let heard: Vec<String> = locked(&v.log)
            .iter()
            .filter(|q| q.turn == id && q.at < played_to)
            .map(|q| q.text.to_string())
            .collect();
        let heard = heard.join(" ");
        tracing::debug!(turn = id, "the answer is stopped");
        v.barge.interrupt(id, heard.clone());
        // an answer queued behind it is dropped with it, unheard
        if let Some(n) = unheard {
            v.barge.interrupt(n, String::new());
        }
        drop(feed);
        v.control.resume();
        for (id, heard) in std::iter::once((id, heard)).chain(unheard.map(|n| (n, String::new()))) {
            v.publish(
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
}
