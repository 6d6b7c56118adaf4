//! The segmentation rules, on exact synthetic decisions.

use super::*;

/// The configuration the frame counts below are written for: the
/// defaults with a 500 ms hangover (31.25 frames of 16 ms), whatever the
/// default hangover is.
fn base() -> VadConfig {
    VadConfig {
        hangover_ms: 500,
        ..VadConfig::default()
    }
}

const F: u64 = FRAME_SAMPLES as u64;

/// Frame `k` holds the value `k` in every sample, so segment contents are checkable.
fn frame(k: usize) -> Vec<f32> {
    vec![k as f32; FRAME_SAMPLES]
}

/// The audio of frames `0..` as one stream, sliced to `[start, end)`.
fn expected_audio(start: u64, end: u64) -> Vec<f32> {
    (start..end).map(|s| (s / F) as f32).collect()
}

/// Feeds `decisions` (one per frame) and returns `(frame index at emission, segment)`.
fn run(tracker: &mut SegmentTracker, decisions: &[bool]) -> Vec<(usize, Segment)> {
    let mut out = Vec::new();
    for (k, &speech) in decisions.iter().enumerate() {
        if let Some(seg) = tracker.push_frame(&frame(k), if speech { 0.9 } else { 0.1 }) {
            out.push((k, seg));
        }
    }
    out
}

/// `n_silence` non-speech frames, `n_speech` speech frames, then `n_after` non-speech frames.
fn pattern(n_silence: usize, n_speech: usize, n_after: usize) -> Vec<bool> {
    let mut v = vec![false; n_silence];
    v.extend(std::iter::repeat_n(true, n_speech));
    v.extend(std::iter::repeat_n(false, n_after));
    v
}

fn tracker(config: VadConfig) -> SegmentTracker {
    SegmentTracker::new(config).unwrap()
}

#[test]
fn confident_end_follows_only_frames_above_the_spec_threshold() {
    // 0.9 speech, then the detector's decaying tail (0.58, 0.52: speech,
    // not confident), then silence.
    let mut t = tracker(VadConfig {
        pre_roll_ms: 0,
        ..base()
    });
    let probs = [0.1, 0.9, 0.9, 0.58, 0.52, 0.2, 0.2];
    for (k, &p) in probs.iter().enumerate() {
        assert!(t.push_frame(&frame(k), p).is_none());
    }
    let o = t.open_utterance().unwrap();
    assert_eq!((o.start_sample, o.end_sample), (F, 5 * F));
    assert_eq!(
        o.confident_end,
        Some(3 * F),
        "the tail frames are not confident"
    );
    assert_eq!(o.samples, &expected_audio(F, 5 * F)[..]);
    assert_eq!(o.samples_to_now, &expected_audio(F, 7 * F)[..]);
    // At or below the speech threshold, every speech frame is confident.
    let mut t = tracker(VadConfig {
        spec_threshold: 0.3,
        pre_roll_ms: 0,
        ..base()
    });
    for (k, &p) in probs.iter().enumerate() {
        t.push_frame(&frame(k), p);
    }
    assert_eq!(t.open_utterance().unwrap().confident_end, Some(5 * F));
    // An utterance that opens on a tail-level frame has no confident speech yet.
    let mut t = tracker(base());
    t.push_frame(&frame(0), 0.55);
    assert_eq!(t.open_utterance().unwrap().confident_end, None);
    t.push_frame(&frame(1), 0.8);
    assert_eq!(t.open_utterance().unwrap().confident_end, Some(2 * F));
}

/// Forced splits at the limit itself, with no lead-in: the rule without
/// a search window or overlap.
fn exact_split(max_utterance_ms: u32) -> VadConfig {
    VadConfig {
        max_utterance_ms,
        split_search_ms: 0,
        split_overlap_ms: 0,
        ..base()
    }
}

