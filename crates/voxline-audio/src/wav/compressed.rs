//! Compressed recordings (MP3, FLAC, Ogg/Vorbis, MP4/M4A with AAC) through symphonia.

use std::path::Path;

use symphonia::core::codecs::audio::{AudioDecoder, AudioDecoderOptions};
use symphonia::core::codecs::CodecParameters;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

use crate::{AudioError, MAX_CHANNELS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};

/// Consecutive undecodable packets tolerated (each is skipped) before giving up.
const MAX_BAD_PACKETS: u32 = 16;

/// How a decode step ended.
pub(crate) enum PacketEnd {
    /// Samples were appended; more may follow.
    More,
    /// The stream ended.
    Done,
    /// Decoding failed; the message says why.
    Failed(String),
    /// The stream ended early (an I/O end of file inside a packet).
    Short,
}

/// A demuxer and decoder for the first audio track.
pub(crate) struct CompressedStream {
    format: Box<dyn FormatReader>,
    decoder: Box<dyn AudioDecoder>,
    track_id: u32,
    pub sample_rate: u32,
    pub channels: u16,
    /// Frames the container declares, when it does.
    pub declared_frames: Option<u64>,
    bad_packets: u32,
}

impl CompressedStream {
    /// Probes `source` (whose first bytes said it is `kind`) and opens its first audio track.
    pub(crate) fn open(
        path: &Path,
        kind: &str,
        source: Box<dyn MediaSource>,
    ) -> Result<Self, AudioError> {
        let unsupported = |reason: String| AudioError::UnsupportedFormat {
            path: path.to_owned(),
            format: kind.to_owned(),
            reason,
        };
        let mss = MediaSourceStream::new(source, MediaSourceStreamOptions::default());
        let mut hint = Hint::new();
        if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
            hint.with_extension(ext);
        }
        let format = symphonia::default::get_probe()
            .probe(
                &hint,
                mss,
                FormatOptions::default(),
                MetadataOptions::default(),
            )
            .map_err(|e| unsupported(describe(&e)))?;
        let track = format
            .default_track(TrackType::Audio)
            .ok_or_else(|| unsupported("it holds no audio track".to_owned()))?;
        let Some(CodecParameters::Audio(params)) = &track.codec_params else {
            return Err(unsupported("it holds no audio track".to_owned()));
        };
        let sample_rate = params
            .sample_rate
            .ok_or_else(|| unsupported("its audio track has no sample rate".to_owned()))?;
        let channels = params
            .channels
            .as_ref()
            .map(|c| c.count())
            .ok_or_else(|| unsupported("its audio track has no channel layout".to_owned()))?;
        if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&sample_rate) {
            return Err(AudioError::UnsupportedSampleRate {
                path: path.to_owned(),
                rate: sample_rate,
            });
        }
        let channels = u16::try_from(channels)
            .ok()
            .filter(|c| (1..=MAX_CHANNELS).contains(c))
            .ok_or(AudioError::UnsupportedChannels {
                path: path.to_owned(),
                channels: u16::try_from(channels).unwrap_or(u16::MAX),
            })?;
        let decoder = symphonia::default::get_codecs()
            .make_audio_decoder(params, &AudioDecoderOptions::default())
            .map_err(|e| unsupported(describe(&e)))?;
        Ok(CompressedStream {
            track_id: track.id,
            declared_frames: track.num_frames,
            format,
            decoder,
            sample_rate,
            channels,
            bad_packets: 0,
        })
    }

    /// Decodes the next packet of the track, appending its interleaved samples to `out`.
    pub(crate) fn read_packet(&mut self, out: &mut Vec<f32>, scratch: &mut Vec<f32>) -> PacketEnd {
        loop {
            let packet = match self.format.next_packet() {
                Ok(Some(p)) => p,
                Ok(None) => return PacketEnd::Done,
                Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return PacketEnd::Short
                }
                Err(e) => return PacketEnd::Failed(describe(&e)),
            };
            if packet.track_id != self.track_id {
                continue;
            }
            match self.decoder.decode(&packet) {
                Ok(buf) => {
                    self.bad_packets = 0;
                    if buf.spec().rate() != self.sample_rate
                        || buf.spec().channels().count() != usize::from(self.channels)
                    {
                        return PacketEnd::Failed(
                            "the sample rate or channel count changes mid-stream".to_owned(),
                        );
                    }
                    buf.copy_to_vec_interleaved(scratch);
                    out.extend_from_slice(scratch);
                    return PacketEnd::More;
                }
                // A damaged packet: skip it, as players do, unless damage goes on and on.
                Err(SymError::DecodeError(why)) if self.bad_packets < MAX_BAD_PACKETS => {
                    self.bad_packets += 1;
                    tracing::warn!(reason = why, "skipped an undecodable packet");
                }
                Err(e) => return PacketEnd::Failed(describe(&e)),
            }
        }
    }
}

fn describe(e: &SymError) -> String {
    match e {
        SymError::Unsupported(what) => format!("unsupported: {what}"),
        other => other.to_string(),
    }
}
