//! The consumer's side of the ring ([`Drainer`]): resampling to 16 kHz mono,
//! placing each block in time (device timestamps, clock gaps) and sending
//! stamped [`AudioFrame`]s.

use std::time::{Duration, Instant};

use voxline_core::{AudioFrame, Clock, EdgeSender};

use super::ring::Block;
use super::timing::TimingAcc;
use crate::{AudioError, StreamResampler, TARGET_RATE};

/// A block starting later than the previous one ended by more than this (or
/// three of its own durations, if longer) opens a clock gap, when the device
/// timestamps its blocks.
const DEVICE_GAP_SLACK: Duration = Duration::from_millis(60);

/// The same when blocks are placed by their arrival, whose instants jitter
/// with the scheduling of the audio thread.
const ARRIVAL_GAP_SLACK: Duration = Duration::from_millis(400);

/// Why draining stopped early.
#[derive(Debug)]
pub(super) enum DrainStop {
    Disconnected,
    Internal(String),
}

impl From<AudioError> for DrainStop {
    fn from(e: AudioError) -> Self {
        DrainStop::Internal(e.to_string())
    }
}

/// The consumer's side of the ring: resampling, stamping and sending.
pub(super) struct Drainer {
    samples: rtrb::Consumer<f32>,
    blocks: rtrb::Consumer<Block>,
    channels: usize,
    rate: u32,
    resampler: StreamResampler,
    /// 16 kHz position of the first sample of the current run (audio since
    /// the start or the last gap).
    run_base: u64,
    /// Device frames fed to the resampler in this run.
    run_in: u64,
    /// 16 kHz samples emitted in this run.
    run_out: u64,
    /// When the sample just past the last block was (would have been) captured.
    last_end: Option<Instant>,
    buf: Vec<f32>,
    clock: Clock,
    /// 16 kHz mono samples sent.
    pub(super) samples_sent: u64,
    /// Frames sent.
    pub(super) frames_sent: u64,
    /// Dropped device frames already accounted for as gaps.
    gap_frames: u64,
    pub(super) timing: TimingAcc,
}

impl Drainer {
    /// The consumer's side of a ring of `rate` Hz × `channels` audio, stamping
    /// frames on `clock`.
    pub(super) fn new(
        samples: rtrb::Consumer<f32>,
        blocks: rtrb::Consumer<Block>,
        channels: u16,
        rate: u32,
        clock: Clock,
    ) -> Result<Drainer, AudioError> {
        Ok(Drainer {
            samples,
            blocks,
            channels: usize::from(channels),
            rate,
            resampler: StreamResampler::new(rate, channels)?,
            run_base: 0,
            run_in: 0,
            run_out: 0,
            last_end: None,
            buf: Vec::new(),
            clock,
            samples_sent: 0,
            frames_sent: 0,
            gap_frames: 0,
            timing: TimingAcc::new(),
        })
    }

    /// Processes the blocks in the ring now (not those arriving meanwhile, so
    /// that a fast device cannot keep it busy forever); returns whether there
    /// were any.
    pub(super) fn drain(&mut self, out: &EdgeSender<AudioFrame>) -> Result<bool, DrainStop> {
        let queued = self.blocks.slots();
        for _ in 0..queued {
            let Ok(block) = self.blocks.pop() else { break };
            if block.gap_before > 0 {
                self.end_run(out)?;
                self.run_base += rate_convert(block.gap_before, self.rate);
                self.gap_frames += block.gap_before;
            }
            self.place(&block, out)?;
            let n = block.frames * self.channels;
            let chunk = self
                .samples
                .read_chunk(n)
                .map_err(|e| DrainStop::Internal(format!("capture ring out of step: {e}")))?;
            let (a, b) = chunk.as_slices();
            self.resampler.process(a, &mut self.buf)?;
            self.resampler.process(b, &mut self.buf)?;
            chunk.commit_all();
            self.run_in += block.frames as u64;
            self.emit(out)?;
        }
        Ok(queued > 0)
    }

