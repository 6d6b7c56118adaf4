//! The echo guard: what the voice said and how loud it played, against
//! what the microphone hears (see the [module](super) documentation).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{words, BargeIn, KEEP};

/// How long after the voice last sounded the microphone may still hear it
/// (the sound server's buffering and the room).
pub const ECHO_TAIL: Duration = Duration::from_millis(600);

/// How far back the assistant's words are compared with what is heard.
pub const ECHO_MEMORY: Duration = Duration::from_secs(60);

/// The share of a transcript's word pairs that must be the assistant's
/// own for it to be echo.
pub const ECHO_MIN_SHARE: f64 = 0.6;

/// How much later than it played the microphone may hear the voice (the
/// sound server's buffering on both sides, the room): the lags searched.
pub const ECHO_MAX_LAG: Duration = Duration::from_millis(500);

/// The correlation of the heard level with the played level (at the best
/// lag) from which what was heard is the voice itself. Measured through
/// PulseAudio with a loopback echo path (`live` tests): the voice's own
/// echo at -12 dB (espeak-ng) and -6 dB (Piper) scored 0.94-1.00; a user's
/// "uh-huh" over the voice, with no echo path, 0.60 and 0.68 (short
/// sounds line up with a level by chance more easily).
pub const ECHO_MIN_LIKENESS: f32 = 0.85;

/// How much of what the microphone heard an echo canceller must have taken
/// out for what is left to be its trace of the voice, judged by the level
/// before it. Through PulseAudio it took 51-63 dB out of the voice's echo
/// (`cargo bench --bench echo`), and a canceller still converging takes
/// some: what it leaks is judged as echo. A person's word over the voice
/// at −6 dB kept all but 6 dB of what the microphone heard (the `aec`
/// test `a_word_over_the_voice_is_the_persons_once_the_echo_is_taken_out`).
pub const ECHO_TAKEN_DB: f32 = 10.0;

/// The fewest frames (20 ms) the levels are compared over: a shorter sound
/// lines up with the voice by chance.
const ECHO_MIN_FRAMES: usize = 25;

/// The frames the levels are compared over.
const ECHO_FRAME: Duration = Duration::from_millis(20);

/// A frame of the microphone's this far under full scale (dB) is digital
/// silence. While the voice sounded, no microphone was there to hear it (a
/// capture that just moved to another device, a muted input): its level
/// says nothing of what was heard, and it is left out of the comparison;
/// a room is never this quiet.
const DIGITAL_SILENCE_DB: f32 = -80.0;

/// The fewest frames the levels are compared over once digital silence is
/// left out (the utterance itself still needs [`ECHO_MIN_FRAMES`]).
const ECHO_MIN_HEARD_FRAMES: usize = 15;

/// The word of the annotation an echo's transcript becomes
/// (`[echo: …]`).
pub const ECHO_ANNOTATION: &str = "echo";

/// Pearson's correlation of two series of levels in dB, `a` and `b` (as
/// long); `None` when either is flat (it moves by under 1 dB: nothing to
/// follow).
#[must_use]
pub fn level_correlation(a: &[f32], b: &[f32]) -> Option<f32> {
    let n = a.len().min(b.len()) as f32;
    let (ma, mb) = (a.iter().sum::<f32>() / n, b.iter().sum::<f32>() / n);
    let (mut ab, mut aa, mut bb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        ab += (x - ma) * (y - mb);
        aa += (x - ma) * (x - ma);
        bb += (y - mb) * (y - mb);
    }
    // a level that moves by under 1 dB is no pattern to follow
    (aa / n > 1.0 && bb / n > 1.0).then(|| ab / (aa * bb).sqrt())
}

/// The mean power of levels in dB, in dB.
fn mean_db(levels: &[f32]) -> f32 {
    let mean =
        levels.iter().map(|l| 10f32.powf(l / 10.0)).sum::<f32>() / levels.len().max(1) as f32;
    10.0 * (mean + 1e-9).log10()
}

