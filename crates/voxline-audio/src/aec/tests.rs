//! The canceller on real recordings through a simulated echo path: the
//! fixtures' espeak-ng answer as the loudspeaker, a human recording as the
//! person at the microphone.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use voxline_core::{AudioFrame, Emitter, Stage};

use super::{AecMeter, AecOptions, AecStage, EchoReference, BLOCK, LEAD};
use crate::WavSource;

fn fixture(name: &str) -> Vec<f32> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name);
    let mut w = WavSource::open(&path).unwrap();
    let mut out = Vec::new();
    while let Some(c) = w.next_chunk().unwrap() {
        out.extend(c);
    }
    out
}

fn db(x: f64) -> f64 {
    10.0 * x.max(1e-20).log10()
}

fn power(s: &[f32]) -> f64 {
    s.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>() / s.len().max(1) as f64
}

/// The loudspeaker plays `far` from 0 s; the microphone hears it through a
/// room (`gain`, and a weaker reflection 15 ms later) plus
/// `near` from `near_at` s; the path's delay is `delay_ms.0` for the first
/// half of the voice and `delay_ms.1` after. The reference is pushed in
/// 10 ms buffers as the output would push it, ahead of the capture. Each
/// buffer's and each frame's instant is off by up to `jitter_ms` either
/// way, as devices report them.
/// Returns the canceller's output, the echo alone and the
/// near speech alone as heard, the meter, the barge-in state it told (the
/// voice's levels as played included), and the instant of sample 0.
fn through_the_room(
    far: &[f32],
    near: &[f32],
    near_at: f64,
    gain: f32,
    delay_ms: (usize, usize),
    options: AecOptions,
    jitter_ms: u64,
) -> (
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    AecMeter,
    voxline_core::BargeIn,
    Instant,
) {
    let len = (far.len() + 32_000).max((near_at * 16_000.0) as usize + near.len() + 8_000);
    let mut echo = vec![0.0f32; len + 16_000];
    for (i, x) in far.iter().enumerate() {
        // the path's delay moves halfway through the voice
        let d = 16
            * if i < far.len() / 2 {
                delay_ms.0
            } else {
                delay_ms.1
            };
        echo[i + d] += gain * x;
        echo[i + d + 240] += 0.4 * gain * x;
    }
    let mut speech = vec![0.0f32; len];
    let at = (near_at * 16_000.0) as usize;
    speech[at..at + near.len()].copy_from_slice(near);
    let mic: Vec<f32> = echo.iter().zip(&speech).map(|(e, s)| e + s).collect();

    let reference = EchoReference::new();
    let meter = AecMeter::default();
    let guard = voxline_core::BargeIn::new();
    let mut stage =
        AecStage::new(reference.clone(), meter.clone(), options).with_echo_guard(guard.clone());
    let t0 = Instant::now();
    // a deterministic jitter in [-jitter_ms, +jitter_ms]
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut jitter = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % (2 * jitter_ms + 1)) as f64 - jitter_ms as f64
    };
    // instants from 1 s on, so a jitter never reaches before `t0`
    let mut at = move |sample: usize| {
        t0 + Duration::from_secs_f64(1.0 + sample as f64 / 16_000.0 + jitter() / 1000.0)
    };
    let mut played = far.to_vec();
    played.resize(len + 16_000, 0.0);
    let mut out_frames: Vec<AudioFrame> = Vec::new();
    let mut pushed = 0;
    // 20 ms microphone frames; the output's far end is known 20 ms past
    // what the canceller reads
    let ahead = (LEAD.as_millis() as usize + 40) * 16;
    for (n, chunk) in mic.chunks(320).enumerate() {
        let start = n * 320;
        while pushed < start + 320 + ahead {
            let block = &played[pushed..pushed + BLOCK];
            let when = at(pushed);
            reference.push(when, block, 16_000);
            // the output's watcher reports each buffer's level too
            let ms = block.iter().map(|x| x * x).sum::<f32>() / BLOCK as f32;
            guard.played(when, Duration::from_millis(10), ms);
            pushed += BLOCK;
        }
        let frame = AudioFrame {
            start_sample: start as u64,
            samples: chunk.to_vec(),
            captured: at(start),
            new_recording: n == 0,
            end_of_stream: false,
        };
        let mut emitted = Vec::new();
        stage
            .process(frame, &mut Emitter::to_vec(&mut emitted))
            .unwrap();
        out_frames.extend(emitted);
    }
    let mut emitted = Vec::new();
    stage.finish(&mut Emitter::to_vec(&mut emitted)).unwrap();
    out_frames.extend(emitted);
    // the frames are the stream, in order, without a hole
    let mut next = 0;
    let mut out = Vec::new();
    for f in &out_frames {
        assert_eq!(f.start_sample, next);
        next = f.end_sample();
        out.extend_from_slice(&f.samples);
    }
    assert_eq!(out.len(), mic.len());
    assert!(out_frames[0].new_recording);
    (out, echo, speech, meter, guard, t0 + Duration::from_secs(1))
}

