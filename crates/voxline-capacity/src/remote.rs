//! `bench --sessions N --via ws://HOST:PORT`: the simulated users talk to a
//! running `voxline serve` over the network; the engines' figures come from
//! its `/metrics`, scraped before and after each session count.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::play::Heard;
use super::{
    measure, play_all, CapacityError, CapacityOptions, CapacityReport, Conversation, Count, Script,
};
use voxline_llm::serving::ServingTotals;
use voxline_pipeline::sessions::{HubTotals, StageBusy};
use voxline_pipeline::topology;
use voxline_report::budget::Budget;
use voxline_serve::client::{ClientError, WsClient};
use voxline_serve::metrics::{parse_exposition, sample};
use voxline_serve::protocol::{Hello, ServerEvent};

/// One simulated user's WebSocket connection.
#[derive(Debug)]
pub struct Remote {
    client: WsClient,
    lost: u64,
    failed: Option<String>,
}

impl Remote {
    /// Connects one user.
    ///
    /// # Errors
    /// As [`WsClient::connect`].
    pub fn connect(url: &str, token: Option<&str>) -> Result<Self, ClientError> {
        Ok(Remote {
            client: WsClient::connect(url, token, Hello::pcm16k())?,
            lost: 0,
            failed: None,
        })
    }

    /// Why the connection failed, if it did.
    #[must_use]
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// What the user hears of `ev`: the turns' events; a `dropped` is
    /// counted as lost, the server's load is not the user's.
    fn event(&mut self, ev: ServerEvent, at: Instant) -> Option<Heard> {
        match ev {
            ServerEvent::Dropped { count, .. } => {
                self.lost += count;
                None
            }
            ServerEvent::Ready { .. } | ServerEvent::Stats { .. } => None,
            // when the user received it: what they felt
            ev => Some((ev, at)),
        }
    }

    fn fail(&mut self, e: &ClientError) {
        self.failed.get_or_insert_with(|| e.to_string());
    }
}

impl Conversation for Remote {
    fn push(&mut self, block: &[f32]) {
        if self.failed.is_none() {
            if let Err(e) = self.client.send_samples(block) {
                self.fail(&e);
            }
        }
    }

    fn end_of_stream(&mut self) {
        if let Err(e) = self.client.end_of_stream() {
            self.fail(&e);
        }
    }

    fn take_events(&mut self) -> Vec<Heard> {
        match self.client.poll() {
            Ok(evs) => evs
                .into_iter()
                .filter_map(|(e, at)| self.event(e, at))
                .collect(),
            Err(e) => {
                self.fail(&e);
                Vec::new()
            }
        }
    }

    fn wait_event(&mut self, timeout: Duration) -> Vec<Heard> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.client.next_event(left) {
                Ok(Some((e, at))) => {
                    if let Some(ev) = self.event(e, at) {
                        return vec![ev];
                    }
                }
                Ok(None) => return Vec::new(),
                Err(e) => {
                    self.fail(&e);
                    return Vec::new();
                }
            }
        }
    }

    fn lost(&self) -> u64 {
        self.lost
    }
}

/// `GET /metrics` of the server behind `url` (`ws://HOST:PORT[/ws]`).
///
/// # Errors
/// [`ClientError`] when the server cannot be reached or refuses.
pub fn scrape(url: &str, token: Option<&str>) -> Result<String, ClientError> {
    get(url, "/metrics", token)
}

/// `GET path` of the server behind `url` (`ws://HOST:PORT[/ws]`): the body
/// of a 200 answer.
///
/// # Errors
/// [`ClientError::Http`] for another status; [`ClientError::Connect`] or
/// [`ClientError::Url`] when the server cannot be reached.
pub fn get(url: &str, path: &str, token: Option<&str>) -> Result<String, ClientError> {
    let bad = |why: &str| ClientError::Url {
        url: url.to_string(),
        why: why.to_string(),
    };
    let authority = url
        .strip_prefix("ws://")
        .ok_or_else(|| bad("only ws:// is supported"))?
        .split('/')
        .next()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| bad("no host"))?;
    let connect = |source| ClientError::Connect {
        url: url.to_string(),
        source,
    };
    let mut tcp = TcpStream::connect(authority).map_err(connect)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(connect)?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\n{auth}Connection: close\r\n\r\n"
    )
    .map_err(connect)?;
    let mut text = String::new();
    tcp.read_to_string(&mut text).map_err(|e| {
        if voxline_serve::client::timed_out(&e) {
            ClientError::Timeout {
                url: url.to_string(),
                what: format!("GET {path}"),
                secs: 10,
            }
        } else {
            connect(e)
        }
    })?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if status != 200 {
        return Err(ClientError::Http {
            status,
            body: body.trim().to_string(),
        });
    }
    Ok(body.to_string())
}