/// Feeds frames of `(speech probability, amplitude)`, each frame a constant
/// level; returns the stream and the segments emitted.
fn run_levels(tracker: &mut SegmentTracker, frames: &[(f32, f32)]) -> (Vec<f32>, Vec<Segment>) {
    let mut stream = Vec::new();
    let mut out = Vec::new();
    for &(prob, level) in frames {
        let f = vec![level; FRAME_SAMPLES];
        stream.extend_from_slice(&f);
        out.extend(tracker.push_frame(&f, prob));
    }
    (stream, out)
}

fn assert_contents(stream: &[f32], segs: &[Segment]) {
    for s in segs {
        assert_eq!(s.samples.len() as u64, s.end_sample - s.start_sample);
        assert_eq!(
            s.samples,
            stream[s.start_sample as usize..s.end_sample as usize]
        );
    }
}

#[test]
fn forced_split_cuts_after_the_quietest_frame_before_the_limit() {
    // 1000 ms: 62 frames fit. The window is a quarter of that, 250 ms = 4000
    // samples: frames ending at 11 872 or later, i.e. frames 46..=61.
    let config = VadConfig {
        max_utterance_ms: 1000,
        ..base()
    };
    let mut frames = vec![(0.9, 0.5); 70];
    frames[20] = (0.9, 0.0); // quieter, but outside the window
    frames[50] = (0.9, 0.05);
    frames[55] = (0.9, 0.01); // the quietest in the window
    frames.extend([(0.1, 0.0); 40]);
    let mut t = tracker(config);
    let (stream, segs) = run_levels(&mut t, &frames);
    assert_eq!(segs.len(), 2, "{segs:?}");
    let (a, b) = (&segs[0], &segs[1]);
    assert!(a.forced_split && !a.continues_previous && a.overlap_samples == 0);
    assert_eq!((a.start_sample, a.end_sample), (0, 56 * F));
    // The continuation starts 250 ms (the capped overlap) before the cut.
    assert!(!b.forced_split && b.continues_previous);
    assert_eq!(b.overlap_samples, 4_000);
    assert_eq!((b.start_sample, b.end_sample), (56 * F - 4_000, 70 * F));
    assert!(b.end_sample - b.start_sample <= 16_000);
    assert_contents(&stream, &segs);
    assert_eq!(t.stats().forced_splits, 1);
}

#[test]
fn a_non_speech_frame_is_a_better_cut_than_quiet_speech() {
    let config = VadConfig {
        max_utterance_ms: 1000,
        ..base()
    };
    let mut frames = vec![(0.9, 0.5); 65];
    frames[52] = (0.2, 0.3);
    frames[55] = (0.9, 0.01);
    frames.extend([(0.1, 0.0); 40]);
    let mut t = tracker(config);
    let (stream, segs) = run_levels(&mut t, &frames);
    assert_eq!(segs[0].end_sample, 53 * F);
    assert_eq!(segs[1].start_sample, 53 * F - 4_000);
    assert_contents(&stream, &segs);
}

#[test]
fn a_pause_is_cut_in_its_middle() {
    let config = VadConfig {
        max_utterance_ms: 1000,
        ..base()
    };
    // frames 50..=54 are digital silence (shorter than the hangover)
    let mut frames = vec![(0.9, 0.5); 65];
    for f in &mut frames[50..55] {
        *f = (0.1, 0.0);
    }
    frames.extend([(0.1, 0.0); 40]);
    let mut t = tracker(config);
    let (stream, segs) = run_levels(&mut t, &frames);
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].end_sample, 53 * F);
    assert_contents(&stream, &segs);
}

#[test]
fn the_lead_in_alone_is_not_a_continuation() {
    // Speech stops 6 frames before the split (less than the hangover): the
    // cut is in the middle of that silence; the continuation's lead-in holds
    // speech, but no speech follows the cut, so it is dropped.
    let config = VadConfig {
        max_utterance_ms: 1000,
        ..base()
    };
    let mut frames = vec![(0.9, 0.5); 56];
    frames.extend([(0.1, 0.0); 60]);
    let mut t = tracker(config);
    let (stream, segs) = run_levels(&mut t, &frames);
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert!(segs[0].forced_split);
    assert_contents(&stream, &segs);
    assert!(!t.in_utterance());
    assert_eq!(t.stats().segments, 1);
}

