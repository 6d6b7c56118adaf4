//! What goes over the socket: the client's hello and audio frames, and the
//! server's events (the `--events` schema: `type`, `id` = the turn, `t_ms`,
//! then the event's own fields; each finished turn carries its latency
//! figures).

use serde::{Deserialize, Serialize};
use voxline_audio::StreamResampler;
use voxline_core::SAMPLE_RATE;
use voxline_llm::Stop;

/// Lowest and highest sample rate a client may declare, Hz.
pub const RATES: std::ops::RangeInclusive<u32> = 8_000..=192_000;
/// Most interleaved channels a client may declare.
pub const MAX_CHANNELS: u16 = 8;
/// Largest message accepted, bytes: an audio frame of 2 s of 16 kHz mono
/// s16le, 170 ms of 48 kHz stereo f32le, at most 4 s of audio at any rate
/// (well inside a session's 20 s queue). Browsers send 3-100 ms frames.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// How the client's samples are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleFormat {
    /// Signed 16-bit little-endian integers.
    S16le,
    /// 32-bit little-endian floats in [-1, 1].
    F32le,
}

impl SampleFormat {
    /// Bytes per sample.
    #[must_use]
    pub fn bytes(self) -> usize {
        match self {
            Self::S16le => 2,
            Self::F32le => 4,
        }
    }
}

/// The client's first message:
/// `{"type":"hello","sample_rate":16000,"channels":1,"format":"s16le"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Samples per second per channel.
    pub sample_rate: u32,
    /// Interleaved channels (mixed down to mono).
    pub channels: u16,
    /// The sample encoding.
    pub format: SampleFormat,
}

/// The hello as it is written.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HelloWire {
    #[serde(rename = "type")]
    kind: HelloTag,
    sample_rate: u32,
    channels: u16,
    format: SampleFormat,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum HelloTag {
    Hello,
}

impl Hello {
    /// The hello as one line of JSON.
    #[must_use]
    pub fn to_json(&self) -> String {
        let wire = HelloWire {
            kind: HelloTag::Hello,
            sample_rate: self.sample_rate,
            channels: self.channels,
            format: self.format,
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// The hello a 16 kHz mono s16le client sends (the page, `bench --via`).
    #[must_use]
    pub fn pcm16k() -> Self {
        Hello {
            sample_rate: SAMPLE_RATE,
            channels: 1,
            format: SampleFormat::S16le,
        }
    }

    /// Reads and checks a hello.
    ///
    /// # Errors
    /// One line saying what was wrong and what a hello looks like.
    pub fn parse(text: &str) -> Result<Self, String> {
        const SHAPE: &str =
            r#"send {"type":"hello","sample_rate":16000,"channels":1,"format":"s16le"} first"#;
        let wire: HelloWire =
            serde_json::from_str(text).map_err(|e| format!("bad hello ({e}); {SHAPE}"))?;
        let hello = Hello {
            sample_rate: wire.sample_rate,
            channels: wire.channels,
            format: wire.format,
        };
        if !RATES.contains(&hello.sample_rate) {
            return Err(format!(
                "bad hello: sample_rate {} is outside {}..={} Hz",
                hello.sample_rate,
                RATES.start(),
                RATES.end()
            ));
        }
        if hello.channels == 0 || hello.channels > MAX_CHANNELS {
            return Err(format!(
                "bad hello: channels {} is outside 1..={MAX_CHANNELS}",
                hello.channels
            ));
        }
        Ok(hello)
    }
}

/// What a client may send as text after the hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    /// The speaker is done: close the open utterance now.
    End,
}

/// Turns the client's frames into 16 kHz mono samples.
#[derive(Debug)]
pub struct Decoder {
    format: SampleFormat,
    channels: usize,
    resampler: StreamResampler,
    scratch: Vec<f32>,
}

impl Decoder {
    /// A decoder for what `hello` declared.
    ///
    /// # Errors
    /// The resampler's reason when it cannot take the rate.
    pub fn new(hello: Hello) -> Result<Self, String> {
        let resampler = StreamResampler::new(hello.sample_rate, hello.channels)
            .map_err(|e| format!("bad hello: {e}"))?;
        Ok(Decoder {
            format: hello.format,
            channels: usize::from(hello.channels),
            resampler,
            scratch: Vec::new(),
        })
    }