/// Waits until the server has no sessions (the users of the previous
/// count have left: a leaving session frees its slot once the engines have
/// let it go); its `/metrics` then.
///
/// # Errors
/// [`ClientError::Busy`] when sessions stay connected (other clients), or
/// as [`scrape`].
fn wait_for_no_sessions(url: &str, token: Option<&str>) -> Result<String, ClientError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(url, token)?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let connected = sample(&parse_exposition(&text), "voxline_sessions") as usize;
        if connected == 0 {
            return Ok(text);
        }
        if Instant::now() >= deadline {
            return Err(ClientError::Busy {
                sessions: connected,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The engines' totals as `/metrics` counts them: every stage it names,
/// and the batching worker's counts.
#[must_use]
pub fn totals_of(exposition: &str) -> HubTotals {
    let s = parse_exposition(exposition);
    let secs = |name: &str| Duration::from_secs_f64(sample(&s, name).max(0.0));
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count = |name: &str| sample(&s, name).max(0.0) as u64;
    let stages: Vec<StageBusy> = s
        .iter()
        .filter_map(|(name, _)| {
            name.strip_prefix("voxline_stage_busy_seconds_total{stage=\"")?
                .strip_suffix("\"}")
        })
        .map(|stage| StageBusy {
            stage: stage.to_owned(),
            busy: secs(&format!(
                "voxline_stage_busy_seconds_total{{stage=\"{stage}\"}}"
            )),
            calls: count(&format!("voxline_stage_runs_total{{stage=\"{stage}\"}}")),
        })
        .collect();
    let llm = ServingTotals {
        busy: stages
            .iter()
            .find(|st| st.stage == topology::LLM.as_str())
            .map_or(Duration::ZERO, |st| st.busy),
        tokens: count("voxline_tokens_total"),
        prefill_tokens: count("voxline_prefill_tokens_total"),
        prefill_busy: secs("voxline_prefill_busy_seconds_total"),
        ..ServingTotals::default()
    };
    HubTotals {
        stages,
        llm,
        peak_threads: usize::try_from(count("voxline_peak_threads")).unwrap_or(usize::MAX),
    }
}

/// What happened between two totals.
fn delta(before: &HubTotals, after: &HubTotals) -> HubTotals {
    let (b, a) = (&before.llm, &after.llm);
    HubTotals {
        stages: after
            .stages
            .iter()
            .map(|st| {
                let was = before.stage(&st.stage);
                StageBusy {
                    stage: st.stage.clone(),
                    busy: st.busy.saturating_sub(was.busy),
                    calls: st.calls.saturating_sub(was.calls),
                }
            })
            .collect(),
        llm: ServingTotals {
            steps: a.steps.saturating_sub(b.steps),
            busy: a.busy.saturating_sub(b.busy),
            tokens: a.tokens.saturating_sub(b.tokens),
            prefill_tokens: a.prefill_tokens.saturating_sub(b.prefill_tokens),
            prefill_busy: a.prefill_busy.saturating_sub(b.prefill_busy),
        },
        peak_threads: after.peak_threads,
    }
}

/// Runs every session count in `opts` against the server at `url`.
///
/// # Errors
/// [`CapacityError::Remote`] when the server cannot be reached, refuses a
/// user (a wrong token, fewer sessions than asked) or its `/metrics`.
pub fn run_via(
    url: &str,
    token: Option<&str>,
    script: &Script,
    fixtures: &[PathBuf],
    opts: &CapacityOptions,
    budget: Option<&Budget>,
    progress: &dyn Fn(&str),
) -> Result<CapacityReport, CapacityError> {
    measure(fixtures, opts, budget, Some(url.to_string()), |n| {
        progress(&format!("{n} session(s) via {url}: connecting"));
        let exposition = wait_for_no_sessions(url, token)?;
        let before = totals_of(&exposition);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threads = sample(&parse_exposition(&exposition), "voxline_threads") as usize;
        let users: Vec<Remote> = (0..n)
            .map(|_| Remote::connect(url, token))
            .collect::<Result<_, _>>()?;
        progress(&format!("{n} session(s) via {url}: playing"));
        let (seen, wall) = play_all(users, script, opts.stagger);
        // the users have left (their sockets closed): the server's counters are final
        let after = totals_of(&scrape(url, token)?);
        Ok(Count {
            seen,
            wall,
            totals: delta(&before, &after),
            threads,
            remote: std::collections::BTreeMap::new(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_come_from_the_exposition() {
        let text = "# HELP x\nvoxline_tokens_total 120\nvoxline_stage_busy_seconds_total{stage=\"stt\"} 2.5\n\
                    voxline_stage_busy_seconds_total{stage=\"llm\"} 1.25\nvoxline_peak_threads 2\n";
        let t = totals_of(text);
        assert_eq!(t.llm.tokens, 120);
        assert_eq!(t.stage("stt").busy, Duration::from_millis(2500));
        assert_eq!(t.stage("llm").busy, Duration::from_millis(1250));
        assert_eq!(t.llm.busy, Duration::from_millis(1250));
        assert_eq!(t.peak_threads, 2);
        let mut before = t.clone();
        before.llm.tokens = 20;
        let d = delta(&before, &t);
        assert_eq!(d.llm.tokens, 100);
        assert_eq!(d.stage("stt").busy, Duration::ZERO);
    }

    #[test]
    fn a_server_that_is_not_there_is_named() {
        // a port nothing listens on: bind one, then close it
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = scrape(&format!("ws://127.0.0.1:{port}"), None).unwrap_err();
        assert!(
            e.to_string().contains("is `voxline serve` running there?"),
            "{e}"
        );
        let e = scrape("http://x", None).unwrap_err();
        assert!(e.to_string().contains("ws://"), "{e}");
    }
}
