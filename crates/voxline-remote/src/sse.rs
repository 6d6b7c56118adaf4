//! Server-sent events, as the chat API streams them: `data:` lines, an
//! event ended by a blank line, `data: [DONE]` at the end; and the
//! streamed chat chunk each event carries.

use std::io::{BufRead, Read};

/// Longest line of a stream, bytes: a chat chunk is a few hundred bytes (a
/// token, the usage, the timings); a line past this is refused as it
/// arrives, so a server that sends no newline cannot grow memory.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Longest event (its `data` lines joined), bytes.
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Reads the events of a stream, one `data` payload at a time.
pub(crate) struct Events<R> {
    inner: R,
    line: Vec<u8>,
}

/// Why no event could be read.
#[derive(Debug)]
pub(crate) enum EventError {
    /// Reading the stream failed.
    Io(std::io::Error),
    /// An event is not UTF-8.
    NotText,
    /// A line or an event is longer than its limit ([`MAX_LINE_BYTES`],
    /// [`MAX_EVENT_BYTES`]).
    TooLong(String),
}

/// What the reading thread passes on: the next event, the end, or why not.
type Next = Result<Option<String>, EventError>;

/// How often a wait for the next event asks whether to stop.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Events read on a thread of their own (see [`EventReader::spawn`]), so
/// that whoever waits for them can stop waiting: a blocking read of a
/// stalled connection cannot be interrupted, and would hold a run's end up
/// for as long as the server's timeouts allow.
pub(crate) struct EventReader {
    events: crossbeam_channel::Receiver<Next>,
}

impl EventReader {
    /// Starts reading `events` on a new thread. At most a few events wait
    /// read ahead; the thread ends at the end of the stream, at an error,
    /// or at its next event once this reader is dropped.
    ///
    /// # Errors
    /// The thread could not be started.
    pub(crate) fn spawn<R: BufRead + Send + 'static>(
        mut events: Events<R>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded(4);
        std::thread::Builder::new()
            .name("remote-stream".into())
            .spawn(move || loop {
                let next = events.next_event();
                let last = !matches!(next, Ok(Some(_)));
                if tx.send(next).is_err() || last {
                    return;
                }
            })?;
        Ok(Self { events: rx })
    }

    /// The next event's data (see [`Events::next_event`]), or `None` once
    /// `stop` says so while waiting for it (asked every 100 ms).
    pub(crate) fn next_until(&self, stop: &dyn Fn() -> bool) -> Option<Next> {
        loop {
            match self.events.recv_timeout(STOP_POLL) {
                Ok(next) => return Some(next),
                // the thread ends only after passing on the end or an error
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Some(Ok(None)),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if stop() => return None,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

impl<R: BufRead> Events<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner,
            line: Vec::new(),
        }
    }

    /// The next event's data (its `data:` lines joined by newlines); `None`
    /// at the end of the stream. An event the stream ends inside (no blank
    /// line after it) is not returned: it may be cut short.
    pub(crate) fn next_event(&mut self) -> Result<Option<String>, EventError> {
        let mut data: Option<String> = None;
        loop {
            self.line.clear();
            // one byte past the limit tells a line too long from one just long enough
            let n = (&mut self.inner)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.line)
                .map_err(EventError::Io)?;
            if n > MAX_LINE_BYTES {
                return Err(EventError::TooLong(format!(
                    "a line of the stream is over {MAX_LINE_BYTES} bytes"
                )));
            }
            if n == 0 || !self.line.ends_with(b"\n") {
                return Ok(None);
            }
            let line = std::str::from_utf8(&self.line).map_err(|_| EventError::NotText)?;
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            if line.is_empty() {
                if let Some(d) = data.take() {
                    return Ok(Some(d));
                }
                continue;
            }
            if line.starts_with(':') {
                continue; // a comment (a keep-alive)
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            if field == "data" {
                if data.as_ref().map_or(0, String::len) + value.len() > MAX_EVENT_BYTES {
                    return Err(EventError::TooLong(format!(
                        "an event of the stream is over {MAX_EVENT_BYTES} bytes"
                    )));
                }
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_owned()),
                }
            }
            // `event`, `id`, `retry`: the chat API does not use them
        }
    }
}