    /// Places `block` in time: sets [`Drainer::last_end`] to the capture
    /// instant just past its last sample and, when it starts later than the
    /// previous block ended by more than the jitter allows, ends the run
    /// there and skips the positions ahead by the gap.
    pub(super) fn place(
        &mut self,
        block: &Block,
        out: &EdgeSender<AudioFrame>,
    ) -> Result<(), DrainStop> {
        let rate = f64::from(self.rate);
        let dur = Duration::from_secs_f64(block.frames as f64 / rate);
        let arrived = block.stamp.arrived;
        // Where the previous block says this one starts (after any ring drop).
        let expected = self
            .last_end
            .map(|e| e + Duration::from_secs_f64(block.gap_before as f64 / rate));
        // When the block started, and the slack its jitter needs.
        let (start, slack) = match block.stamp.age {
            Some(age) => {
                self.timing.device_timed(age);
                (
                    arrived.checked_sub(age).unwrap_or(arrived),
                    DEVICE_GAP_SLACK,
                )
            }
            None => {
                self.timing.blocks_arrival_timed += 1;
                // its last sample at arrival
                (
                    arrived.checked_sub(dur).unwrap_or(arrived),
                    ARRIVAL_GAP_SLACK,
                )
            }
        };
        let gap = expected
            .filter(|&e| start > e + slack.max(dur * 3))
            .map(|e| start - e);
        if let Some(gap) = gap {
            self.end_run(out)?;
            self.timing.gap(self.run_base, gap);
            self.run_base += (gap.as_secs_f64() * f64::from(TARGET_RATE)).round() as u64;
        }
        let end = match (block.stamp.age, expected) {
            // the last sample cannot have been captured after the callback ran
            (Some(_), _) => (start + dur).min(arrived),
            // Arrival instants only ever run late: chain on from the previous
            // block unless that puts the end after the arrival; a chain that
            // lags arrival is pulled towards it slowly, so it follows a device
            // clock that runs slow without taking on the jitter.
            (None, Some(e)) if gap.is_none() && e + dur < arrived => {
                let chained = e + dur;
                chained + (arrived - chained) / 16
            }
            (None, _) => arrived,
        };
        self.last_end = Some(end);
        Ok(())
    }

    /// The stream position after the last emitted sample plus the frames
    /// dropped after the last block (`dropped_total` counts all drops).
    pub(super) fn end_sample(&self, dropped_total: u64) -> u64 {
        let trailing = dropped_total.saturating_sub(self.gap_frames);
        self.run_base + self.run_out + rate_convert(trailing, self.rate)
    }

    /// Processes blocks until the ring is empty (once the stream is stopped).
    pub(super) fn drain_all(&mut self, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        while self.drain(out)? {}
        Ok(())
    }

    /// Flushes the resampler and emits the tail of the current run; the next
    /// run starts where this one ended.
    pub(super) fn end_run(&mut self, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        self.resampler.flush(&mut self.buf)?;
        self.emit(out)?;
        self.run_base += self.run_out;
        self.run_in = 0;
        self.run_out = 0;
        Ok(())
    }

    /// Sends what is in `buf` as one frame, stamped with its capture instant.
    pub(super) fn emit(&mut self, out: &EdgeSender<AudioFrame>) -> Result<(), DrainStop> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let arrived = self.last_end.unwrap_or_else(|| self.clock.now());
        // Audio between this frame's first sample and the end of the last block.
        let behind = self.run_in as f64 / f64::from(self.rate)
            - self.run_out as f64 / f64::from(TARGET_RATE);
        let captured = arrived
            .checked_sub(Duration::from_secs_f64(behind.max(0.0)))
            .unwrap_or(arrived);
        let samples = std::mem::take(&mut self.buf);
        let len = samples.len() as u64;
        let frame = AudioFrame {
            start_sample: self.run_base + self.run_out,
            samples,
            captured,
            new_recording: false,
            end_of_stream: false,
        };
        self.run_out += len;
        out.send(frame).map_err(|_| DrainStop::Disconnected)?;
        self.samples_sent += len;
        self.frames_sent += 1;
        Ok(())
    }
}

