//! What is done with transcripts' text: word error rate, joining the
//! chunks of long speech, and spotting a transcript too short for its audio.

use crate::normalise;

/// Word error rate of `hypothesis` against `reference` (after [`normalise`],
/// so `10` and `ten`, `Mr.` and `mister` are the same word):
/// word-level edit distance / reference words. An empty reference gives 0
/// for an empty hypothesis and 1 otherwise.
#[must_use]
pub fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let (r, h) = (normalise(reference), normalise(hypothesis));
    if r.is_empty() {
        return if h.is_empty() { 0.0 } else { 1.0 };
    }
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut cur = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            let sub = prev[j] + usize::from(rw != hw);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[h.len()] as f64 / r.len() as f64
}

/// Most words of the previous chunk's transcript [`join_continuation`]
/// compares with the start of the next one.
pub const MAX_OVERLAP_WORDS: usize = 16;

/// Words at either edge of an overlap that may differ (a word the cut or the
/// lead-in's start clipped) and still be dropped with it.
pub const OVERLAP_SLACK_WORDS: usize = 2;

/// The text of a continuation (a chunk whose audio starts with a lead-in that
/// repeats the end of the previous chunk) without the words it repeats: the
/// longest run of [`normalise`]d words that ends the previous transcript
/// (`previous`, already normalised) and starts `text`, dropped from `text`
/// with everything before it. Up to [`OVERLAP_SLACK_WORDS`] words may
/// separate the run from either edge (clipped words the two transcripts hear
/// differently); a run so placed must be at least two words long. The run is
/// at most [`MAX_OVERLAP_WORDS`] long; the longest wins, then the one closest
/// to the edges. Without such a run nothing is dropped (a repeated word is
/// better than a lost one).
///
/// Returns the remaining text (whitespace-separated pieces of `text`, as
/// whisper wrote them) and how many normalised words were dropped.
#[must_use]
pub fn join_continuation(previous: &[String], text: &str) -> (String, usize) {
    let pieces: Vec<(&str, usize)> = text
        .split_whitespace()
        .map(|p| (p, normalise(p).len()))
        .collect();
    let words = normalise(text);
    let prev = &previous[previous
        .len()
        .saturating_sub(MAX_OVERLAP_WORDS + OVERLAP_SLACK_WORDS)..];
    // (run length, slack used, words to drop)
    let mut best: Option<(usize, usize, usize)> = None;
    for skip_new in 0..=OVERLAP_SLACK_WORDS.min(words.len()) {
        for skip_prev in 0..=OVERLAP_SLACK_WORDS.min(prev.len()) {
            let room = MAX_OVERLAP_WORDS
                .min(words.len() - skip_new)
                .min(prev.len() - skip_prev);
            let min_run = if skip_new + skip_prev > 0 { 2 } else { 1 };
            let end = prev.len() - skip_prev;
            let Some(run) = (min_run..=room)
                .rev()
                .find(|&k| prev[end - k..end] == words[skip_new..skip_new + k])
            else {
                continue;
            };
            let slack = skip_new + skip_prev;
            if best.is_none_or(|(k, s, _)| run > k || (run == k && slack < s)) {
                best = Some((run, slack, skip_new + run));
            }
        }
    }
    let Some((_, _, drop)) = best else {
        return (text.trim().to_string(), 0);
    };
    let mut dropped = 0;
    let rest: Vec<&str> = pieces
        .into_iter()
        .filter(|&(_, n)| {
            let keep = dropped >= drop;
            dropped += n;
            keep
        })
        .map(|(p, _)| p)
        .collect();
    (rest.join(" "), drop)
}

/// A transcript with fewer words per second of audio than this, for an
/// utterance longer than [`CHECKED_AFTER_S`], may be a failed transcription
/// (whisper heard "The" in 20 s of speech): the stage reads its audio again
/// in pieces ([`crate::pieces`]) and keeps the reading with more words.
/// Sparse speech (digits 1.8 s apart, fillers, a question over babble) is
/// below it too, so it is never an error by itself.
pub const MIN_WORDS_PER_S: f64 = 0.5;

/// Utterances at most this long (seconds) are not held to [`MIN_WORDS_PER_S`]:
/// a short one may be a single word.
pub const CHECKED_AFTER_S: f64 = 5.0;

/// Why a transcript may be short of its audio's words, if it is: fewer
/// than [`MIN_WORDS_PER_S`] words per second over more than
/// [`CHECKED_AFTER_S`] seconds.
#[must_use]
pub fn implausibly_short(text: &str, audio_s: f64) -> Option<String> {
    let words = normalise(text).len();
    let rate = words as f64 / audio_s;
    (audio_s > CHECKED_AFTER_S && rate < MIN_WORDS_PER_S).then(|| {
        format!(
            "whisper heard only {words} word{} ({text:?}) in {audio_s:.1} s of speech \
             ({rate:.2} words/s, under {MIN_WORDS_PER_S})",
            if words == 1 { "" } else { "s" }
        )
    })
}