/// The server's token counts (`usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Usage {
    pub(crate) prompt_tokens: Option<u32>,
    pub(crate) completion_tokens: Option<u32>,
    pub(crate) cached_tokens: Option<u32>,
}

/// The server's own timings (llama-server's `timings`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Timings {
    pub(crate) prompt_ms: Option<f64>,
    pub(crate) decode_ms: Option<f64>,
    pub(crate) cached_tokens: Option<u32>,
}

/// One streamed chat chunk, what voxline takes of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Chunk {
    /// The first choice's new text.
    pub(crate) content: Option<String>,
    /// Why the first choice ended, if it did.
    pub(crate) finish: Option<String>,
    pub(crate) usage: Option<Usage>,
    pub(crate) timings: Option<Timings>,
}

/// What a reply's figures must fit: what voxline asked for and saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    /// The request's `max_tokens`.
    pub(crate) max_tokens: u32,
    /// Pieces of text the answer streamed: an answer with text has at
    /// least one token.
    pub(crate) pieces: u32,
    /// The request body's size: a prompt cannot hold more tokens than its
    /// text has bytes.
    pub(crate) request_bytes: usize,
    /// The exchange's wall time as voxline measured it, ms: the server
    /// cannot have spent longer on it.
    pub(crate) elapsed_ms: f64,
}

/// The server's `usage` and `timings` where they can be true; a figure
/// that cannot (more completion tokens than `max_tokens`, none for an
/// answer that streamed text, a prompt longer
/// than the request, more cached tokens than the prompt, a time that is
/// negative, not finite or longer than the exchange) is dropped, and what
/// voxline counted itself stands in. The second value names what was
/// dropped, for one warning.
pub(crate) fn plausible(
    usage: Usage,
    timings: Option<Timings>,
    seen: Seen,
) -> (Usage, Option<Timings>, Vec<&'static str>) {
    let mut dropped = Vec::new();
    let mut keep = |v: Option<u32>, min: u64, max: u64, name: &'static str| {
        v.filter(|&n| {
            let ok = (min..=max).contains(&u64::from(n));
            if !ok {
                dropped.push(name);
            }
            ok
        })
    };
    let request = u64::try_from(seen.request_bytes).unwrap_or(u64::MAX);
    let prompt_tokens = keep(usage.prompt_tokens, 0, request, "usage.prompt_tokens");
    // text streamed is at least one token
    let completion_tokens = keep(
        usage.completion_tokens,
        u64::from(seen.pieces.min(1)),
        u64::from(seen.max_tokens),
        "usage.completion_tokens",
    );
    let prompt_cap = prompt_tokens.map_or(request, u64::from);
    let cached_tokens = keep(usage.cached_tokens, 0, prompt_cap, "usage.cached_tokens");
    let timings = timings.map(|t| {
        // the server's clock against voxline's: a millisecond of slack
        let mut ms = |v: Option<f64>, name: &'static str| {
            v.filter(|&x| {
                let ok = x.is_finite() && x >= 0.0 && x <= seen.elapsed_ms + 1.0;
                if !ok {
                    dropped.push(name);
                }
                ok
            })
        };
        let prompt_ms = ms(t.prompt_ms, "timings.prompt_ms");
        let decode_ms = ms(t.decode_ms, "timings.predicted_ms");
        Timings {
            prompt_ms,
            decode_ms,
            cached_tokens: t.cached_tokens.filter(|&n| {
                let ok = u64::from(n) <= prompt_cap;
                if !ok {
                    dropped.push("timings.cache_n");
                }
                ok
            }),
        }
    });
    (
        Usage {
            prompt_tokens,
            completion_tokens,
            cached_tokens,
        },
        timings,
        dropped,
    )
}

