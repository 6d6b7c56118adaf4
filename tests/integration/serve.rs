//! `voxline serve` end to end: the real binary, the real models, real
//! sockets on the loopback.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use voxline_capacity::remote::{get, scrape, Remote};
use voxline_capacity::{play, Script, TurnSeen};
use voxline_serve::client::{ClientError, WsClient};
use voxline_serve::metrics::{parse_exposition, sample};
use voxline_serve::protocol::{Hello, SampleFormat, ServerEvent};

use crate::util;

/// A running `voxline serve`, stopped (killed) when dropped.
pub struct Server {
    child: Child,
    /// `HOST:PORT`.
    pub addr: String,
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts the server on a free loopback port with short answers and
    /// waits until it listens.
    pub fn start(extra: &[&str]) -> Server {
        let tokens: &[&str] = if extra.contains(&"--max-tokens") {
            &[]
        } else {
            &["--max-tokens", "24"]
        };
        let mut child = util::voxline_bin()
            .args(["serve", "--listen", "127.0.0.1:0", "--ctx", "512"])
            .args(tokens)
            .arg("--models-dir")
            .arg(util::models_dir())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start voxline serve");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = lines.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("voxline serve did not start listening: {said:?}")
            };
            said.push(line.clone());
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split('/').next().unwrap().to_string();
                return Server { child, addr, lines };
            }
        }
    }

    /// The socket's address.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// The server's metrics, parsed.
    pub fn metrics(&self, token: Option<&str>) -> Vec<(String, f64)> {
        parse_exposition(&scrape(&self.url(), token).unwrap())
    }

    /// Sends SIGINT (Ctrl-C).
    pub fn interrupt(&self) {
        self.signal("INT");
    }

    /// Sends signal `name` (`TERM`, `INT`).
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args([format!("-{name}"), pid])
            .status()
            .unwrap()
            .success());
    }

    /// The server's resident memory, MB, once every session has ended
    /// (its clients may have left a moment before, and a session still
    /// closing holds its engines' memory: reading then measures timing).
    pub fn rss_mb_when_idle(&self) -> f64 {
        let asked = Instant::now();
        while sample(&self.metrics(None), "voxline_sessions") != 0.0 {
            assert!(
                asked.elapsed() < Duration::from_secs(30),
                "sessions still open after 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.rss_mb()
    }

    /// The server's resident memory now, MB.
    pub fn rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb / 1024.0
    }

    /// Waits for the server to exit; its status and what it printed after starting.
    pub fn wait(mut self, within: Duration) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let said: Vec<String> = self.lines.try_iter().collect();
                return (status.code(), said);
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn script(names: &[&str]) -> Script {
    let files: Vec<_> = names.iter().map(|n| util::fixture(n)).collect();
    Script::load(&files, Duration::from_millis(800)).unwrap()
}

/// Every event until the stream's turns are all answered.
pub(crate) fn collect(client: &mut WsClient, within: Duration) -> Vec<ServerEvent> {
    let deadline = Instant::now() + within;
    let mut log = Vec::new();
    loop {
        let ended = log
            .iter()
            .any(|e| matches!(e, ServerEvent::StreamEnd { .. }));
        let heard = log
            .iter()
            .filter(|e| matches!(e, ServerEvent::Transcript { .. }))
            .count();
        let done = log
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    ServerEvent::TurnComplete { .. } | ServerEvent::TurnError { .. }
                )
            })
            .count();
        if ended && done == heard {
            return log;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no end of the turns: {log:?}");
        match client.next_event(left).unwrap() {
            Some((e, _)) => log.push(e),
            None => panic!("closed: {:?}; {log:?}", client.close_reason()),
        }
    }
}