/// The voice (`q_story.wav`) through the room at −6 dB, 60 ms, then 1 s
/// after it the person alone, with instants off by up to `jitter_ms`.
/// Returns the echo taken out once converged (from 1.5 s, while only the
/// voice sounds), the person's level after against as heard (the
/// high-pass filter aside), the meter and the barge-in state.
fn voice_then_person(jitter_ms: u64) -> (f64, f64, AecMeter, voxline_core::BargeIn) {
    let far = fixture("q_story.wav");
    let near = fixture("human/arctic-a0024.wav");
    let near_at = far.len() as f64 / 16_000.0 + 1.0;
    let (out, echo, speech, meter, guard, _) = through_the_room(
        &far,
        &near,
        near_at,
        0.5,
        (60, 60),
        AecOptions::default(),
        jitter_ms,
    );
    let erle = db(power(&echo[24_000..far.len()]) / power(&out[24_000..far.len()]));
    let at = (near_at * 16_000.0) as usize;
    let kept = db(power(&out[at..at + near.len()]) / power(&speech[at..at + near.len()]));
    (erle, kept, meter, guard)
}

#[test]
fn the_loudspeakers_echo_is_taken_out_and_the_person_is_kept() {
    let (erle, kept, meter, guard) = voice_then_person(0);
    let s = meter.summary();
    eprintln!("echo at -6 dB: ERLE {erle:.1} dB measured, {s:?}; the person kept at {kept:+.2} dB");
    assert!(erle >= 20.0, "only {erle:.1} dB of the echo was taken out");
    assert!(kept.abs() <= 1.0, "the person was changed by {kept:+.2} dB");
    // its own figure, over the seconds the voice sounded
    assert!(s.erle_db.is_some_and(|e| e >= 20.0), "{s:?}");
    // and it told the endpointer it takes the voice out: speech over the
    // voice is judged at the usual threshold
    assert!(guard.echo_cancelled());
    // the lead (40 ms) and the room's 60 ms
    assert!(s.delay_ms.is_some_and(|d| (80..=130).contains(&d)), "{s:?}");
    assert_eq!(
        s.far_end_back_ms, 0,
        "an echo AEC3 finds leaves the far end where it is"
    );
    let far = fixture("q_story.wav");
    let sounding = far
        .chunks(BLOCK)
        .filter(|b| b.iter().map(|x| x * x).sum::<f32>() / BLOCK as f32 > 1e-6)
        .count() as u64;
    assert!(
        s.blocks_with_voice.abs_diff(sounding) <= 5,
        "{s:?}, {sounding} sounding"
    );
}