fn count(v: &serde_json::Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// Parses one event's data as a chat chunk.
///
/// # Errors
/// What is wrong with it: not JSON, an `error` object the server streamed,
/// no `choices` where there is no `usage` either.
pub(crate) fn chunk(data: &str) -> Result<Chunk, String> {
    let v: serde_json::Value =
        serde_json::from_str(data).map_err(|e| format!("an event is not JSON ({e})"))?;
    if let Some(err) = v.get("error") {
        let msg = err["message"]
            .as_str()
            .map_or_else(|| err.to_string(), str::to_owned);
        return Err(format!("the server streamed an error: {msg}"));
    }
    let usage = v.get("usage").filter(|u| u.is_object()).map(|u| Usage {
        prompt_tokens: count(&u["prompt_tokens"]),
        completion_tokens: count(&u["completion_tokens"]),
        cached_tokens: count(&u["prompt_tokens_details"]["cached_tokens"]),
    });
    let timings = v.get("timings").filter(|t| t.is_object()).map(|t| Timings {
        prompt_ms: t["prompt_ms"].as_f64(),
        decode_ms: t["predicted_ms"].as_f64(),
        cached_tokens: count(&t["cache_n"]),
    });
    let choices = match v.get("choices") {
        Some(serde_json::Value::Array(c)) => c.as_slice(),
        Some(_) => return Err("`choices` is not a list".into()),
        None if usage.is_some() || timings.is_some() => &[],
        None => return Err("a chunk with neither `choices` nor `usage`".into()),
    };
    let first = choices.first();
    let delta = first.map(|c| &c["delta"]);
    let content = match delta.map(|d| &d["content"]) {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        None | Some(serde_json::Value::Null) => None,
        Some(other) => return Err(format!("`delta.content` is not text: {other}")),
    };
    Ok(Chunk {
        content,
        finish: first.and_then(|c| c["finish_reason"].as_str().map(str::to_owned)),
        usage,
        timings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(stream: &str) -> Vec<String> {
        let mut e = Events::new(stream.as_bytes());
        let mut out = Vec::new();
        while let Some(d) = e.next_event().unwrap() {
            out.push(d);
        }
        out
    }

    #[test]
    fn figures_a_server_cannot_have_measured_are_dropped() {
        let seen = Seen {
            max_tokens: 64,
            pieces: 60,
            request_bytes: 500,
            elapsed_ms: 200.0,
        };
        let honest = Usage {
            prompt_tokens: Some(40),
            completion_tokens: Some(64),
            cached_tokens: Some(30),
        };
        let times = Timings {
            prompt_ms: Some(12.5),
            decode_ms: Some(150.0),
            cached_tokens: Some(30),
        };
        assert_eq!(
            plausible(honest, Some(times), seen),
            (honest, Some(times), vec![])
        );
        let lying = Usage {
            prompt_tokens: Some(501),
            completion_tokens: Some(u32::MAX),
            // more than the request has bytes (the prompt's own figure is dropped)
            cached_tokens: Some(600),
        };
        let bad_times = Timings {
            prompt_ms: Some(-3.0),
            decode_ms: Some(f64::NAN),
            cached_tokens: Some(501),
        };
        let (u, t, dropped) = plausible(lying, Some(bad_times), seen);
        assert_eq!(u, Usage::default());
        assert_eq!(t, Some(Timings::default()));
        assert_eq!(dropped.len(), 6, "{dropped:?}");
        // a cache larger than the prompt the server itself reported
        let (u, _, dropped) = plausible(
            Usage {
                cached_tokens: Some(41),
                ..honest
            },
            None,
            seen,
        );
        assert_eq!((u.prompt_tokens, u.cached_tokens), (Some(40), None));
        assert_eq!(dropped, ["usage.cached_tokens"]);
        // longer than the exchange took
        let (_, t, _) = plausible(
            honest,
            Some(Timings {
                decode_ms: Some(5_000.0),
                ..times
            }),
            seen,
        );
        assert_eq!(t.unwrap().decode_ms, None);
        // no tokens for an answer that streamed text; none for one that did not
        let none = Usage {
            completion_tokens: Some(0),
            ..honest
        };
        let (u, _, dropped) = plausible(none, None, seen);
        assert_eq!(
            (u.completion_tokens, dropped),
            (None, vec!["usage.completion_tokens"])
        );
        let (u, _, dropped) = plausible(none, None, Seen { pieces: 0, ..seen });
        assert_eq!((u.completion_tokens, dropped), (Some(0), vec![]));
    }

    #[test]
    fn events_are_data_lines_up_to_a_blank_line() {
        assert_eq!(
            events("data: {\"a\":1}\n\ndata: [DONE]\n\n"),
            ["{\"a\":1}", "[DONE]"]
        );
        // CRLF, comments, other fields, several data lines, no space after the colon
        assert_eq!(
            events(": keep-alive\r\n\r\nevent: x\r\nid: 3\r\ndata:one\r\ndata: two\r\n\r\n"),
            ["one\ntwo"]
        );
        // blank lines between events are nothing
        assert_eq!(events("\n\n\ndata: x\n\n\n"), ["x"]);
        // a field with no colon is a field with an empty value
        assert_eq!(events("data\n\n"), [""]);
    }

    #[test]
    fn an_event_the_stream_ends_inside_is_not_returned() {
        assert_eq!(events("data: {\"a\":1}\n\ndata: {\"b\""), ["{\"a\":1}"]);
        assert_eq!(
            events("data: {\"a\":1}\n\ndata: {\"b\":2}\n"),
            ["{\"a\":1}"]
        );
        assert!(events("").is_empty());
    }

    #[test]
    fn a_line_or_an_event_past_its_limit_is_refused_as_it_arrives() {
        // a line that never ends: refused after the limit, not read to the end
        let endless = std::io::repeat(b'a');
        let mut e = Events::new(std::io::BufReader::new(
            std::io::Cursor::new(b"data: ".to_vec()).chain(endless),
        ));
        assert!(matches!(e.next_event(), Err(EventError::TooLong(m)) if m.contains("line")));
        // a line just at the limit is fine
        let line = format!("data: {}\n\n", "x".repeat(MAX_LINE_BYTES - 7));
        assert_eq!(events(&line)[0].len(), MAX_LINE_BYTES - 7);
        // an event of many lines, each within the limit, is refused past its own
        let piece = format!("data: {}\n", "y".repeat(60_000));
        let stream = piece.repeat(6);
        let mut e = Events::new(stream.as_bytes());
        assert!(matches!(e.next_event(), Err(EventError::TooLong(m)) if m.contains("event")));
    }

    #[test]
    fn an_event_that_is_not_text_is_an_error() {
        let mut e = Events::new(&b"data: \xff\xfe\n\n"[..]);
        assert!(matches!(e.next_event(), Err(EventError::NotText)));
    }

    #[test]
    fn chunks_give_content_finish_usage_and_timings() {
        let c = chunk(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}],"object":"chat.completion.chunk"}"#).unwrap();
        assert_eq!(c.content.as_deref(), Some("Hel"));
        assert_eq!(c.finish, None);
        let c = chunk(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#).unwrap();
        assert_eq!((c.content, c.finish.as_deref()), (None, Some("length")));
        let c = chunk(r#"{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":24}},"timings":{"cache_n":24,"prompt_n":6,"prompt_ms":12.5,"predicted_n":9,"predicted_ms":80.25}}"#).unwrap();
        assert_eq!(
            c.usage,
            Some(Usage {
                prompt_tokens: Some(30),
                completion_tokens: Some(9),
                cached_tokens: Some(24)
            })
        );
        assert_eq!(
            c.timings,
            Some(Timings {
                prompt_ms: Some(12.5),
                decode_ms: Some(80.25),
                cached_tokens: Some(24)
            })
        );
        // usage alone, no choices (vLLM's last chunk)
        let c = chunk(r#"{"usage":{"prompt_tokens":3,"completion_tokens":1}}"#).unwrap();
        assert_eq!(c.usage.and_then(|u| u.completion_tokens), Some(1));
        // a null usage is no usage
        let c = chunk(r#"{"choices":[{"delta":{"content":"x"}}],"usage":null}"#).unwrap();
        assert_eq!(c.usage, None);
    }

    #[test]
    fn malformed_chunks_say_what_is_wrong() {
        for (data, says) in [
            ("{\"choices\":[{\"delta\":{\"content\":\"x\"", "not JSON"),
            ("not json", "not JSON"),
            ("{\"id\":1}", "neither"),
            ("{\"choices\":{}}", "not a list"),
            ("{\"choices\":[{\"delta\":{\"content\":5}}]}", "not text"),
            (
                "{\"error\":{\"message\":\"context too long\",\"code\":400}}",
                "streamed an error: context too long",
            ),
        ] {
            let e = chunk(data).unwrap_err();
            assert!(e.contains(says), "{data}: {e}");
        }
    }
}
