//! The conversation as it was heard: a stereo WAV of a replay, the user on
//! the left channel and the assistant's voice on the right, both on the
//! input's timeline at 16 kHz (`voxline replay --voice-out`).
//!
//! Each spoken answer starts where its first audio left voxline — the turn's
//! end of speech plus its voice latency, on the report's clock (the wall
//! clock at real-time pace, the virtual one at fast pace) — and plays on
//! without gaps, as a player would play it; an answer that starts while the
//! one before is still playing waits for it. At real-time pace a block that
//! arrived after the audio before it had finished playing starts when it
//! arrived (the gap a listener heard).

use std::collections::BTreeMap;
use std::time::Instant;

use voxline_core::UtteranceId;
use voxline_pipeline::pipeline::{Pace, RunResult};
use voxline_tts::VoiceAudio;

use crate::Report;

/// The rate of both channels.
pub const RATE: u32 = voxline_core::SAMPLE_RATE;

/// The assistant's voice on the input's timeline (16 kHz mono).
///
/// # Errors
/// When a block's audio cannot be resampled.
pub fn assistant_track(run: &RunResult, report: &Report) -> Result<Vec<f32>, String> {
    let mut blocks: BTreeMap<UtteranceId, Vec<(Instant, &VoiceAudio)>> = BTreeMap::new();
    for ev in &run.events {
        if let Some(a) = ev.event.engine::<VoiceAudio>() {
            blocks.entry(a.id).or_default().push((ev.at, a));
        }
    }
    let wall = matches!(run.pace, Pace::Realtime | Pace::Live);
    let at_ms = |i: Instant| run.clock.ms_since_origin(i);
    let mut track: Vec<f32> = Vec::new();
    for t in &report.turns {
        let Some(turn) = blocks.get(&t.id) else {
            continue;
        };
        // where the first audio left voxline, on the report's clock
        let start_ms = match t.voice_latency_ms {
            Some(v) => t.timeline.end_of_speech_ms + v,
            None if wall => at_ms(turn[0].0),
            None => continue,
        };
        let rate = turn[0].1.sample_rate;
        let mut resampler =
            voxline_audio::StreamResampler::new(rate, 1).map_err(|e| e.to_string())?;
        let mut pos = to_sample(start_ms).max(track.len());
        for (at, block) in turn {
            if wall {
                // an underrun: the block came after what was before it had played
                pos = pos.max(to_sample(at_ms(*at)));
            }
            let mut out = Vec::new();
            resampler
                .process(&block.samples, &mut out)
                .map_err(|e| e.to_string())?;
            place(&mut track, pos, &out);
            pos += out.len();
        }
        let mut tail = Vec::new();
        resampler.flush(&mut tail).map_err(|e| e.to_string())?;
        place(&mut track, pos, &tail);
    }
    Ok(track)
}

fn to_sample(ms: f64) -> usize {
    (ms.max(0.0) * f64::from(RATE) / 1000.0).round() as usize
}

/// Writes `samples` into `track` from `at`, growing it as needed.
fn place(track: &mut Vec<f32>, at: usize, samples: &[f32]) {
    if track.len() < at + samples.len() {
        track.resize(at + samples.len(), 0.0);
    }
    for (d, s) in track[at..].iter_mut().zip(samples) {
        *d += *s;
    }
}

/// A stereo 16-bit WAV of `user` (left) and `assistant` (right), as long
/// as the longer of them.
///
/// # Errors
/// The WAV writer's error.
pub fn stereo_wav(user: &[f32], assistant: &[f32]) -> Result<Vec<u8>, hound::Error> {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut bytes = std::io::Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut bytes, spec)?;
    let pcm = |x: f32| (x.clamp(-1.0, 1.0) * 32767.0).round() as i16;
    for i in 0..user.len().max(assistant.len()) {
        w.write_sample(pcm(user.get(i).copied().unwrap_or(0.0)))?;
        w.write_sample(pcm(assistant.get(i).copied().unwrap_or(0.0)))?;
    }
    w.finalize()?;
    Ok(bytes.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_placed_and_overlaps_mix() {
        let mut t = Vec::new();
        place(&mut t, 2, &[0.5, 0.5]);
        place(&mut t, 3, &[0.25]);
        assert_eq!(t, [0.0, 0.0, 0.5, 0.75]);
        assert_eq!(to_sample(1000.0), 16_000);
        assert_eq!(to_sample(-5.0), 0);
    }

    #[test]
    fn the_wav_is_stereo_user_left_assistant_right() {
        let bytes = stereo_wav(&[0.5, 0.5, 0.5], &[-0.5]).unwrap();
        let mut r = hound::WavReader::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!((r.spec().channels, r.spec().sample_rate), (2, 16_000));
        let s: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
        assert_eq!(s, [16384, -16384, 16384, 0, 16384, 0]);
    }
}
