//! Speech to text on a remote server: `POST /v1/audio/transcriptions`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ureq::unversioned::multipart::{Form, Part};
use voxline_stt::{SpeechToText, SttError, Transcription};

use crate::{Client, RemoteError};

const PATH: &str = "/audio/transcriptions";

/// Whisper's first special token: segment token ids below it are text.
const FIRST_SPECIAL_TOKEN: u64 = 50256;

/// Most characters a server's transcript may hold per second of its audio.
/// Whisper writes at most 448 tokens a 30 s window (some 15 a second, about
/// 70 characters of English) and the fastest speech is some 25 characters
/// a second: a transcript past this is not of the audio sent.
pub const MAX_TRANSCRIPT_CHARS_PER_S: usize = 100;

/// The most characters any transcript may hold, however short its audio:
/// one window of whisper's longest output, with room to spare.
pub const MIN_TRANSCRIPT_CHAR_LIMIT: usize = 3_000;

/// Most characters of a transcript of `audio_ms` of audio:
/// [`MAX_TRANSCRIPT_CHARS_PER_S`] a second, at least
/// [`MIN_TRANSCRIPT_CHAR_LIMIT`]. A server's transcript past it is a
/// malformed reply, neither shown nor answered.
#[must_use]
pub fn transcript_char_limit(audio_ms: f64) -> usize {
    // an utterance is at most minutes long: the product fits
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let by_length =
        (audio_ms.max(0.0) / 1000.0 * MAX_TRANSCRIPT_CHARS_PER_S as f64).ceil() as usize;
    by_length.max(MIN_TRANSCRIPT_CHAR_LIMIT)
}

/// How a remote server is asked for a transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct SttOptions {
    /// The model to ask for (`model`; a server with one model ignores it).
    pub model: String,
    /// The language spoken (`language`), if known.
    pub language: Option<String>,
    /// Tries of one transcription (a connection refused, a timeout, a
    /// server error or an overloaded server is tried again, after 100 ms,
    /// then four times longer each time).
    pub tries: u32,
}

impl Default for SttOptions {
    /// `whisper-1`, English, three tries.
    fn default() -> Self {
        Self {
            model: "whisper-1".into(),
            language: Some("en".into()),
            tries: 3,
        }
    }
}

/// A remote speech-to-text engine, as the STT stage's engine: each
/// utterance is sent as a 16-bit WAV and its transcript read from the
/// reply (`verbose_json`, whose segments give whisper's token count; the
/// words are counted where a server sends text only). The request runs on
/// a thread of its own, so a cancelled speculative attempt returns at once
/// (its reply, when it comes, is thrown away).
#[derive(Debug, Clone)]
pub struct RemoteStt {
    client: Client,
    options: SttOptions,
}

impl RemoteStt {
    /// Transcribes on `client`'s server.
    #[must_use]
    pub fn new(client: Client, options: SttOptions) -> Self {
        Self { client, options }
    }

    /// The server.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// `samples` (16 kHz mono, -1..1) as a 16-bit PCM WAV file.
fn wav(samples: &[f32]) -> Result<Vec<u8>, hound::Error> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: voxline_core::SAMPLE_RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = std::io::Cursor::new(Vec::with_capacity(44 + samples.len() * 2));
    {
        let mut w = hound::WavWriter::new(&mut out, spec)?;
        for &s in samples {
            // saturating: the cast clamps what clipping pushed past full scale
            #[allow(clippy::cast_possible_truncation)]
            w.write_sample((s * 32767.0).round() as i16)?;
        }
        w.finalize()?;
    }
    Ok(out.into_inner())
}

