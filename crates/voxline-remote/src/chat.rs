//! The language model on a remote server: `POST /v1/chat/completions`,
//! streamed.

use std::io::BufReader;

use voxline_llm::{ChatBackend, LlmCounters, LlmError, Response, ServerCounts, Stop, TokenSource};

use crate::sse::{self, EventError, Events};
use crate::{Client, RemoteError};

const PATH: &str = "/chat/completions";

/// How a remote conversation is asked for its answers.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOptions {
    /// The model to ask for (as the server names it).
    pub model: String,
    /// The system prompt, first in every request.
    pub system_prompt: String,
    /// Most tokens per answer (`max_tokens`).
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// Sampling seed (servers that take one).
    pub seed: u32,
    /// Remember earlier turns; without, each request is the system prompt
    /// and the turn.
    pub memory: bool,
    /// The most characters of history sent with a turn: the oldest turns
    /// are left out first, so a long conversation stays within the server's
    /// context (about three characters a token).
    pub history_chars: usize,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct Message {
    role: &'static str,
    content: String,
}

/// A conversation with a remote language model, as the language-model
/// stage's backend. The conversation is kept here and sent whole with each
/// turn, the system prompt first and every earlier message byte for byte as
/// before, so a server with a prefix cache (llama-server, vLLM) evaluates
/// only what is new. A checkpoint is the conversation's length, so
/// speculation works as with the local engine: a cancelled attempt's stream
/// is closed at its next token and its turn forgotten.
#[derive(Debug)]
pub struct RemoteChat {
    client: Client,
    options: ChatOptions,
    /// User and assistant messages, alternating.
    history: Vec<Message>,
}

impl RemoteChat {
    /// A new conversation on `client`'s server.
    #[must_use]
    pub fn new(client: Client, options: ChatOptions) -> Self {
        Self {
            client,
            options,
            history: Vec::new(),
        }
    }

    /// The conversation's messages so far, as `(role, content)`.
    #[must_use]
    pub fn history(&self) -> Vec<(&str, &str)> {
        self.history
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect()
    }

    /// Keeps a turn and its answer in the conversation.
    fn remember(&mut self, user: &str, answer: &str) {
        for (role, content) in [("user", user), ("assistant", answer)] {
            self.history.push(Message {
                role,
                content: content.to_owned(),
            });
        }
    }

    /// The request's body: the system prompt, the history that fits, the
    /// turn. Returns the body and the number of turns left out.
    fn request(&self, user: &str) -> (Vec<u8>, u32) {
        let mut from = 0;
        if self.options.memory {
            let mut chars: usize = self.history.iter().map(|m| m.content.len()).sum();
            // whole turns (a user message and its answer) go, oldest first
            while chars > self.options.history_chars && from + 2 <= self.history.len() {
                chars -= self.history[from].content.len() + self.history[from + 1].content.len();
                from += 2;
            }
        } else {
            from = self.history.len();
        }
        let system = Message {
            role: "system",
            content: self.options.system_prompt.clone(),
        };
        let turn = Message {
            role: "user",
            content: user.to_owned(),
        };
        let messages: Vec<&Message> = std::iter::once(&system)
            .chain(&self.history[from..])
            .chain(std::iter::once(&turn))
            .collect();
        let body = serde_json::json!({
            "model": self.options.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": self.options.max_tokens,
            "temperature": self.options.temperature,
            "seed": self.options.seed,
        });
        let dropped = if self.options.memory {
            u32::try_from(from / 2).unwrap_or(u32::MAX)
        } else {
            0
        };
        (body.to_string().into_bytes(), dropped)
    }