#[test]
fn a_long_monologue_is_cut_into_overlapping_chunks_of_at_most_the_limit() {
    let config = VadConfig {
        max_utterance_ms: 2000,
        ..base()
    };
    // speech with a quiet stretch of 6 frames (96 ms, a gap between
    // words) every 20 frames, and a single quiet frame (a soft consonant)
    // between them; 30 s long
    let frames: Vec<(f32, f32)> = (0..1875)
        .map(|k| match k % 20 {
            10..=15 => (0.8, 0.02),
            2 => (0.8, 0.0),
            _ => (0.9, 0.4),
        })
        .chain(std::iter::repeat_n((0.1, 0.0), 40))
        .collect();
    let mut t = tracker(config);
    let (stream, segs) = run_levels(&mut t, &frames);
    assert!(segs.len() > 15, "{}", segs.len());
    assert_contents(&stream, &segs);
    assert_eq!(segs[0].start_sample, 0);
    // the last piece holds the end of the speech (a split that falls in
    // the silence after it cuts there, mid-pause)
    let end = segs.last().unwrap().end_sample;
    assert!((1875 * F..1875 * F + 16 * F).contains(&end), "{end}");
    for pair in segs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(a.forced_split && b.continues_previous);
        assert!(a.end_sample - a.start_sample <= 32_000);
        // every cut is after a frame of a quiet stretch, never after the
        // single quiet frame inside the speech
        let last_frame = a.end_sample / F - 1;
        assert!(
            (10..=15).contains(&(last_frame % 20)),
            "cut after frame {last_frame}"
        );
        // and the continuation repeats 500 ms (a quarter of the limit) before it
        assert_eq!(b.overlap_samples, 8_000);
        assert_eq!(b.start_sample + b.overlap_samples, a.end_sample);
    }
}

#[test]
fn segment_bounds_pre_roll_and_contents() {
    let mut t = tracker(base());
    let out = run(&mut t, &pattern(40, 30, 40));
    assert_eq!(out.len(), 1);
    let (_, seg) = &out[0];
    // 200 ms pre-roll = 3200 samples before frame 40.
    assert_eq!(seg.start_sample, 40 * F - 3200);
    assert_eq!(seg.end_sample, 70 * F);
    assert!(!seg.forced_split);
    assert_eq!(
        seg.samples,
        expected_audio(seg.start_sample, seg.end_sample)
    );
    assert_eq!(
        t.stats(),
        VadStats {
            frames: 110,
            speech_frames: 30,
            segments: 1,
            discarded_short: 0,
            forced_splits: 0
        }
    );
}

#[test]
fn pre_roll_is_clamped_at_stream_start() {
    let mut t = tracker(base());
    let out = run(&mut t, &pattern(3, 30, 40));
    let (_, seg) = &out[0];
    assert_eq!(seg.start_sample, 0);
    assert_eq!(seg.end_sample, 33 * F);
    assert_eq!(seg.samples, expected_audio(0, 33 * F));

    let mut t = tracker(base());
    let out = run(&mut t, &pattern(0, 30, 40));
    assert_eq!(out[0].1.start_sample, 0);
}

#[test]
fn emitted_exactly_when_hangover_has_elapsed() {
    // 500 ms = 8000 samples = 31.25 frames: the 32nd silent frame closes it.
    let mut t = tracker(base());
    let out = run(&mut t, &pattern(20, 30, 31));
    assert!(out.is_empty(), "closed before the hangover elapsed");
    assert!(t.in_utterance());
    let seg = t
        .push_frame(&frame(81), 0.0)
        .expect("closes on the 32nd silent frame");
    assert_eq!(seg.end_sample, 50 * F);
    assert_eq!(t.position() - seg.end_sample, 32 * F);
    assert!(!t.in_utterance());
}

