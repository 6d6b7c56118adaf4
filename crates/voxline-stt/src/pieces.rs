//! What whisper is given of an utterance: its long pauses shortened
//! ([`compact_pauses`]), and, when a transcript heard too few words for its
//! audio, the audio cut into pieces at its quietest points ([`pieces`]) for
//! a second reading.

use crate::SAMPLE_RATE;

/// Longest piece a sparse transcript's audio is transcribed again in,
/// seconds: whisper reads a few seconds of speech reliably; a dense 10–20 s
/// window is where tiny.en stopped after its first word.
pub const MAX_PIECE_S: f64 = 8.0;

/// Energy frames of 16 ms, smoothed over this many on either side when a
/// cut is placed (176 ms, the gap between two words rather than a stop
/// inside one, as the endpointer's forced split does).
const SMOOTH_FRAMES: usize = 5;

/// Samples in one energy frame (16 ms).
const FRAME: usize = SAMPLE_RATE as usize / 1000 * 16;

/// How far under the loud frames (the 95th percentile of the 16 ms frames'
/// energy) a frame still sounds, dB: speech's syllables vary by ~15 dB, the
/// pauses of a quiet room lie 30 dB and more below them.
const SOUNDING_WITHIN_DB: f64 = 25.0;

/// A pause longer than this, ms, is shortened to [`KEPT_PAUSE_MS`] before
/// whisper hears it. A shorter one is how whisper tells one sentence from
/// two: "Seven of clubs." | a second | "Go forward ten meters." ran together
/// as one sentence with a 1 s pause cut to 300 ms.
pub const LONG_PAUSE_MS: u32 = 1_200;

/// What is kept of a long pause, ms: half at either end, so the words on
/// both sides keep their tails and the gap between them still reads as one.
pub const KEPT_PAUSE_MS: u32 = 600;

/// Per 16 ms frame of `samples`: whether it sounds (within
/// [`SOUNDING_WITHIN_DB`] of the loud frames and above -70 dBFS).
fn sounding_frames(samples: &[f32]) -> Vec<bool> {
    let energy: Vec<f64> = samples
        .chunks(FRAME)
        .map(|f| f.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / f.len() as f64)
        .map(|e| if e.is_finite() { e } else { 0.0 })
        .collect();
    if energy.is_empty() {
        return Vec::new();
    }
    let mut sorted = energy.clone();
    let k = (sorted.len() * 95 / 100).min(sorted.len() - 1);
    let (_, loud, _) = sorted.select_nth_unstable_by(k, f64::total_cmp);
    let floor = (*loud * 10f64.powf(-SOUNDING_WITHIN_DB / 10.0)).max(1e-7);
    energy.iter().map(|&e| e >= floor).collect()
}

/// Utterances at most this long (seconds) are read as they are: in a few
/// seconds of speech a pause is how whisper tells one sentence from two,
/// and the turn-taking reads its punctuation on held speech (two questions
/// 1.5 s apart, their pause shortened, were once heard as one turn).
/// Invented and dropped words came only in long, mostly silent windows.
pub const COMPACT_AFTER_S: f64 = MAX_PIECE_S;

/// `samples`, when longer than [`COMPACT_AFTER_S`], with every pause (frames
/// that do not sound) longer than [`LONG_PAUSE_MS`] shortened to
/// [`KEPT_PAUSE_MS`]: what whisper reads.
/// "My account number is … three … seven …", said 1.8 s apart and joined
/// into one turn, reads as the digits said at an ordinary pace; tiny.en
/// drops and invents words in long silences (faster-whisper's VAD filter
/// takes the pauses out for the same reason). Speech, and audio with no
/// quiet (a question over babble), is unchanged.
#[must_use]
pub fn compact_pauses(samples: &[f32]) -> std::borrow::Cow<'_, [f32]> {
    if samples.len() as f64 <= COMPACT_AFTER_S * f64::from(SAMPLE_RATE) {
        return std::borrow::Cow::Borrowed(samples);
    }
    let frames = sounding_frames(samples);
    let ms_frames = |ms: u32| (ms as usize * SAMPLE_RATE as usize / 1000).div_ceil(FRAME);
    let (long, kept) = (ms_frames(LONG_PAUSE_MS), ms_frames(KEPT_PAUSE_MS));
    // the runs of quiet frames to shorten: (first frame, end frame)
    let mut cuts = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        if frames[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < frames.len() && !frames[i] {
            i += 1;
        }
        if i - start > long {
            cuts.push((start + kept / 2, i - (kept - kept / 2)));
        }
    }
    if cuts.is_empty() {
        return std::borrow::Cow::Borrowed(samples);
    }
    let mut out = Vec::with_capacity(samples.len());
    let mut from = 0;
    for (a, b) in cuts {
        out.extend_from_slice(&samples[from..(a * FRAME).min(samples.len())]);
        from = (b * FRAME).min(samples.len());
    }
    out.extend_from_slice(&samples[from..]);
    std::borrow::Cow::Owned(out)
}

