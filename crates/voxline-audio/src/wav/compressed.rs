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
    /// The first packet's samples, decoded at open (see [`CompressedStream::open_file`]).
    primed: Option<(Vec<f32>, bool)>,
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
            .map_err(|e| match e {
                SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => unsupported(
                    "it ends before its header and first audio could be read: it was cut short, or its header is damaged (a rate, size or bit depth that its frames do not have)".to_owned(),
                ),
                e => unsupported(describe(&e)),
            })?;
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
            primed: None,
        })
    }

    /// Opens a regular file: with seeks first, then, when that fails at
    /// the probe or on the first packet (an Ogg cut inside a page, an MP4
    /// whose index promises more than the file holds), front to back as a
    /// stream, which decodes what is there and reports the cut.
    pub(crate) fn open_file(
        path: &Path,
        kind: &str,
        file: std::fs::File,
    ) -> Result<Self, AudioError> {
        let again = file.try_clone().ok();
        let e = match Self::open(path, kind, Box::new(file)).and_then(|s| s.primed(path, kind)) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let Some(mut f) = again else {
            return Err(e);
        };
        if std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).is_err() {
            return Err(e);
        }
        let source = symphonia::core::io::ReadOnlySource::new(f);
        // the first failure names the file's own problem
        Self::open(path, kind, Box::new(source))
            .and_then(|s| s.primed(path, kind))
            .map_err(|_| e)
    }

    /// The next stream of a chain (Ogg): its decoder, when it has the
    /// first one's rate and channels.
    fn next_in_chain(&mut self) -> Result<(), String> {
        let track = self
            .format
            .default_track(TrackType::Audio)
            .ok_or("the next stream of the chain holds no audio")?;
        let Some(CodecParameters::Audio(params)) = &track.codec_params else {
            return Err("the next stream of the chain holds no audio".to_owned());
        };
        let channels = params.channels.as_ref().map(|c| c.count());
        if params.sample_rate != Some(self.sample_rate)
            || channels != Some(usize::from(self.channels))
        {
            return Err(format!(
                "it is a chain of recordings, and the next one has {} Hz and {} channel(s) where the first has {} Hz and {}; convert it to one recording",
                params.sample_rate.unwrap_or(0),
                channels.unwrap_or(0),
                self.sample_rate,
                self.channels
            ));
        }
        self.decoder = symphonia::default::get_codecs()
            .make_audio_decoder(params, &AudioDecoderOptions::default())
            .map_err(|e| describe(&e))?;
        self.track_id = track.id;
        Ok(())
    }

    /// The stream with its first packet decoded, so that a file that
    /// cannot give one is known at open.
    fn primed(mut self, path: &Path, kind: &str) -> Result<Self, AudioError> {
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        match self.read_packet(&mut out, &mut scratch) {
            end @ (PacketEnd::More | PacketEnd::Done) => {
                self.primed = Some((out, matches!(end, PacketEnd::Done)));
                Ok(self)
            }
            PacketEnd::Short => Err(AudioError::CutShort {
                path: path.to_owned(),
                format: kind.to_owned(),
                seconds: 0.0,
            }),
            PacketEnd::Failed(reason) => Err(AudioError::Decode {
                path: path.to_owned(),
                seconds: 0.0,
                frames_read: 0,
                reason,
            }),
        }
    }

    /// Decodes the next packet of the track, appending its interleaved samples to `out`.
    pub(crate) fn read_packet(&mut self, out: &mut Vec<f32>, scratch: &mut Vec<f32>) -> PacketEnd {
        if let Some((first, done)) = self.primed.take() {
            out.extend_from_slice(&first);
            return if done {
                PacketEnd::Done
            } else {
                PacketEnd::More
            };
        }
        loop {
            let mut packet = match self.format.next_packet() {
                Ok(Some(p)) => p,
                Ok(None) => return PacketEnd::Done,
                Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return PacketEnd::Short
                }
                // a chained Ogg: the next logical stream begins
                Err(SymError::ResetRequired) => match self.next_in_chain() {
                    Ok(()) => continue,
                    Err(why) => return PacketEnd::Failed(why),
                },
                Err(e) => return PacketEnd::Failed(describe(&e)),
            };
            if packet.track_id != self.track_id {
                continue;
            }
            // A packet wholly past the length the header declared is another
            // recording appended to this one (MP3s concatenated): the demuxer
            // would have it trimmed away as the first one's padding.
            let past = self
                .declared_frames
                .is_some_and(|n| u64::try_from(packet.pts.get()).is_ok_and(|pts| pts >= n));
            if past {
                packet.trim_start = symphonia::core::units::Duration::ZERO;
                packet.trim_end = symphonia::core::units::Duration::ZERO;
            }
            match self.decoder.decode(&packet) {
                Ok(buf) => {
                    self.bad_packets = 0;
                    if buf.spec().rate() != self.sample_rate
                        || buf.spec().channels().count() != usize::from(self.channels)
                    {
                        return PacketEnd::Failed(format!(
                            "its sample rate or channel count changes mid-stream ({} Hz, {} channel(s) where it began with {} Hz, {}; recordings of different rates joined?); convert it to one rate",
                            buf.spec().rate(),
                            buf.spec().channels().count(),
                            self.sample_rate,
                            self.channels
                        ));
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
        // the MP3 decoder's words for a frame of another rate or channel
        // count than the stream began with (files of two rates joined)
        other if other.to_string().contains("signal spec") => {
            "its sample rate or channel count changes mid-stream (recordings of different rates joined?); convert it to one rate".to_owned()
        }
        other => other.to_string(),
    }
}