#[test]
fn zero_hangover_closes_on_first_silent_frame() {
    let mut t = tracker(VadConfig {
        hangover_ms: 0,
        ..base()
    });
    let out = run(&mut t, &pattern(20, 30, 5));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 50);
    assert_eq!(out[0].1.end_sample, 50 * F);
}

#[test]
fn pauses_shorter_than_hangover_are_bridged() {
    let mut decisions = pattern(20, 20, 25);
    decisions.extend(pattern(0, 20, 40));
    let mut t = tracker(base());
    let out = run(&mut t, &decisions);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.end_sample, 85 * F);
    assert_eq!(
        out[0].1.samples,
        expected_audio(out[0].1.start_sample, 85 * F)
    );
}

#[test]
fn utterances_shorter_than_min_speech_are_discarded() {
    // 250 ms = 4000 samples = 15.6 frames.
    let mut t = tracker(base());
    assert!(run(&mut t, &pattern(20, 15, 40)).is_empty());
    assert_eq!(t.stats().discarded_short, 1);
    assert_eq!(t.stats().segments, 0);

    let mut t = tracker(base());
    let out = run(&mut t, &pattern(20, 16, 40));
    assert_eq!(out.len(), 1);
    assert_eq!(t.stats().discarded_short, 0);
}

#[test]
fn speech_span_counts_not_voiced_frames() {
    // Two 5-frame blips 10 frames apart: span 20 frames (320 ms) >= 250 ms.
    let mut decisions = pattern(20, 5, 10);
    decisions.extend(pattern(0, 5, 40));
    let mut t = tracker(base());
    let out = run(&mut t, &decisions);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.end_sample, 40 * F);
}

#[test]
fn next_pre_roll_never_reaches_into_the_previous_segment() {
    let config = VadConfig {
        hangover_ms: 100,
        pre_roll_ms: 500,
        ..base()
    };
    let mut decisions = pattern(40, 20, 8);
    decisions.extend(pattern(0, 20, 40));
    let mut t = tracker(config);
    let out = run(&mut t, &decisions);
    assert_eq!(out.len(), 2);
    let (a, b) = (&out[0].1, &out[1].1);
    assert_eq!(a.end_sample, 60 * F);
    // The 100 ms hangover is 6.25 frames: closed at the 7th silent frame; the second
    // segment's pre-roll holds the 8 silent frames since the first one's end.
    assert_eq!(b.start_sample, a.end_sample);
    assert_eq!(b.end_sample, 88 * F);
    assert_eq!(b.samples, expected_audio(b.start_sample, b.end_sample));
}

#[test]
fn forced_split_emits_contiguous_pieces() {
    let config = exact_split(1000);
    let mut t = tracker(config);
    // 1000 ms = 16000 samples = 62.5 frames.
    let out = run(&mut t, &pattern(0, 150, 40));
    let segs: Vec<&Segment> = out.iter().map(|(_, s)| s).collect();
    assert_eq!(segs.len(), 3);
    assert!(segs[0].forced_split && segs[1].forced_split && !segs[2].forced_split);
    assert_eq!(segs[0].start_sample, 0);
    // 62 frames (15 872 samples) fit; a 63rd would not.
    assert_eq!(segs[0].end_sample, 62 * F);
    assert_eq!(segs[1].start_sample, 62 * F);
    assert_eq!(segs[1].end_sample, 124 * F);
    assert_eq!(segs[2].start_sample, 124 * F);
    assert_eq!(segs[2].end_sample, 150 * F);
    for s in &segs {
        assert_eq!(s.samples, expected_audio(s.start_sample, s.end_sample));
    }
    // Forced splits are emitted at once, on the frame that reaches the limit.
    assert_eq!(out[0].0, 61);
    assert_eq!(t.stats().forced_splits, 2);
    assert_eq!(t.stats().segments, 3);
}

#[test]
fn short_tail_after_forced_split_is_kept() {
    let config = exact_split(1000);
    let mut t = tracker(config);
    // Speech runs 4 frames past the split: shorter than min_speech, but it is the rest of the utterance.
    let out = run(&mut t, &pattern(0, 66, 40));
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].1.start_sample, 62 * F);
    assert_eq!(out[1].1.end_sample, 66 * F);
    assert_eq!(t.stats().discarded_short, 0);
}

