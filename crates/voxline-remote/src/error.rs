//! What can go wrong talking to a remote server: each error names the
//! server (`host:port`) and says what happened, never the API key.

use std::time::Duration;

/// Errors of a remote engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The URL given is not one voxline can use.
    #[error("{flag} {url}: {why}")]
    Url {
        /// The flag it was given with.
        flag: &'static str,
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// No connection could be made.
    #[error("{server}: cannot connect ({detail}); is the server running, and is the URL right?")]
    Connect {
        /// The server, `host:port`.
        server: String,
        /// Why.
        detail: String,
    },
    /// The server did not answer in time.
    #[error("{server}: no answer on {path} within {} s ({what})", after.as_secs_f64())]
    Timeout {
        /// The server, `host:port`.
        server: String,
        /// The request's path.
        path: String,
        /// Which wait ran out.
        what: &'static str,
        /// How long was waited.
        after: Duration,
    },
    /// The server answered with an HTTP error status.
    #[error("{server}: {path} answered HTTP {status}{}", excerpt(body))]
    Status {
        /// The server, `host:port`.
        server: String,
        /// The request's path.
        path: String,
        /// The status code.
        status: u16,
        /// The start of the body the server sent with it.
        body: String,
    },
    /// The connection broke, or the stream ended, before the reply was complete.
    #[error("{server}: {path}: the reply was cut short ({detail})")]
    CutShort {
        /// The server, `host:port`.
        server: String,
        /// The request's path.
        path: String,
        /// What happened.
        detail: String,
    },
    /// The server's reply is not what the API says it should be.
    #[error("{server}: {path}: malformed reply ({detail})")]
    Malformed {
        /// The server, `host:port`.
        server: String,
        /// The request's path.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The model asked for is not among those the server lists.
    #[error(
        "{server}: serves no model `{model}` (it lists: {listed}); name one of those with {flag}"
    )]
    UnknownModel {
        /// The server, `host:port`.
        server: String,
        /// The model asked for.
        model: String,
        /// What the server lists.
        listed: String,
        /// The flag that names the model.
        flag: &'static str,
    },
    /// The server lists no model, and none was named.
    #[error("{server}: lists no model; name the one to use with {flag}")]
    NoModel {
        /// The server, `host:port`.
        server: String,
        /// The flag that names the model.
        flag: &'static str,
    },
}

impl RemoteError {
    /// Whether the request may be sent again: nothing of a reply was taken
    /// (no connection, a timeout, the server overloaded or failing).
    #[must_use]
    pub fn retryable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } | Self::CutShort { .. } => true,
            Self::Status { status, .. } => matches!(status, 429 | 500 | 502 | 503 | 504),
            _ => false,
        }
    }
}

/// `: <the body's first line, at most 200 characters>`, or nothing.
fn excerpt(body: &str) -> String {
    let line = body.lines().map(str::trim).find(|l| !l.is_empty());
    match line {
        Some(l) => {
            let cut: String = l.chars().take(200).collect();
            let more = if cut.len() < l.len() { "…" } else { "" };
            format!(": {cut}{more}")
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_server_and_what_happened() {
        let e = RemoteError::Status {
            server: "gpu1:8000".into(),
            path: "/v1/chat/completions".into(),
            status: 503,
            body: "\n  {\"error\": \"loading model\"}\nmore".into(),
        };
        assert_eq!(
            e.to_string(),
            "gpu1:8000: /v1/chat/completions answered HTTP 503: {\"error\": \"loading model\"}"
        );
        assert!(e.retryable());
        let long = RemoteError::Status {
            server: "h:1".into(),
            path: "/p".into(),
            status: 400,
            body: "x".repeat(500),
        };
        let s = long.to_string();
        assert!(s.ends_with('…') && s.len() < 260, "{s}");
        assert!(!long.retryable());
        let t = RemoteError::Timeout {
            server: "h:1".into(),
            path: "/v1/models".into(),
            what: "connecting",
            after: Duration::from_millis(2500),
        };
        assert_eq!(
            t.to_string(),
            "h:1: no answer on /v1/models within 2.5 s (connecting)"
        );
        let empty = RemoteError::Status {
            server: "h:1".into(),
            path: "/p".into(),
            status: 401,
            body: " \n".into(),
        };
        assert_eq!(empty.to_string(), "h:1: /p answered HTTP 401");
    }
}
