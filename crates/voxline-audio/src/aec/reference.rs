//! What the loudspeaker played, sample by sample, on the session clock: the
//! echo canceller's far end.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::StreamResampler;

/// How much of what played the reference keeps (16 kHz samples): enough
/// for the lead and the sound server's buffering on both sides.
const KEEP: usize = 16_000 * 2;

/// What the voice's output sent to the device, resampled to 16 kHz, with
/// when each sample left it. The speaker's thread pushes every buffer the
/// callback played (silent ones too, so the timeline has no holes) as the
/// callback wakes it; the echo canceller reads the stretch that sounded at
/// a given instant, waiting for it when it is not known yet
/// ([`EchoReference::wait_known`]). Cloning shares it.
#[derive(Clone, Default)]
pub struct EchoReference {
    inner: Arc<(Mutex<Timeline>, Condvar)>,
}

impl std::fmt::Debug for EchoReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoReference").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Timeline {
    /// The device's rate and the resampler from it to 16 kHz.
    resampler: Option<(u32, StreamResampler)>,
    /// Device frames pushed so far.
    in_frames: u64,
    /// The last buffer's first frame: when it played, and its index.
    anchor: Option<(Instant, u64)>,
    /// The 16 kHz samples kept, the first of them `first` in the stream.
    samples: VecDeque<f32>,
    first: u64,
    /// Scratch for the resampler's output.
    out: Vec<f32>,
}

impl EchoReference {
    /// An empty reference: nothing played.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The output played `samples` (mono, at `rate` Hz), the first of them
    /// at `at`. A buffer at another rate than the last starts afresh.
    pub fn push(&self, at: Instant, samples: &[f32], rate: u32) {
        let mut t = self.lock();
        if t.resampler.as_ref().is_none_or(|(r, _)| *r != rate) {
            let Ok(r) = StreamResampler::new(rate, 1) else {
                return;
            };
            *t = Timeline {
                resampler: Some((rate, r)),
                ..Timeline::default()
            };
        }
        let at_frame = t.in_frames;
        t.anchor = Some((at, at_frame));
        t.in_frames += samples.len() as u64;
        let Timeline { resampler, out, .. } = &mut *t;
        out.clear();
        if let Some((_, r)) = resampler.as_mut() {
            if r.process(samples, out).is_err() {
                out.clear();
            }
        }
        let fresh = std::mem::take(&mut t.out);
        t.samples.extend(fresh.iter().copied());
        t.out = fresh;
        let over = t.samples.len().saturating_sub(KEEP);
        t.samples.drain(..over);
        t.first += over as u64;
        drop(t);
        self.inner.1.notify_all();
    }

