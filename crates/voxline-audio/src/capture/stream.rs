//! Building the cpal input stream: the period to ask for, and the callback
//! (typed by the device's sample format) that feeds the ring.

use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use cpal::traits::DeviceTrait;
use cpal::{FromSample, SampleFormat, SizedSample};
use voxline_core::Clock;

use super::devices::open_error;
use super::ring::{BlockWriter, Counters, Stamp};
use super::{CaptureError, DEFAULT_BUFFER_MS, MAX_BUFFER_MS};

/// The period to ask for, in device frames at `rate`: `wanted_ms` (default
/// [`DEFAULT_BUFFER_MS`]) moved into the `supported` range, with a note when
/// a period the caller asked for had to be moved.
pub(super) fn choose_period(
    rate: u32,
    supported: &cpal::SupportedBufferSize,
    wanted_ms: Option<u32>,
) -> (u32, Option<String>) {
    let ms = wanted_ms
        .unwrap_or(DEFAULT_BUFFER_MS)
        .clamp(1, MAX_BUFFER_MS);
    let frames = u32::try_from((u64::from(rate) * u64::from(ms)).div_ceil(1000))
        .unwrap_or(u32::MAX)
        .max(1);
    match *supported {
        cpal::SupportedBufferSize::Range { min, max } if min.max(1) <= max => {
            let chosen = frames.clamp(min.max(1), max);
            let note = (wanted_ms.is_some() && chosen != frames).then(|| {
                let to_ms = |f: u32| f64::from(f) * 1000.0 / f64::from(rate.max(1));
                format!(
                    "{ms} ms is {frames} frames at {rate} Hz, outside the device's {min}–{max} frames \
                     ({:.1}–{:.1} ms): {chosen} frames ({:.1} ms) asked for",
                    to_ms(min),
                    to_ms(max),
                    to_ms(chosen)
                )
            });
            (chosen, note)
        }
        _ => (frames, None),
    }
}

/// The consumer thread, once it runs: the input callback wakes it after
/// each block (an unpark, which never blocks), and so does a stream error.
pub(super) type Waker = Arc<std::sync::OnceLock<std::thread::Thread>>;

/// What the input callback and the error callback share.
pub(super) struct Ends {
    pub(super) writer: BlockWriter,
    pub(super) errors: SyncSender<cpal::Error>,
    pub(super) counters: Arc<Counters>,
    pub(super) wake: Waker,
}

/// Builds the cpal input stream whose callback feeds `ends.writer` and
/// wakes the consumer.
pub(super) fn build_stream(
    device: &cpal::Device,
    device_id: &str,
    config: cpal::StreamConfig,
    format: SampleFormat,
    ends: Ends,
    clock: Clock,
) -> Result<cpal::Stream, CaptureError> {
    fn typed<T>(
        device: &cpal::Device,
        config: cpal::StreamConfig,
        ends: Ends,
        clock: Clock,
    ) -> Result<cpal::Stream, cpal::Error>
    where
        T: SizedSample,
        f32: FromSample<T>,
    {
        let Ends {
            mut writer,
            errors,
            counters,
            wake,
        } = ends;
        let wake_on_error = Arc::clone(&wake);
        device.build_input_stream::<T, _, _>(
            config,
            move |data: &[T], info: &cpal::InputCallbackInfo| {
                writer.write(data, Stamp::device(clock.now(), info.timestamp()));
                if let Some(t) = wake.get() {
                    t.unpark();
                }
            },
            move |e: cpal::Error| {
                if e.kind() == cpal::ErrorKind::Xrun {
                    counters.overruns.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Full means the consumer already has plenty to report.
                    let _ = errors.try_send(e);
                    if let Some(t) = wake_on_error.get() {
                        t.unpark();
                    }
                }
            },
            None,
        )
    }
    let built = match format {
        SampleFormat::I8 => typed::<i8>(device, config, ends, clock),
        SampleFormat::I16 => typed::<i16>(device, config, ends, clock),
        SampleFormat::I24 => typed::<cpal::I24>(device, config, ends, clock),
        SampleFormat::I32 => typed::<i32>(device, config, ends, clock),
        SampleFormat::I64 => typed::<i64>(device, config, ends, clock),
        SampleFormat::U8 => typed::<u8>(device, config, ends, clock),
        SampleFormat::U16 => typed::<u16>(device, config, ends, clock),
        SampleFormat::U24 => typed::<cpal::U24>(device, config, ends, clock),
        SampleFormat::U32 => typed::<u32>(device, config, ends, clock),
        SampleFormat::U64 => typed::<u64>(device, config, ends, clock),
        SampleFormat::F32 => typed::<f32>(device, config, ends, clock),
        SampleFormat::F64 => typed::<f64>(device, config, ends, clock),
        other => {
            return Err(CaptureError::UnsupportedConfig {
                device: device_id.to_owned(),
                reason: format!("sample format {other} is not PCM audio"),
            })
        }
    };
    built.map_err(|e| open_error(device_id, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_small_and_within_what_the_device_supports() {
        use cpal::SupportedBufferSize::{Range, Unknown};
        // 10 ms by default
        assert_eq!(
            choose_period(
                48_000,
                &Range {
                    min: 16,
                    max: 8_192
                },
                None
            ),
            (480, None)
        );
        assert_eq!(choose_period(44_100, &Unknown, None), (441, None));
        // the smallest the device supports when that is more
        assert_eq!(
            choose_period(
                48_000,
                &Range {
                    min: 1_024,
                    max: 8_192
                },
                None
            ),
            (1_024, None)
        );
        // what was asked for, moved into the range with a note
        assert_eq!(
            choose_period(
                16_000,
                &Range {
                    min: 16,
                    max: 8_192
                },
                Some(25)
            ),
            (400, None)
        );
        let (frames, note) = choose_period(
            48_000,
            &Range {
                min: 1_024,
                max: 8_192,
            },
            Some(5),
        );
        assert_eq!(frames, 1_024);
        let note = note.unwrap();
        assert!(note.contains("5 ms is 240 frames"), "{note}");
        assert!(note.contains("1024 frames (21.3 ms)"), "{note}");
        let (frames, _) = choose_period(
            48_000,
            &Range {
                min: 16,
                max: 4_096,
            },
            Some(1_000),
        );
        assert_eq!(frames, 4_096);
    }
}