#[test]
fn split_exactly_at_speech_end_leaves_nothing_behind() {
    let config = exact_split(1000);
    let mut t = tracker(config);
    let out = run(&mut t, &pattern(0, 62, 60));
    assert_eq!(out.len(), 1);
    assert!(out[0].1.forced_split);
    assert_eq!(t.stats().segments, 1);
    assert_eq!(t.stats().discarded_short, 0);
    assert!(!t.in_utterance());
    assert!(t.finish().is_none());
}

#[test]
fn finish_closes_open_utterance_and_restarts_positions() {
    let mut t = tracker(base());
    assert!(run(&mut t, &pattern(20, 30, 5)).is_empty());
    let seg = t.finish().expect("open utterance is closed");
    assert_eq!(seg.end_sample, 50 * F);
    assert_eq!(seg.samples.len() as u64, seg.end_sample - seg.start_sample);
    assert_eq!(t.position(), 0);
    assert!(t.finish().is_none());

    // A short one is still discarded at finish.
    assert!(run(&mut t, &pattern(20, 5, 0)).is_empty());
    assert!(t.finish().is_none());
    assert_eq!(t.stats().discarded_short, 1);
}

#[test]
fn zero_pre_roll_starts_at_first_speech_frame() {
    let mut t = tracker(VadConfig {
        pre_roll_ms: 0,
        ..base()
    });
    let out = run(&mut t, &pattern(40, 30, 40));
    assert_eq!(out[0].1.start_sample, 40 * F);
}

#[test]
fn threshold_is_inclusive() {
    let mut t = tracker(VadConfig {
        threshold: 0.7,
        ..base()
    });
    for k in 0..20 {
        assert!(t.push_frame(&frame(k), 0.7).is_none());
    }
    let mut emitted = Vec::new();
    for k in 20..60 {
        if let Some(seg) = t.push_frame(&frame(k), 0.69) {
            emitted.push((k, seg.end_sample));
        }
    }
    // 0.7 counts as speech, 0.69 does not: the segment ends after frame 19 and
    // closes on the 32nd frame below the threshold.
    assert_eq!(emitted, vec![(51, 20 * F)]);
    assert_eq!(t.stats().speech_frames, 20);
}

#[test]
fn an_open_utterance_split_at_a_pause_keeps_only_what_follows() {
    // 10 frames of speech, 20 of silence, 30 of speech: still one open
    // utterance under the 500 ms hangover; cut where the second speech's
    // pre-roll begins, it closes as the second speech alone.
    let mut t = tracker(VadConfig {
        pre_roll_ms: 0,
        ..base()
    });
    let decisions = pattern(2, 10, 20);
    let mut k = 0;
    for &d in &decisions {
        assert!(t.push_frame(&frame(k), if d { 0.9 } else { 0.1 }).is_none());
        k += 1;
    }
    for _ in 0..30 {
        assert!(t.push_frame(&frame(k), 0.9).is_none());
        k += 1;
    }
    let resume = 32 * F;
    // outside the utterance or after its speech: nothing happens
    t.split_open(0, resume);
    t.split_open(63 * F, resume);
    assert_eq!(t.open_utterance().unwrap().start_sample, 2 * F);
    t.split_open(resume - F, resume);
    let open = t.open_utterance().unwrap();
    assert_eq!(open.start_sample, resume - F);
    assert_eq!(open.first_speech, resume);
    assert!(open.confident_end.is_some_and(|c| c == 62 * F));
    assert_eq!(open.samples_to_now, &expected_audio(resume - F, 62 * F)[..]);
    let seg = t.end_utterance().unwrap();
    assert_eq!((seg.start_sample, seg.end_sample), (resume - F, 62 * F));
    assert_eq!(seg.samples, expected_audio(resume - F, 62 * F));
    assert!(!seg.continues_previous);
}
