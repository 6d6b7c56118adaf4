//! The VAD stage on the fixtures.
use std::time::Duration;

use super::*;

fn fixture_16k(name: &str) -> Vec<f32> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name);
    let mut src = crate::WavSource::open(&path).unwrap();
    let mut out = Vec::new();
    while let Some(c) = src.next_chunk().unwrap() {
        out.extend_from_slice(&c);
    }
    out
}

/// A field (`start_sample`, `end_sample`) of q_capital's spoken turn, from its sidecar.
fn q_capital_turn(field: &str) -> usize {
    let sidecar: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../audio-fixtures/q_capital.json"),
        )
        .unwrap(),
    )
    .unwrap();
    sidecar["turns"][0][field].as_u64().unwrap() as usize
}

fn frames(audio: &[f32], offset: u64, clock: &Clock) -> Vec<AudioFrame> {
    audio
        .chunks(320)
        .enumerate()
        .map(|(i, c)| {
            let start = offset + (i * 320) as u64;
            AudioFrame {
                start_sample: start,
                samples: c.to_vec(),
                captured: clock.sample_due(start),
                new_recording: i == 0,
                end_of_stream: false,
            }
        })
        .collect()
}

#[test]
fn numbers_utterances_and_places_them_on_the_stream_clock() {
    let clock = Clock::start();
    let audio = fixture_16k("multi_turn.wav");
    // the stream does not start at 0 (a second file, say): positions follow it
    let offset = 48_000;
    let mut stage = VadStage::new(VadConfig::default()).unwrap();
    let out = voxline_core::drive(&mut stage, frames(&audio, offset, &clock)).unwrap();
    assert_eq!(out.iter().map(|u| u.id).collect::<Vec<_>>(), vec![1, 2, 3]);
    for u in &out {
        assert!(u.start_sample >= offset && u.end_sample > u.start_sample);
        assert_eq!(u.samples.len() as u64, u.end_sample - u.start_sample);
        // closed once the default hangover passed, within a frame or two
        let delay = u.closed_sample - u.end_sample;
        let hangover = u64::from(crate::vad::DEFAULT_HANGOVER_MS) * 16;
        assert!(
            (hangover - 256..=hangover + 2 * 320 + 256).contains(&delay),
            "closed {delay} samples after the end of speech"
        );
        // the end's wall time is the instant that sample was due
        let due = clock.sample_due(u.end_sample);
        let skew = if u.end_wall > due {
            u.end_wall - due
        } else {
            due - u.end_wall
        };
        assert!(skew < Duration::from_millis(1), "{skew:?}");
    }
}

#[test]
fn positions_stay_true_stream_positions_after_dropped_audio() {
    let clock = Clock::start();
    let audio = fixture_16k("multi_turn.wav");
    let whole = voxline_core::drive(
        &mut VadStage::new(VadConfig::default()).unwrap(),
        frames(&audio, 0, &clock),
    )
    .unwrap();
    // drop five seconds of frames from the silence before the last question
    let gap_start = (whole[2].start_sample - 16_000 * 6) as usize / 320;
    let mut fs = frames(&audio, 0, &clock);
    fs.drain(gap_start..gap_start + 250);
    let mut stage = VadStage::new(VadConfig::default()).unwrap();
    let cut = voxline_core::drive(&mut stage, fs).unwrap();
    assert_eq!(stage.gap_samples(), 250 * 320);
    let last = cut.last().unwrap();
    // the last question is where it is in the stream, not 5 s earlier
    let drift = last.end_sample.abs_diff(whole[2].end_sample);
    assert!(
        drift <= 512,
        "{} vs {}",
        last.end_sample,
        whole[2].end_sample
    );
}

#[test]
fn a_clock_gap_in_the_hangover_does_not_move_the_end_of_speech() {
    let clock = Clock::start();
    let audio = fixture_16k("multi_turn.wav");
    // the device delivered nothing for 500 ms, 200 ms after the first
    // question ended: later frames skip 8 000 positions and were captured
    // 500 ms later than their audio alone says
    let gap_at = 28_197 + 3_200;
    let gap = Duration::from_millis(500);
    let frames: Vec<AudioFrame> = frames(&audio, 0, &clock)
        .into_iter()
        .map(|mut f| {
            if f.start_sample >= gap_at {
                f.start_sample += 8_000;
                f.captured += gap;
            }
            f
        })
        .collect();
    let mut stage = VadStage::new(VadConfig::default()).unwrap();
    let out = voxline_core::drive(&mut stage, frames).unwrap();
    assert_eq!(out.len(), 3);
    for u in &out {
        // positions are true stream positions (the gap included), so the
        // end's wall time is simply when that stream sample was due
        let due = clock.sample_due(u.end_sample);
        let skew = if u.end_wall > due {
            u.end_wall - due
        } else {
            due - u.end_wall
        };
        assert!(skew < Duration::from_millis(1), "turn {}: {skew:?}", u.id);
    }
}

