//! A server's address, its API key and the HTTP client that talks to it.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use ureq::Agent;

use crate::RemoteError;

/// Most bytes of a reply's body read whole (a transcript, a model list):
/// the rest is not read, and the cut JSON is a malformed reply.
const MAX_BODY_BYTES: u64 = 16 << 20;

/// An API key, read from the environment (never from a flag, which would
/// show in `ps`). It is sent as `Authorization: Bearer …` and nowhere
/// else: its `Debug` hides it, and no error or report carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(hidden)")
    }
}

impl ApiKey {
    /// The key in environment variable `var`, if it is set and not empty.
    #[must_use]
    pub fn from_env(var: &str) -> Option<Self> {
        std::env::var(var)
            .ok()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .map(Self)
    }

    /// A key given in code (a test's).
    #[must_use]
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
}

/// How long to wait, per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To make the connection (TCP and TLS).
    pub connect: Duration,
    /// From the request sent to the reply's headers (a queued request
    /// waits here).
    pub response: Duration,
    /// Between two reads of the reply's body (a stalled stream).
    pub read: Duration,
    /// For the whole exchange.
    pub total: Duration,
}

impl Default for Timeouts {
    /// 5 s to connect, 30 s for the headers and between reads, 120 s in all.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(30),
            read: Duration::from_secs(30),
            total: Duration::from_secs(120),
        }
    }
}

/// An OpenAI-compatible server: its API root (`…/v1`), the `host:port`
/// that names it in messages and reports, and its key.
#[derive(Debug, Clone)]
pub struct Endpoint {
    api: String,
    server: String,
    https: bool,
    key: Option<ApiKey>,
}

impl Endpoint {
    /// The server at `url` (`http://` or `https://`, a host, an optional
    /// port and path; the API root is the path, with `/v1` added unless it
    /// ends so). `flag` is the flag it was given with, for the message.
    ///
    /// # Errors
    /// [`RemoteError::Url`] when it is not such a URL.
    pub fn parse(flag: &'static str, url: &str, key: Option<ApiKey>) -> Result<Self, RemoteError> {
        let bad = |why: &str| RemoteError::Url {
            flag,
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad(
                "give an http:// or https:// URL, e.g. http://127.0.0.1:8080",
            ));
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() {
            return Err(bad("no host in the URL"));
        }
        if authority.contains('@') {
            return Err(bad(
                "credentials in a URL would show in `ps` and in reports; give the key in the environment",
            ));
        }
        if path.contains(['?', '#']) || authority.contains(['?', '#']) {
            return Err(bad("a query or fragment has no place in the API root"));
        }
        let default_port = if https { 443 } else { 80 };
        // an IPv6 literal is bracketed: its colons are not the port's
        let split = match authority.strip_prefix('[') {
            Some(v6) => {
                let close = v6
                    .find(']')
                    .ok_or_else(|| bad("an unclosed [ in the host"))?;
                let after = &v6[close + 1..];
                if !after.is_empty() && !after.starts_with(':') {
                    return Err(bad("after the bracketed host only a :port may follow"));
                }
                (&authority[..close + 2], after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            },
        };
        let (host, port) = match split {
            (h, Some(p)) => {
                let port: u16 = p
                    .parse()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
                (h, port)
            }
            (h, None) => (h, default_port),
        };
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad("no host in the URL"));
        }
        let path = path.trim_end_matches('/');
        let root = if path.ends_with("/v1") {
            path.to_owned()
        } else {
            format!("{path}/v1")
        };
        Ok(Self {
            api: format!(
                "{}://{host}:{port}{root}",
                if https { "https" } else { "http" }
            ),
            server: format!("{host}:{port}"),
            https,
            key,
        })
    }

    /// The server as `host:port`.
    #[must_use]
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API root, `scheme://host:port/…/v1`.
    #[must_use]
    pub fn api_root(&self) -> &str {
        &self.api
    }

    /// Whether the connection is encrypted (https, through rustls).
    #[must_use]
    pub fn is_https(&self) -> bool {
        self.https
    }
}

/// A client of one server: the endpoint and a connection pool. Cheap to
/// clone; the clones share the pool.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Arc<Endpoint>,
    agent: Agent,
    timeouts: Timeouts,
}