pub(crate) fn transcripts(log: &[ServerEvent]) -> Vec<String> {
    log.iter()
        .filter_map(|e| match e {
            ServerEvent::Transcript { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// Sends 16 kHz samples as fast as the socket takes them, then `end`.
pub(crate) fn send_all(client: &mut WsClient, samples: &[f32]) {
    for block in samples.chunks(320) {
        client.send_samples(block).unwrap();
    }
    client.end_of_stream().unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn a_fixture_streamed_in_real_time_gives_what_replay_gives() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let events = tmp.path().join("events.jsonl");
    let out = util::voxline_bin()
        .arg("replay")
        .arg(util::fixture("multi_turn.wav"))
        .args([
            "--pace",
            "fast",
            "--quiet",
            "--max-tokens",
            "24",
            "--ctx",
            "512",
        ])
        .arg("--models-dir")
        .arg(util::models_dir())
        .arg("--events")
        .arg(&events)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed: Vec<String> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "transcript")
        .map(|v| v["text"].as_str().unwrap().to_string())
        .collect();

    let server = Server::start(&["--max-sessions", "1"]);
    let user = Remote::connect(&server.url(), None).unwrap();
    let turns: Vec<TurnSeen> = play(
        user,
        &script(&["multi_turn.wav"]),
        Instant::now(),
        Duration::from_secs(60),
    );
    let heard: Vec<String> = turns.iter().map(|t| t.transcript.clone()).collect();
    assert_eq!(
        turns.len(),
        replayed.len(),
        "{heard:?} against replay's {replayed:?}"
    );
    assert_eq!(turns.len(), 3, "{heard:?}");
    for (h, r) in heard.iter().zip(&replayed) {
        assert_eq!(
            voxline_stt::word_error_rate(r, h),
            0.0,
            "over the socket {h:?}, replayed {r:?}"
        );
    }
    for t in &turns {
        assert!(
            t.error.is_none() && !t.answer.is_empty() && t.tokens > 0,
            "{t:?}"
        );
        // measured by the user, from the labelled end of speech
        let r = t.response_ms.expect("a response latency");
        assert!(r > 0.0, "{t:?}");
    }
    let m = server.metrics(None);
    assert_eq!(sample(&m, "voxline_turns_total"), 3.0);
    assert_eq!(sample(&m, "voxline_response_latency_seconds_count"), 3.0);
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="accepted"}"#),
        1.0
    );
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn eight_clients_have_their_own_conversations_and_bad_ones_close_alone() {
    let _g = util::engine_lock();
    let server = Server::start(&["--max-sessions", "8"]);
    let url = server.url();
    let fixtures = [
        "q_capital.wav",
        "q_moon.wav",
        "q_tea.wav",
        "q_weather.wav",
        "q_story.wav",
        "q_capital_noisy.wav",
        "multi_turn.wav",
    ];
    let mut clients: Vec<(WsClient, &str)> = fixtures
        .iter()
        .map(|f| (WsClient::connect(&url, None, Hello::pcm16k()).unwrap(), *f))
        .collect();

    // a bad frame (3 bytes of s16le) closes only that connection, and frees its slot
    let mut bad = WsClient::connect(&url, None, Hello::pcm16k()).unwrap();
    bad.send_binary(vec![1, 2, 3]).unwrap();
    while bad.next_event(Duration::from_secs(10)).unwrap().is_some() {}
    let (code, reason) = bad.close_reason().expect("closed with a reason");
    assert_eq!(code, 1007, "{reason}");
    assert!(reason.contains("bad frame: 3 bytes"), "{reason}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&server.metrics(None), "voxline_sessions") != 7.0 {
        assert!(
            Instant::now() < deadline,
            "the bad client's slot was not freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // the eighth: a 48 kHz stereo float recording, sent as it is
    let raw = hound::WavReader::open(util::fixture("q_capital_48k_f32.wav")).unwrap();
    let spec = raw.spec();
    let samples: Vec<f32> = raw.into_samples::<f32>().map(Result::unwrap).collect();
    let hello = Hello {
        sample_rate: spec.sample_rate,
        channels: spec.channels,
        format: SampleFormat::F32le,
    };
    let mut eighth = WsClient::connect(&url, None, hello).unwrap();

    // the ninth is refused with a reason
    match WsClient::connect(&url, None, Hello::pcm16k()) {
        Err(ClientError::Closed { code, reason }) => {
            assert_eq!(code, 1013);
            assert!(reason.contains("all 8 sessions are in use"), "{reason}");
        }
        other => panic!("the ninth session was not refused: {other:?}"),
    }
    // a bad hello closes its connection, with a reason
    match WsClient::connect(
        &url,
        None,
        Hello {
            sample_rate: 100,
            channels: 1,
            format: SampleFormat::S16le,
        },
    ) {
        Err(ClientError::Closed { code, reason }) => {
            assert_eq!(code, 1008);
            assert!(reason.contains("sample_rate 100"), "{reason}");
        }
        other => panic!("a bad hello was accepted: {other:?}"),
    }

    // all eight talk at once
    let frame_bytes = 960 * usize::from(spec.channels);
    let logs: Vec<(Vec<ServerEvent>, &str)> = std::thread::scope(|s| {
        let mut handles: Vec<_> = clients
            .iter_mut()
            .map(|(c, f)| {
                s.spawn(move || {
                    send_all(c, &util::read_16k(&util::fixture(f)));
                    (collect(c, Duration::from_secs(240)), *f)
                })
            })
            .collect();
        handles.push(s.spawn(|| {
            for block in samples.chunks(frame_bytes) {
                let bytes: Vec<u8> = block.iter().flat_map(|x| x.to_le_bytes()).collect();
                eighth.send_binary(bytes).unwrap();
            }
            eighth.end_of_stream().unwrap();
            (
                collect(&mut eighth, Duration::from_secs(240)),
                "q_capital_48k_f32.wav",
            )
        }));
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sessions = std::collections::HashSet::new();
    for (log, fixture) in &logs {
        let said = util::expected_texts(fixture);
        let heard = transcripts(log);
        assert_eq!(
            heard.len(),
            said.len(),
            "{fixture}: {heard:?} against {said:?}"
        );
        for (h, r) in heard.iter().zip(&said) {
            let wer = voxline_stt::word_error_rate(r, h);
            assert!(wer <= 0.25, "{fixture}: heard {h:?} for {r:?}");
        }
        let answered: Vec<_> = log
            .iter()
            .filter_map(|e| match e {
                ServerEvent::TurnComplete {
                    transcript,
                    response,
                    ..
                } => Some((transcript, response)),
                _ => None,
            })
            .collect();
        assert_eq!(answered.len(), said.len(), "{fixture}: {log:?}");
        for (t, r) in answered {
            assert!(
                heard.contains(t) && !r.is_empty(),
                "{fixture}: {t:?} → {r:?}"
            );
        }
        assert!(
            !log.iter()
                .any(|e| matches!(e, ServerEvent::TurnError { .. })),
            "{fixture}: {log:?}"
        );
        sessions.insert(fixture);
    }
    assert_eq!(sessions.len(), 8);
    let m = server.metrics(None);
    assert_eq!(sample(&m, "voxline_sessions"), 8.0);
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="full"}"#),
        1.0
    );
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="bad_hello"}"#),
        1.0
    );
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="bad_frame"}"#),
        1.0
    );
    assert!(sample(&m, "voxline_peak_threads") <= sample(&m, "voxline_threads"));
}

