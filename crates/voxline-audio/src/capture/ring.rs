//! The lock-free ring between cpal's audio callback and the consumer thread:
//! the callback's side ([`BlockWriter`]) and the records of each block.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cpal::{FromSample, Sample};
use voxline_core::Clock;

use super::drain::Drainer;
use crate::AudioError;

/// Block records the ring holds (an upper bound on blocks in flight).
const BLOCK_RECORDS: usize = 8_192;

/// A device timestamp older than this (capture → callback) is taken to be
/// wrong, and the block is placed by its arrival instead.
const MAX_DEVICE_AGE: Duration = Duration::from_secs(10);

/// Counters shared by the callback, the consumer and [`Capture`](super::Capture).
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Device frames accepted into the ring.
    pub(super) captured: AtomicU64,
    /// Device frames dropped because the ring was full.
    pub(super) dropped: AtomicU64,
    /// Overruns (xruns) the audio host reported.
    pub(super) overruns: AtomicU64,
    /// Clock gaps so far, and the last one's length in ms (set by the
    /// consumer as it places the blocks).
    pub(super) clock_gaps: AtomicU64,
    pub(super) last_gap_ms: AtomicU64,
}

/// When a block was captured, as its callback saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stamp {
    /// When the callback ran, on the session clock.
    pub(super) arrived: Instant,
    /// Capture of the block's first sample → the callback, from the device's
    /// timestamps; `None` when the host gave no usable one.
    pub(super) age: Option<Duration>,
}

impl Stamp {
    /// The stamp of a callback running now, with cpal's timestamps: the
    /// stream's instants are placed on the session clock through `now`.
    pub(super) fn device(now: Instant, ts: cpal::InputStreamTimestamp) -> Stamp {
        Stamp {
            arrived: now,
            age: device_age(ts.callback, ts.capture),
        }
    }
}

/// `callback − capture`, when it is a plausible device latency: a zero
/// `capture` (cpal's floor when it could not subtract), a capture at or
/// after the callback (a host that reports none) or one older than
/// [`MAX_DEVICE_AGE`] is not.
fn device_age(callback: cpal::StreamInstant, capture: cpal::StreamInstant) -> Option<Duration> {
    if capture == cpal::StreamInstant::ZERO {
        return None;
    }
    callback
        .checked_duration_since(capture)
        .filter(|age| !age.is_zero() && *age <= MAX_DEVICE_AGE)
}

/// What the callback records about each block it put in the ring.
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    /// Device frames in the block.
    pub(super) frames: usize,
    /// When it was captured.
    pub(super) stamp: Stamp,
    /// Device frames dropped immediately before this block.
    pub(super) gap_before: u64,
}

/// The callback's side of the ring. Nothing here allocates, blocks or locks.
pub(super) struct BlockWriter {
    samples: rtrb::Producer<f32>,
    blocks: rtrb::Producer<Block>,
    channels: usize,
    /// Frames dropped since the last block that was written.
    pending_gap: u64,
    counters: Arc<Counters>,
}

impl BlockWriter {
    /// Copies one interleaved block into the ring as `f32`, or drops it whole
    /// (counting its frames) when the ring lacks room for it.
    pub(super) fn write<T>(&mut self, data: &[T], stamp: Stamp)
    where
        T: Sample,
        f32: FromSample<T>,
    {
        let frames = data.len() / self.channels;
        if frames == 0 {
            return;
        }
        let n = frames * self.channels;
        let fits = self.blocks.slots() > 0 && self.samples.slots() >= n;
        let written = fits
            && match self.samples.write_chunk_uninit(n) {
                Ok(chunk) => {
                    chunk.fill_from_iter(data[..n].iter().map(|&s| f32::from_sample_(s)));
                    true
                }
                Err(_) => false,
            };
        if !written {
            self.pending_gap += frames as u64;
            self.counters
                .dropped
                .fetch_add(frames as u64, Ordering::Relaxed);
            return;
        }
        // A slot was free above and only this side fills the ring.
        let _ = self.blocks.push(Block {
            frames,
            stamp,
            gap_before: std::mem::take(&mut self.pending_gap),
        });
        self.counters
            .captured
            .fetch_add(frames as u64, Ordering::Relaxed);
    }
}

