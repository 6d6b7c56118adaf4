//! A blocking client of `voxline serve` (for `bench --via` and the tests):
//! connect, hello, audio frames out, events in.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tungstenite::client::IntoClientRequest as _;
use tungstenite::http::header::{HeaderValue, AUTHORIZATION};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

use super::protocol::{encode_s16le, Hello, ServerEvent};

/// Why the client could not talk to the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not a `ws://host:port/...` URL.
    #[error("{url}: not a ws://HOST:PORT address ({why})")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The TCP connection failed.
    #[error("cannot connect to {url}: {source}; is `voxline serve` running there?")]
    Connect {
        /// The URL.
        url: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The server took the connection and then said nothing in time.
    #[error("{url}: no answer to {what} within {secs} s; the server there is hung or is not `voxline serve`")]
    Timeout {
        /// The URL.
        url: String,
        /// What was asked (`the WebSocket handshake`, `GET /healthz`).
        what: String,
        /// How long it waited.
        secs: u64,
    },
    /// The server answered the upgrade with an HTTP error (a wrong token, shutting down).
    #[error("the server refused the connection: HTTP {status}: {body}")]
    Http {
        /// The status code.
        status: u16,
        /// The server's one line.
        body: String,
    },
    /// The server closed the connection, with its reason.
    #[error("the server closed the connection ({code}): {reason}")]
    Closed {
        /// The close code.
        code: u16,
        /// The server's reason.
        reason: String,
    },
    /// The server kept serving other clients (a capacity run needs it to itself).
    #[error("the server still has {sessions} session(s) of other clients after 30 s; measure capacity on a server no one else uses")]
    Busy {
        /// Sessions connected.
        sessions: usize,
    },
    /// The WebSocket failed.
    #[error("WebSocket: {0}")]
    Socket(#[from] tungstenite::Error),
    /// The server sent something that is not an event.
    #[error("the server sent something that is not a voxline event: {0}")]
    Protocol(String),
}

/// One conversation with a server.
pub struct WsClient {
    socket: WebSocket<TcpStream>,
    queued: VecDeque<(ServerEvent, Instant)>,
    closed: Option<(u16, String)>,
    /// A `voice` event waiting for its binary frame.
    voice: Option<ServerEvent>,
    /// The session's slot on the server.
    pub session: usize,
}

impl std::fmt::Debug for WsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsClient")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// The `ws://` address of a server's socket for `base` (`ws://HOST:PORT`, with
/// or without a path).
#[must_use]
pub fn socket_url(base: &str) -> String {
    let trimmed = base.trim_end_matches('/');
    if trimmed.ends_with("/ws") || trimmed.contains("/ws?") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/ws")
    }
}

/// Checks that `url` is a `ws://HOST:PORT` address, before anything is
/// connected.
///
/// # Errors
/// [`ClientError::Url`] saying what is wrong.
pub fn check_url(url: &str) -> Result<(), ClientError> {
    request_for(&socket_url(url)).map(|_| ())
}

/// The upgrade request for `url`, its host and port.
fn request_for(
    url: &str,
) -> Result<(tungstenite::handshake::client::Request, String, u16), ClientError> {
    let bad = |why: String| ClientError::Url {
        url: url.to_string(),
        why,
    };
    let request = url.into_client_request().map_err(|e| bad(e.to_string()))?;
    if request.uri().scheme_str() != Some("ws") {
        return Err(bad("only ws:// is supported".into()));
    }
    let host = request
        .uri()
        .host()
        .ok_or_else(|| bad("no host".into()))?
        .to_string();
    let port = request.uri().port_u16().unwrap_or(80);
    Ok((request, host, port))
}

