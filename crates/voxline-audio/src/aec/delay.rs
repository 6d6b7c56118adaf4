//! An echo further behind its far end than AEC3 searches.
//!
//! AEC3's delay estimator finds the echo up to ~400 ms behind the far end
//! it is handed (the `aec` tests: 400 ms is followed, from 500 ms on it
//! takes out 1–3 dB). The far end is placed by the devices' instants, so
//! the sound server's buffering is mostly in them already; what is left is
//! what the devices misreport (a Bluetooth speaker's own buffer, a sound
//! server under load reporting late). [`CoarseDelay`] finds that from the
//! levels alone: while the canceller fails to converge on an echo it can
//! hear, the microphone's level, block by block, is correlated with the far
//! end's level as placed, over lags up to [`MAX_LAG_BLOCKS`]; a clear match
//! outside AEC3's range moves the far end back by it, leaving AEC3 the
//! usual ~100 ms to find.

use std::collections::VecDeque;

use voxline_core::barge::level_correlation;

/// The longest echo delay searched, behind where the instants place the
/// far end (10 ms blocks): 1.5 s.
pub const MAX_LAG_BLOCKS: usize = 150;

/// The microphone's levels compared (10 ms blocks): 2 s.
const WINDOW_BLOCKS: usize = 200;

/// The fewest of the microphone's levels compared when asked whether it
/// follows the voice at all (10 ms blocks): a quarter of a second.
const FOLLOWS_MIN_BLOCKS: usize = 25;

/// The fewest blocks with the voice speaking compared when asked whether
/// the microphone follows it.
const FOLLOWS_MIN_SPEAKING: usize = 15;

/// The correlation of the levels from which the microphone follows the
/// voice: stricter than [`MIN_LIKENESS`], the window being shorter.
const FOLLOWS_LIKENESS: f32 = 0.8;

/// The correlation of the levels from which a lag is the echo's.
const MIN_LIKENESS: f32 = 0.7;

/// The delay AEC3 is left to find behind the far end handed to it, when
/// the far end is moved (10 ms blocks): it found 64–80 ms through
/// PulseAudio with the far end as placed.
const LEFT_FOR_AEC3_BLOCKS: i64 = 10;

/// The delays AEC3 finds by itself behind the far end it is handed (10 ms
/// blocks): it followed an echo 455 ms behind (400 ms, the lead and a
/// reflection), and not one 555 ms behind.
const AEC3_FINDS_BLOCKS: i64 = 48;

/// The far end's and the microphone's levels, block by block, and how far
/// back the far end is read.
#[derive(Debug, Default)]
pub(super) struct CoarseDelay {
    /// (far end as placed, microphone before the canceller), in dB.
    levels: VecDeque<(f32, f32)>,
    /// Blocks the far end is read behind where it is placed.
    back: i64,
}

fn db(mean_square: f32) -> f32 {
    10.0 * (mean_square + 1e-10).log10()
}

impl CoarseDelay {
    /// One block: the far end's level where the instants place it, and the
    /// microphone's before the canceller (mean squares).
    pub(super) fn block(&mut self, far: f32, mic: f32) {
        self.levels.push_back((db(far), db(mic)));
        while self.levels.len() > WINDOW_BLOCKS + MAX_LAG_BLOCKS {
            self.levels.pop_front();
        }
    }

    /// Blocks the far end is read behind where it is placed.
    pub(super) fn back_blocks(&self) -> i64 {
        self.back
    }

    /// Milliseconds the far end is read behind where it is placed.
    pub(super) fn back_ms(&self) -> i64 {
        self.back * (super::BLOCK as i64 * 1000 / i64::from(voxline_core::SAMPLE_RATE))
    }

