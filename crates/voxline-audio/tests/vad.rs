//! End-pointing real speech: the audio fixtures carry the true speech
//! boundaries in their JSON sidecars.

use std::path::{Path, PathBuf};

use serde_json::Value;
use voxline_audio::{Endpointer, Segment, VadConfig, WavSource};

/// ±150 ms at 16 kHz.
const TOLERANCE: u64 = 2_400;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../audio-fixtures")
        .join(name)
}

fn decode(path: &Path) -> Vec<f32> {
    let mut src = WavSource::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    while let Some(chunk) = src.next_chunk().unwrap_or_else(|e| panic!("{e}")) {
        out.extend(chunk);
    }
    out
}

/// True `(start, end)` of each turn, converted to 16 kHz sample positions.
fn truth(name: &str) -> Vec<(u64, u64)> {
    let sidecar = fixture(name).with_extension("json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&sidecar).unwrap()).unwrap();
    let rate = json["sample_rate"].as_u64().unwrap();
    let to16k = |s: &Value| (s.as_u64().unwrap() as f64 * 16_000.0 / rate as f64).round() as u64;
    json["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (to16k(&t["start_sample"]), to16k(&t["end_sample"])))
        .collect()
}

/// Runs the endpointer over `audio` in `chunk`-sized pieces; returns each segment with
/// the stream position at which it was emitted.
fn segment(audio: &[f32], chunk: usize, config: VadConfig) -> Vec<(u64, Segment)> {
    let mut ep = Endpointer::new(config).unwrap();
    let mut out = Vec::new();
    let mut pos = 0u64;
    for piece in audio.chunks(chunk) {
        pos += piece.len() as u64;
        for seg in ep.push(piece) {
            out.push((pos, seg));
        }
    }
    if let Some(seg) = ep.finish() {
        out.push((pos, seg));
    }
    out
}

fn assert_matches_truth(name: &str, segments: &[(u64, Segment)], audio: &[f32]) {
    let turns = truth(name);
    let pre_roll = 3_200; // default 200 ms
    assert_eq!(
        segments.len(),
        turns.len(),
        "{name}: {:?}",
        bounds(segments)
    );
    for ((emitted_at, seg), &(start, end)) in segments.iter().zip(&turns) {
        // The detected speech onset (segment start without its pre-roll) is near the truth,
        // and the segment as cut (with pre-roll) includes the true start.
        let onset = seg.start_sample + pre_roll;
        assert!(
            onset.abs_diff(start) <= TOLERANCE,
            "{name}: onset {onset} vs true start {start}"
        );
        assert!(
            seg.start_sample <= start,
            "{name}: segment starts after the speech"
        );
        assert!(
            seg.end_sample.abs_diff(end) <= TOLERANCE,
            "{name}: end {} vs true end {end}",
            seg.end_sample
        );
        assert!(!seg.forced_split);
        assert_eq!(
            seg.samples,
            audio[seg.start_sample as usize..seg.end_sample as usize],
            "{name}: samples"
        );
        // Emitted once the default hangover has passed, within a frame (the
        // hangover is counted in whole 256-sample frames from the last
        // speech frame, the end is sample-accurate) plus the push chunk.
        let delay = emitted_at - seg.end_sample;
        let hangover = u64::from(voxline_audio::vad::DEFAULT_HANGOVER_MS) * 16;
        assert!(
            (hangover - 256..hangover + 256 + 1_000).contains(&delay),
            "{name}: endpoint delay {delay} samples"
        );
    }
}

fn bounds(segments: &[(u64, Segment)]) -> Vec<(u64, u64)> {
    segments
        .iter()
        .map(|(_, s)| (s.start_sample, s.end_sample))
        .collect()
}

#[test]
fn single_question_is_one_segment_at_the_right_place() {
    for name in [
        "q_capital.wav",
        "q_weather.wav",
        "q_tea.wav",
        "q_story.wav",
        "q_moon.wav",
    ] {
        let audio = decode(&fixture(name));
        let segments = segment(&audio, 1_000, VadConfig::default());
        assert_matches_truth(name, &segments, &audio);
    }
}

#[test]
fn multi_turn_gives_three_segments() {
    let audio = decode(&fixture("multi_turn.wav"));
    let segments = segment(&audio, 1_000, VadConfig::default());
    assert_matches_truth("multi_turn.wav", &segments, &audio);
}

#[test]
fn resampled_variants_segment_like_the_original() {
    for name in [
        "q_capital_44k_stereo.wav",
        "q_capital_48k_f32.wav",
        "q_capital_8k.wav",
        "q_capital_24bit.wav",
    ] {
        let audio = decode(&fixture(name));
        let segments = segment(&audio, 1_000, VadConfig::default());
        assert_matches_truth(name, &segments, &audio);
    }
}

#[test]
fn segmentation_does_not_depend_on_chunk_size() {
    let audio = decode(&fixture("multi_turn.wav"));
    let reference = bounds(&segment(&audio, 256, VadConfig::default()));
    for chunk in [1, 7, 255, 257, 4_096, audio.len()] {
        assert_eq!(
            bounds(&segment(&audio, chunk, VadConfig::default())),
            reference,
            "chunk {chunk}"
        );
    }
}

#[test]
fn silence_gives_no_segment() {
    let audio = decode(&fixture("silence.wav"));
    let mut ep = Endpointer::new(VadConfig::default()).unwrap();
    assert!(ep.push(&audio).is_empty());
    assert!(ep.finish().is_none());
    assert_eq!(ep.stats().speech_frames, 0);
    assert_eq!(ep.stats().frames, 188);
}

#[test]
fn long_utterance_stays_whole_and_splits_when_capped() {
    let audio = decode(&fixture("long_10s.wav"));
    let whole = segment(&audio, 1_000, VadConfig::default());
    assert_matches_truth("long_10s.wav", &whole, &audio);

    let capped = VadConfig {
        max_utterance_ms: 4_000,
        ..VadConfig::default()
    };
    let pieces = segment(&audio, 1_000, capped);
    assert!(pieces.len() >= 3, "{:?}", bounds(&pieces));
    let described = || {
        pieces
            .iter()
            .map(|(_, s)| {
                (
                    s.start_sample,
                    s.end_sample,
                    s.forced_split,
                    s.overlap_samples,
                )
            })
            .collect::<Vec<_>>()
    };
    for pair in pieces.windows(2) {
        let (a, b) = (&pair[0].1, &pair[1].1);
        assert!(a.forced_split && b.continues_previous, "{:?}", described());
        // The rest starts with a lead-in (1 s, the overlap capped at a quarter
        // of the limit) that repeats the end of the piece it continues.
        assert_eq!(b.overlap_samples, 16_000, "{:?}", described());
        assert_eq!(b.start_sample + b.overlap_samples, a.end_sample);
        assert!(a.end_sample - a.start_sample <= 64_000);
        assert_eq!(
            b.samples,
            audio[b.start_sample as usize..b.end_sample as usize]
        );
        // Cut at the quietest point of the last second before the limit, not at the limit.
        let limit = a.start_sample + 64_000;
        assert!(a.end_sample >= limit - 16_000 - 256, "{:?}", described());
        // the energy of the ~176 ms around a frame (it and five on either side)
        let energy = |end: u64| {
            let f = &audio[end as usize - 6 * 256..end as usize + 5 * 256];
            f.iter().map(|x| x * x).sum::<f32>() / f.len() as f32
        };
        let window: Vec<f32> = (1..=62)
            .map(|k| energy(limit - k * 256))
            .filter(|e| e.is_finite())
            .collect();
        let mut sorted = window.clone();
        sorted.sort_by(f32::total_cmp);
        assert!(
            energy(a.end_sample) <= sorted[sorted.len() / 4],
            "the cut is not among the quietest quarter of the window: {:?}",
            described()
        );
    }
    assert_eq!(pieces[0].1.start_sample, whole[0].1.start_sample);
    assert_eq!(pieces.last().unwrap().1.end_sample, whole[0].1.end_sample);
}

#[test]
fn a_forced_split_cuts_in_the_pause_between_sentences() {
    // "Tell me a short story about a cat.", 200 ms of silence (shorter than the
    // hangover), then two more sentences with no pause: one utterance, which
    // reaches a 2.8 s limit about 0.4 s after the pause; the cut lands in it.
    let story = decode(&fixture("q_story.wav"));
    let long = decode(&fixture("long_10s.wav"));
    let (s0, s1) = truth("q_story.wav")[0];
    let (l0, l1) = truth("long_10s.wav")[0];
    let mut audio = vec![0.0; 8_000];
    audio.extend_from_slice(&story[s0 as usize..s1 as usize]);
    let pause = (audio.len() as u64, audio.len() as u64 + 3_200);
    audio.extend(std::iter::repeat_n(0.0, 3_200));
    audio.extend_from_slice(&long[l0 as usize..l1 as usize]);
    audio.extend(std::iter::repeat_n(0.0, 16_000));
    let config = VadConfig {
        max_utterance_ms: 2_800,
        ..VadConfig::default()
    };
    let pieces = segment(&audio, 1_000, config);
    let first = &pieces[0].1;
    assert!(first.forced_split, "{:?}", bounds(&pieces));
    assert!(
        (pause.0..=pause.1).contains(&first.end_sample),
        "cut at {} outside the pause {pause:?}",
        first.end_sample
    );
    let second = &pieces[1].1;
    assert!(second.continues_previous);
    assert_eq!(
        second.start_sample,
        first.end_sample - second.overlap_samples
    );
}

#[test]
fn noisy_question_still_covers_the_speech() {
    let audio = decode(&fixture("q_capital_noisy.wav"));
    let segments = segment(&audio, 1_000, VadConfig::default());
    let (start, end) = truth("q_capital_noisy.wav")[0];
    assert_eq!(segments.len(), 1, "{:?}", bounds(&segments));
    let seg = &segments[0].1;
    assert!(seg.start_sample <= start);
    assert!(
        seg.end_sample.abs_diff(end) <= TOLERANCE,
        "end {} vs {end}",
        seg.end_sample
    );
}

#[test]
fn a_short_hangover_is_a_shorter_endpoint_delay() {
    let audio = decode(&fixture("q_capital.wav"));
    let config = VadConfig {
        hangover_ms: 200,
        ..VadConfig::default()
    };
    let segments = segment(&audio, 256, config);
    assert_eq!(segments.len(), 1);
    let (emitted_at, seg) = &segments[0];
    // 200 ms = 3200 samples = 12.5 frames: closes on the 13th frame after speech ends.
    assert_eq!(emitted_at - seg.end_sample, 13 * 256);
}