/// Words of hesitation: said while thinking, never a request in themselves.
const HESITATIONS: &[&str] = &[
    "um", "umm", "uh", "uhm", "uhh", "er", "erm", "eh", "ah", "hmm", "hm", "mm", "so", "well",
    "like",
];

/// Whether `text` holds words and every one of them is a hesitation ("Um…
/// so… well…"), said without a question mark: a speaker thinking aloud,
/// which nothing answers (the question that follows is its own turn).
#[must_use]
pub fn hesitation_only(text: &str) -> bool {
    let words: Vec<String> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    !words.is_empty()
        && !text.trim_end().ends_with('?')
        && words.iter().all(|w| HESITATIONS.contains(&w.as_str()))
}

/// A transcript whose no-speech probability ([`crate::Confidence::no_speech`])
/// is above this is whisper's guess at a sound, not words: faster-whisper's
/// threshold, 0.6. Measured on tiny.en (`cargo bench --bench noise`): hums
/// (1.5-8 s, alone and in room noise), tones, chords, a melody, noise, a
/// fan and clicks at -3, -10 and -26 dBFS scored 0.58-0.95; 21 recordings
/// of real people and espeak-ng questions, as recorded, 20 and 30 dB
/// quieter and over a 50 Hz hum, 0.01-0.41.
pub const NOISE_MIN_NO_SPEECH: f32 = 0.6;

/// Between this and [`NOISE_MIN_NO_SPEECH`] whisper is unsure whether it
/// heard speech; a transcript there is a sound when whisper is unsure of
/// its words too (mean token log-probability under
/// [`UNSURE_MAX_AVG_LOGPROB`]). Measured: a 440 Hz tone at -3 dBFS scored
/// 0.58 with -0.87; no speech clip scored over 0.41.
pub const UNSURE_MIN_NO_SPEECH: f32 = 0.5;

/// See [`UNSURE_MIN_NO_SPEECH`]: the speech measured scored -0.73 to -0.06,
/// and none of it over 0.41 no-speech; the sounds' guesses with text -0.34
/// to -1.42.
pub const UNSURE_MAX_AVG_LOGPROB: f32 = -0.5;