    /// The echo's lag behind the far end as placed (blocks) and how well
    /// the levels match there, over the microphone's last `window` blocks
    /// and lags up to `max_lag`; `None` without enough of them, or when
    /// the far end's level hardly moves.
    fn lag(&self, window: usize, max_lag: usize) -> Option<(usize, f32)> {
        let n = self.levels.len();
        if n < window + max_lag {
            return None;
        }
        let (far, mic): (Vec<f32>, Vec<f32>) = self.levels.iter().copied().unzip();
        let heard = &mic[n - window..];
        (0..=max_lag)
            .filter_map(|lag| {
                let played = &far[n - window - lag..n - lag];
                level_correlation(heard, played).map(|c| (lag, c))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Whether the microphone's level over its last `blocks` follows the
    /// far end's closely (at least [`FOLLOWS_MIN_BLOCKS`], at most
    /// [`WINDOW_BLOCKS`] looked at), at a lag AEC3 finds: the voice's echo
    /// does, a person speaking over the voice does not. Only the blocks in
    /// which the voice speaks are compared (at least
    /// [`FOLLOWS_MIN_SPEAKING`] of them): where it is silent, a person who
    /// is silent too would look like its echo.
    pub(super) fn follows_the_voice(&self, blocks: usize) -> bool {
        let reach = ((AEC3_FINDS_BLOCKS + self.back.max(0)) as usize).min(MAX_LAG_BLOCKS);
        let window = blocks.clamp(FOLLOWS_MIN_BLOCKS, WINDOW_BLOCKS);
        let n = self.levels.len();
        if n < window + reach {
            return false;
        }
        let (far, mic): (Vec<f32>, Vec<f32>) = self.levels.iter().copied().unzip();
        let speaks = db(super::path::VOICE_SPEAKS);
        (0..=reach).any(|lag| {
            let (heard, played): (Vec<f32>, Vec<f32>) = (n - window..n)
                .map(|i| (mic[i], far[i - lag]))
                .filter(|&(_, f)| f > speaks)
                .unzip();
            heard.len() >= FOLLOWS_MIN_SPEAKING
                && level_correlation(&heard, &played).is_some_and(|c| c >= FOLLOWS_LIKENESS)
        })
    }

    /// The canceller did not converge on an echo the microphone hears:
    /// where the levels place the echo outside what AEC3 finds, the far end
    /// is moved back by it. Returns the blocks it moved (positive: further
    /// back), if it did.
    pub(super) fn not_converged(&mut self) -> Option<i64> {
        let (lag, likeness) = self.lag(WINDOW_BLOCKS, MAX_LAG_BLOCKS)?;
        if likeness < MIN_LIKENESS {
            return None;
        }
        // what AEC3 has to find behind the far end it is handed
        let left = lag as i64 - self.back;
        if (0..=AEC3_FINDS_BLOCKS).contains(&left) {
            return None;
        }
        let back = (lag as i64 - LEFT_FOR_AEC3_BLOCKS).max(0);
        let moved = back - self.back;
        self.back = back;
        (moved != 0).then_some(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A voice's level, block by block: syllables and pauses.
    fn voice(n: usize, seed: u32, rate: f32, phrase: usize) -> Vec<f32> {
        let mut seed = seed;
        (0..n)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                let syllable = ((i as f32) * rate).sin().max(0.0);
                let pause = if (i / phrase) % 3 == 2 { 0.0 } else { 1.0 };
                1e-6 + 0.01 * syllable * pause * (0.5 + (seed % 100) as f32 / 100.0)
            })
            .collect()
    }

    fn heard_behind(far: &[f32], lag: usize) -> CoarseDelay {
        let mut d = CoarseDelay::default();
        for i in 0..far.len() {
            let echo = if i >= lag { 0.25 * far[i - lag] } else { 0.0 };
            d.block(far[i], 1e-7 + echo);
        }
        d
    }

    #[test]
    fn an_echo_far_behind_moves_the_far_end_back_by_it() {
        let far = voice(600, 0x2545_f491, 0.21, 70);
        // 700 ms behind: the far end is read 600 ms back, 100 ms left
        let mut d = heard_behind(&far, 70);
        assert_eq!(d.not_converged(), Some(60));
        assert_eq!(d.back_blocks(), 60);
        // found again, it stays
        assert_eq!(d.not_converged(), None);
        // 1.2 s behind
        let mut d = heard_behind(&far, 120);
        assert_eq!(d.not_converged(), Some(110));
    }

    #[test]
    fn an_echo_within_aec3s_reach_is_left_to_it() {
        let far = voice(600, 0x2545_f491, 0.21, 70);
        let mut d = heard_behind(&far, 8);
        assert_eq!(d.not_converged(), None);
        assert_eq!(d.back_blocks(), 0);
    }

    #[test]
    fn the_far_end_comes_forward_again_when_the_echo_does() {
        let far = voice(600, 0x2545_f491, 0.21, 70);
        let mut d = heard_behind(&far, 70);
        assert_eq!(d.not_converged(), Some(60));
        // the buffering shrank: the echo is 100 ms behind the placed far
        // end, before the far end now handed
        let mut again = heard_behind(&far, 10);
        again.back = d.back;
        assert_eq!(again.not_converged(), Some(-60));
        d.back = again.back;
        assert_eq!(d.back_blocks(), 0);
    }

    #[test]
    fn what_does_not_follow_the_far_end_moves_nothing() {
        let far = voice(600, 0x2545_f491, 0.21, 70);
        // a person talking, not the voice
        let other = voice(600, 0x9e37_79b9, 0.13, 45);
        let mut d = CoarseDelay::default();
        for (i, f) in far.iter().enumerate() {
            d.block(*f, other[i]);
        }
        assert_eq!(d.not_converged(), None);
        assert!(!d.follows_the_voice(40));
        // too little heard yet
        let mut d = heard_behind(&far[..300], 70);
        assert_eq!(d.not_converged(), None);
    }

    #[test]
    fn an_echo_that_began_a_second_ago_follows_the_voice() {
        // the voice speaks from block 280 to 350 without a pause
        let far = voice(345, 0x2545_f491, 0.21, 70);
        let mut d = CoarseDelay::default();
        for (i, f) in far.iter().enumerate() {
            // the microphone at its floor, then the loudspeaker's monitor, 20 ms behind
            let mic = if i >= 300 { far[i - 2] } else { 1e-9 };
            d.block(*f, mic);
        }
        assert!(d.follows_the_voice(45));
        // an echo 300 ms behind, 20 dB down, in a room: still followed
        let mut room = CoarseDelay::default();
        for (i, f) in far.iter().enumerate() {
            room.block(*f, 1e-7 + if i >= 300 { 0.01 * far[i - 30] } else { 0.0 });
        }
        assert!(room.follows_the_voice(45));
    }

    #[test]
    fn a_person_silent_where_the_voice_is_silent_does_not_follow_it() {
        // a person's words over the voice, in a digitally silent room: by
        // chance they speak where the voice speaks and pause where it
        // pauses, and the levels of the two correlate over the whole window
        let far = voice(345, 0x2545_f491, 0.21, 70);
        let other = voice(345, 0x9e37_79b9, 0.13, 45);
        let mut d = CoarseDelay::default();
        for (i, f) in far.iter().enumerate() {
            let speaks = *f > 1e-4;
            d.block(*f, if i >= 300 && speaks { other[i] } else { 0.0 });
        }
        assert!(!d.follows_the_voice(45));
    }
}
