//! Helpers shared by the capture tests: a ring on a fresh clock, stamps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use voxline_core::{AudioFrame, Clock};

use super::drain::Drainer;
use super::ring::{ring, BlockWriter, Counters, Stamp};

/// A ring of `seconds` of `rate` Hz × `channels` audio on a fresh clock.
pub(super) fn setup(
    rate: u32,
    channels: u16,
    seconds: u32,
) -> (BlockWriter, Drainer, Arc<Counters>, Clock) {
    let counters = Arc::new(Counters::default());
    let clock = Clock::start();
    let (w, d) = ring(rate, channels, seconds, Arc::clone(&counters), clock).unwrap();
    (w, d, counters, clock)
}

/// A block placed by its arrival at `t` (no device timestamp).
pub(super) fn arrival(t: Instant) -> Stamp {
    Stamp {
        arrived: t,
        age: None,
    }
}

/// A block whose callback ran at `t`, its first sample captured `age_ms` earlier.
pub(super) fn device(t: Instant, age_ms: u64) -> Stamp {
    Stamp {
        arrived: t,
        age: Some(Duration::from_millis(age_ms)),
    }
}

/// Whether two instants are the same to within a microsecond.
pub(super) fn near(a: Instant, b: Instant) -> bool {
    let d = if a > b { a - b } else { b - a };
    d < Duration::from_micros(1)
}

/// The frames waiting on an edge.
pub(super) fn collect(rx: &voxline_core::EdgeReceiver<AudioFrame>) -> Vec<AudioFrame> {
    rx.try_iter().map(|e| e.item).collect()
}