#[test]
fn a_token_is_required_off_localhost_and_checked_on_every_connection() {
    let token = "0123456789abcdef-test";
    // no token for a non-local address: refused before anything loads
    let out = util::voxline_bin()
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("VOXLINE_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs --token") && err.lines().count() == 1,
        "{err}"
    );

    let _g = util::engine_lock();
    let server = Server::start(&[
        "--token",
        token,
        "--max-sessions",
        "2",
        "--idle-timeout-s",
        "3",
    ]);
    for wrong in [None, Some("0123456789abcdef-tesT"), Some("short")] {
        match WsClient::connect(&server.url(), wrong, Hello::pcm16k()) {
            Err(ClientError::Http { status, body }) => {
                assert_eq!(status, 401);
                assert!(body.contains("missing or wrong token"), "{body}");
            }
            other => panic!("{wrong:?} was let in: {other:?}"),
        }
    }
    assert!(matches!(
        scrape(&server.url(), None),
        Err(ClientError::Http { status: 401, .. })
    ));
    // health needs no token; the page and its worklet are served
    let health: serde_json::Value =
        serde_json::from_str(&get(&server.url(), "/healthz", None).unwrap()).unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["max_sessions"], 2);
    assert!(get(&server.url(), "/", None)
        .unwrap()
        .contains("voxline-tap"));
    assert!(get(&server.url(), "/worklet.js", None)
        .unwrap()
        .contains("registerProcessor"));
    let mut ok = WsClient::connect(&server.url(), Some(token), Hello::pcm16k()).unwrap();
    send_all(&mut ok, &util::read_16k(&util::fixture("q_capital.wav")));
    let log = collect(&mut ok, Duration::from_secs(120));
    assert_eq!(transcripts(&log).len(), 1);
    // answered, and then nothing more from either side: idle after 3 s
    let quiet = Instant::now();
    while let Some((e, _)) = ok.next_event(Duration::from_secs(30)).unwrap() {
        assert!(matches!(e, ServerEvent::Stats { .. }), "{e:?}");
    }
    let (code, reason) = ok.close_reason().unwrap();
    assert_eq!(code, 1000, "{reason}");
    assert!(reason.contains("idle"), "{reason}");
    assert!(
        quiet.elapsed() >= Duration::from_secs(2),
        "{:?}",
        quiet.elapsed()
    );
    let m = server.metrics(Some(token));
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="bad_token"}"#),
        3.0
    );
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="idle"}"#),
        1.0
    );
}