/// `frames` at `rate` Hz as a count of 16 kHz samples, rounded.
pub(super) fn rate_convert(frames: u64, rate: u32) -> u64 {
    let num = u128::from(frames) * u128::from(TARGET_RATE);
    let den = u128::from(rate.max(1));
    u64::try_from((num + den / 2) / den).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use voxline_core::{edge, AudioFrame, FullPolicy};

    use super::super::test_support::{arrival, collect, device, near, setup};
    use super::super::timing::LATENCY_BUCKET_MS;
    use super::super::ClockGap;
    use super::*;

    #[test]
    fn a_gap_flushes_the_run_and_skips_the_dropped_duration() {
        let (mut w, mut d, _, _) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let now = Instant::now();
        w.write(&vec![0.1f32; 10_000][..], arrival(now));
        w.write(&vec![0.2f32; 10_000][..], arrival(now)); // dropped: 6 000 slots left
        w.write(&vec![0.3f32; 6_000][..], arrival(now));
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].start_sample, 0);
        assert_eq!(frames[1].start_sample, 20_000);
        assert!(frames[1].samples.iter().all(|&s| s == 0.3));
    }

    #[test]
    fn resampled_stereo_keeps_length_and_level() {
        let (mut w, mut d, _, _) = setup(48_000, 2, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 1_024, FullPolicy::Block);
        // 0.5 s of a 440 Hz tone, identical in both channels, in 10 ms blocks.
        let tone: Vec<f32> = (0..24_000)
            .flat_map(|i| {
                let s = 0.5 * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 48_000.0).sin();
                [s, s]
            })
            .collect();
        for block in tone.chunks(960) {
            w.write(block, arrival(Instant::now()));
            d.drain(&tx).unwrap();
        }
        d.end_run(&tx).unwrap();
        let frames = collect(&rx);
        let mut expected_start = 0;
        for f in &frames {
            assert_eq!(f.start_sample, expected_start);
            expected_start = f.end_sample();
        }
        let out: Vec<f32> = frames.into_iter().flat_map(|f| f.samples).collect();
        assert_eq!(out.len(), 8_000);
        let rms = (out[800..7_200].iter().map(|s| s * s).sum::<f32>() / 6_400.0).sqrt();
        assert!((rms - 0.5 / 2f32.sqrt()).abs() < 0.01, "rms {rms}");
    }

    #[test]
    fn a_disconnected_edge_stops_draining() {
        let (mut w, mut d, _, _) = setup(16_000, 1, 1);
        let (tx, rx) = edge::<AudioFrame>("audio", 4, FullPolicy::DropOldest);
        drop(rx);
        w.write(&[0.0f32; 100][..], arrival(Instant::now()));
        assert!(matches!(d.drain(&tx), Err(DrainStop::Disconnected)));
    }

    #[test]
    fn device_timestamps_place_each_block_and_give_the_device_latency() {
        let (mut w, mut d, _, clock) = setup(16_000, 1, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(5);
        // 10 ms blocks whose callbacks run 30, 32 and 30 ms after their first sample
        w.write(&[0.1f32; 160][..], device(t0, 30));
        w.write(
            &[0.1f32; 160][..],
            device(t0 + Duration::from_millis(12), 32),
        );
        w.write(
            &[0.1f32; 160][..],
            device(t0 + Duration::from_millis(20), 30),
        );
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 3);
        for (i, f) in frames.iter().enumerate() {
            let first = t0 + Duration::from_millis(10 * i as u64) - Duration::from_millis(30);
            assert!(near(f.captured, first), "frame {i}");
            assert_eq!(f.start_sample, 160 * i as u64);
        }
        let timing = d.timing.summary();
        assert_eq!(timing.blocks_device_timed, 3);
        assert_eq!(timing.blocks_arrival_timed, 0);
        assert_eq!(timing.clock_gaps, 0);
        let lat = timing.device_latency_ms.unwrap();
        assert_eq!(lat.n, 3);
        assert!(
            (lat.min - 30.0).abs() < 1e-6 && (lat.max - 32.0).abs() < 1e-6,
            "{lat:?}"
        );
        assert!((lat.p50 - 30.0).abs() <= LATENCY_BUCKET_MS, "{lat:?}");
        assert!((lat.mean - 30.666_666).abs() < 1e-3, "{lat:?}");
    }

    #[test]
    fn a_device_that_delivers_less_than_wall_time_opens_a_counted_clock_gap() {
        let (mut w, mut d, _, clock) = setup(16_000, 1, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(5);
        w.write(&[0.1f32; 160][..], device(t0, 20));
        // the source was suspended: the next block starts 500 ms after this one ended
        let resumed = t0 + Duration::from_millis(510);
        w.write(&[0.2f32; 160][..], device(resumed, 20));
        w.write(
            &[0.2f32; 160][..],
            device(resumed + Duration::from_millis(10), 20),
        );
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].start_sample, 0);
        // the position skipped the gap: 160 + 500 ms
        assert_eq!(frames[1].start_sample, 160 + 8_000);
        assert_eq!(frames[2].start_sample, 160 + 8_000 + 160);
        assert!(near(
            frames[1].captured,
            resumed - Duration::from_millis(20)
        ));
        let timing = d.timing.summary();
        assert_eq!(timing.clock_gaps, 1);
        assert!((timing.clock_gap_ms - 500.0).abs() < 1e-6, "{timing:?}");
        assert_eq!(
            timing.gaps,
            vec![ClockGap {
                at_sample: 160,
                ms: timing.clock_gap_ms
            }]
        );
        // jitter within the slack is no gap
        let (mut w, mut d, _, _) = setup(16_000, 1, 2);
        w.write(&[0.1f32; 160][..], device(t0, 20));
        w.write(
            &[0.1f32; 160][..],
            device(t0 + Duration::from_millis(50), 20),
        );
        d.drain(&tx).unwrap();
        assert_eq!(d.timing.summary().clock_gaps, 0);
    }

    #[test]
    fn arrival_stamps_chain_through_a_late_callback_and_reanchor_after_a_gap() {
        let (mut w, mut d, _, clock) = setup(16_000, 1, 2);
        let (tx, rx) = edge::<AudioFrame>("audio", 64, FullPolicy::Block);
        let t0 = clock.origin() + Duration::from_secs(5);
        let ms = Duration::from_millis;
        w.write(&[0.1f32; 160][..], arrival(t0));
        // a callback 100 ms late, then two more in a burst: the audio was there in time
        w.write(&[0.1f32; 160][..], arrival(t0 + ms(110)));
        w.write(&[0.1f32; 160][..], arrival(t0 + ms(111)));
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert_eq!(frames.len(), 3);
        assert!(near(frames[0].captured, t0 - ms(10)));
        // chained on (pulled towards the late arrival by 1/16 of 100 ms), not 100 ms late
        let second = frames[1].captured;
        assert!(second >= t0 && second <= t0 + ms(7), "{:?}", second - t0);
        assert!(frames[2].captured > second && frames[2].captured <= t0 + ms(25));
        assert_eq!(d.timing.summary().clock_gaps, 0);
        // a second without audio: a gap, and the stamps start again from the arrival
        let back = t0 + ms(1_500);
        w.write(&[0.1f32; 160][..], arrival(back));
        d.drain(&tx).unwrap();
        let frames = collect(&rx);
        assert!(near(frames.last().unwrap().captured, back - ms(10)));
        let timing = d.timing.summary();
        assert_eq!(timing.clock_gaps, 1);
        assert_eq!(timing.blocks_arrival_timed, 4);
        assert!(timing.device_latency_ms.is_none());
    }
}
