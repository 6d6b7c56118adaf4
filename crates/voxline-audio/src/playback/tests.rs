//! The callback's marks, driven without a device.

use super::*;

const RATE: u32 = 48_000;

/// A callback as the speaker's thread builds it, with the feeding
/// side's ends of its rings.
struct Rig {
    cb: Callback,
    samples: rtrb::Producer<f32>,
    marks: rtrb::Producer<Mark>,
    played: rtrb::Consumer<PlayedMark>,
    /// The speaker's thread's ends of the levels' and samples' rings.
    levels: rtrb::Consumer<RawLevel>,
    played_samples: rtrb::Consumer<f32>,
    pushed: u64,
}

impl Rig {
    fn new() -> Self {
        let (samples, consumer) = rtrb::RingBuffer::new(RATE as usize);
        let (marks, marks_out) = rtrb::RingBuffer::new(MARKS);
        let (played_marks, played) = rtrb::RingBuffer::new(MARKS);
        let (levels, levels_out) = rtrb::RingBuffer::new(LEVELS);
        let (played_samples, played_samples_out) = rtrb::RingBuffer::new(RATE as usize);
        let cb = Callback {
            consumer,
            marks: marks_out,
            played_marks,
            shared: Arc::new(Shared::default()),
            clock: Clock::start(),
            channels: 1,
            rate: RATE,
            fade_left: None,
            level: usize::MAX,
            levels,
            played: played_samples,
            wake: None,
        };
        Self {
            cb,
            samples,
            marks,
            played,
            levels: levels_out,
            played_samples: played_samples_out,
            pushed: 0,
        }
    }

    /// What [`Speaker::play`] does: the mark first, then the block.
    fn play(&mut self, n: usize, tag: u64) {
        self.marks
            .push(Mark {
                tag,
                sample: self.pushed,
            })
            .unwrap();
        for _ in 0..n {
            self.samples.push(0.5).unwrap();
        }
        self.pushed += n as u64;
        self.cb.shared.pushed.store(self.pushed, Ordering::Release);
    }

    /// One buffer of `frames`, its first sample at the device at
    /// `at_ms` on the session clock; the marks it played, with their
    /// instants in ms.
    fn buffer(&mut self, frames: usize, at_ms: u64) -> Vec<(u64, f64)> {
        let mut data = vec![0.0f32; frames];
        let origin = self.cb.clock.origin();
        self.cb
            .fill_at(&mut data, origin, Duration::from_millis(at_ms));
        std::iter::from_fn(|| self.played.pop().ok())
            .map(|(m, ns)| (m.tag, ns as f64 / 1e6))
            .collect()
    }
}

#[test]
fn each_mark_is_reported_once_at_the_instant_its_sample_plays() {
    let mut rig = Rig::new();
    // two short answers queued back to back, the second starting
    // 240 samples (5 ms) into the first buffer
    rig.play(240, 1);
    rig.play(960, 2);
    let got = rig.buffer(480, 100);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, 1);
    assert!((got[0].1 - 100.0).abs() < 0.01, "{got:?}");
    assert_eq!(got[1].0, 2);
    assert!((got[1].1 - 105.0).abs() < 0.01, "{got:?}");
    // nothing is reported twice
    assert!(rig.buffer(480, 110).is_empty());
}

#[test]
fn a_mark_queued_while_the_device_plays_silence_is_reported_when_its_sample_plays() {
    let mut rig = Rig::new();
    assert!(rig.buffer(480, 0).is_empty());
    // queued between two buffers, as a block that arrives while the
    // ring is empty: the next buffer's first sample is the mark's
    rig.play(100, 7);
    let got = rig.buffer(480, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!((got[0].1 - 10.0).abs() < 0.01, "{got:?}");
    // and a later mark is not held up behind it
    rig.play(100, 8);
    let got = rig.buffer(480, 20);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![8]);
}

#[test]
fn a_paused_speaker_reports_its_mark_only_once_resumed() {
    let mut rig = Rig::new();
    rig.cb.shared.paused.store(true, Ordering::Release);
    rig.buffer(480, 0);
    rig.play(4800, 3);
    assert!(rig.buffer(480, 10).is_empty());
    rig.cb.shared.paused.store(false, Ordering::Release);
    let got = rig.buffer(480, 20);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].1 >= 20.0, "{got:?}");
}

#[test]
fn an_interrupt_drops_the_marks_of_the_audio_it_drops_and_keeps_later_ones() {
    let mut rig = Rig::new();
    rig.play(480, 1);
    rig.play(4800, 2);
    rig.play(4800, 3);
    let got = rig.buffer(480, 0);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1]);
    rig.cb.shared.interrupt.store(true, Ordering::Release);
    // the fade plays (a few samples of answer 2), then the rest is dropped
    let got = rig.buffer(480, 10);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![2]);
    assert!(rig.buffer(480, 20).is_empty());
    assert_eq!(rig.cb.marks.slots(), 0, "answer 3's mark is dropped");
    // what is queued after the interrupt is reported again
    rig.play(480, 4);
    let got = rig.buffer(480, 30);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![4]);
}

/// A stop pauses the answer and drops what is queued at once, while it
/// sounds: the pause's fade and the drop's end together, and the drop is
/// done within the next buffers (it waited for a resume that never came,
/// and a stop took 2.4 s live).
#[test]
fn a_stop_while_the_answer_sounds_drops_what_is_queued_at_once() {
    let mut rig = Rig::new();
    rig.play(48_000, 1);
    rig.buffer(480, 0);
    let before = rig.cb.shared.interrupts.load(Ordering::Acquire);
    rig.cb.shared.paused.store(true, Ordering::Release);
    rig.cb.shared.interrupt.store(true, Ordering::Release);
    for k in 1..4 {
        rig.buffer(480, 10 * k);
    }
    assert_eq!(
        rig.cb.shared.interrupts.load(Ordering::Acquire),
        before + 1,
        "the drop is done"
    );
    assert_eq!(rig.cb.consumer.slots(), 0, "nothing is left queued");
}