/// Builds the ring for `rate` Hz × `channels`, holding `seconds` of audio.
pub(super) fn ring(
    rate: u32,
    channels: u16,
    seconds: u32,
    counters: Arc<Counters>,
    clock: Clock,
) -> Result<(BlockWriter, Drainer), AudioError> {
    let capacity = (rate as usize)
        .saturating_mul(usize::from(channels))
        .saturating_mul(seconds as usize)
        .max(1);
    let (sample_tx, sample_rx) = rtrb::RingBuffer::new(capacity);
    let (block_tx, block_rx) = rtrb::RingBuffer::new(BLOCK_RECORDS);
    let writer = BlockWriter {
        samples: sample_tx,
        blocks: block_tx,
        channels: usize::from(channels),
        pending_gap: 0,
        counters,
    };
    let drainer = Drainer::new(sample_rx, block_rx, channels, rate, clock)?;
    Ok((writer, drainer))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use voxline_core::{edge, AudioFrame, FullPolicy};

    use super::super::drain::rate_convert;
    use super::super::test_support::{arrival, collect, near, setup};
    use super::*;

    #[test]
    fn integer_blocks_pass_through_as_f32_with_running_positions() {
        let (mut w, mut d, counters, clock) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(1);
        w.write(&[i16::MIN, 0, 16_384, i16::MAX][..], arrival(t0));
        w.write(
            &[-16_384i16; 160][..],
            arrival(t0 + Duration::from_millis(10)),
        );
        assert!(d.drain(&tx).unwrap());
        assert!(!d.drain(&tx).unwrap());
        let frames = collect(&rx);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].start_sample, 0);
        assert_eq!(frames[0].samples[..3], [-1.0, 0.0, 0.5]);
        assert!((frames[0].samples[3] - 1.0).abs() < 1e-4);
        assert_eq!(frames[1].start_sample, 4);
        assert!(frames[1].samples.iter().all(|&s| s == -0.5));
        // Without device timestamps each block's last sample was captured
        // when it arrived, its first one the block's duration earlier.
        assert!(near(frames[0].captured, t0 - Duration::from_micros(250)));
        assert!(near(frames[1].captured, t0));
        assert_eq!(counters.captured.load(Ordering::Relaxed), 164);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn full_ring_drops_the_incoming_block_and_counts_its_frames() {
        // 1 s at 100 Hz stereo: 200 samples of room.
        let (mut w, mut d, counters, _) = setup(100, 2, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let now = Instant::now();
        let block = [0.25f32; 120]; // 60 frames
        w.write(&block[..], arrival(now));
        w.write(&block[..], arrival(now)); // 240 > 200: dropped whole
        assert_eq!(counters.captured.load(Ordering::Relaxed), 60);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 60);
        w.write(&[0.5f32; 80][..], arrival(now)); // 40 frames fit beside the first block
        assert_eq!(counters.captured.load(Ordering::Relaxed), 100);
        d.drain(&tx).unwrap();
        d.end_run(&tx).unwrap();
        let frames = collect(&rx);
        let total: usize = frames.iter().map(|f| f.samples.len()).sum();
        // 60 + 40 frames at 100 Hz kept, plus the 60-frame gap skipped.
        assert_eq!(
            total,
            rate_convert(60, 100) as usize + rate_convert(40, 100) as usize
        );
        let last = frames.last().unwrap();
        assert_eq!(
            last.end_sample(),
            rate_convert(60, 100) + rate_convert(60, 100) + rate_convert(40, 100)
        );
        // Drops after the last block count towards the end of the stream.
        w.write(&[0.5f32; 500][..], arrival(now)); // 250 frames: more than the whole ring
        let dropped = counters.dropped.load(Ordering::Relaxed);
        assert_eq!(dropped, 60 + 250);
        assert_eq!(
            d.end_sample(dropped),
            last.end_sample() + rate_convert(250, 100)
        );
    }

    #[test]
    fn implausible_device_timestamps_are_not_used() {
        use cpal::StreamInstant;
        let at = |ms: u64| StreamInstant::from_nanos(ms * 1_000_000);
        assert_eq!(device_age(at(100), at(70)), Some(Duration::from_millis(30)));
        // no latency reported, capture after the callback, cpal's zero floor, absurd age
        assert_eq!(device_age(at(100), at(100)), None);
        assert_eq!(device_age(at(100), at(120)), None);
        assert_eq!(device_age(at(100), StreamInstant::ZERO), None);
        assert_eq!(device_age(at(60_000), at(10)), None);
    }
}