    fn stream(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Response, RemoteError> {
        let (body, dropped_turns) = self.request(user);
        let started = std::time::Instant::now();
        let request_bytes = body.len();
        let reply = self.client.post_json(PATH, &body)?;
        let events = Events::new(BufReader::new(reply.into_body().into_reader()));
        let events =
            sse::EventReader::spawn(events).map_err(|e| self.client.read_error(PATH, &e))?;
        let mut text = String::new();
        let (mut chunks, mut stop, mut finished, mut done) = (0u32, None, false, false);
        let (mut usage, mut timings) = (None, None);
        loop {
            let Some(next) = events.next_until(stopped) else {
                // the run stops: a stalled server is not waited for
                stop = Some(Stop::Cancelled);
                break;
            };
            let data = match next {
                Ok(Some(d)) => d,
                Ok(None) => break,
                Err(EventError::Io(e)) => return Err(self.client.read_error(PATH, &e)),
                Err(EventError::NotText) => {
                    return Err(self.client.malformed(PATH, "an event is not UTF-8".into()))
                }
                Err(EventError::TooLong(what)) => return Err(self.client.malformed(PATH, what)),
            };
            if data.trim() == "[DONE]" {
                done = true;
                break;
            }
            let c = sse::chunk(&data).map_err(|d| self.client.malformed(PATH, d))?;
            usage = c.usage.or(usage);
            timings = c.timings.or(timings);
            if let Some(reason) = c.finish {
                finished = true;
                stop = Some(match reason.as_str() {
                    "length" => Stop::MaxTokens,
                    _ => Stop::EndOfGeneration,
                });
            }
            if let Some(piece) = c.content.filter(|p| !p.is_empty()) {
                if chunks >= self.options.max_tokens {
                    // a server that streams past the answer's limit is held
                    // to it: dropping the reply closes the connection
                    tracing::warn!(
                        server = self.client.endpoint().server(),
                        max_tokens = self.options.max_tokens,
                        "the server streamed past max_tokens; the answer ends there"
                    );
                    stop = Some(Stop::MaxTokens);
                    finished = true;
                    break;
                }
                let limit = answer_byte_limit(self.options.max_tokens);
                if text.len() + piece.len() > limit {
                    return Err(self.client.malformed(
                        PATH,
                        format!(
                            "the answer passed {limit} bytes, more than {} tokens can hold",
                            self.options.max_tokens
                        ),
                    ));
                }
                text.push_str(&piece);
                chunks += 1;
                if !on_token(&piece) {
                    // dropping the reply closes the connection: the server stops generating
                    stop = Some(Stop::Cancelled);
                    break;
                }
            }
        }
        if stop != Some(Stop::Cancelled) && !(done || finished) {
            return Err(RemoteError::CutShort {
                server: self.client.endpoint().server().to_owned(),
                path: self.client.shown(PATH),
                detail: format!(
                    "the stream ended after {chunks} pieces with no finish_reason and no [DONE]"
                ),
            });
        }
        let stop = stop.unwrap_or(Stop::EndOfGeneration);
        let (usage, timings, dropped) = sse::plausible(
            usage.unwrap_or_default(),
            timings,
            sse::Seen {
                max_tokens: self.options.max_tokens,
                pieces: chunks,
                request_bytes,
                elapsed_ms: started.elapsed().as_secs_f64() * 1000.0,
            },
        );
        if !dropped.is_empty() {
            tracing::warn!(
                server = self.client.endpoint().server(),
                figures = dropped.join(", "),
                "the server's figures cannot be true; voxline's own count stands in"
            );
        }
        let (tokens_from, completion) = match usage.completion_tokens {
            Some(n) => (TokenSource::Usage, n),
            None => (TokenSource::Chunks, chunks),
        };
        let prompt = usage.prompt_tokens.unwrap_or(0);
        let cached = usage
            .cached_tokens
            .or(timings.and_then(|t| t.cached_tokens));
        let prefill = prompt.saturating_sub(cached.unwrap_or(0));
        if stop != Stop::Cancelled && self.options.memory {
            self.remember(user, &text);
        }
        Ok(Response {
            text,
            n_prompt_tokens: prompt,
            n_prefill_tokens: prefill,
            n_sampled: completion,
            n_streamed: chunks,
            stop,
            dropped_turns,
            engine: LlmCounters {
                n_prefill_tokens: prefill,
                n_decode_tokens: completion,
            },
            server: Some(ServerCounts {
                server: self.client.endpoint().server().to_owned(),
                tokens_from,
                prompt_tokens: usage.prompt_tokens,
                cached_tokens: cached,
                completion_tokens: completion,
                prompt_ms: timings.and_then(|t| t.prompt_ms),
                decode_ms: timings.and_then(|t| t.decode_ms),
            }),
        })
    }
}

/// Most bytes one token's text may take in a streamed answer: a token of a
/// real vocabulary is a few bytes, its longest a few dozen.
pub const MAX_BYTES_PER_TOKEN: usize = 64;

/// Most bytes of an answer of `max_tokens` tokens ([`MAX_BYTES_PER_TOKEN`]
/// each); a server that sends more is refused as the bytes arrive.
#[must_use]
pub fn answer_byte_limit(max_tokens: u32) -> usize {
    (max_tokens as usize).saturating_mul(MAX_BYTES_PER_TOKEN)
}

impl ChatBackend for RemoteChat {
    type Checkpoint = usize;