    /// Decodes one binary frame into 16 kHz mono samples.
    ///
    /// # Errors
    /// One line when the frame is empty, too large, or not whole samples of
    /// every channel.
    pub fn frame(&mut self, bytes: &[u8]) -> Result<Vec<f32>, String> {
        let unit = self.format.bytes() * self.channels;
        if bytes.is_empty() || bytes.len() > MAX_FRAME_BYTES || !bytes.len().is_multiple_of(unit) {
            return Err(format!(
                "bad frame: {} bytes is not 1 to {MAX_FRAME_BYTES} bytes of whole {}-byte frames ({} × {} channel(s))",
                bytes.len(),
                unit,
                match self.format {
                    SampleFormat::S16le => "s16le",
                    SampleFormat::F32le => "f32le",
                },
                self.channels
            ));
        }
        self.scratch.clear();
        match self.format {
            SampleFormat::S16le => self.scratch.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0),
            ),
            SampleFormat::F32le => {
                for b in bytes.chunks_exact(4) {
                    let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if !x.is_finite() {
                        return Err("bad frame: a sample is not a finite number".into());
                    }
                    self.scratch.push(x.clamp(-1.0, 1.0));
                }
            }
        }
        let mut out = Vec::with_capacity(self.scratch.len());
        self.resampler
            .process(&self.scratch, &mut out)
            .map_err(|e| format!("resampling failed: {e}"))?;
        Ok(out)
    }

    /// The resampler's buffered tail, at the end of the stream.
    #[must_use]
    pub fn flush(&mut self) -> Vec<f32> {
        let mut out = Vec::new();
        let _ = self.resampler.flush(&mut out);
        out
    }
}

/// Encodes 16 kHz mono samples as one s16le frame (the page's and
/// `bench --via`'s encoding).
#[must_use]
pub fn encode_s16le(samples: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(samples.len() * 2);
    for &x in samples {
        // round to nearest: a 16-bit recording passes through bit-exact
        #[allow(clippy::cast_possible_truncation)]
        let v = (x * 32768.0).round().clamp(-32768.0, 32767.0) as i16;
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// One turn's latency figures, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Latency {
    /// The end of speech (as the VAD marked it) arriving at the server →
    /// the first token leaving it.
    pub response_ms: Option<f64>,
    /// Whisper's own time.
    pub stt_ms: f64,
    /// Waiting for the CPU before whisper ran.
    pub stt_wait_ms: f64,
    /// The transcript handed to the LLM → its first token.
    pub first_token_ms: Option<f64>,
    /// First token → last token.
    pub decode_ms: Option<f64>,
}

/// What the server says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerEvent {
    /// The hello was accepted: send audio.
    Ready {
        /// The session's slot.
        session: usize,
        /// The rate the server works at (it resamples what it is sent).
        sample_rate: u32,
        /// Sessions the server holds at most.
        max_sessions: usize,
    },
    /// A turn's words.
    Transcript {
        /// The session's turn number.
        id: u32,
        /// The end of speech in the stream (16 kHz samples).
        sample: u64,
        /// Since the session started, ms.
        t_ms: f64,
        /// What whisper heard.
        text: String,
        /// Whisper's own time, ms.
        stt_ms: f64,
        /// Waiting for the CPU before whisper ran, ms.
        stt_wait_ms: f64,
    },
    /// A piece of the answer.
    Token {
        /// The turn.
        id: u32,
        /// Since the session started, ms.
        t_ms: f64,
        /// Position in the answer, from 0.
        index: u32,
        /// The text.
        text: String,
    },
    /// The answer is complete.
    TurnComplete {
        /// The turn.
        id: u32,
        /// Since the session started, ms.
        t_ms: f64,
        /// What whisper heard.
        transcript: String,
        /// The whole answer.
        response: String,
        /// Tokens sampled.
        n_generated: u32,
        /// Why the answer ended.
        stop: Stop,
        /// The turn's latency figures.
        latency: Latency,
    },
    /// The turn was taken back: the speaker went on within moments of its
    /// end (`--semantic-turn` had ended it early). Nothing more of its
    /// answer comes, and its words start the next turn, which answers the
    /// whole.
    TurnMerged {
        /// The turn.
        id: u32,
        /// Since the session started, ms.
        t_ms: f64,
    },
    /// The turn failed.
    TurnError {
        /// The turn.
        id: u32,
        /// Since the session started, ms.
        t_ms: f64,
        /// What went wrong.
        message: String,
    },
    /// Events or audio were lost on the way (counted since the last such event).
    Dropped {
        /// `client` (the outgoing queue of a client that does not read),
        /// `events` (the session's event queue) or `audio` (refused frames).
        edge: String,
        /// How many.
        count: u64,
    },
    /// A block of the spoken answer follows as the next binary frame:
    /// `samples` mono samples at `sample_rate`, 16-bit little-endian PCM
    /// (`format`: `s16le`). A server started with `--voice` sends it.
    Voice {
        /// The turn.
        id: u32,
        /// Since the session started, ms.
        t_ms: f64,
        /// Which chunk of the answer (from 0).
        chunk: u32,
        /// The frame's sample rate.
        sample_rate: u32,
        /// Always `s16le`.
        format: String,
        /// Samples in the frame.
        samples: usize,
        /// The chunk's text, on its first block.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// On the answer's first block: the end of speech arriving → this
        /// block leaving, ms (the voice latency as the server sees it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        voice_latency_ms: Option<f64>,
        /// The frame itself (not in the JSON: the binary frame after it).
        #[serde(skip)]
        pcm: Vec<u8>,
    },
    /// Every utterance before the client's `end` has been transcribed.
    StreamEnd {
        /// Since the session started, ms.
        t_ms: f64,
    },
    /// The server's load, about once a second.
    Stats {
        /// Sessions connected.
        sessions: usize,
        /// Each stage's share of the last seconds (every stage of the
        /// pipeline, added ones included).
        utilisation: std::collections::BTreeMap<String, f64>,
        /// The stage with the largest share (what limits the server now), or
        /// `idle` when none ran.
        bottleneck: String,
    },
}

