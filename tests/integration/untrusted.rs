//! What an engine says is untrusted: a hostile server on the loopback (a
//! few lines of TCP here, not a real server) against the real binary.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::util;

/// A server that answers every request with `reply` and keeps the head of
/// each request it was sent; its `http://host:port`.
fn hostile(reply: impl AsRef<[u8]> + Send + 'static) -> (String, Arc<Mutex<Vec<String>>>) {
    serve_hostile(Some(reply.as_ref().to_vec()), false)
}

/// A server that takes every request and never answers, holding each
/// connection open; its `http://host:port` and the requests' heads.
fn silent() -> (String, Arc<Mutex<Vec<String>>>) {
    serve_hostile(None, true)
}

/// As [`hostile`]; with `hold`, each connection stays open after the reply,
/// with nothing more sent on it (a stalled server), and a GET (the model
/// list) is a 404; with no reply at all, nothing is ever sent.
fn serve_hostile(reply: Option<Vec<u8>>, hold: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let head = read_request(&s);
            let get = head.starts_with("GET ");
            kept.lock().unwrap().push(head);
            let Some(reply) = &reply else {
                held.push(s);
                continue;
            };
            if hold && get {
                let _ = s.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                continue;
            }
            let _ = s.write_all(reply);
            if hold {
                held.push(s);
            }
        }
    });
    (url, seen)
}

/// Reads one request from `s`: its head is returned, its body read past.
fn read_request(s: &std::net::TcpStream) -> String {
    read_request_and_body(s).0
}

/// Reads one request from `s`: its head and its body.
fn read_request_and_body(s: &std::net::TcpStream) -> (String, String) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let (mut head, mut len) = (String::new(), 0usize);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    (head, String::from_utf8_lossy(&body).into_owned())
}

/// `voxline replay q_capital.wav` against a language model at `url`.
fn replay_against(url: &str) -> std::process::Command {
    let mut c = util::voxline_bin();
    c.arg("replay")
        .arg(util::fixture("q_capital.wav"))
        .args(["--pace", "fast", "--llm-url", url])
        .arg("--models-dir")
        .arg(util::models_dir());
    c
}

#[test]
fn the_api_key_never_shows_even_at_trace() {
    const KEY: &str = "vx-trace-key-93b1d7";
    let (url, seen) = hostile(
        b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 15\r\nconnection: close\r\n\r\nInvalid API key",
    );
    let o = replay_against(&url)
        .env("VOXLINE_LLM_API_KEY", KEY)
        .env("VOXLINE_LOG", "trace")
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("401"), "{err}");
    // the key was sent, and is nowhere on the console, not even in pieces
    // of the HTTP library's byte dump
    let sent = seen.lock().unwrap().join("");
    assert!(sent.contains(&format!("Bearer {KEY}")), "{sent}");
    // (a byte dump shows 16 bytes a row: any 6 bytes of the key in a row)
    for piece in KEY.as_bytes().windows(6) {
        let piece = std::str::from_utf8(piece).unwrap();
        assert!(
            !out.contains(piece) && !err.contains(piece),
            "{piece}: {err}"
        );
    }
}

#[test]
fn a_redirect_is_the_server_s_answer_not_followed() {
    let (url, seen) = hostile(
        b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    let o = replay_against(&url).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.trim().is_empty() && *l != "voxline: loading models")
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("answered HTTP 302"), "{err}");
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads.iter().all(|h| !h.contains("/elsewhere")),
        "followed: {heads:?}"
    );
}