    /// Streams the answer. A connection that fails before anything was sent
    /// is tried again (twice, after 100 and 400 ms); one that breaks once
    /// the answer streams is the turn's error (its half cannot be resent).
    fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError> {
        self.respond_until(user, on_token, &|| false)
    }

    /// As [`ChatBackend::respond`]; while the server sends nothing, `stop`
    /// is asked every 100 ms, and ends the answer as cancelled (the
    /// stream is read on a thread of its own, so a stalled read never
    /// holds up the run's end).
    fn respond_until(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
        stop: &dyn Fn() -> bool,
    ) -> Result<Response, LlmError> {
        let mut wait = std::time::Duration::from_millis(100);
        let mut tries = 0;
        loop {
            match self.stream(user, on_token, stop) {
                Err(e @ RemoteError::Connect { .. }) if tries < 2 => {
                    tracing::warn!(error = %e, "connecting to the language model's server again");
                    std::thread::sleep(wait);
                    wait *= 4;
                    tries += 1;
                }
                r => return r.map_err(|e| LlmError::Remote(Box::new(e))),
            }
        }
    }

    fn can_roll_back(&self) -> bool {
        true
    }

    fn checkpoint(&mut self) -> Option<usize> {
        Some(self.history.len())
    }

    fn rollback(&mut self, checkpoint: usize) -> Result<(), LlmError> {
        self.history.truncate(checkpoint);
        Ok(())
    }

    fn computes_here(&self) -> bool {
        false
    }

    fn amend_answer(&mut self, back: usize, answer: &str) {
        if let Some(m) = self
            .history
            .iter_mut()
            .rev()
            .filter(|m| m.role == "assistant")
            .nth(back)
        {
            answer.clone_into(&mut m.content);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, Timeouts};

    fn chat(memory: bool, history_chars: usize) -> RemoteChat {
        let c = Client::new(
            Endpoint::parse("--llm-url", "http://127.0.0.1:9", None).unwrap(),
            Timeouts::default(),
        );
        RemoteChat::new(
            c,
            ChatOptions {
                model: "m".into(),
                system_prompt: "Be brief.".into(),
                max_tokens: 8,
                temperature: 0.0,
                seed: 1,
                memory,
                history_chars,
            },
        )
    }

    /// A server on the loopback that answers one request with `headers`
    /// and then whatever `body` writes (until it fails: the client closed).
    fn hostile(
        body: impl FnOnce(&mut std::net::TcpStream) -> std::io::Result<()> + Send + 'static,
    ) -> (String, std::thread::JoinHandle<()>) {
        use std::io::{BufRead as _, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            std::io::Read::read_exact(&mut r, &mut vec![0; len]).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
                .unwrap();
            let _ = body(&mut s);
        });
        (url, h)
    }

    fn chat_at(url: &str, max_tokens: u32) -> RemoteChat {
        RemoteChat::new(
            Client::new(
                Endpoint::parse("--llm-url", url, None).unwrap(),
                Timeouts::default(),
            ),
            ChatOptions {
                model: "m".into(),
                system_prompt: "Be brief.".into(),
                max_tokens,
                temperature: 0.0,
                seed: 1,
                memory: true,
                history_chars: 10_000,
            },
        )
    }