/// Seconds of `samples` that sound: 16 ms frames within
/// [`SOUNDING_WITHIN_DB`] of the loud ones (and above -70 dBFS). A
/// transcript is held to a speaking rate over these, not over the pauses
/// between them: "three … seven … one", 1.8 s apart, is as many words as it
/// sounds, while 18 s of dense speech heard as "The" is not.
#[must_use]
pub fn sounding_s(samples: &[f32]) -> f64 {
    let sounding = sounding_frames(samples).iter().filter(|&&s| s).count();
    sounding as f64 * FRAME as f64 / f64::from(SAMPLE_RATE)
}

/// Where `samples` is cut into pieces of at most `max_s` seconds: the sample
/// index each piece after the first starts at (empty when the audio fits in
/// one). Each cut is at the quietest point (mean square over the 16 ms frame
/// and [`SMOOTH_FRAMES`] on either side) of the second half of the piece it
/// ends, so a piece is at least half `max_s` long, and no word is cut where
/// a pause lies within reach.
#[must_use]
pub fn quiet_cuts(samples: &[f32], max_s: f64) -> Vec<usize> {
    let max = ((max_s * f64::from(SAMPLE_RATE)) as usize / FRAME).max(2);
    let energy: Vec<f64> = samples
        .chunks(FRAME)
        .map(|f| {
            let e = f.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / f.len() as f64;
            // out-of-range input is never the quietest
            if e.is_finite() {
                e
            } else {
                f64::INFINITY
            }
        })
        .collect();
    let smoothed = |i: usize| {
        let (a, b) = (
            i.saturating_sub(SMOOTH_FRAMES),
            (i + SMOOTH_FRAMES + 1).min(energy.len()),
        );
        energy[a..b].iter().sum::<f64>() / (b - a) as f64
    };
    let mut cuts = Vec::new();
    let mut start = 0;
    while energy.len() - start > max {
        let from = start + max / 2;
        let to = start + max;
        let quietest = (from..to)
            .min_by(|&a, &b| smoothed(a).total_cmp(&smoothed(b)))
            .unwrap_or(to);
        // the cut after the quietest frame's middle
        let cut = quietest * FRAME + FRAME / 2;
        cuts.push(cut.min(samples.len()));
        start = quietest + 1;
    }
    cuts
}