impl ServerEvent {
    /// The event as one line of JSON.
    #[must_use]
    pub fn to_json(&self) -> String {
        // only strings, numbers and enums: serialising cannot fail
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A close reason fitted into a WebSocket close frame (at most 123 bytes).
#[must_use]
pub fn close_reason(text: &str) -> String {
    if text.len() <= 123 {
        return text.to_string();
    }
    let mut end = 120;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_is_checked_field_by_field() {
        let ok =
            Hello::parse(r#"{"type":"hello","sample_rate":48000,"channels":2,"format":"f32le"}"#)
                .unwrap();
        assert_eq!(
            ok,
            Hello {
                sample_rate: 48_000,
                channels: 2,
                format: SampleFormat::F32le
            }
        );
        for (bad, says) in [
            ("not json", "bad hello"),
            (
                r#"{"type":"hi","sample_rate":16000,"channels":1,"format":"s16le"}"#,
                "bad hello",
            ),
            (
                r#"{"type":"hello","sample_rate":16000,"channels":1}"#,
                "missing field `format`",
            ),
            (
                r#"{"type":"hello","sample_rate":16000,"channels":1,"format":"u8"}"#,
                "unknown variant",
            ),
            (
                r#"{"type":"hello","sample_rate":100,"channels":1,"format":"s16le"}"#,
                "sample_rate 100",
            ),
            (
                r#"{"type":"hello","sample_rate":16000,"channels":0,"format":"s16le"}"#,
                "channels 0",
            ),
            (
                r#"{"type":"hello","sample_rate":16000,"channels":1,"format":"s16le","x":1}"#,
                "unknown field",
            ),
        ] {
            let e = Hello::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn s16le_round_trips_bit_exact_and_bad_frames_are_named() {
        let samples: Vec<f32> = [0i16, 1, -1, 12_345, -32_768, 32_767]
            .iter()
            .map(|&v| f32::from(v) / 32768.0)
            .collect();
        let mut d = Decoder::new(Hello::pcm16k()).unwrap();
        assert_eq!(d.frame(&encode_s16le(&samples)).unwrap(), samples);
        assert!(d.frame(&[1, 2, 3]).unwrap_err().contains("3 bytes"));
        assert!(d.frame(&[]).unwrap_err().contains("0 bytes"));
        let mut f = Decoder::new(Hello {
            sample_rate: 16_000,
            channels: 2,
            format: SampleFormat::F32le,
        })
        .unwrap();
        // two channels mixed down to their mean
        let frame: Vec<u8> = [0.5f32, 0.25, -1.0, 1.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(f.frame(&frame).unwrap(), vec![0.375, 0.0]);
        assert!(f.frame(&frame[..4]).unwrap_err().contains("8-byte"));
        let nan: Vec<u8> = [f32::NAN, 0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert!(f.frame(&nan).unwrap_err().contains("finite"));
    }

    #[test]
    fn a_48k_stream_comes_out_at_16k() {
        let mut d = Decoder::new(Hello {
            sample_rate: 48_000,
            channels: 1,
            format: SampleFormat::S16le,
        })
        .unwrap();
        let tone: Vec<f32> = (0..48_000)
            .map(|i| 0.5 * (i as f32 * 440.0 * std::f32::consts::TAU / 48_000.0).sin())
            .collect();
        let mut n = 0;
        for block in tone.chunks(960) {
            n += d.frame(&encode_s16le(block)).unwrap().len();
        }
        n += d.flush().len();
        assert_eq!(n, 16_000);
    }

    #[test]
    fn events_carry_the_events_schema_tags() {
        let e = ServerEvent::TurnComplete {
            id: 2,
            t_ms: 1.5,
            transcript: "hi".into(),
            response: "hello".into(),
            n_generated: 3,
            stop: Stop::EndOfGeneration,
            latency: Latency {
                response_ms: Some(900.0),
                ..Latency::default()
            },
        };
        let j = e.to_json();
        assert!(j.starts_with(r#"{"type":"turn_complete","id":2"#), "{j}");
        assert!(j.contains(r#""stop":"end_of_generation""#), "{j}");
        let back: ServerEvent = serde_json::from_str(&j).unwrap();
        assert_eq!(back, e);
        assert_eq!(
            serde_json::from_str::<Control>(r#"{"type":"end"}"#).unwrap(),
            Control::End
        );
        assert_eq!(
            Hello::parse(&Hello::pcm16k().to_json()).unwrap(),
            Hello::pcm16k()
        );
    }

    #[test]
    fn close_reasons_fit_a_close_frame() {
        let long = "é".repeat(100);
        let r = close_reason(&long);
        assert!(r.len() <= 123 && r.ends_with("..."));
        assert_eq!(close_reason("short"), "short");
    }
}