/// A turn still being transcribed is the server's work, not an idle
/// client: with a 1 s idle timeout, a 10 s recording sent at once and ended
/// (its transcription alone takes over a second, and tells the client
/// nothing meanwhile) is answered in full, and only then closed as idle.
#[test]
fn a_client_whose_turn_is_still_in_the_works_is_not_idle() {
    let _g = util::engine_lock();
    let server = Server::start(&["--idle-timeout-s", "1", "--max-tokens", "8"]);
    let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    send_all(&mut client, &util::read_16k(&util::fixture("long_10s.wav")));
    let log = collect(&mut client, Duration::from_secs(120));
    let heard = transcripts(&log);
    assert!(!heard.is_empty(), "{log:?}");
    let done = log
        .iter()
        .filter(|e| matches!(e, ServerEvent::TurnComplete { .. }))
        .count();
    assert_eq!(done, heard.len(), "{log:?}");
    while let Some((e, _)) = client.next_event(Duration::from_secs(30)).unwrap() {
        assert!(matches!(e, ServerEvent::Stats { .. }), "{e:?}");
    }
    let (code, reason) = client.close_reason().unwrap();
    assert_eq!(code, 1000, "{reason}");
    assert!(reason.contains("idle"), "{reason}");
}

#[test]
fn ctrl_c_lets_the_answer_in_flight_finish_then_stops() {
    let _g = util::engine_lock();
    let server = Server::start(&["--max-sessions", "2", "--max-tokens", "48"]);
    let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    // speech without `end`: the turn is still being worked on at Ctrl-C
    let audio = util::read_16k(&util::fixture("q_story.wav"));
    for block in audio.chunks(320) {
        client.send_samples(block).unwrap();
    }
    loop {
        match client.next_event(Duration::from_secs(60)).unwrap() {
            Some((ServerEvent::Transcript { .. }, _)) => break,
            Some(_) => {}
            None => panic!("no transcript: {:?}", client.close_reason()),
        }
    }
    server.interrupt();
    let mut complete = false;
    while let Some((e, _)) = client.next_event(Duration::from_secs(60)).unwrap() {
        if let ServerEvent::TurnComplete { response, .. } = e {
            assert!(!response.is_empty());
            complete = true;
        }
    }
    assert!(complete, "the answer in flight did not finish");
    let (code, reason) = client.close_reason().unwrap();
    assert_eq!(code, 1001);
    assert!(reason.contains("shutting down"), "{reason}");
    let (status, said) = server.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "{said:?}");
    assert!(
        said.iter().any(|l| l.contains("voxline: stopped")),
        "{said:?}"
    );
}