/// The transcript and its token count from a reply's body; a transcript of
/// more than `max_chars` characters is refused.
fn parse(client: &Client, body: &str, max_chars: usize) -> Result<(String, u32), RemoteError> {
    let v = client.json(PATH, body)?;
    let text = v["text"]
        .as_str()
        .ok_or_else(|| client.malformed(PATH, "no `text` in the reply".into()))?
        .trim();
    let chars = text.chars().count();
    if chars > max_chars {
        return Err(client.malformed(
            PATH,
            format!(
                "a transcript of {chars} characters, past the limit of {max_chars} for this \
                 audio ({MAX_TRANSCRIPT_CHARS_PER_S} a second, at least \
                 {MIN_TRANSCRIPT_CHAR_LIMIT})"
            ),
        ));
    }
    let text = text.to_owned();
    let tokens: Option<u64> = v["segments"].as_array().map(|segs| {
        segs.iter()
            .filter_map(|s| s["tokens"].as_array())
            .flatten()
            .filter(|t| t.as_u64().is_some_and(|id| id < FIRST_SPECIAL_TOKEN))
            .count() as u64
    });
    let n = match tokens.filter(|&n| n > 0) {
        Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
        None => u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX),
    };
    Ok((text, n))
}

/// One transcription, tried again while it is safe and not abandoned.
fn request(
    client: &Client,
    options: &SttOptions,
    audio: &[u8],
    max_chars: usize,
    abandoned: &AtomicBool,
) -> Result<(String, u32), RemoteError> {
    let mut wait = Duration::from_millis(100);
    let mut tried = 1;
    loop {
        let mut form = Form::new()
            .text("model", &options.model)
            .text("response_format", "verbose_json")
            .text("temperature", "0");
        if let Some(l) = &options.language {
            form = form.text("language", l);
        }
        let part = Part::bytes(audio)
            .file_name("utterance.wav")
            .mime_str("audio/wav")
            .map_err(|e| client.malformed(PATH, e.to_string()))?;
        let r = client
            .post_form(PATH, form.part("file", part))
            .and_then(|body| parse(client, &body, max_chars));
        match r {
            Err(e) if e.retryable() && tried < options.tries => {
                tracing::warn!(error = %e, "transcribing again");
                std::thread::sleep(wait);
                if abandoned.load(Ordering::Relaxed) {
                    return Err(e);
                }
                wait *= 4;
                tried += 1;
            }
            r => return r,
        }
    }
}