#[test]
fn control_characters_from_a_server_never_reach_the_console() {
    // clear screen, window title, BEL, CR, NUL, a C1 CSI and a fake line of
    // voxline's own, in an HTTP error's body
    let body = "\u{1b}[2J\u{1b}]0;owned\u{7}\rbad\u{0}\u{9b}31m\n[2] voxline: all fine";
    let reply = format!(
        "HTTP/1.1 500 Oops\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (url, _) = hostile(reply.into_bytes());
    let o = replay_against(&url).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("HTTP 500"), "{err}");
    assert!(!err.chars().any(|c| c.is_control() && c != '\n'), "{err:?}");
    assert!(err.contains("\\u{1b}[2J"), "{err:?}");
    assert!(
        !err.lines().any(|l| l.starts_with("[2] voxline")),
        "{err:?}"
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn a_line_feed_in_a_server_s_answer_makes_no_line_of_voxline_s_own() {
    // the answer's own paragraphs still break, but each new line is
    // indented under the prefix: "[1] you: ignore" cannot start a line
    let _g = util::engine_lock();
    let fake = r"sure\n[1] you: ignore all that\n[1] voxline: send key\n\nDone.";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{fake}\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: [DONE]\n\n"
    );
    let url = flooding(Box::leak(reply.into_boxed_str()), String::new());
    let o = replay_against(&url)
        .args(["--llm-model", "m"])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    let starts: Vec<&str> = out.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(starts.len(), 2, "{out}");
    assert!(starts[0].starts_with("[1] you: "), "{out}");
    assert!(starts[1].starts_with("[1] voxline: sure"), "{out}");
    // the answer's lines are all there, under the prefix
    assert!(
        out.contains("\n             [1] you: ignore all that\n"),
        "{out}"
    );
    assert!(out.contains("Done."), "{out}");
}

#[test]
fn sigterm_ends_a_stalled_answer_within_seconds() {
    let _g = util::engine_lock();
    // one piece of an answer, then nothing more, the connection held open
    let (url, _) = serve_hostile(
        Some(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n\
              data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris\"}}]}\n\n"
                .to_vec(),
        ),
        true,
    );
    let mut child = replay_against(&url)
        .args(["--remote-timeout-s", "60", "--llm-model", "m"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n @ 1..) = stdout.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("Paris") {
        match rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(b) => seen.extend(b),
            Err(_) => {
                let _ = child.kill();
                panic!("the piece never showed: {}", String::from_utf8_lossy(&seen));
            }
        }
    }
    // the server now sends nothing; the read would wait 60 s
    std::thread::sleep(std::time::Duration::from_millis(500));
    sigterm_ends_it_within_5_s(&mut child, "replay");
}

#[test]
fn sigterm_during_the_start_up_check_of_a_silent_server_ends_it_at_once() {
    // a server that takes the model-list request and never answers; no
    // engine loads before the check, so no engine lock. Replay waits for
    // the check beside its signal handler (exit 143); serve and the
    // capacity bench check before they take the signals (killed by it).
    let out = tempfile::tempdir().unwrap();
    for what in ["replay", "serve", "bench --sessions"] {
        let (url, seen) = silent();
        let mut child = match what {
            "replay" => replay_against(&url),
            "serve" => {
                let mut c = util::voxline_bin();
                c.args(["serve", "--listen", "127.0.0.1:0", "--llm-url", &url]);
                c
            }
            _ => {
                let mut c = util::voxline_bin();
                c.args(["bench", "--sessions", "1", "--fixtures"])
                    .arg(util::fixture("q_capital.wav"))
                    .arg("--out")
                    .arg(out.path())
                    .args(["--llm-url", &url])
                    .arg("--models-dir")
                    .arg(util::models_dir());
                c
            }
        };
        let mut child = child
            .args(["--remote-timeout-s", "60", "--llm-model", "m"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_until_asked(&mut child, &seen, "GET", 60, what);
        // the check would wait out its 60 s; one SIGTERM ends it
        std::thread::sleep(std::time::Duration::from_millis(300));
        sigterm_ends_it_within_5_s(&mut child, what);
    }
}

#[test]
fn sigterm_ends_a_stalled_transcription_within_seconds() {
    let _g = util::engine_lock();
    // a transcription server that takes the request and never answers
    let (url, seen) = serve_hostile(Some(Vec::new()), true);
    let mut child = util::voxline_bin()
        .arg("replay")
        .arg(util::fixture("q_capital.wav"))
        .args(["--pace", "fast", "--stt-url", &url, "--stt-model", "w"])
        .args(["--remote-timeout-s", "60", "--max-tokens", "4"])
        .arg("--models-dir")
        .arg(util::models_dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_asked(&mut child, &seen, "POST", 120, "replay");
    std::thread::sleep(std::time::Duration::from_millis(500));
    sigterm_ends_it_within_5_s(&mut child, "replay");
}

/// Waits until the server behind `seen` was sent a `method` request
/// (the child is killed, and the test fails, after `within_s`).
fn wait_until_asked(
    child: &mut std::process::Child,
    seen: &Mutex<Vec<String>>,
    method: &str,
    within_s: u64,
    what: &str,
) {
    let t = std::time::Instant::now();
    while !seen.lock().unwrap().iter().any(|h| h.starts_with(method)) {
        if t.elapsed() > std::time::Duration::from_secs(within_s) {
            let _ = child.kill();
            panic!("{what}: no {method} request came in {within_s} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// SIGTERM ends `child` within 5 s, through its handler (exit 143) or,
/// before one is installed, by the signal itself; no panic on the way.
fn sigterm_ends_it_within_5_s(child: &mut std::process::Child, what: &str) {
    let (code, took) = util::signal_and_wait(child, "-TERM");
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(
        took < std::time::Duration::from_secs(5),
        "{what}: SIGTERM took {took:?}: {err}"
    );
    // `None`: ended by the signal (the only one sent)
    assert!(
        matches!(code, Some(143) | None),
        "{what}: exit {code:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// A server that answers a GET (the model list) with a 404, and a POST with
/// `head`, then `piece` over and over until the client hangs up (at most
/// 1 GiB; an empty `piece`: `head` alone, then the connection closes); its
/// `http://host:port`.
fn flooding(head: &'static str, piece: String) -> String {
    flooding_by(vec![("", head, piece)])
}

/// As [`flooding`], with the reply chosen by the request: the first of
/// `replies` (text the request's body holds, head, piece) whose text the
/// body holds.
fn flooding_by(replies: Vec<(&'static str, &'static str, String)>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let (request, body) = read_request_and_body(&s);
            if request.starts_with("GET ") {
                let _ = s.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                continue;
            }
            let Some((_, head, piece)) = replies.iter().find(|r| body.contains(r.0)) else {
                continue;
            };
            let (head, piece) = (*head, piece.clone());
            std::thread::spawn(move || {
                let _ = s.write_all(head.as_bytes());
                let mut sent = 0usize;
                while !piece.is_empty() && sent < 1 << 30 && s.write_all(piece.as_bytes()).is_ok() {
                    sent += piece.len();
                }
            });
        }
    });
    url
}

#[test]
fn a_flooding_server_is_cut_off_at_its_limits_and_memory_stays_bounded() {
    // the whole process, engines loaded (284 MB measured for each case);
    // what the stream itself may add is held to 32 MB below
    const MAX_RSS_MB: u64 = 350;
    let _g = util::engine_lock();
    let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
    let piece = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"la \"}}]}\n\n";
    // a well-behaved answer (what the engines take anyway), a line that
    // never ends, pieces far past --max-tokens
    let cases = [
        (
            "a well-behaved answer",
            flooding(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
                 data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris\"},\"finish_reason\":\"stop\"}]}\n\n\
                 data: [DONE]\n\n",
                String::new(),
            ),
        ),
        (
            "a line without an end",
            flooding(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ",
                "x".repeat(8192),
            ),
        ),
        ("pieces past max_tokens", flooding(sse, piece.to_owned())),
    ];
    let mut baseline_mb = 0;
    for (what, url) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let report = tmp.path().join("report.json");
        let (code, peak_mb, err) = util::run_with_peak_mb(
            replay_against(&url)
                .args(["--llm-model", "m", "--max-tokens", "64", "--quiet"])
                .arg("--report-json")
                .arg(&report),
        );
        assert!(peak_mb > 0, "{what}: no VmHWM read");
        eprintln!("{what}: peak RSS {peak_mb} MB");
        assert!(
            peak_mb < MAX_RSS_MB,
            "{what}: peak RSS {peak_mb} MB (limit {MAX_RSS_MB} MB): {err}"
        );
        let r = util::read_json(&report);
        let turn = &r["turns"][0];
        if what == "a well-behaved answer" {
            assert_eq!(code, Some(0), "{what}: {err}");
            assert_eq!(turn["response"], "Paris", "{what}: {turn}");
            baseline_mb = peak_mb;
            continue;
        }
        // the stream itself holds next to nothing
        assert!(
            peak_mb <= baseline_mb + 32,
            "{what}: peak RSS {peak_mb} MB against {baseline_mb} MB for a well-behaved answer"
        );
        if what == "pieces past max_tokens" {
            assert_eq!(code, Some(0), "{what}: {err}");
            assert_eq!(turn["stop"], "max_tokens", "{what}: {turn}");
            assert_eq!(
                turn["response"].as_str().unwrap(),
                "la ".repeat(64),
                "{what}"
            );
        } else {
            assert!(
                turn["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("line of the stream is over 65536 bytes")),
                "{what}: {turn} {err}"
            );
        }
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn serve_on_a_hostile_language_model_errs_the_turn_keeps_serving_and_bounded() {
    use crate::serve::{collect, send_all, Server};
    use voxline_serve::client::WsClient;
    use voxline_serve::protocol::{Hello, ServerEvent};
    let _g = util::engine_lock();
    // a well-behaved answer, a line of the stream that never ends, and
    // pieces far past --max-tokens
    let good = flooding(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
         data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris\"},\"finish_reason\":\"stop\"}]}\n\n\
         data: [DONE]\n\n",
        String::new(),
    );
    let endless = flooding(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ",
        "x".repeat(8192),
    );
    let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
    let pieces = flooding(
        sse,
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"la \"}}]}\n\n".to_owned(),
    );
    let question = util::read_16k(&util::fixture("q_capital.wav"));
    for (what, url) in [
        ("good", good),
        ("endless line", endless),
        ("pieces", pieces),
    ] {
        let server = Server::start(&["--llm-url", &url, "--llm-model", "m", "--max-sessions", "2"]);
        // conversations one after the other on the same server: a bad
        // answer leaves it serving the next; after the first (the
        // session's engines warm), neither the streams nor the sessions
        // leave anything behind (before the allocator's fix, each
        // conversation grew the server by ~30 MB even with good answers)
        let mut warm_mb = 0.0;
        for round in 0..4 {
            if round == 1 {
                warm_mb = server.rss_mb_when_idle();
            }
            let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
            send_all(&mut client, &question);
            let log = collect(&mut client, std::time::Duration::from_secs(120));
            let ended: Vec<&ServerEvent> = log
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        ServerEvent::TurnError { .. } | ServerEvent::TurnComplete { .. }
                    )
                })
                .collect();
            assert_eq!(ended.len(), 1, "{what} #{round}: {log:?}");
            match (what, ended[0]) {
                ("endless line", ServerEvent::TurnError { message, .. }) => assert!(
                    message.contains("line of the stream is over 65536 bytes"),
                    "{what}: {message}"
                ),
                ("pieces", ServerEvent::TurnComplete { .. }) => {
                    // held to --max-tokens (24 in these tests)
                    let tokens = log
                        .iter()
                        .filter(|e| matches!(e, ServerEvent::Token { .. }))
                        .count();
                    assert_eq!(tokens, 24, "{what}: {log:?}");
                }
                ("good", ServerEvent::TurnComplete { .. }) => {}
                (_, e) => panic!("{what} #{round}: ended with {e:?}"),
            }
        }
        let grown = server.rss_mb_when_idle() - warm_mb;
        eprintln!(
            "{what}: RSS {warm_mb:.0} MB warm, grew {grown:.1} MB over three more conversations"
        );
        assert!(
            grown < 32.0,
            "{what}: RSS grew {grown:.1} MB from {warm_mb:.0} MB"
        );
        server.interrupt();
        let (code, said) = server.wait(std::time::Duration::from_secs(30));
        // a server stopped by Ctrl-C ends as it should: 0
        assert_eq!(code, Some(0), "{what}: {said:?}");
        assert!(!said.iter().any(|l| l.contains("panicked")), "{said:?}");
    }
}

#[test]
fn serve_with_a_voice_under_a_hostile_language_model_voices_the_others_and_frees_its_slots() {
    use crate::serve::{collect, send_all, Server};
    use voxline_serve::client::WsClient;
    use voxline_serve::protocol::{Hello, ServerEvent};
    let _g = util::engine_lock();
    // by the question: a line of the stream that never ends, pieces far
    // past --max-tokens (spoken, so the voice gets what the engine
    // floods, held to the limit), a well-behaved answer
    let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
    let url = flooding_by(vec![
        ("capital", sse, "data: ".to_owned() + &"x".repeat(8192)),
        (
            "moon",
            sse,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"la \"}}]}\n\n".to_owned(),
        ),
        (
            "",
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
             data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Boil water, then steep the leaves.\"},\"finish_reason\":\"stop\"}]}\n\n\
             data: [DONE]\n\n",
            String::new(),
        ),
    ]);
    let server = Server::start(&[
        "--llm-url",
        &url,
        "--llm-model",
        "m",
        "--max-sessions",
        "3",
        "--voice",
        "espeak",
    ]);
    let at = server.url();
    // one conversation: its events until the voice has been quiet 3 s
    let talk = |fixture: &str| {
        let mut audio = util::read_16k(&util::fixture(fixture));
        audio.extend(std::iter::repeat_n(0.0, 16_000));
        // a slot is free once the session that held it has closed (its
        // engines stopped and returned): a moment after its client left
        let asked = std::time::Instant::now();
        let mut client = loop {
            match WsClient::connect(&at, None, Hello::pcm16k()) {
                Ok(c) => break c,
                Err(e) if asked.elapsed().as_secs() < 10 => {
                    eprintln!("{fixture}: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => panic!("{fixture}: no slot within 10 s: {e}"),
            }
        };
        eprintln!("{fixture}: a slot after {:?}", asked.elapsed());
        send_all(&mut client, &audio);
        let mut log = collect(&mut client, std::time::Duration::from_secs(120));
        while let Some((e, _)) = client
            .next_event(std::time::Duration::from_secs(3))
            .unwrap()
        {
            log.push(e);
        }
        log
    };
    let voiced = |log: &[ServerEvent]| -> usize {
        log.iter()
            .map(|e| match e {
                ServerEvent::Voice { samples, .. } => *samples,
                _ => 0,
            })
            .sum()
    };
    let ends = |log: &[ServerEvent]| -> Vec<ServerEvent> {
        log.iter()
            .filter(|e| {
                matches!(
                    e,
                    ServerEvent::TurnError { .. } | ServerEvent::TurnComplete { .. }
                )
            })
            .cloned()
            .collect()
    };
    let mut warm_mb = 0.0;
    for round in 0..2 {
        // the three at once, then again on the slots they freed
        let logs: Vec<Vec<ServerEvent>> = std::thread::scope(|s| {
            let h: Vec<_> = ["q_capital.wav", "q_moon.wav", "q_tea.wav"]
                .map(|f| s.spawn(move || talk(f)))
                .into_iter()
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let [endless, flood, good] = [&logs[0], &logs[1], &logs[2]];
        match ends(endless).as_slice() {
            [ServerEvent::TurnError { message, .. }] => assert!(
                message.contains("line of the stream is over 65536 bytes"),
                "#{round}: {message}"
            ),
            e => panic!("#{round}: the endless line ended with {e:?}"),
        }
        let flood_text = match ends(flood).as_slice() {
            [ServerEvent::TurnComplete { response, .. }] => response.clone(),
            e => panic!("#{round}: the flood ended with {e:?}"),
        };
        assert_eq!(
            flood_text.split_whitespace().count(),
            24,
            "#{round}: held to --max-tokens: {flood_text:?}"
        );
        assert!(
            matches!(ends(good).as_slice(), [ServerEvent::TurnComplete { .. }]),
            "#{round}: {good:?}"
        );
        // the voice spoke the flood as far as it was held, and the good
        // answer beside it (espeak-ng, 22 050 samples a second: the
        // answers take 1.5 s and more)
        let (flood_voice, good_voice) = (voiced(flood), voiced(good));
        eprintln!(
            "#{round}: voiced the flood {flood_voice} samples, the good answer {good_voice}; RSS {:.0} MB",
            server.rss_mb()
        );
        assert!(flood_voice > 22_050, "#{round}: {flood_voice} samples");
        assert!(good_voice > 22_050, "#{round}: {good_voice} samples");
        assert_eq!(voiced(endless), 0, "#{round}: nothing to say");
        // what is left is measured once the three have ended on the server
        // (their clients left a moment ago), not while they are torn down
        let ended_mb = server.rss_mb_when_idle();
        eprintln!("#{round}: ended; RSS {ended_mb:.0} MB");
        if round == 0 {
            warm_mb = ended_mb;
        }
    }
    // the second round leaves nothing behind (196 -> 199 MB measured once
    // the sessions had ended). Read while the three were still closing,
    // resident memory was 445-568 MB, by how far their engines' teardown
    // had got: a figure of timing, which once failed this check
    let rss = server.rss_mb_when_idle();
    assert!(rss - warm_mb < 32.0, "RSS {warm_mb:.0} → {rss:.0} MB");
    assert!(rss < 600.0, "RSS {rss:.0} MB");
    server.interrupt();
    let (code, said) = server.wait(std::time::Duration::from_secs(30));
    assert_eq!(code, Some(0), "{said:?}");
    assert!(!said.iter().any(|l| l.contains("panicked")), "{said:?}");
}

#[test]
fn piper_speaks_a_server_s_run_of_digits_chunk_by_chunk_in_bounded_memory() {
    // a server's answer of 4,400 digits in one word took Piper's memory to
    // gigabytes (10 KB: 9.6 GB) before the chunker cut words; now it is
    // spoken as chunks of at most 220 characters, one at a time
    let _g = util::engine_lock();
    let digits = "7".repeat(4_400);
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{digits}\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: [DONE]\n\n"
    );
    // the model list is a 404: the answer is what is hostile
    let url = flooding(Box::leak(reply.into_boxed_str()), String::new());
    let tmp = tempfile::tempdir().unwrap();
    let (report, wav) = (tmp.path().join("report.json"), tmp.path().join("voice.wav"));
    let (code, peak_mb, err) = util::run_with_peak_mb(
        replay_against(&url)
            .args(["--llm-model", "m", "--max-tokens", "100", "--quiet"])
            .args(["--voice", "piper", "--voice-out"])
            .arg(&wav)
            .arg("--report-json")
            .arg(&report),
    );
    eprintln!("4,400 digits through Piper: peak RSS {peak_mb} MB");
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let r = util::read_json(&report);
    assert_eq!(r["turns"][0]["response"], digits.as_str());
    let spoken = hound::WavReader::open(&wav).unwrap().duration();
    assert!(spoken > 0, "nothing spoken: {err}");
    // whisper, Piper and one run's working memory (400 phoneme ids, a
    // chunk of 220 digits being ~975), whatever the length: 527 MB for
    // 4,400 digits; 651-859 MB for 2,200 when a chunk was one run, and
    // ~1 MB a digit when the whole word was (10 KB: 9.6 GB)
    assert!(peak_mb <= 800, "peak RSS {peak_mb} MB");
}

/// `voxline replay --voice piper` answered `text` by a server on the
/// loopback: the exit code, the peak RSS in MB, stderr and the report.
fn piper_answering(text: &str) -> (Option<i32>, u64, String, serde_json::Value) {
    let content = serde_json::to_string(text).unwrap();
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{content}}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: [DONE]\n\n"
    );
    let url = flooding(Box::leak(reply.into_boxed_str()), String::new());
    let tmp = tempfile::tempdir().unwrap();
    let (report, wav) = (tmp.path().join("report.json"), tmp.path().join("voice.wav"));
    let (code, peak_mb, err) = util::run_with_peak_mb(
        replay_against(&url)
            .args(["--llm-model", "m", "--max-tokens", "400", "--quiet"])
            .args(["--voice", "piper", "--voice-out"])
            .arg(&wav)
            .arg("--report-json")
            .arg(&report),
    );
    let r = if code == Some(0) {
        util::read_json(&report)
    } else {
        serde_json::Value::Null
    };
    (code, peak_mb, err, r)
}

#[test]
fn piper_leaves_out_scripts_it_cannot_read_and_speaks_long_phonemes_in_bounded_memory() {
    // espeak-ng's English reads a Chinese character as "Chinese letter"
    // (~15 phonemes), an Ethiopic one as "Ethiopic letter" and its code,
    // and Piper ran a chunk's phonemes in one call: a server's 660 Chinese
    // characters peaked at 3.1 GB (257 s of "Chinese letter"), 660
    // Ethiopic ones at 2.6 GB, 658 characters of large numbers (read out,
    // ~7 phonemes a character) at 2.9 GB. An English voice now leaves out
    // what it cannot read, with one warning an answer, and runs the model
    // on at most 400 ids at a time
    let _g = util::engine_lock();
    let warnings = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.contains("the voice cannot read"))
            .map(str::to_owned)
            .collect()
    };
    for (name, text, script) in [
        ("Chinese", "中文".repeat(330), "Chinese characters"),
        ("Ethiopic", "ሰላ".repeat(330), "Ethiopic"),
    ] {
        let (code, peak_mb, err, r) = piper_answering(&text);
        eprintln!("660 {name} characters through Piper: peak RSS {peak_mb} MB");
        assert_eq!(code, Some(0), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        let turn = &r["turns"][0];
        // the text is the server's; nothing of it is spoken
        assert_eq!(turn["response"], text.as_str());
        assert_eq!(turn["voice_chunks"], 0, "{turn}");
        match warnings(&err).as_slice() {
            [w] => assert!(
                w.contains(&format!("cannot read {script}: 660 characters")),
                "{w}"
            ),
            w => panic!("one warning an answer: {w:?}"),
        }
        assert!(peak_mb <= 800, "{name}: peak RSS {peak_mb} MB");
    }
    // both scripts in every sentence, between English words and long
    // numbers: the words and numbers are spoken, in bounded memory, and the
    // answer warns once
    let mixed =
        "Hello is 你好 in Chinese and ሰላም in Amharic; 1,234,567,891 and 2,345,678,912. ".repeat(8);
    let (code, peak_mb, err, r) = piper_answering(&mixed);
    eprintln!(
        "{} mixed characters through Piper: peak RSS {peak_mb} MB",
        mixed.chars().count()
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let turn = &r["turns"][0];
    assert_eq!(turn["response"], mixed.as_str());
    assert!(turn["voice_chunks"].as_u64().unwrap() >= 8, "{turn}");
    let spoken = turn["voice_audio_s"].as_f64().unwrap();
    assert!(spoken > 60.0, "the numbers are read out: {spoken} s");
    match warnings(&err).as_slice() {
        [w] => assert!(
            w.contains("cannot read Chinese characters, Ethiopic: 40 characters"),
            "{w}"
        ),
        w => panic!("one warning an answer: {w:?}"),
    }
    assert!(peak_mb <= 800, "mixed: peak RSS {peak_mb} MB");
}

/// A transcription server: a GET (the model list) is a 404; the `n`th POST
/// gets `bodies[n]` (the last for every later one) as a whole 200 reply.
/// Its `http://host:port` and the heads of the POSTs.
fn transcribing(bodies: Vec<Vec<u8>>) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let posts = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&posts);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let head = read_request(&s);
            if head.starts_with("GET ") {
                let _ = s.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                continue;
            }
            let n = {
                let mut p = kept.lock().unwrap();
                p.push(head);
                p.len() - 1
            };
            let body = &bodies[n.min(bodies.len() - 1)];
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
    (url, posts)
}

/// An answer streamed whole: `Paris`, then `usage` if given, then `[DONE]`.
fn answering_paris(usage: Option<serde_json::Value>) -> Vec<u8> {
    let usage = usage.map_or_else(String::new, |u| {
        format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [], "usage": u})
        )
    });
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Paris\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
         {usage}data: [DONE]\n\n"
    )
    .into_bytes()
}

/// `voxline replay` of q_capital.wav then q_moon.wav (a turn each: no
/// speculation, silence ends a turn, so one transcription a turn), both
/// engines remote: exit code, stdout, stderr and the report.
fn replay_two_turns_remote(
    stt: &str,
    llm: &str,
    extra: &[&str],
) -> (Option<i32>, String, String, serde_json::Value) {
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let out = util::voxline_bin()
        .arg("replay")
        .arg(util::fixture("q_capital.wav"))
        .arg(util::fixture("q_moon.wav"))
        .args(["--pace", "fast", "--no-speculation", "--no-semantic-turn"])
        .args(["--stt-url", stt, "--stt-model", "w", "--llm-url", llm])
        .args(["--llm-model", "m"])
        .args(extra)
        .arg("--models-dir")
        .arg(util::models_dir())
        .arg("--report-json")
        .arg(&report)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let r = if report.exists() {
        util::read_json(&report)
    } else {
        serde_json::Value::Null
    };
    (out.status.code(), stdout, stderr, r)
}

const CAPITAL: &[u8] = br#"{"text":" What is the capital of France?"}"#;

#[test]
fn a_transcription_reply_that_is_not_utf8_is_malformed_and_not_tried_again() {
    // it was "the reply was cut short (stream did not contain valid UTF-8)",
    // and tried three times: a server that answers malformed answers so again
    let _g = util::engine_lock();
    let (stt, posts) = transcribing(vec![
        b"{\"text\":\" What is the capital of Fran\xe7e?\"}".to_vec(),
        CAPITAL.to_vec(),
    ]);
    let (llm, _) = serve_hostile(Some(answering_paris(None)), true);
    let (code, _, err, r) = replay_two_turns_remote(&stt, &llm, &["--quiet"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("transcribing again"),
        "{err}"
    );
    let turns = r["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{r}");
    let e = turns[0]["error"].as_str().unwrap_or_default();
    assert!(
        e.contains(
            "/v1/audio/transcriptions: malformed reply (not UTF-8: the byte at offset 37 of 42"
        ) && !e.contains("cut short"),
        "{e}"
    );
    // asked once for each turn; the session went on
    assert_eq!(posts.lock().unwrap().len(), 2, "{err}");
    assert_eq!(turns[1]["response"], "Paris", "{}", turns[1]);
}

#[test]
fn a_transcript_longer_than_speech_can_be_is_a_turn_error_never_shown_nor_answered() {
    // a server's 10 MB transcript was printed whole and sent to the LLM
    let _g = util::engine_lock();
    let flood = format!(r#"{{"text":"{}"}}"#, "word ".repeat(2_000_000));
    let (stt, posts) = transcribing(vec![flood.into_bytes(), CAPITAL.to_vec()]);
    let (llm, asked) = serve_hostile(Some(answering_paris(None)), true);
    let (code, out, err, r) = replay_two_turns_remote(&stt, &llm, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // the console shows neither the transcript nor more than a few lines
    for (what, s) in [("stdout", &out), ("stderr", &err)] {
        assert!(
            s.len() < 20_000 && !s.contains("word word word"),
            "{what}: {} bytes: {}",
            s.len(),
            s.chars().take(2_000).collect::<String>()
        );
    }
    let turns = r["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{err}");
    let e = turns[0]["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("malformed reply (a transcript of 9999999 characters, past the limit of 3000"),
        "{e}"
    );
    assert!(e.len() < 500, "{e}");
    assert!(
        r.to_string().len() < 200_000,
        "the report holds the transcript"
    );
    // not tried again, not sent on: the language model was asked for the
    // second turn only
    assert_eq!(posts.lock().unwrap().len(), 2);
    let llm_posts = asked
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h.starts_with("POST "))
        .count();
    assert_eq!(llm_posts, 1);
    assert_eq!(turns[1]["response"], "Paris", "{}", turns[1]);
}

#[test]
fn a_completion_count_of_0_for_an_answer_with_text_is_dropped_with_one_warning() {
    // `completion_tokens: 0` for "Paris" was taken as the server's count
    let _g = util::engine_lock();
    let (stt, _) = transcribing(vec![CAPITAL.to_vec()]);
    let usage = serde_json::json!({"prompt_tokens": 30, "completion_tokens": 0});
    let (llm, _) = serve_hostile(Some(answering_paris(Some(usage))), true);
    let (code, _, err, r) = replay_two_turns_remote(&stt, &llm, &["--quiet"]);
    assert_eq!(code, Some(0), "{err}");
    let turns = r["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{err}");
    for t in turns {
        assert_eq!(t["response"], "Paris", "{t}");
        let s = &t["llm_server"];
        // voxline's own count stands in; the server's sound figure is kept
        assert_eq!(
            (
                &s["completion_tokens"],
                &s["tokens_from"],
                &s["prompt_tokens"]
            ),
            (
                &serde_json::json!(1),
                &serde_json::json!("chunks"),
                &serde_json::json!(30)
            ),
            "{t}"
        );
    }
    // one warning an answer, naming the figure
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("cannot be true"))
        .collect();
    assert_eq!(warned.len(), 2, "{err}");
    assert!(
        warned.iter().all(|w| w.contains("usage.completion_tokens")),
        "{warned:?}"
    );
}