/// Double talk: the person speaks over the voice's echo, which is as loud
/// as them or louder (a loudspeaker turned up). What the canceller gives is
/// compared with what it gives of the person alone (its high-pass filter
/// and gain are in both): the echo and what its suppressor does to the
/// person while the voice plays are what differ.
#[test]
fn a_person_speaking_over_the_voice_is_heard_through_it() {
    let far = fixture("q_story.wav");
    let near = fixture("human/arctic-a0024.wav");
    let silent = vec![0.0; far.len()];
    // the person starts 2 s into the voice's answer (it has converged)
    let (alone, _, _, _, _, _) =
        through_the_room(&silent, &near, 2.0, 1.0, (60, 60), AecOptions::default(), 0);
    for gain in [2.0f32, 4.0] {
        let (out, echo, speech, _, _, _) =
            through_the_room(&far, &near, 2.0, gain, (60, 60), AecOptions::default(), 0);
        let span = 32_000..32_000 + near.len().min(far.len() - 32_000);
        let before = db(power(&speech[span.clone()]) / power(&echo[span.clone()]));
        let residual: Vec<f32> = out[span.clone()]
            .iter()
            .zip(&alone[span.clone()])
            .map(|(o, s)| o - s)
            .collect();
        let after = db(power(&alone[span.clone()]) / power(&residual));
        let kept = db(power(&out[span.clone()]) / power(&alone[span.clone()]));
        eprintln!(
            "double talk, echo x{gain}: the person over the echo {before:+.1} dB as heard, {after:+.1} dB after; their level {kept:+.1} dB"
        );
        assert!(
            after >= 5.0 && after >= before + 3.0,
            "{before:.1} -> {after:.1} dB"
        );
        assert!(kept.abs() <= 3.0, "the person's level moved {kept:+.1} dB");
    }
}

/// The sound server's buffering moves under load: the echo comes 60 ms
/// behind the voice, then 400 ms (the canceller reads the voice 40 ms
/// ahead, so 440 ms behind what it was handed). It finds the new delay
/// within seconds and takes the echo out again.
#[test]
fn an_echo_whose_delay_moves_by_hundreds_of_ms_is_followed() {
    let story = fixture("q_story.wav");
    let far: Vec<f32> = std::iter::repeat_n(story.iter(), 4)
        .flatten()
        .copied()
        .collect();
    let near = fixture("human/arctic-a0024.wav");
    let near_at = far.len() as f64 / 16_000.0 + 1.0;
    let (out, echo, _, meter, _, _) = through_the_room(
        &far,
        &near,
        near_at,
        0.5,
        (60, 400),
        AecOptions::default(),
        0,
    );
    let half = far.len() / 2;
    let erle = |from: usize, to: usize| db(power(&echo[from..to]) / power(&out[from..to]));
    let (first, second) = (erle(24_000, half), erle(half + 48_000, far.len()));
    let s = meter.summary();
    eprintln!("echo 60 ms then 400 ms behind: ERLE {first:.1} dB, then {second:.1} dB from 3 s after the move; {s:?}");
    assert!(
        first >= 20.0 && second >= 20.0,
        "{first:.1}, {second:.1} dB"
    );
}

/// The devices' instants jitter: each output buffer's and each microphone
/// frame's is off by up to 8 ms either way. The canceller reads the far
/// end on as one stream, so AEC3's filter still models the room.
#[test]
fn instants_that_jitter_do_not_break_the_echo_path() {
    let (erle, kept, meter, _) = voice_then_person(8);
    let s = meter.summary();
    eprintln!(
        "instants jittering by 8 ms: ERLE {erle:.1} dB; the person kept at {kept:+.2} dB; {s:?}"
    );
    assert!(erle >= 20.0, "only {erle:.1} dB of the echo was taken out");
    assert!(kept.abs() <= 1.0, "the person was changed by {kept:+.2} dB");
    // jitter alone never moves the far end
    assert_eq!(s.realignments, 0, "{s:?}");
}

/// A quiet room's hiss (-70 dBFS), deterministic.
fn hiss(len: usize) -> Vec<f32> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-3
        })
        .collect()
}