#[test]
fn a_second_ctrl_c_cancels_the_answer_in_flight() {
    let _g = util::engine_lock();
    let server = Server::start(&["--max-sessions", "1", "--max-tokens", "400"]);
    let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    send_all(&mut client, &util::read_16k(&util::fixture("q_story.wav")));
    loop {
        match client.next_event(Duration::from_secs(60)).unwrap() {
            Some((ServerEvent::Token { .. }, _)) => break,
            Some(_) => {}
            None => panic!("no answer: {:?}", client.close_reason()),
        }
    }
    server.interrupt();
    std::thread::sleep(Duration::from_millis(200));
    server.interrupt();
    let mut completed = false;
    while let Some((e, _)) = client.next_event(Duration::from_secs(30)).unwrap() {
        completed |= matches!(e, ServerEvent::TurnComplete { .. });
    }
    let (code, reason) = client.close_reason().unwrap();
    assert_eq!(code, 1001);
    assert!(reason.contains("cancelled") && !completed, "{reason}");
    let (status, said) = server.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "{said:?}");
    assert!(
        said.iter()
            .any(|l| l.contains("answers in flight cancelled")),
        "{said:?}"
    );
}

/// Plays `script` as one user over the socket; the response latencies (ms).
fn latencies(url: &str, script: &Script) -> Vec<f64> {
    let user = Remote::connect(url, None).unwrap();
    let turns = play(user, script, Instant::now(), Duration::from_secs(60));
    assert!(turns.iter().all(|t| t.error.is_none()), "{turns:?}");
    turns.iter().filter_map(|t| t.response_ms).collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn a_client_that_stops_reading_does_not_delay_the_others() {
    let _g = util::engine_lock();
    let server = Server::start(&[
        "--max-sessions",
        "2",
        "--client-queue",
        "4",
        "--max-tokens",
        "64",
    ]);
    let sc = script(&["q_capital.wav", "q_moon.wav", "q_tea.wav"]);
    // warm-up, then alone
    latencies(&server.url(), &script(&["q_weather.wav"]));
    let mut alone = latencies(&server.url(), &sc);
    // a client that talks, then never reads again
    let mut stalled = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    send_all(&mut stalled, &util::read_16k(&util::fixture("q_story.wav")));
    let turns_before = sample(&server.metrics(None), "voxline_turns_total");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&server.metrics(None), "voxline_turns_total") < turns_before + 1.0 {
        assert!(
            Instant::now() < deadline,
            "the stalled client's turn was not answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut beside = latencies(&server.url(), &sc);
    assert_eq!(alone.len(), 3);
    assert_eq!(beside.len(), 3);
    let (a, b) = (median(&mut alone), median(&mut beside));
    eprintln!(
        "response latency p50: {a:.0} ms alone, {b:.0} ms beside a stalled client (×{:.2})",
        b / a
    );
    assert!(
        b < 1.5 * a + 200.0,
        "a stalled client delayed the others: {a:.0} → {b:.0} ms"
    );
    // the other user has left; the stalled client is still connected
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&server.metrics(None), "voxline_sessions") != 1.0 {
        assert!(
            Instant::now() < deadline,
            "sessions: {:?}",
            server.metrics(None)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(stalled);
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn bench_via_the_socket_agrees_with_the_servers_metrics() {
    let _g = util::engine_lock();
    let server = Server::start(&["--max-sessions", "2"]);
    let tmp = tempfile::tempdir().unwrap();
    let out = util::voxline_bin()
        .args([
            "bench",
            "--sessions",
            "1",
            "--via",
            &server.url(),
            "--think-ms",
            "500",
        ])
        .arg("--fixtures")
        .args([util::fixture("q_capital.wav"), util::fixture("q_moon.wav")])
        .arg("--models-dir")
        .arg(util::models_dir())
        .arg("--out")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = util::read_json(&tmp.path().join("sessions.json"));
    assert_eq!(report["via"], server.url().as_str());
    let row = &report["rows"][0];
    let m = server.metrics(None);
    // the bench's figures are the server's counters over the run
    assert!(row["tokens"].as_u64().unwrap() > 0, "{row}");
    assert_eq!(row["tokens"], row["tokens_received"], "{row}");
    assert_eq!(
        row["tokens"].as_u64().unwrap() as f64,
        sample(&m, "voxline_tokens_total")
    );
    assert_eq!(row["turns"], 1, "two turns, the first warm-up: {row}");
    assert_eq!(sample(&m, "voxline_turns_total"), 2.0);
    let stt = sample(&m, r#"voxline_stage_busy_seconds_total{stage="stt"}"#);
    let util_stt = row["utilisation"]["stt"].as_f64().unwrap() * row["wall_s"].as_f64().unwrap();
    assert!(
        (stt - util_stt).abs() < 1e-3,
        "whisper busy {stt} s against the report's {util_stt}"
    );
}

#[test]
fn a_server_with_a_voice_sends_each_block_after_its_voice_event() {
    let _g = util::engine_lock();
    let server = Server::start(&["--max-sessions", "1", "--voice", "espeak"]);
    let url = server.url();
    let mut client = WsClient::connect(&url, None, Hello::pcm16k()).unwrap();
    let mut audio = util::read_16k(&util::fixture("q_capital.wav"));
    audio.extend(std::iter::repeat_n(0.0, 16_000));
    send_all(&mut client, &audio);
    let mut log = collect(&mut client, Duration::from_secs(60));
    // the voice goes on after the answer's text is complete
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match client.next_event(Duration::from_millis(500)).unwrap() {
            Some((e, _)) => log.push(e),
            None => break,
        }
    }
    let answer = log
        .iter()
        .find_map(|e| match e {
            ServerEvent::TurnComplete { response, .. } => Some(response.clone()),
            _ => None,
        })
        .expect("answered");
    let mut chunks = Vec::new();
    let mut samples = 0;
    for e in &log {
        if let ServerEvent::Voice {
            id,
            sample_rate,
            format,
            samples: n,
            text,
            pcm,
            ..
        } = e
        {
            assert_eq!((*id, *sample_rate, format.as_str()), (1, 22_050, "s16le"));
            assert_eq!(pcm.len(), n * 2, "the frame holds what its event says");
            samples += n;
            chunks.extend(text.clone());
        }
    }
    assert!(samples > 22_050, "{samples} samples of voice");
    assert_eq!(chunks.join(" "), voxline_tts::chunk::speakable(&answer));
    let latencies: Vec<f64> = log
        .iter()
        .filter_map(|e| match e {
            ServerEvent::Voice {
                voice_latency_ms, ..
            } => *voice_latency_ms,
            _ => None,
        })
        .collect();
    assert_eq!(
        latencies.len(),
        1,
        "the answer's first block says its latency"
    );
    assert!(latencies[0] > 0.0);
    let m = server.metrics(None);
    assert_eq!(sample(&m, "voxline_voice_latency_seconds_count"), 1.0);
}

/// The status line of a WebSocket upgrade to `/ws` sent with `origin`
/// (none: no `Origin` header, as a script sends it).
fn upgrade_status(addr: &str, origin: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\n{origin}Upgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[test]
fn a_page_of_another_origin_may_not_take_the_assistant() {
    let server = Server::start(&[
        "--max-sessions",
        "4",
        "--allow-origin",
        "https://app.example",
    ]);
    let addr = server.addr.clone();
    let own = format!("http://{addr}");
    assert!(
        upgrade_status(&addr, None).contains(" 101 "),
        "a script (no Origin)"
    );
    assert!(
        upgrade_status(&addr, Some(&own)).contains(" 101 "),
        "the server's own page"
    );
    assert!(
        upgrade_status(&addr, Some("https://app.example")).contains(" 101 "),
        "an allowed origin"
    );
    for evil in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let status = upgrade_status(&addr, Some(evil));
        assert!(status.contains(" 403 "), "{evil}: {status}");
    }
    let m = server.metrics(None);
    assert_eq!(
        sample(&m, r#"voxline_connections_total{outcome="bad_origin"}"#),
        3.0
    );
}