#[test]
fn the_pre_roll_never_reaches_back_past_a_new_recording() {
    let clock = Clock::start();
    // a recording whose speech starts 50 ms in, after 1 s of digital silence
    let audio = fixture_16k("q_capital.wav");
    let speech = q_capital_turn("start_sample");
    let clip = &audio[speech - 800..];
    let mut stream = vec![0.0f32; 16_000];
    stream.extend_from_slice(clip);
    let mut fs = frames(&stream, 0, &clock);
    let file_start = 16_000u64;
    for f in &mut fs {
        f.new_recording = f.start_sample == file_start;
    }
    let out = voxline_core::drive(&mut VadStage::new(VadConfig::default()).unwrap(), fs).unwrap();
    assert_eq!(out.len(), 1);
    // not one sample of what came before
    assert!(
        out[0].start_sample >= file_start,
        "the pre-roll reached back to {} before the recording at {file_start}",
        out[0].start_sample
    );
}

/// Speculates on `q_capital` with `spec_threshold`; returns (attempts
/// started, the committed attempt's position after the true end in
/// samples, the end of the committed attempt's audio, the end of the
/// closed segment's speech).
fn speculate_on_q_capital(spec_threshold: f32) -> (usize, u64, u64, u64) {
    let clock = Clock::start();
    let audio = fixture_16k("q_capital.wav");
    let board = SpecBoard::new();
    let config = VadConfig {
        spec_threshold,
        ..VadConfig::default()
    };
    let mut stage = VadStage::new(config.clone())
        .unwrap()
        .with_speculation(board.clone(), 48);
    let out = voxline_core::drive(&mut stage, frames(&audio, 0, &clock)).unwrap();
    let committed: Vec<&Utterance> = out
        .iter()
        .filter(|u| board.state(u.id) == voxline_core::SpecState::Committed)
        .collect();
    assert_eq!(committed.len(), 1, "one turn, committed");
    assert!(
        out.iter()
            .all(|u| board.state(u.id) != voxline_core::SpecState::Final),
        "the committed attempt is not sent again"
    );
    let c = committed[0];
    // The segment the hangover closes (the same audio without speculation).
    let whole = voxline_core::drive(
        &mut VadStage::new(config).unwrap(),
        frames(&audio, 0, &clock),
    )
    .unwrap();
    assert_eq!(whole.len(), 1);
    assert_eq!(c.start_sample, whole[0].start_sample);
    assert_eq!(c.samples.len() as u64, c.end_sample - c.start_sample);
    let true_end = q_capital_turn("end_sample") as u64;
    (
        out.len(),
        c.closed_sample - true_end,
        c.end_sample,
        whole[0].end_sample,
    )
}

#[test]
fn a_confident_threshold_speculates_sooner_and_keeps_the_whole_word() {
    let (n_old, after_old, _, _) = speculate_on_q_capital(0.5);
    let (n_new, after_new, sent_end, seg_end) = speculate_on_q_capital(0.6);
    // The detector's decaying tail is no longer waited for: at least a
    // detector frame sooner.
    assert!(
        after_new + crate::FRAME_SAMPLES as u64 <= after_old,
        "attempt {after_new} samples after the true end, against {after_old}"
    );
    assert!(n_new >= n_old);
    // The attempt sends the audio up to where it was sent: every speech
    // frame of the segment the hangover closes (the tail included).
    assert!(
        sent_end + TAIL_GRACE >= seg_end,
        "the attempt's audio ends {} samples before the segment's speech",
        seg_end.saturating_sub(sent_end)
    );
}

#[test]
fn forced_splits_are_never_speculative_and_their_rest_names_them() {
    let clock = Clock::start();
    let audio = fixture_16k("long_10s.wav");
    let board = SpecBoard::new();
    let config = VadConfig {
        max_utterance_ms: 4_000,
        ..VadConfig::default()
    };
    // a short speculation silence, so attempts start inside the long speech too
    let mut stage = VadStage::new(config)
        .unwrap()
        .with_speculation(board.clone(), 50);
    let out = voxline_core::drive(&mut stage, frames(&audio, 16_000, &clock)).unwrap();
    let forced: Vec<&Utterance> = out.iter().filter(|u| u.forced_split).collect();
    assert!(forced.len() >= 2, "{} forced splits", forced.len());
    let mut last_forced: Option<&Utterance> = None;
    let mut continuations = 0;
    for u in &out {
        let attempt = board.state(u.id) != voxline_core::SpecState::Final;
        assert!(
            !(attempt && u.forced_split),
            "attempt {} is a forced split",
            u.id
        );
        assert_eq!(u.samples.len() as u64, u.end_sample - u.start_sample);
        match last_forced {
            Some(f) if u.start_sample < f.end_sample => {
                continuations += 1;
                assert_eq!(u.continues, Some(f.id), "utterance {}", u.id);
                assert_eq!(u.start_sample + u.overlap_samples, f.end_sample);
                // the lead-in is the same audio as the end of the piece before
                let lead = usize::try_from(u.overlap_samples).unwrap();
                assert_eq!(u.samples[..lead], f.samples[f.samples.len() - lead..]);
            }
            _ => {
                assert_eq!(u.continues, None);
                assert_eq!(u.overlap_samples, 0);
            }
        }
        if u.forced_split {
            last_forced = Some(u);
        }
    }
    assert!(continuations >= forced.len(), "{continuations}");
}

#[test]
fn end_of_stream_closes_an_open_utterance() {
    let clock = Clock::start();
    let audio = fixture_16k("q_capital.wav");
    // cut the file 100 ms after the speech ends: no hangover left to close it
    let end = q_capital_turn("end_sample") + 1600;
    let mut stage = VadStage::new(VadConfig::default()).unwrap();
    let out = voxline_core::drive(&mut stage, frames(&audio[..end], 0, &clock)).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].closed_sample, end as u64);
}