/// `samples` cut at [`quiet_cuts`] into pieces of at most `max_s` seconds.
#[must_use]
pub fn pieces(samples: &[f32], max_s: f64) -> Vec<&[f32]> {
    let mut out = Vec::new();
    let mut from = 0;
    for cut in quiet_cuts(samples, max_s) {
        out.push(&samples[from..cut]);
        from = cut;
    }
    out.push(&samples[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(secs: f64, amp: f32) -> Vec<f32> {
        (0..(secs * 16_000.0) as usize)
            .map(|i| amp * (i as f32 * 0.07).sin())
            .collect()
    }

    #[test]
    fn only_what_sounds_counts_not_the_pauses_between() {
        let mut a = Vec::new();
        for _ in 0..5 {
            a.extend(tone(0.5, 0.3));
            a.extend(tone(1.5, 0.0003)); // 60 dB down: a quiet room
        }
        let s = sounding_s(&a);
        assert!((2.3..=2.7).contains(&s), "{s}");
        // babble 14 dB under the voice sounds throughout
        let mut b = tone(10.0, 0.06);
        for (i, x) in b.iter_mut().enumerate().take(48_000) {
            *x += 0.3 * (i as f32 * 0.11).sin();
        }
        assert!(sounding_s(&b) > 9.5, "{}", sounding_s(&b));
        assert!(sounding_s(&[]) < 1e-9);
        assert!(sounding_s(&vec![0.0; 32_000]) < 1e-9);
    }

    #[test]
    fn long_pauses_are_shortened_and_the_sound_is_kept_whole() {
        // "digits" of 0.4 s, 1.8 s apart, in a quiet room
        let mut a = tone(0.3, 0.0003);
        for _ in 0..4 {
            a.extend(tone(0.4, 0.3));
            a.extend(tone(1.8, 0.0003));
        }
        let c = compact_pauses(&a);
        let secs = c.len() as f64 / 16_000.0;
        // 1.6 s of sound, 0.3 s before it, four pauses of 0.6 s
        assert!((4.0..=4.4).contains(&secs), "{secs}");
        assert!((sounding_s(&c) - sounding_s(&a)).abs() < 0.05);
        // the loud samples are all there, in order
        let loud: Vec<f32> = a.iter().copied().filter(|x| x.abs() > 0.01).collect();
        let kept: Vec<f32> = c.iter().copied().filter(|x| x.abs() > 0.01).collect();
        assert_eq!(loud, kept);
        // no quiet at all, or pauses short enough: not copied
        for unchanged in [tone(10.0, 0.2), {
            let mut b = tone(1.0, 0.3);
            b.extend(tone(0.4, 0.0));
            b.extend(tone(1.0, 0.3));
            b
        }] {
            assert!(matches!(
                compact_pauses(&unchanged),
                std::borrow::Cow::Borrowed(_)
            ));
        }
        assert!(compact_pauses(&[]).is_empty());
        // a few seconds keep their pauses, even long ones
        let mut pair = tone(2.0, 0.3);
        pair.extend(tone(1.5, 0.0));
        pair.extend(tone(2.5, 0.3));
        assert!(matches!(
            compact_pauses(&pair),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn short_audio_is_one_piece() {
        let a = tone(7.9, 0.3);
        assert!(quiet_cuts(&a, MAX_PIECE_S).is_empty());
        assert_eq!(pieces(&a, MAX_PIECE_S).len(), 1);
        assert_eq!(pieces(&[], MAX_PIECE_S), vec![&[] as &[f32]]);
    }

    #[test]
    fn long_audio_is_cut_in_its_pauses_and_every_sample_is_kept() {
        // 3 s of sound, 0.6 s pause, four times over: 14.4 s
        let mut a = Vec::new();
        let mut pauses = Vec::new();
        for _ in 0..4 {
            a.extend(tone(3.0, 0.3));
            pauses.push(a.len()..a.len() + 9_600);
            a.extend(std::iter::repeat_n(0.0, 9_600));
        }
        let cuts = quiet_cuts(&a, MAX_PIECE_S);
        assert!(!cuts.is_empty());
        for c in &cuts {
            assert!(
                pauses.iter().any(|p| p.contains(c)),
                "cut at {c} not in a pause"
            );
        }
        let ps = pieces(&a, MAX_PIECE_S);
        assert_eq!(ps.iter().map(|p| p.len()).sum::<usize>(), a.len());
        assert!(
            ps.iter().all(|p| p.len() <= 8 * 16_000),
            "{:?}",
            ps.iter().map(|p| p.len()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn unbroken_sound_is_still_cut_within_the_limit_and_bad_samples_are_never_the_cut() {
        let mut a = tone(30.0, 0.3);
        a[5 * 16_000] = f32::NAN;
        a[6 * 16_000] = f32::INFINITY;
        let ps = pieces(&a, MAX_PIECE_S);
        assert!(ps.len() >= 4, "{}", ps.len());
        assert!(ps.iter().all(|p| p.len() <= 8 * 16_000 + FRAME));
        assert_eq!(ps.iter().map(|p| p.len()).sum::<usize>(), a.len());
        let cuts = quiet_cuts(&a, MAX_PIECE_S);
        assert!(cuts.windows(2).all(|w| w[0] < w[1]));
    }
}