/// How long a server has to answer a WebSocket handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether an I/O error is a read or write that timed out.
#[must_use]
pub fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl WsClient {
    /// Connects to `url` (`ws://HOST:PORT[/ws]`), presenting `token` if
    /// given, sends `hello` and waits for the server's `ready`.
    ///
    /// # Errors
    /// [`ClientError`]: the address, the connection, an HTTP refusal (a wrong
    /// token), or the server's close with its reason (all sessions in use, a
    /// bad hello).
    pub fn connect(url: &str, token: Option<&str>, hello: Hello) -> Result<Self, ClientError> {
        let url = socket_url(url);
        let (mut request, host, port) = request_for(&url)?;
        let bad = |why: String| ClientError::Url {
            url: url.clone(),
            why,
        };
        if let Some(t) = token {
            let v =
                HeaderValue::from_str(&format!("Bearer {t}")).map_err(|e| bad(e.to_string()))?;
            request.headers_mut().insert(AUTHORIZATION, v);
        }
        let tcp =
            TcpStream::connect((host.as_str(), port)).map_err(|source| ClientError::Connect {
                url: url.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        tcp.set_write_timeout(Some(Duration::from_secs(30)))
            .and_then(|()| tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
            .map_err(|source| ClientError::Connect {
                url: url.clone(),
                source,
            })?;
        let (socket, _) = match tungstenite::client(request, tcp) {
            Ok(ok) => ok,
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Io(e)))
                if timed_out(&e) =>
            {
                return Err(ClientError::Timeout {
                    url,
                    what: "the WebSocket handshake".into(),
                    secs: HANDSHAKE_TIMEOUT.as_secs(),
                })
            }
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
                let body = r
                    .body()
                    .as_deref()
                    .map(|b| String::from_utf8_lossy(b).trim().to_string())
                    .unwrap_or_default();
                return Err(ClientError::Http {
                    status: r.status().as_u16(),
                    body,
                });
            }
            Err(tungstenite::HandshakeError::Failure(e)) => return Err(e.into()),
            Err(tungstenite::HandshakeError::Interrupted(_)) => {
                return Err(ClientError::Protocol("the handshake did not finish".into()))
            }
        };
        let mut client = WsClient {
            socket,
            queued: VecDeque::new(),
            voice: None,
            closed: None,
            session: 0,
        };
        client.send_text(&hello.to_json())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client.next_event(deadline.saturating_duration_since(Instant::now()))? {
                Some((ServerEvent::Ready { session, .. }, _)) => {
                    client.session = session;
                    return Ok(client);
                }
                Some(_) => {}
                None => {
                    return Err(match client.closed.take() {
                        Some((code, reason)) => ClientError::Closed { code, reason },
                        None => ClientError::Protocol("no `ready` within 30 s".into()),
                    })
                }
            }
        }
    }

    /// Sends one text message.
    ///
    /// # Errors
    /// [`ClientError::Socket`] when the connection has failed.
    pub fn send_text(&mut self, text: &str) -> Result<(), ClientError> {
        self.socket.send(Message::text(text))?;
        Ok(())
    }

    /// Sends one binary frame as it is.
    ///
    /// # Errors
    /// [`ClientError::Socket`] when the connection has failed.
    pub fn send_binary(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        self.socket.send(Message::binary(bytes))?;
        Ok(())
    }

    /// Sends `bytes` as one text message as they are, UTF-8 or not (what a
    /// broken client might send; the server closes on it).
    ///
    /// # Errors
    /// As [`WsClient::send_binary`].
    pub fn send_raw_text(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        use tungstenite::protocol::frame::{coding::Data, coding::OpCode, Frame};
        let frame = Frame::message(bytes, OpCode::Data(Data::Text), true);
        self.socket.send(Message::Frame(frame))?;
        Ok(())
    }

    /// Sends 16 kHz mono samples as one s16le frame.
    ///
    /// # Errors
    /// As [`WsClient::send_binary`].
    pub fn send_samples(&mut self, samples: &[f32]) -> Result<(), ClientError> {
        self.send_binary(encode_s16le(samples))
    }

    /// Tells the server the speaker is done.
    ///
    /// # Errors
    /// As [`WsClient::send_text`].
    pub fn end_of_stream(&mut self) -> Result<(), ClientError> {
        self.send_text(r#"{"type":"end"}"#)
    }

    /// The next event, with when it arrived, waiting up to `timeout`;
    /// `None` when none came in time or the server closed (then
    /// [`WsClient::close_reason`] says why).
    ///
    /// # Errors
    /// [`ClientError::Socket`] when the connection failed;
    /// [`ClientError::Protocol`] for a message that is not an event.
    pub fn next_event(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<(ServerEvent, Instant)>, ClientError> {
        if let Some(e) = self.queued.pop_front() {
            return Ok(Some(e));
        }
        if self.closed.is_some() {
            return Ok(None);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // a zero read timeout means "block forever": wait at least 1 ms
            self.socket
                .get_mut()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(tungstenite::Error::Io)?;
            match self.socket.read() {
                Ok(Message::Text(t)) => {
                    let ev: ServerEvent = serde_json::from_str(t.as_str())
                        .map_err(|e| ClientError::Protocol(format!("{e}: {}", t.as_str())))?;
                    if matches!(ev, ServerEvent::Voice { .. }) {
                        // its frame comes next
                        self.voice = Some(ev);
                        continue;
                    }
                    return Ok(Some((ev, Instant::now())));
                }
                Ok(Message::Binary(bytes)) => {
                    let Some(mut ev) = self.voice.take() else {
                        return Err(ClientError::Protocol(
                            "a binary frame without its voice event".into(),
                        ));
                    };
                    if let ServerEvent::Voice { pcm, .. } = &mut ev {
                        *pcm = bytes.to_vec();
                    }
                    return Ok(Some((ev, Instant::now())));
                }
                Ok(Message::Close(frame)) => {
                    self.closed = Some(
                        frame.map_or((u16::from(CloseCode::Status), String::new()), |f| {
                            (u16::from(f.code), f.reason.as_str().to_string())
                        }),
                    );
                    return Ok(None);
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                }
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    self.closed
                        .get_or_insert((u16::from(CloseCode::Abnormal), String::new()));
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Every event already arrived, without waiting. A `voice` event comes
    /// with its binary frame in its `pcm`.
    ///
    /// # Errors
    /// As [`WsClient::next_event`].
    pub fn poll(&mut self) -> Result<Vec<(ServerEvent, Instant)>, ClientError> {
        let mut out: Vec<_> = self.queued.drain(..).collect();
        while let Some(e) = self.next_event(Duration::from_millis(1))? {
            out.push(e);
        }
        Ok(out)
    }

    /// The server's close code and reason, once it closed.
    #[must_use]
    pub fn close_reason(&self) -> Option<(u16, &str)> {
        self.closed.as_ref().map(|(c, r)| (*c, r.as_str()))
    }

    /// Closes the connection (the session leaves).
    pub fn close(mut self) {
        let _ = self.socket.close(None);
        let _ = self.socket.flush();
        let _ = self.next_event(Duration::from_millis(500));
    }
}