/// Headphones: the microphone never hears the voice. A person who speaks
/// 1 s into the voice's first answer (and 8 s into it) is heard as they
/// would be with nothing playing: AEC3 alone would have taken their first
/// 300 ms down by 45-70 dB while it learnt that there is no echo to take
/// out. The same voice through a loudspeaker 30 dB down is still
/// cancelled: the microphone rose with it.
#[test]
fn with_headphones_a_person_over_the_voices_first_second_is_heard_as_they_are() {
    let far = fixture("q_story.wav").repeat(4);
    let question = fixture("q_moon.wav");
    let onset = question.iter().position(|x| x.abs() > 0.02).unwrap();
    let silent = vec![0.0; far.len()];
    // the voice's first sound (q_story.wav begins with 0.5 s of silence)
    let voice = far.iter().position(|x| x.abs() > 1e-3).unwrap();
    for at_s in [1.0f64, 8.0] {
        let mut near = hiss(far.len() + 16_000);
        let at = voice + (at_s * 16_000.0) as usize - onset;
        for (n, q) in near[at..].iter_mut().zip(&question) {
            *n += q;
        }
        let opts = AecOptions::default();
        let (alone, _, _, _, _, _) = through_the_room(&silent, &near, 0.0, 0.0, (60, 60), opts, 0);
        let (out, _, _, meter, guard, _) =
            through_the_room(&far, &near, 0.0, 0.0, (60, 60), opts, 0);
        let first = at + onset..at + onset + 300 * 16;
        let kept = db(power(&out[first.clone()]) / power(&alone[first]));
        let whole = at + onset..at + question.len();
        let kept_whole = db(power(&out[whole.clone()]) / power(&alone[whole]));
        let s = meter.summary();
        eprintln!("headphones, {at_s} s in: the first 300 ms {kept:+.1} dB, all of it {kept_whole:+.1} dB; {s:?}");
        assert!(
            kept.abs() <= 1.0 && kept_whole.abs() <= 1.0,
            "{kept:+.1} / {kept_whole:+.1} dB"
        );
        assert_eq!(
            (s.stretches_without_echo, s.stretches_with_echo),
            (1, 0),
            "{s:?}"
        );
        assert!(
            guard.echo_cancelled(),
            "speech over the voice is judged as speech"
        );
        assert_eq!(
            (s.voice_heard, s.rejudged),
            (0, 0),
            "a person is no device change"
        );
    }
    let mut near = hiss(far.len() + 16_000);
    near.truncate(far.len());
    let (_, _, _, meter, _, _) =
        through_the_room(&far, &near, 0.0, 0.0316, (60, 60), AecOptions::default(), 0);
    let s = meter.summary();
    assert_eq!(
        (s.stretches_without_echo, s.stretches_with_echo),
        (0, 1),
        "{s:?}"
    );
}

/// A person's one word over the voice through a loudspeaker at −6 dB
/// ("one", from `sr-english`), once the canceller has converged. The
/// microphone's level before the canceller follows the voice (the echo is
/// most of what it heard), but what the canceller let through is the
/// person's: not echo. The same stretch without the word, the canceller's
/// trace of the voice alone, is.
#[test]
fn a_word_over_the_voice_is_the_persons_once_the_echo_is_taken_out() {
    use voxline_core::barge::ECHO_MIN_LIKENESS;
    let far = fixture("q_story.wav").repeat(2);
    let one = fixture("human/sr-english.wav")[..9_600].to_vec();
    let at = 4 * 16_000;
    // the utterance the VAD would cut: the word, 200 ms before, 300 ms after
    let (from, to) = (at - 3_200, at + one.len() + 4_800);
    let opts = AecOptions::default();
    let (out, echo, speech, _, guard, origin) =
        through_the_room(&far, &one, 4.0, 0.5, (60, 60), opts, 0);
    let end = origin + Duration::from_secs_f64(to as f64 / 16_000.0);
    let person = guard.echo_likeness(&out[from..to], end).unwrap();
    // the microphone's level alone, as when no canceller reports it
    let by_level = voxline_core::BargeIn::new();
    for (i, block) in far.chunks(BLOCK).enumerate() {
        let ms = block.iter().map(|x| x * x).sum::<f32>() / block.len() as f32;
        by_level.played(
            origin + Duration::from_millis(10 * i as u64),
            Duration::from_millis(10),
            ms,
        );
    }
    let mic: Vec<f32> = echo[from..to]
        .iter()
        .zip(&speech[from..to])
        .map(|(e, s)| e + s)
        .collect();
    let level = by_level.echo_likeness(&mic, end).unwrap();
    let (trace, _, _, _, guard, origin) = through_the_room(&far, &[], 4.0, 0.5, (60, 60), opts, 0);
    let end = origin + Duration::from_secs_f64(to as f64 / 16_000.0);
    let voice = guard.echo_likeness(&trace[from..to], end).unwrap();
    eprintln!("a word over the voice: {person:.3} (by the microphone's level {level:.3}); the voice alone: {voice:.3}");
    assert!(
        level >= ECHO_MIN_LIKENESS,
        "the microphone follows the voice: {level:.3}"
    );
    assert!(person < ECHO_MIN_LIKENESS, "the person's word: {person:.3}");
    assert!(voice >= ECHO_MIN_LIKENESS, "the voice's trace: {voice:.3}");
}