/// Why the transcript `text` is whisper's guess at a sound rather than
/// words, from its own signals (`c`): its no-speech probability is over
/// [`NOISE_MIN_NO_SPEECH`], or over [`UNSURE_MIN_NO_SPEECH`] with a mean
/// token log-probability under [`UNSURE_MAX_AVG_LOGPROB`]. `None`: words.
/// faster-whisper asks for both a no-speech probability over 0.6 and a
/// mean log-probability under -1.0; on tiny.en the guesses at the sounds
/// measured score -0.3 to -1.4 (a hum heard as "How far?" would pass it),
/// so over 0.6 the log-probability is not required.
#[must_use]
pub fn not_words(text: &str, c: crate::Confidence) -> Option<String> {
    if c.no_speech > NOISE_MIN_NO_SPEECH {
        return Some(format!(
            "whisper heard {text:?} but judged it a sound, not words (no-speech probability \
             {:.2}, over {NOISE_MIN_NO_SPEECH}; mean token log-probability {:.2})",
            c.no_speech, c.avg_logprob
        ));
    }
    (c.no_speech > UNSURE_MIN_NO_SPEECH && c.avg_logprob < UNSURE_MAX_AVG_LOGPROB).then(|| {
        format!(
            "whisper heard {text:?} but was unsure of speech and of its words (no-speech \
             probability {:.2}, over {UNSURE_MIN_NO_SPEECH}; mean token log-probability {:.2}, \
             under {UNSURE_MAX_AVG_LOGPROB})",
            c.no_speech, c.avg_logprob
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_is_noise_when_whisper_says_no_speech() {
        let c = |no_speech, avg_logprob| crate::Confidence {
            no_speech,
            avg_logprob,
        };
        // the measured extremes: a sound at 0.62, quiet speech at 0.41
        assert!(not_words("How far?", c(0.62, -0.5)).is_some());
        assert!(not_words("How far?", c(0.92, -0.1)).is_some());
        assert!(not_words("Will it be Sunday tomorrow?", c(0.41, -0.21)).is_none());
        assert!(not_words("7 of clubs.", c(0.03, -0.59)).is_none());
        // unsure of both: the 440 Hz tone at -3 dBFS
        assert!(not_words("Ring.", c(0.576, -0.87)).is_some());
        // unsure of speech, sure of the words; or sure of speech
        assert!(not_words("How far away is the moon?", c(0.55, -0.2)).is_none());
        assert!(not_words("7 of clubs.", c(0.45, -0.9)).is_none());
        let why = not_words("How far?", c(0.84, -1.1)).unwrap();
        assert!(
            why.contains("\"How far?\"") && why.contains("0.84"),
            "{why}"
        );
    }

    #[test]
    fn wer_counts_edits_over_reference_words() {
        assert_eq!(
            word_error_rate(
                "What is the capital of France?",
                "what is the capital of france"
            ),
            0.0
        );
        assert!((word_error_rate("a b c d", "a x c d") - 0.25).abs() < 1e-9);
        assert!((word_error_rate("a b c d", "a c d") - 0.25).abs() < 1e-9);
        assert!((word_error_rate("a b", "a b c d") - 1.0).abs() < 1e-9);
        assert_eq!(word_error_rate("", ""), 0.0);
        assert_eq!(word_error_rate("", "x"), 1.0);
        assert_eq!(normalise("Two-plus two's"), vec!["2", "plus", "two's"]);
        // numbers and abbreviations as whisper writes them are not errors
        assert_eq!(
            word_error_rate(
                "Mr. Smith walked ten miles",
                "Mister Smith walked 10 miles."
            ),
            0.0
        );
        assert!((word_error_rate("twenty five apples", "25 5 apples") - 0.5).abs() < 1e-9);
    }

    fn words(s: &str) -> Vec<String> {
        normalise(s)
    }

    #[test]
    fn continuation_drops_the_words_its_lead_in_repeats() {
        let prev = words("Every morning the old man walked slowly along the river");
        // an exact overlap
        assert_eq!(
            join_continuation(&prev, "along the river with his small brown dog."),
            ("with his small brown dog.".to_string(), 3)
        );
        // case and punctuation do not matter; whisper's spelling of the rest is kept
        assert_eq!(
            join_continuation(&prev, "Along the River, with his dog."),
            ("with his dog.".to_string(), 3)
        );
        // the lead-in's first word clipped into another word: dropped with the overlap
        assert_eq!(
            join_continuation(&prev, "song the river with his dog"),
            ("with his dog".to_string(), 3)
        );
        // the previous chunk's last word clipped by the cut
        let clipped = words("the old man walked slowly along the riv");
        assert_eq!(
            join_continuation(&clipped, "slowly along the river with his dog"),
            ("river with his dog".to_string(), 3)
        );
        // the longest overlap wins over a shorter one ("the")
        let prev2 = words("x the capital of the");
        assert_eq!(
            join_continuation(&prev2, "the capital of the moon"),
            ("moon".to_string(), 4)
        );
    }

    #[test]
    fn continuation_without_an_overlap_is_kept_whole() {
        let prev = words("the old man walked slowly");
        // nothing in common: nothing dropped
        assert_eq!(
            join_continuation(&prev, "tell me a story"),
            ("tell me a story".to_string(), 0)
        );
        // one word shared away from the edges is not enough
        assert_eq!(
            join_continuation(&words("a b man c"), "x man y z"),
            ("x man y z".to_string(), 0)
        );
        // but one word shared exactly at the edges is an overlap
        assert_eq!(
            join_continuation(&prev, "slowly along"),
            ("along".to_string(), 1)
        );
        // empty sides
        assert_eq!(join_continuation(&[], "a b"), ("a b".to_string(), 0));
        assert_eq!(join_continuation(&prev, ""), (String::new(), 0));
        // the whole continuation repeated: nothing left
        assert_eq!(
            join_continuation(&prev, "walked slowly."),
            (String::new(), 2)
        );
        // a piece holding several words is dropped whole once one of them overlaps
        assert_eq!(
            join_continuation(&words("it is two"), "two-plus three"),
            ("three".to_string(), 1)
        );
    }

    #[test]
    fn only_hesitations_is_thinking_aloud_and_anything_more_is_a_request() {
        for t in [
            "So. Well. So. Well.",
            "So... Well... Um... Uh...",
            "well, well, well,",
            "Uh so",
            "Hmm.",
        ] {
            assert!(hesitation_only(t), "{t:?}");
        }
        for t in [
            "",
            "...",
            "Well?",
            "So what time is it",
            "Um, what is the capital of France?",
            "I like it",
        ] {
            assert!(!hesitation_only(t), "{t:?}");
        }
    }

    #[test]
    fn a_transcript_too_short_for_its_audio_is_flagged() {
        let why = implausibly_short("The", 20.0).expect("1 word in 20 s");
        assert!(why.contains("1 word") && why.contains("20.0 s"), "{why}");
        assert!(implausibly_short("", 6.0).is_some());
        // at the floor or above: fine
        assert!(implausibly_short("one two three", 6.0).is_none());
        // short utterances may be a single word
        assert!(implausibly_short("Yes.", 5.0).is_none());
        assert!(implausibly_short("", 1.0).is_none());
    }
}