impl Client {
    /// A client of `endpoint`, waiting as `timeouts` say.
    #[must_use]
    pub fn new(endpoint: Endpoint, timeouts: Timeouts) -> Self {
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            // a redirect is the server's answer, not followed: a 301/302
            // turns a POST into a body-less GET, whose reply is no answer
            .max_redirects(0)
            .timeout_connect(Some(timeouts.connect))
            .timeout_recv_response(Some(timeouts.response))
            .timeout_per_read(Some(timeouts.read))
            .timeout_global(Some(timeouts.total))
            .max_idle_connections_per_host(64)
            .user_agent(concat!("voxline/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self {
            endpoint: Arc::new(endpoint),
            agent,
            timeouts,
        }
    }

    /// The server.
    #[must_use]
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The full URL of `path` (under the API root: `/models`).
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint.api)
    }

    /// The path as messages name it (`/v1/models`).
    pub(crate) fn shown(&self, path: &str) -> String {
        let root = self.endpoint.api.splitn(4, '/').nth(3).unwrap_or("v1");
        format!("/{root}{path}")
    }

    fn authorised<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.endpoint.key {
            Some(k) => r.header("Authorization", format!("Bearer {}", k.0)),
            None => r,
        }
    }

    /// `GET path`, its body as JSON.
    pub(crate) fn get_json(&self, path: &str) -> Result<serde_json::Value, RemoteError> {
        let r = self
            .authorised(self.agent.get(self.url(path)))
            .call()
            .map_err(|e| self.error(path, e))?;
        let body = self.ok_body(path, r)?;
        self.json(path, &body)
    }

    /// `POST path` with `body` as JSON: the reply, its status checked.
    pub(crate) fn post_json(
        &self,
        path: &str,
        body: &[u8],
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let r = self
            .authorised(self.agent.post(self.url(path)))
            .content_type("application/json")
            .send(body)
            .map_err(|e| self.error(path, e))?;
        self.ok(path, r)
    }

    /// `POST path` with a multipart `form`: the reply's body, its status checked.
    pub(crate) fn post_form(
        &self,
        path: &str,
        form: ureq::unversioned::multipart::Form<'_>,
    ) -> Result<String, RemoteError> {
        let r = self
            .authorised(self.agent.post(self.url(path)))
            .send(form)
            .map_err(|e| self.error(path, e))?;
        self.ok_body(path, r)
    }

    /// The reply if its status is a success; else its status and the start of its body.
    fn ok(
        &self,
        path: &str,
        r: ureq::http::Response<ureq::Body>,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let status = r.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(r);
        }
        let mut body = String::new();
        // the start is enough to say what went wrong
        let _ = r
            .into_body()
            .into_reader()
            .take(4096)
            .read_to_string(&mut body);
        Err(RemoteError::Status {
            server: self.endpoint.server.clone(),
            path: self.shown(path),
            status,
            body,
        })
    }

    fn ok_body(
        &self,
        path: &str,
        r: ureq::http::Response<ureq::Body>,
    ) -> Result<String, RemoteError> {
        let r = self.ok(path, r)?;
        let mut body = Vec::new();
        r.into_body()
            .into_reader()
            .take(MAX_BODY_BYTES)
            .read_to_end(&mut body)
            .map_err(|e| self.read_error(path, &e))?;
        // bytes that are not text are what the server sent, whole: a
        // malformed reply (it would send the same again), not one cut short
        String::from_utf8(body).or_else(|e| {
            let (at, len) = (e.utf8_error().valid_up_to(), e.as_bytes().len());
            if e.utf8_error().error_len().is_none() && len as u64 == MAX_BODY_BYTES {
                // the limit cut a character in two: the text up to it
                let mut body = e.into_bytes();
                body.truncate(at);
                return String::from_utf8(body).map_err(|e| self.malformed(path, e.to_string()));
            }
            Err(self.malformed(
                path,
                format!("not UTF-8: the byte at offset {at} of {len} is not text"),
            ))
        })
    }

    pub(crate) fn json(&self, path: &str, body: &str) -> Result<serde_json::Value, RemoteError> {
        serde_json::from_str(body).map_err(|e| self.malformed(path, format!("not JSON: {e}")))
    }

    pub(crate) fn malformed(&self, path: &str, detail: String) -> RemoteError {
        RemoteError::Malformed {
            server: self.endpoint.server.clone(),
            path: self.shown(path),
            detail,
        }
    }

    /// What a failed exchange means.
    pub(crate) fn error(&self, path: &str, e: ureq::Error) -> RemoteError {
        let server = self.endpoint.server.clone();
        match e {
            ureq::Error::Timeout(t) => {
                let (what, after) = match t {
                    ureq::Timeout::Connect | ureq::Timeout::Resolve => {
                        ("connecting", self.timeouts.connect)
                    }
                    ureq::Timeout::RecvResponse | ureq::Timeout::SendRequest => {
                        ("waiting for the reply", self.timeouts.response)
                    }
                    ureq::Timeout::PerRead => ("the reply stalled", self.timeouts.read),
                    _ => ("the whole exchange", self.timeouts.total),
                };
                RemoteError::Timeout {
                    server,
                    path: self.shown(path),
                    what,
                    after,
                }
            }
            ureq::Error::Io(io) => match io.kind() {
                std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::NotConnected
                | std::io::ErrorKind::AddrNotAvailable => RemoteError::Connect {
                    server,
                    detail: reason(&io),
                },
                _ => RemoteError::CutShort {
                    server,
                    path: self.shown(path),
                    detail: reason(&io),
                },
            },
            ureq::Error::HostNotFound => RemoteError::Connect {
                server,
                detail: "host not found".into(),
            },
            ureq::Error::ConnectionFailed => RemoteError::Connect {
                server,
                detail: "connection failed".into(),
            },
            ureq::Error::Protocol(p) => RemoteError::Malformed {
                server,
                path: self.shown(path),
                detail: format!("not HTTP: {p}"),
            },
            other => RemoteError::CutShort {
                server,
                path: self.shown(path),
                detail: other.to_string(),
            },
        }
    }

    /// What a failed read of a reply's body means (a timeout, a broken connection).
    pub(crate) fn read_error(&self, path: &str, e: &std::io::Error) -> RemoteError {
        let inner = e
            .get_ref()
            .and_then(|i| i.downcast_ref::<ureq::Error>())
            .map(|u| match u {
                ureq::Error::Timeout(t) => ureq::Error::Timeout(*t),
                _ => ureq::Error::Other(u.to_string().into()),
            });
        match inner {
            Some(u) => self.error(path, u),
            None => RemoteError::CutShort {
                server: self.endpoint.server.clone(),
                path: self.shown(path),
                detail: reason(e),
            },
        }
    }

    /// Checks that the server answers and lists `model` (or, with no model
    /// named, lists one: the first is then used). A server that has no
    /// model list (404 on `/models`) is taken at its word. Returns the model
    /// to ask for.
    ///
    /// # Errors
    /// [`RemoteError`] when the server does not answer, refuses the key,
    /// or lists no such model; `flag` names the model's flag in the message.
    pub fn check_model(
        &self,
        model: Option<&str>,
        flag: &'static str,
    ) -> Result<Option<String>, RemoteError> {
        let listed = match self.get_json("/models") {
            Ok(v) => v,
            Err(RemoteError::Status { status: 404, .. }) => return Ok(model.map(str::to_owned)),
            Err(e) => return Err(e),
        };
        let ids: Vec<String> = listed["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        match model {
            Some(m) if ids.is_empty() || ids.iter().any(|i| i == m) => Ok(Some(m.to_owned())),
            Some(m) => Err(RemoteError::UnknownModel {
                server: self.endpoint.server.clone(),
                model: m.to_owned(),
                listed: ids.join(", "),
                flag,
            }),
            None => ids
                .into_iter()
                .next()
                .map(Some)
                .ok_or(RemoteError::NoModel {
                    server: self.endpoint.server.clone(),
                    flag,
                }),
        }
    }
}