impl SpeechToText for RemoteStt {
    fn transcribe(
        &mut self,
        samples: &[f32],
        _chunk: bool,
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        let audio_ms = samples.len() as f64 * 1000.0 / f64::from(voxline_core::SAMPLE_RATE);
        let audio = wav(samples).map_err(|e| SttError::Remote(Box::new(e)))?;
        let max_chars = transcript_char_limit(audio_ms);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let abandoned = Arc::new(AtomicBool::new(false));
        let (client, options, gone) =
            (self.client.clone(), self.options.clone(), abandoned.clone());
        std::thread::Builder::new()
            .name("stt-request".into())
            .spawn(move || {
                let _ = tx.send(request(&client, &options, &audio, max_chars, &gone));
            })
            .map_err(|e| SttError::Remote(Box::new(e)))?;
        let result = loop {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(r) => break r,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    if abort() {
                        abandoned.store(true, Ordering::Relaxed);
                        return Err(SttError::Aborted);
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(SttError::Remote(
                        "the transcription's request thread ended without a reply".into(),
                    ))
                }
            }
        };
        let (text, n_tokens) = result.map_err(|e| SttError::Remote(Box::new(e)))?;
        Ok(Transcription {
            text,
            n_tokens,
            audio_ms,
            audio_ctx: 0,
            confidence: None,
        })
    }

    fn threads(&self) -> usize {
        0
    }

    fn computes_here(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, Timeouts};

    fn client() -> Client {
        Client::new(
            Endpoint::parse("--stt-url", "http://127.0.0.1:9", None).unwrap(),
            Timeouts::default(),
        )
    }

    #[test]
    fn utterances_go_as_16_bit_wav_that_reads_back() {
        let samples: Vec<f32> = (0..1600).map(|i| ((i as f32) / 50.0).sin() * 0.5).collect();
        let mut clipped = samples.clone();
        clipped[0] = 1.7;
        clipped[1] = -3.0;
        let bytes = wav(&clipped).unwrap();
        let r = hound::WavReader::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(r.spec().sample_rate, 16_000);
        assert_eq!(r.spec().channels, 1);
        let back: Vec<i16> = r.into_samples().map(Result::unwrap).collect();
        assert_eq!(back.len(), 1600);
        assert_eq!((back[0], back[1]), (i16::MAX, i16::MIN));
        assert_eq!(back[100], (samples[100] * 32767.0).round() as i16);
    }

    #[test]
    fn replies_give_the_text_and_whispers_token_count() {
        let c = client();
        let verbose = r#"{"task":"transcribe","text":" What is the capital of France?","segments":[{"id":0,"text":" What is the capital of France?","tokens":[50363,1867,318,262,3139,286,4881,30,50513]}]}"#;
        assert_eq!(
            parse(&c, verbose, 3000).unwrap(),
            ("What is the capital of France?".into(), 7)
        );
        // text only: the words are counted
        assert_eq!(
            parse(&c, r#"{"text":" Two words "}"#, 3000).unwrap(),
            ("Two words".into(), 2)
        );
        for (body, says) in [("{\"words\":[]}", "no `text`"), ("<html>", "not JSON")] {
            let e = parse(&c, body, 3000).unwrap_err().to_string();
            assert!(
                e.contains(says) && e.starts_with("127.0.0.1:9: /v1/audio/transcriptions"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_transcript_longer_than_speech_can_be_is_refused_not_shown() {
        let c = client();
        assert_eq!(transcript_char_limit(2_000.0), 3_000);
        assert_eq!(transcript_char_limit(60_000.0), 6_000);
        let at = |n: usize| format!(r#"{{"text":"{}"}}"#, "a".repeat(n));
        assert_eq!(parse(&c, &at(3_000), 3_000).unwrap().0.len(), 3_000);
        // characters, not bytes, and the text itself stays out of the message
        let e = parse(&c, &format!(r#"{{"text":"{}"}}"#, "é".repeat(3_001)), 3_000).unwrap_err();
        assert!(!e.retryable());
        let e = e.to_string();
        assert!(
            e.contains("a transcript of 3001 characters, past the limit of 3000")
                && !e.contains('é'),
            "{e}"
        );
    }

    #[test]
    fn a_reply_that_is_not_utf8_is_malformed_and_asked_once() {
        use std::io::{BufRead as _, Read as _, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let n = Arc::clone(&asked);
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                n.fetch_add(1, Ordering::Relaxed);
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let _ = r.read_exact(&mut vec![0; len]);
                let body = b"{\"text\":\"caf\xe9\"}";
                let _ = s.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                    .as_bytes(),
                );
                let _ = s.write_all(body);
            }
        });
        let mut stt = RemoteStt::new(
            Client::new(
                Endpoint::parse("--stt-url", &format!("http://127.0.0.1:{port}"), None).unwrap(),
                Timeouts::default(),
            ),
            SttOptions::default(),
        );
        let e = stt.transcribe(&[0.0; 1600], false, &|| false).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("malformed reply (not UTF-8: the byte at offset 12 of 15 is not text)"),
            "{e}"
        );
        assert_eq!(asked.load(Ordering::Relaxed), 1, "asked again");
    }

    #[test]
    fn an_abort_returns_at_once_whatever_the_server_does() {
        // a listener that accepts and never answers
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut stt = RemoteStt::new(
            Client::new(
                Endpoint::parse("--stt-url", &format!("http://127.0.0.1:{port}"), None).unwrap(),
                Timeouts::default(),
            ),
            SttOptions::default(),
        );
        let asked = std::sync::atomic::AtomicU32::new(0);
        let r = stt.transcribe(&[0.0; 1600], false, &|| {
            asked.fetch_add(1, Ordering::Relaxed) >= 3
        });
        assert!(matches!(r, Err(SttError::Aborted)), "{r:?}");
        assert!(stt.threads() == 0 && !stt.computes_here());
    }
}