    fn piece(text: &str) -> String {
        format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [{"index": 0, "delta": {"content": text}}]})
        )
    }

    #[test]
    fn a_server_that_streams_past_max_tokens_is_held_to_it() {
        use std::io::Write as _;
        // endless pieces, never a finish_reason
        let (url, h) = hostile(|s| loop {
            s.write_all(piece("la ").as_bytes())?;
        });
        let mut c = chat_at(&url, 64);
        let mut seen = 0u32;
        let r = c
            .stream(
                "sing",
                &mut |_| {
                    seen += 1;
                    true
                },
                &|| false,
            )
            .unwrap();
        assert_eq!((seen, r.n_streamed), (64, 64));
        assert_eq!(r.stop, Stop::MaxTokens);
        assert_eq!(r.text, "la ".repeat(64));
        h.join().unwrap();
    }

    #[test]
    fn an_answer_bigger_than_its_tokens_can_hold_is_refused_as_it_arrives() {
        use std::io::Write as _;
        // four pieces of 40 KB: each event within its limit, the answer not
        let (url, h) = hostile(|s| loop {
            s.write_all(piece(&"x".repeat(40_000)).as_bytes())?;
        });
        let mut c = chat_at(&url, 64);
        let e = c
            .stream("hi", &mut |_| true, &|| false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("passed 4096 bytes"), "{e}");
        h.join().unwrap();
    }

    #[test]
    fn a_line_without_an_end_is_refused_at_its_limit() {
        use std::io::Write as _;
        let (url, h) = hostile(|s| {
            s.write_all(b"data: ")?;
            let block = [b'a'; 8192];
            loop {
                s.write_all(&block)?;
            }
        });
        let mut c = chat_at(&url, 64);
        let e = c
            .stream("hi", &mut |_| true, &|| false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line of the stream is over 65536 bytes"), "{e}");
        h.join().unwrap();
    }

    fn said(c: &mut RemoteChat, user: &str, answer: &str) {
        c.remember(user, answer);
    }

    fn messages(body: &[u8]) -> Vec<(String, String)> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn each_request_repeats_the_conversation_byte_for_byte_and_adds_the_turn() {
        let mut c = chat(true, 10_000);
        let (first, _) = c.request("hi");
        said(&mut c, "hi", "Hello.");
        let (second, dropped) = c.request("and you?");
        assert_eq!(dropped, 0);
        // the second request's messages start with the first's, unchanged
        let (a, b) = (
            String::from_utf8(first).unwrap(),
            String::from_utf8(second).unwrap(),
        );
        let prefix = a.find("{\"content\":\"hi\"").unwrap();
        assert_eq!(a[..prefix], b[..prefix]);
        assert_eq!(
            messages(b.as_bytes()),
            [
                ("system".into(), "Be brief.".into()),
                ("user".into(), "hi".into()),
                ("assistant".into(), "Hello.".into()),
                ("user".into(), "and you?".into()),
            ]
        );
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["max_tokens"], 8);
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn the_oldest_turns_go_first_when_the_history_is_too_long() {
        let mut c = chat(true, 25);
        said(&mut c, "one one one", "first answer");
        said(&mut c, "two", "second");
        let (body, dropped) = c.request("three");
        assert_eq!(dropped, 1);
        let m = messages(&body);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].1, "two");
        // without memory: the system prompt and the turn only
        let mut c = chat(false, 10_000);
        said(&mut c, "one", "a");
        let (body, dropped) = c.request("two");
        assert_eq!((messages(&body).len(), dropped), (2, 0));
    }

    #[test]
    fn checkpoints_roll_the_conversation_back_and_barge_in_amends_the_answer() {
        let mut c = chat(true, 10_000);
        said(&mut c, "one", "a");
        let cp = c.checkpoint().unwrap();
        said(&mut c, "two", "b long answer");
        c.amend_answer(0, "b [interrupted]");
        assert_eq!(c.history().last(), Some(&("assistant", "b [interrupted]")));
        c.rollback(cp).unwrap();
        assert_eq!(c.history(), [("user", "one"), ("assistant", "a")]);
        assert!(c.can_roll_back() && !c.computes_here());
        // an answer before the last, and one past the conversation: nothing
        said(&mut c, "two", "b");
        c.amend_answer(1, "a [interrupted]");
        c.amend_answer(2, "nothing");
        assert_eq!(
            c.history(),
            [
                ("user", "one"),
                ("assistant", "a [interrupted]"),
                ("user", "two"),
                ("assistant", "b")
            ]
        );
    }
}