impl BargeIn {
    /// The voice queued `text` to say now.
    pub fn said(&self, text: &str) {
        let mut s = self.lock();
        let now = Instant::now();
        s.said.push_back((now, text.to_owned()));
        while s
            .said
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > ECHO_MEMORY)
            || s.said.len() > KEEP
        {
            s.said.pop_front();
        }
    }

    /// The voice sounds at the device now, until `to` (what the device
    /// already holds): the output calls it while it plays.
    pub fn sounding(&self, now: Instant, to: Instant) {
        let mut s = self.lock();
        match s.sounded.back_mut() {
            // still the same stretch of sound
            Some((_, end)) if now <= *end + Duration::from_millis(50) => *end = (*end).max(to),
            _ => {
                s.sounded.push_back((now, to));
                if s.sounded.len() > KEEP {
                    s.sounded.pop_front();
                }
            }
        }
    }

    /// The voice played a buffer from `at` for `duration`, this loud (mean
    /// square): the output reports every buffer, silent ones included.
    pub fn played(&self, at: Instant, duration: Duration, mean_square: f32) {
        let mut s = self.lock();
        s.played.push_back((at, at + duration, mean_square));
        while s
            .played
            .front()
            .is_some_and(|(from, _, _)| at.saturating_duration_since(*from) > ECHO_MEMORY)
        {
            s.played.pop_front();
        }
    }

    /// The microphone heard a block this loud (mean square) from
    /// `captured`, before an echo canceller took the voice out of it
    /// ([`BargeIn::echo_likeness`] then follows these).
    pub fn heard_raw(&self, captured: Instant, mean_square: f32) {
        let mut s = self.lock();
        s.heard_raw.push_back((captured, mean_square));
        while s
            .heard_raw
            .front()
            .is_some_and(|(at, _)| captured.saturating_duration_since(*at) > ECHO_MEMORY)
        {
            s.heard_raw.pop_front();
        }
    }

    /// An echo canceller's verdict on the last second the voice sounded in:
    /// whether it took the voice out of the microphone (it had converged).
    pub fn set_echo_cancelled(&self, cancelled: bool) {
        self.lock().cancelled = cancelled;
    }

    /// Whether an echo canceller takes the voice out of the microphone, by
    /// its last verdict: then speech over the voice is judged as speech
    /// anywhere else; otherwise (no canceller, one still converging, or
    /// one that lost the echo path) a raised threshold stands in for it.
    #[must_use]
    pub fn echo_cancelled(&self) -> bool {
        self.lock().cancelled
    }

    /// The microphone's level before the canceller, frame by frame
    /// (`n` frames of [`ECHO_FRAME`] from `start`, in dB), where its blocks
    /// cover every frame.
    fn raw_levels(&self, start: Instant, n: usize) -> Option<Vec<f32>> {
        let s = self.lock();
        let width = ECHO_FRAME.as_secs_f64();
        let mut sum = vec![0.0f64; n];
        let mut count = vec![0u32; n];
        for &(at, ms) in &s.heard_raw {
            let Some(offset) = at.checked_duration_since(start) else {
                continue;
            };
            let k = (offset.as_secs_f64() / width) as usize;
            if k < n {
                sum[k] += f64::from(ms);
                count[k] += 1;
            }
        }
        count.iter().all(|&c| c > 0).then(|| {
            sum.iter()
                .zip(&count)
                .map(|(e, c)| 10.0 * ((e / f64::from(*c)) as f32 + 1e-9).log10())
                .collect()
        })
    }

    /// How much `samples` (16 kHz, ending at `end`) sound like the voice as
    /// it played: the best correlation, over lags up to [`ECHO_MAX_LAG`],
    /// of the heard level with the played level, frame by frame (20 ms, in
    /// dB). `None` when the voice did not play over it (no variation to
    /// compare with). Echo scores near 1; the user speaking over the voice
    /// does not follow its level, and scores low.
    ///
    /// Where an echo canceller reported the microphone's level before it
    /// ([`BargeIn::heard_raw`]), that level is what follows the voice. When
    /// the canceller took [`ECHO_TAKEN_DB`] or more out of it, the samples
    /// are its trace of the voice (or what it leaks while it converges), and
    /// the level before it decides. Otherwise most of what was heard went
    /// through it: the likeness is the lower of the two, so a person's word
    /// over a loud echo (the level before the canceller following the
    /// voice, theirs not) is theirs, while an echo the canceller failed on
    /// follows the voice in both.
    #[must_use]
    pub fn echo_likeness(&self, samples: &[f32], end: Instant) -> Option<f32> {
        let frame =
            usize::try_from(u64::from(crate::SAMPLE_RATE) * ECHO_FRAME.as_millis() as u64 / 1000)
                .ok()?;
        let n = samples.len() / frame;
        if n < ECHO_MIN_FRAMES {
            return None;
        }
        let start = end.checked_sub(Duration::from_secs_f64(
            samples.len() as f64 / f64::from(crate::SAMPLE_RATE),
        ))?;
        let db = |ms: f32| 10.0 * (ms + 1e-9).log10();
        let own: Vec<f32> = samples
            .chunks_exact(frame)
            .map(|c| db(c.iter().map(|x| x * x).sum::<f32>() / frame as f32))
            .collect();
        let raw = self.raw_levels(start, n);
        // the played level on the same grid, reaching back by the longest lag
        let lags = (ECHO_MAX_LAG.as_millis() / ECHO_FRAME.as_millis()) as usize;
        let origin = start.checked_sub(ECHO_MAX_LAG)?;
        let bins = n + lags;
        let mut energy = vec![0.0f64; bins];
        let mut covered = vec![0.0f64; bins];
        {
            let s = self.lock();
            let width = ECHO_FRAME.as_secs_f64();
            for &(from, to, ms) in &s.played {
                if to <= origin || from >= end {
                    continue;
                }
                let a = from.saturating_duration_since(origin).as_secs_f64() / width;
                let b = to.saturating_duration_since(origin).as_secs_f64() / width;
                let mut i = a.floor() as usize;
                while (i as f64) < b && i < bins {
                    let overlap = (b.min(i as f64 + 1.0) - a.max(i as f64)).max(0.0);
                    energy[i] += f64::from(ms) * overlap;
                    covered[i] += overlap;
                    i += 1;
                }
            }
        }
        if covered.iter().filter(|&&c| c > 0.5).count() < n / 2 {
            return None;
        }
        let played: Vec<f32> = energy
            .iter()
            .zip(&covered)
            .map(|(e, c)| db(if *c > 0.0 { (e / c) as f32 } else { 0.0 }))
            .collect();
        // a frame of digital silence (before the canceller, where it said)
        // while the voice sounded is a microphone that was not there: it
        // follows nothing and is left out; silent while the voice was
        // silent too, it agrees with the voice and stays
        let mic: &[f32] = raw.as_deref().unwrap_or(&own);
        let absent = |lag: usize, k: usize| {
            mic[k] <= DIGITAL_SILENCE_DB && played[lags - lag + k] > DIGITAL_SILENCE_DB
        };
        // the mic hears at frame k what played at bin k + lags - lag
        let likeness = |heard: &[f32]| {
            (0..=lags)
                .filter_map(|lag| {
                    let (a, b): (Vec<f32>, Vec<f32>) = (0..n)
                        .filter(|&k| !absent(lag, k))
                        .map(|k| (heard[k], played[lags - lag + k]))
                        .unzip();
                    if a.len() < ECHO_MIN_HEARD_FRAMES {
                        return None;
                    }
                    level_correlation(&a, &b)
                })
                .reduce(f32::max)
        };
        let Some(raw) = raw.as_deref() else {
            return likeness(&own);
        };
        let before = likeness(raw)?;
        if mean_db(raw) - mean_db(&own) >= ECHO_TAKEN_DB {
            return Some(before);
        }
        // a level that follows nothing (flat) is not the voice
        Some(before.min(likeness(&own).unwrap_or(0.0)))
    }

    /// Whether `text`, heard in audio from `start` to `end`, is the
    /// assistant's own voice come back through the microphone: the audio
    /// overlaps a time the voice sounded (or its [`ECHO_TAIL`]), and at
    /// least [`ECHO_MIN_SHARE`] of its word pairs (two words or more) are
    /// pairs the voice said in the last [`ECHO_MEMORY`]. A user who
    /// repeats the assistant's words after it has finished is not echo.
    #[must_use]
    pub fn is_echo(&self, text: &str, start: Instant, end: Instant) -> bool {
        let heard = words(text);
        if heard.len() < 2 {
            return false;
        }
        let s = self.lock();
        let overlaps = s
            .sounded
            .iter()
            .any(|&(from, to)| start <= to + ECHO_TAIL && end >= from);
        if !overlaps {
            return false;
        }
        let said: Vec<String> = s.said.iter().flat_map(|(_, t)| words(t)).collect();
        let pairs: HashSet<(&str, &str)> = said
            .windows(2)
            .map(|w| (w[0].as_str(), w[1].as_str()))
            .collect();
        let own = heard
            .windows(2)
            .filter(|w| pairs.contains(&(w[0].as_str(), w[1].as_str())))
            .count();
        own as f64 / (heard.len() - 1) as f64 >= ECHO_MIN_SHARE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assistants_own_words_heard_while_it_speaks_are_echo() {
        let b = BargeIn::new();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        b.said("The capital of France is Paris. It is known for the Eiffel Tower.");
        b.sounding(at(0), at(100));
        b.sounding(at(90), at(3_000));
        // heard while it spoke: its own words, even misheard in part
        assert!(b.is_echo("capital of France is Paris.", at(500), at(1_500)));
        assert!(b.is_echo("It is known for the Eiffel power", at(2_000), at(2_900)));
        // ... and in its tail
        assert!(b.is_echo("the Eiffel Tower.", at(3_200), at(3_500)));
        // the user's own words over it, or one word
        assert!(!b.is_echo("What about Germany then?", at(1_000), at(2_000)));
        assert!(!b.is_echo("Paris.", at(1_000), at(1_500)));
        // the same words said after the voice stopped are the user's
        assert!(!b.is_echo("The capital of France is Paris.", at(5_000), at(6_500)));
    }

    /// `voice` played from `t0` in 10 ms buffers.
    fn play(b: &BargeIn, t0: Instant, voice: &[f32]) {
        for (i, buf) in voice.chunks(160).enumerate() {
            let ms = buf.iter().map(|x| x * x).sum::<f32>() / buf.len() as f32;
            b.played(
                t0 + Duration::from_millis(10 * i as u64),
                Duration::from_millis(10),
                ms,
            );
        }
    }

    /// Speech-like sound: noise whose level moves as syllables do
    /// (`rate` of them a second, from `phase`).
    fn syllables(n: usize, rate: f32, phase: f32, seed: u32) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let noise = x as f32 / u32::MAX as f32 - 0.5;
                let t = i as f32 / 16_000.0;
                let level = (std::f32::consts::TAU * rate * t + phase).sin().max(0.0);
                noise * level * level
            })
            .collect()
    }

    #[test]
    fn what_follows_the_played_level_is_the_voice_itself() {
        let b = BargeIn::new();
        let t0 = Instant::now();
        // 3 s of the voice, played in 10 ms buffers
        let voice = syllables(48_000, 3.3, 0.0, 7);
        play(&b, t0, &voice);
        // heard 120 ms later, 12 dB down, with some room noise
        let lag = 1_920;
        let room = syllables(48_000, 0.0, 1.0, 99);
        let heard: Vec<f32> = (0..40_000)
            .map(|i| 0.25 * voice.get(i + 8_000 - lag).copied().unwrap_or(0.0) + 0.002 * room[i])
            .collect();
        let end = t0 + Duration::from_millis(500 + 2_500);
        let echo = b.echo_likeness(&heard, end).unwrap();
        assert!(echo > 0.9, "echo: {echo}");
        // the user over it: another voice, louder than the echo
        let user = syllables(40_000, 4.1, 1.3, 3);
        let over: Vec<f32> = heard.iter().zip(&user).map(|(e, u)| e + 2.0 * u).collect();
        let talk = b.echo_likeness(&over, end).unwrap();
        assert!(talk < ECHO_MIN_LIKENESS, "the user over the voice: {talk}");
        // nothing played then: nothing to tell
        assert_eq!(b.echo_likeness(&heard, end + Duration::from_secs(60)), None);
        // an echo canceller left only a flat trace of the echo: the
        // microphone's level before it, block by block, is what is followed
        let residual = syllables(40_000, 0.0, 0.5, 11);
        let residual: Vec<f32> = residual.iter().map(|x| 0.001 * x).collect();
        assert!(b
            .echo_likeness(&residual, end)
            .is_none_or(|l| l < ECHO_MIN_LIKENESS));
        let from = end - Duration::from_millis(2_500);
        for (i, block) in heard.chunks(160).enumerate() {
            let ms = block.iter().map(|x| x * x).sum::<f32>() / block.len() as f32;
            b.heard_raw(from + Duration::from_millis(10 * i as u64), ms);
        }
        let raw = b.echo_likeness(&residual, end).unwrap();
        assert!(raw > 0.9, "echo before the canceller: {raw}");
        // a canceller that failed: the echo is all still there
        let failed = b.echo_likeness(&heard, end);
        assert!(
            failed.is_some_and(|l| l > 0.9),
            "echo the canceller left: {failed:?}"
        );
    }

    /// A capture that moves onto the loudspeaker's monitor mid-answer: the
    /// utterance's first frames (the endpointer's pre-roll) are the old
    /// device's digital silence, the rest the voice itself. The silence
    /// follows nothing and is left out; the voice is still the voice.
    #[test]
    fn digital_silence_before_the_voice_is_no_level_to_compare() {
        let b = BargeIn::new();
        let t0 = Instant::now();
        // the voice with its own faint floor (a synthesised voice is
        // digitally silent only between its chunks)
        let floor = syllables(48_000, 0.0, 1.0, 99);
        let voice: Vec<f32> = syllables(48_000, 3.3, 0.0, 7)
            .iter()
            .zip(&floor)
            .map(|(v, f)| v + 0.002 * f)
            .collect();
        play(&b, t0, &voice);
        // 650 ms heard from 1.5 s on: 200 ms of digital zeros, then the
        // voice as it played, at full level and no delay (a monitor)
        let (from, silent, len) = (24_000, 3_200, 10_400);
        let heard: Vec<f32> = (0..len)
            .map(|i| if i < silent { 0.0 } else { voice[from + i] })
            .collect();
        let end = t0 + Duration::from_millis(1_500 + 650);
        let l = b.echo_likeness(&heard, end).unwrap();
        assert!(
            l >= ECHO_MIN_LIKENESS,
            "the voice after digital silence: {l}"
        );
        // a microphone that heard nothing at all tells nothing
        assert_eq!(b.echo_likeness(&vec![0.0; len], end), None);
        // a person there, over no echo path: still not the voice
        let user = syllables(len, 4.1, 1.3, 3);
        let person: Vec<f32> = (0..len)
            .map(|i| if i < silent { 0.0 } else { user[i] })
            .collect();
        let p = b.echo_likeness(&person, end);
        assert!(
            p.is_none_or(|p| p < ECHO_MIN_LIKENESS),
            "a person after digital silence: {p:?}"
        );
    }
}