    /// Waits until the reference knows the samples up to `needed` (a
    /// [`known_index`](Self::known_index)), woken by each push, until
    /// `deadline` at most; not at all before anything is known, nor when
    /// what is known is more than `behind` samples short of it (a stalled
    /// output: waiting would only hold the microphone back).
    pub fn wait_known(&self, needed: i64, behind: i64, deadline: Instant) {
        let mut t = self.lock();
        loop {
            let Some(known) = t.anchor.map(|_| (t.first + t.samples.len() as u64) as i64) else {
                return;
            };
            if known >= needed || needed - known > behind {
                return;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            t = match self.inner.1.wait_timeout(t, left) {
                Ok((t, _)) => t,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Fills `out` with the 16 kHz samples that sounded from `from` on;
    /// zeros where nothing is known (before the voice, or not played yet).
    /// Returns whether any of them is sound.
    pub fn read(&self, from: Instant, out: &mut [f32]) -> bool {
        match self.index_at(from) {
            Some(index) => self.read_index(index.round() as i64, out),
            None => {
                out.fill(0.0);
                false
            }
        }
    }

    /// The position (16 kHz samples since the first pushed, fractional) of
    /// the sample that sounded at `at`, through the last buffer's instant;
    /// `None` before anything played. Each buffer's instant comes from the
    /// device and jitters by some ms, and so does this.
    #[must_use]
    pub fn index_at(&self, at: Instant) -> Option<f64> {
        let t = self.lock();
        let (played, frame) = t.anchor?;
        let (rate, _) = t.resampler.as_ref()?;
        let anchor_s = frame as f64 / f64::from(*rate);
        let offset_s = if at >= played {
            at.duration_since(played).as_secs_f64()
        } else {
            -played.duration_since(at).as_secs_f64()
        };
        Some((anchor_s + offset_s) * 16_000.0)
    }

    /// Fills `out` with the samples from position `index` on (see
    /// [`index_at`](Self::index_at)); zeros where nothing is known (no
    /// longer kept, or not played yet). Returns whether any is sound.
    pub fn read_index(&self, index: i64, out: &mut [f32]) -> bool {
        out.fill(0.0);
        let t = self.lock();
        let mut loud = false;
        for (i, o) in out.iter_mut().enumerate() {
            let k = index + i as i64;
            if k < t.first as i64 {
                continue;
            }
            let Some(s) = t.samples.get((k - t.first as i64) as usize) else {
                break;
            };
            *o = *s;
            loud |= *s != 0.0;
        }
        loud
    }

    /// The position just past the last sample known (`None` before any).
    #[must_use]
    pub fn known_index(&self) -> Option<i64> {
        let t = self.lock();
        t.anchor?;
        Some((t.first + t.samples.len() as u64) as i64)
    }

    /// When the last sample known sounds (`None` before any).
    #[must_use]
    pub fn known_until(&self) -> Option<Instant> {
        let t = self.lock();
        let (at, frame) = t.anchor?;
        let (rate, _) = t.resampler.as_ref()?;
        let ahead = t.in_frames.saturating_sub(frame);
        Some(at + Duration::from_secs_f64(ahead as f64 / f64::from(*rate)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Timeline> {
        voxline_core::sync::lock(&self.inner.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_played_is_read_back_at_the_instant_it_sounded() {
        let r = EchoReference::new();
        let t0 = Instant::now();
        // 16 kHz buffers of 10 ms: a ramp, so each sample says where it is
        let mut n = 0.0f32;
        for b in 0..50u32 {
            let buf: Vec<f32> = (0..160)
                .map(|_| {
                    n += 1.0;
                    n / 100_000.0
                })
                .collect();
            r.push(t0 + Duration::from_millis(u64::from(b) * 10), &buf, 16_000);
        }
        let mut out = [0.0f32; 160];
        assert!(r.read(t0 + Duration::from_millis(200), &mut out));
        // sample 3200 is the 3201st pushed
        assert!((out[0] - 3201.0 / 100_000.0).abs() < 1e-6, "{}", out[0]);
        assert!((out[159] - 3360.0 / 100_000.0).abs() < 1e-6);
        // before anything played, and after what is known: silence
        assert!(!r.read(t0 - Duration::from_secs(1), &mut out));
        assert!(!r.read(t0 + Duration::from_secs(1), &mut out));
        assert_eq!(r.known_until(), Some(t0 + Duration::from_millis(500)));
    }

    #[test]
    fn a_device_rate_is_resampled_to_16_khz_in_place() {
        let r = EchoReference::new();
        let t0 = Instant::now();
        // 48 kHz: silence for 100 ms, then a tone
        for b in 0..40u32 {
            let buf: Vec<f32> = (0..480)
                .map(|i| {
                    if b < 10 {
                        0.0
                    } else {
                        (f64::from(b * 480 + i) * 2.0 * std::f64::consts::PI * 440.0 / 48_000.0)
                            .sin() as f32
                            * 0.5
                    }
                })
                .collect();
            r.push(t0 + Duration::from_millis(u64::from(b) * 10), &buf, 48_000);
        }
        let mut out = [0.0f32; 160];
        let rms = |s: &[f32]| (s.iter().map(|x| x * x).sum::<f32>() / s.len() as f32).sqrt();
        r.read(t0 + Duration::from_millis(40), &mut out);
        assert!(rms(&out) < 0.01, "silence reads {}", rms(&out));
        r.read(t0 + Duration::from_millis(200), &mut out);
        assert!(
            (rms(&out) - 0.35).abs() < 0.05,
            "the tone reads {}",
            rms(&out)
        );
    }
}