/// The echo comes far later than AEC3 searches (~400 ms): 60 ms behind
/// the voice, then 700 ms or 1.2 s (a device misreporting its playback by
/// that much). The levels place it, the far end is read that much further
/// back, and the echo is taken out again within seconds.
#[test]
fn an_echo_later_than_the_canceller_searches_is_found_by_its_level() {
    // (AEC3 alone: 400 ms is followed, 500 ms and more take out 1-3 dB)
    let story = fixture("q_story.wav");
    let far: Vec<f32> = std::iter::repeat_n(story.iter(), 6)
        .flatten()
        .copied()
        .collect();
    let near = fixture("human/arctic-a0024.wav");
    let near_at = far.len() as f64 / 16_000.0 + 1.0;
    for late in [700, 1_200] {
        let (out, echo, _, meter, _, _) = through_the_room(
            &far,
            &near,
            near_at,
            0.5,
            (60, late),
            AecOptions::default(),
            0,
        );
        let half = far.len() / 2;
        let erle = |from: usize, to: usize| db(power(&echo[from..to]) / power(&out[from..to]));
        let s = meter.summary();
        let (first, last) = (erle(24_000, half), erle(far.len() - 4 * 16_000, far.len()));
        eprintln!(
            "echo 60 ms, then {late} ms behind: ERLE {first:.1} dB, {last:.1} dB in the last 4 s; {s:?}"
        );
        assert!(first >= 20.0 && last >= 20.0, "{first:.1}, {last:.1} dB");
        // read back by the delay (with the lead and the reflection), less
        // the ~100 ms left for AEC3 to find
        assert!(
            (s.far_end_back_ms - (late as i64 - 45)).abs() <= 30,
            "{} ms back",
            s.far_end_back_ms
        );
    }
}

/// Issue 65: the microphone went away 1.5 s into an answer judged without
/// an echo path (headphones), and PulseAudio moved the capture to the
/// loudspeaker's monitor: from then on the microphone hears the voice
/// itself, at full level, 20 ms behind. The stage sees it within a second,
/// says so and starts the canceller again on it (the echo guard strict
/// until it converges); the canceller then takes the voice out.
#[test]
fn a_capture_moved_to_the_loudspeakers_monitor_mid_answer_is_seen_and_cancelled() {
    let far = fixture("q_story.wav").repeat(3);
    let voice = far.iter().position(|x| x.abs() > 1e-3).unwrap();
    let moved = voice + 24_000;
    let mut near = hiss(far.len() + 16_000);
    for (i, n) in near.iter_mut().enumerate().skip(moved) {
        *n += far.get(i - 320).copied().unwrap_or(0.0);
    }
    let (out, _, heard, meter, _, _) =
        through_the_room(&far, &near, 0.0, 0.0, (60, 60), AecOptions::default(), 0);
    let s = meter.summary();
    eprintln!("moved to the monitor: {s:?}");
    assert_eq!((s.voice_heard, s.rejudged), (1, 1), "{s:?}");
    assert!(s.stretches_with_echo >= 1, "{s:?}");
    // the last seconds of the voice: taken out
    let tail = far.len() - 4 * 16_000..far.len() - 16_000;
    let erle = db(power(&heard[tail.clone()]) / power(&out[tail]));
    assert!(
        erle >= 15.0,
        "the monitor's voice taken out by {erle:.1} dB"
    );
}