/// The operating system's reason, without Rust's "(os error N)".
fn reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Endpoint, RemoteError> {
        Endpoint::parse("--llm-url", url, None)
    }

    #[test]
    fn urls_become_an_api_root_and_a_server_name() {
        let e = parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(e.api_root(), "http://127.0.0.1:8080/v1");
        assert_eq!(e.server(), "127.0.0.1:8080");
        assert!(!e.is_https());
        let e = parse("https://gpu.example:8000/v1/").unwrap();
        assert_eq!(e.api_root(), "https://gpu.example:8000/v1");
        assert!(e.is_https());
        let e = parse("https://gateway.example/llm").unwrap();
        assert_eq!(e.api_root(), "https://gateway.example:443/llm/v1");
        assert_eq!(e.server(), "gateway.example:443");
        let e = parse("http://[::1]:9000").unwrap();
        assert_eq!(e.server(), "[::1]:9000");
        let e = parse("http://[::1]").unwrap();
        assert_eq!(e.server(), "[::1]:80");
        let c = Client::new(parse("http://h:1/a/b").unwrap(), Timeouts::default());
        assert_eq!(c.shown("/models"), "/a/b/v1/models");
        let c = Client::new(parse("http://h:1").unwrap(), Timeouts::default());
        assert_eq!(c.shown("/chat/completions"), "/v1/chat/completions");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("127.0.0.1:8080", "http:// or https://"),
            ("ftp://h", "http:// or https://"),
            ("http://", "no host"),
            ("http:///v1", "no host"),
            ("http://h:0", "port"),
            ("http://h:99999", "port"),
            ("http://h:x", "port"),
            ("http://user:secret@h:1", "environment"),
            ("http://h:1/v1?x=1", "query"),
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--llm-url {url}: ")), "{e}");
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn the_key_never_shows() {
        let e =
            Endpoint::parse("--llm-url", "http://h:1", Some(ApiKey::new("sk-secret-1"))).unwrap();
        let c = Client::new(e, Timeouts::default());
        assert!(!format!("{c:?}").contains("sk-secret-1"));
        assert_eq!(format!("{:?}", ApiKey::new("sk-x")), "ApiKey(hidden)");
        assert!(ApiKey::from_env("VOXLINE_TEST_SURELY_UNSET_KEY").is_none());
    }

    #[test]
    fn a_closed_port_is_a_connect_error_naming_the_server() {
        // a port nothing listens on: bind one, then free it
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Client::new(
            parse(&format!("http://127.0.0.1:{port}")).unwrap(),
            Timeouts::default(),
        );
        let e = c.check_model(None, "--llm-model").unwrap_err();
        assert!(matches!(e, RemoteError::Connect { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("127.0.0.1:{port}: cannot connect")),
            "{e}"
        );
        assert!(e.retryable());
    }
}
