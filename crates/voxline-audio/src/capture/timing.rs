//! How a capture placed its audio in time: the device latency and clock gaps
//! ([`CaptureTiming`]), tallied by the consumer as it places each block.

use std::time::Duration;

/// Clock gaps kept in [`CaptureTiming::gaps`] (all are counted).
const MAX_KEPT_GAPS: usize = 16;

/// Resolution of the device-latency histogram.
pub(super) const LATENCY_BUCKET_MS: f64 = 0.25;

/// Buckets of the device-latency histogram (larger values land in the last).
const LATENCY_BUCKETS: usize = 8_001;

/// Percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Values.
    pub n: u64,
    /// Smallest.
    pub min: f64,
    /// Median (±0.25 ms).
    pub p50: f64,
    /// 95th percentile (±0.25 ms).
    pub p95: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// A stretch of wall time the device delivered no audio for.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClockGap {
    /// The 16 kHz stream position where it begins (the positions skip it).
    pub at_sample: u64,
    /// How long it was, in milliseconds.
    pub ms: f64,
}

/// How a capture placed its audio in time (see *Timestamps* in [`capture`](super)).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct CaptureTiming {
    /// Blocks placed by the device's capture timestamp.
    pub blocks_device_timed: u64,
    /// Blocks placed by their arrival (the host gave no usable timestamp).
    pub blocks_arrival_timed: u64,
    /// Device latency: capture of a block's first sample → its callback, as
    /// the device timestamps it (`None` when no block had a timestamp).
    pub device_latency_ms: Option<LatencySummary>,
    /// Clock gaps: times the device delivered fewer samples than wall time.
    pub clock_gaps: u64,
    /// Their total length, in milliseconds.
    pub clock_gap_ms: f64,
    /// The first 16 of them.
    pub gaps: Vec<ClockGap>,
}

/// The consumer's tally of [`CaptureTiming`].
pub(super) struct TimingAcc {
    blocks_device_timed: u64,
    pub(super) blocks_arrival_timed: u64,
    /// Device latencies in [`LATENCY_BUCKET_MS`] buckets.
    latency: Vec<u32>,
    latency_min: f64,
    latency_max: f64,
    latency_sum: f64,
    clock_gaps: u64,
    clock_gap_ms: f64,
    last_gap_ms: f64,
    gaps: Vec<ClockGap>,
}

impl TimingAcc {
    pub(super) fn new() -> TimingAcc {
        TimingAcc {
            blocks_device_timed: 0,
            blocks_arrival_timed: 0,
            latency: vec![0; LATENCY_BUCKETS],
            latency_min: f64::INFINITY,
            latency_max: 0.0,
            latency_sum: 0.0,
            clock_gaps: 0,
            clock_gap_ms: 0.0,
            last_gap_ms: 0.0,
            gaps: Vec::new(),
        }
    }

    pub(super) fn device_timed(&mut self, age: Duration) {
        self.blocks_device_timed += 1;
        let ms = age.as_secs_f64() * 1000.0;
        let bucket = ((ms / LATENCY_BUCKET_MS).round() as usize).min(LATENCY_BUCKETS - 1);
        self.latency[bucket] = self.latency[bucket].saturating_add(1);
        self.latency_min = self.latency_min.min(ms);
        self.latency_max = self.latency_max.max(ms);
        self.latency_sum += ms;
    }

    pub(super) fn gap(&mut self, at_sample: u64, gap: Duration) {
        let ms = gap.as_secs_f64() * 1000.0;
        self.clock_gaps += 1;
        self.clock_gap_ms += ms;
        self.last_gap_ms = ms;
        if self.gaps.len() < MAX_KEPT_GAPS {
            self.gaps.push(ClockGap { at_sample, ms });
        }
    }

    /// Clock gaps so far, and the last one's length in ms.
    pub(super) fn gaps_so_far(&self) -> (u64, f64) {
        (self.clock_gaps, self.last_gap_ms)
    }

    /// The bucket value at quantile `q`, clamped into the exact min and max.
    fn quantile(&self, q: f64) -> f64 {
        let n = self.blocks_device_timed;
        let rank = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.latency.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return (i as f64 * LATENCY_BUCKET_MS).clamp(self.latency_min, self.latency_max);
            }
        }
        self.latency_max
    }

    pub(super) fn summary(&self) -> CaptureTiming {
        let n = self.blocks_device_timed;
        CaptureTiming {
            blocks_device_timed: n,
            blocks_arrival_timed: self.blocks_arrival_timed,
            device_latency_ms: (n > 0).then(|| LatencySummary {
                n,
                min: self.latency_min,
                p50: self.quantile(0.5),
                p95: self.quantile(0.95),
                max: self.latency_max,
                mean: self.latency_sum / n as f64,
            }),
            clock_gaps: self.clock_gaps,
            clock_gap_ms: self.clock_gap_ms,
            gaps: self.gaps.clone(),
        }
    }
}
