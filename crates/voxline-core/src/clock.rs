//! The one clock of a session.
//!
//! Every timestamp in the pipeline is a point on a single clock with two
//! readings: a position in the input stream, counted in samples at
//! [`SAMPLE_RATE`], and the monotonic [`Instant`] at which that sample was
//! captured (live input) or due (paced replay). [`Clock`] holds the instant of
//! sample 0 and converts between the two.

use std::time::{Duration, Instant};

/// The pipeline's internal sample rate in Hz (mono `f32` samples).
pub const SAMPLE_RATE: u32 = 16_000;

/// Nanoseconds per sample at [`SAMPLE_RATE`]; 16 kHz divides 10^9 exactly.
const NANOS_PER_SAMPLE: u64 = 1_000_000_000 / SAMPLE_RATE as u64;

/// The clock of one session: the monotonic instant of input sample 0.
///
/// It is `Copy`, so every thread can hold its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// Starts a session clock whose origin (sample 0) is now.
    #[must_use]
    pub fn start() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// A clock whose sample 0 lies at `origin` (for sources that learn the
    /// capture instant of their first sample, and for tests).
    #[must_use]
    pub fn with_origin(origin: Instant) -> Self {
        Self { origin }
    }

    /// The instant of sample 0.
    #[must_use]
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// The current monotonic instant.
    #[must_use]
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// The instant at which input sample `sample` is due: origin plus
    /// `sample / SAMPLE_RATE` seconds, computed exactly in integers.
    ///
    /// # Panics
    ///
    /// Only when the platform's `Instant` cannot represent the result (stream
    /// positions millions of years long on some platforms); use
    /// [`Clock::checked_sample_due`] for untrusted positions.
    #[must_use]
    pub fn sample_due(&self, sample: u64) -> Instant {
        self.origin + Self::samples_to_duration(sample)
    }

    /// Like [`Clock::sample_due`], but `None` where the instant would not be
    /// representable.
    #[must_use]
    pub fn checked_sample_due(&self, sample: u64) -> Option<Instant> {
        self.origin.checked_add(Self::samples_to_duration(sample))
    }

    /// Milliseconds from the origin to `t`; negative when `t` precedes it.
    #[must_use]
    pub fn ms_since_origin(&self, t: Instant) -> f64 {
        match t.checked_duration_since(self.origin) {
            Some(after) => after.as_secs_f64() * 1e3,
            None => -(self.origin.duration_since(t).as_secs_f64() * 1e3),
        }
    }

    /// The stream time of `sample` on this clock (its due instant).
    ///
    /// # Panics
    ///
    /// As [`Clock::sample_due`].
    #[must_use]
    pub fn stream_time(&self, sample: u64) -> StreamTime {
        StreamTime {
            sample,
            wall: self.sample_due(sample),
        }
    }

    /// The duration of `n` samples at [`SAMPLE_RATE`], exact to the nanosecond.
    #[must_use]
    pub fn samples_to_duration(n: u64) -> Duration {
        let rate = u64::from(SAMPLE_RATE);
        // `n % rate < 16_000`, so the nanosecond part is below 10^9 and fits.
        let nanos = u32::try_from((n % rate) * NANOS_PER_SAMPLE).unwrap_or(u32::MAX);
        Duration::new(n / rate, nanos)
    }

    /// The duration of `n` samples at [`SAMPLE_RATE`] in milliseconds.
    #[must_use]
    pub fn samples_to_ms(n: u64) -> f64 {
        n as f64 * 1e3 / f64::from(SAMPLE_RATE)
    }
}

/// A point on the session clock: a position in the input stream and the
/// monotonic instant at which that sample was captured (live) or
/// due/released (replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTime {
    /// Position in the input stream, in samples at [`SAMPLE_RATE`].
    pub sample: u64,
    /// When that sample was captured or due.
    pub wall: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_due_is_origin_plus_exact_sample_time() {
        let clock = Clock::start();
        assert_eq!(clock.sample_due(0), clock.origin());
        assert_eq!(
            clock.sample_due(16_000) - clock.origin(),
            Duration::from_secs(1)
        );
        assert_eq!(
            clock.sample_due(8_000) - clock.origin(),
            Duration::from_millis(500)
        );
        // One sample is 62.5 µs.
        assert_eq!(
            clock.sample_due(1) - clock.origin(),
            Duration::from_nanos(62_500)
        );
        assert_eq!(
            clock.sample_due(48_001) - clock.origin(),
            Duration::new(3, 62_500)
        );
    }

    #[test]
    fn checked_sample_due_agrees_with_sample_due() {
        let clock = Clock::start();
        assert_eq!(clock.checked_sample_due(16), Some(clock.sample_due(16)));
        // Whether the largest position is representable depends on the
        // platform; when it is, it lies after the origin.
        if let Some(t) = clock.checked_sample_due(u64::MAX) {
            assert!(t > clock.origin());
        }
    }

    #[test]
    fn samples_to_ms_converts_at_16_khz() {
        assert_eq!(Clock::samples_to_ms(0), 0.0);
        assert_eq!(Clock::samples_to_ms(16), 1.0);
        assert_eq!(Clock::samples_to_ms(16_000), 1_000.0);
        assert_eq!(Clock::samples_to_ms(24_000), 1_500.0);
        assert_eq!(Clock::samples_to_ms(8), 0.5);
    }

    #[test]
    fn ms_since_origin_is_signed() {
        let origin = Instant::now() + Duration::from_secs(10);
        let clock = Clock::with_origin(origin);
        let later = origin + Duration::from_millis(1_250);
        assert!((clock.ms_since_origin(later) - 1_250.0).abs() < 1e-9);
        let earlier = origin - Duration::from_millis(40);
        assert!((clock.ms_since_origin(earlier) + 40.0).abs() < 1e-9);
        assert!((clock.ms_since_origin(clock.sample_due(32_000)) - 2_000.0).abs() < 1e-9);
    }

    #[test]
    fn stream_time_pairs_sample_and_due_instant() {
        let clock = Clock::start();
        let st = clock.stream_time(4_000);
        assert_eq!(st.sample, 4_000);
        assert_eq!(st.wall, clock.origin() + Duration::from_millis(250));
    }
}