/// The feeding side's watch on the device, around a rig's callback.
fn control(rig: &Rig) -> SpeakerControl {
    SpeakerControl {
        shared: rig.cb.shared.clone(),
        reference: crate::aec::EchoReference::new(),
        room: crossbeam_channel::bounded(1).0,
        clock: rig.cb.clock,
        rate: RATE,
    }
}

/// The speaker's thread sleeps until the callback wakes it, then hands on
/// what played in order: the marks, then the levels of the buffers they
/// played in, and their samples to the echo reference. Only then does the
/// control say everything queued was handed on.
#[test]
fn the_callback_wakes_the_speakers_thread_which_hands_on_marks_then_levels() {
    let Rig {
        mut cb,
        mut samples,
        mut marks,
        played,
        levels,
        played_samples,
        ..
    } = Rig::new();
    cb.wake = Some(std::thread::current());
    let reference = crate::aec::EchoReference::new();
    let mut rings = PlayedRings {
        marks: played,
        levels,
        samples: played_samples,
        reference: reference.clone(),
    };
    let c = SpeakerControl {
        shared: cb.shared.clone(),
        reference: reference.clone(),
        room: crossbeam_channel::bounded(1).0,
        clock: cb.clock,
        rate: RATE,
    };
    marks.push(Mark { tag: 7, sample: 0 }).unwrap();
    for _ in 0..240 {
        samples.push(0.5).unwrap();
    }
    cb.shared.pushed.store(240, Ordering::Release);
    // a token from before is used up, so the park below waits for the callback
    std::thread::park_timeout(Duration::ZERO);
    let mut data = vec![0.0f32; 480];
    let now = cb.clock.now();
    cb.fill_at(&mut data, now, Duration::from_millis(30));
    // the callback's unpark ends the park at once (without it, the 60 s)
    let parked = Instant::now();
    std::thread::park_timeout(Duration::from_secs(60));
    assert!(parked.elapsed() < Duration::from_secs(30), "not woken");
    assert!(!c.is_playing());
    assert!(!c.is_handed_on(), "played, not yet handed on");
    let mut got = Vec::new();
    let lost = rings.forward(&cb.shared, cb.clock.origin(), RATE, &mut |p| {
        got.push(p);
        true
    });
    assert_eq!(lost, 0);
    assert!(c.is_handed_on());
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        matches!(got[0], Played::Mark(Mark { tag: 7, sample: 0 }, at) if at == now + Duration::from_millis(30)),
        "{got:?}"
    );
    let Played::Level(l) = got[1] else {
        panic!("{got:?}")
    };
    assert_eq!(l.at, now + Duration::from_millis(30));
    assert_eq!(l.duration, Duration::from_millis(10));
    // half the buffer at 0.5, half silent
    assert!((l.mean_square - 0.125).abs() < 1e-6, "{}", l.mean_square);
    assert!(reference.known_index().is_some(), "the samples went on");
    // a reader that has no room: counted as lost, the rest goes on
    let mut data = vec![0.0f32; 480];
    cb.fill_at(&mut data, now, Duration::from_millis(40));
    assert_eq!(
        rings.forward(&cb.shared, cb.clock.origin(), RATE, &mut |_| false),
        1
    );
}

/// A device that stops asking for audio while the voice is queued on it
/// has stalled once [`STALL_AFTER`] has passed since its last callback,
/// and no longer once it calls back (a live run hung on a suspended sink,
/// its feed waiting for room that never came).
#[test]
fn a_device_that_stops_asking_for_audio_with_the_voice_queued_has_stalled() {
    let mut rig = Rig::new();
    // a session clock that began well before, as a live one does
    let origin = Instant::now()
        .checked_sub(STALL_AFTER * 3)
        .expect("the monotonic clock is that old");
    rig.cb.clock = Clock::with_origin(origin);
    let c = control(&rig);
    let mut data = vec![0.0f32; 480];
    rig.cb.fill_at(&mut data, Instant::now(), Duration::ZERO);
    assert!(c.silent_for() < STALL_AFTER, "{:?}", c.silent_for());
    // the device last asked 2 s ago or more
    rig.cb
        .shared
        .asked_at(&rig.cb.clock, origin + STALL_AFTER / 2);
    assert!(c.silent_for() >= STALL_AFTER, "{:?}", c.silent_for());
    assert!(!c.is_stalled(), "nothing queued: nothing is lost");
    rig.play(4800, 1);
    assert!(c.is_stalled());
    assert_eq!(c.queued(), 4800);
    // it asks again: not stalled, and it plays what is queued
    rig.cb.fill_at(&mut data, Instant::now(), Duration::ZERO);
    assert!(!c.is_stalled());
    assert_eq!(c.queued(), 4800 - 480);
}

/// Closing ends the playback: what is queued is dropped at the device's
/// next buffers, and it says it is closed (the feed then queues nothing).
#[test]
fn a_closed_speaker_drops_what_is_queued() {
    let mut rig = Rig::new();
    let c = control(&rig);
    rig.play(48_000, 1);
    rig.buffer(480, 0);
    assert!(!c.is_closed());
    c.close();
    assert!(c.is_closed());
    for k in 1..3 {
        rig.buffer(480, 10 * k);
    }
    assert!(!c.is_playing(), "{} left", c.queued());
}
