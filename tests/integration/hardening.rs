//! `voxline serve` under abuse: bounded in connections, memory and
//! shutdown time before any token is checked, and strict about what a
//! client sends. The real binary on the loopback, bounded loops.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use voxline_capacity::remote::get;
use voxline_serve::client::WsClient;
use voxline_serve::metrics::sample;
use voxline_serve::protocol::{Hello, SampleFormat, ServerEvent};

use crate::serve::{collect, transcripts, Server};
use crate::util;

/// Whether the server has closed `s` (end of file or reset; what it sent
/// before closing is read past).
fn is_closed(s: &mut TcpStream) -> bool {
    let _ = s.set_nonblocking(true);
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// The status of one raw HTTP request `head` (without its blank line).
fn status(addr: &str, head: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!("{head}\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn closed(server: &Server, reason: &str) -> f64 {
    sample(
        &server.metrics(None),
        &format!(r#"voxline_closed_connections_total{{reason="{reason}"}}"#),
    )
}

#[test]
fn idle_sockets_are_closed_in_time_and_healthz_answers_while_they_are_held() {
    let _g = util::engine_lock();
    let server = Server::start(&["--header-timeout-s", "3", "--max-connections", "600"]);
    let t0 = Instant::now();
    let mut idle: Vec<TcpStream> = (0..1100)
        .map(|i| {
            TcpStream::connect(&server.addr).unwrap_or_else(|e| {
                panic!("idle socket {i}: {e} (the test needs about 1,200 descriptors: ulimit -n)")
            })
        })
        .collect();
    // 1,100 sockets that send nothing, against a cap of 600: a health
    // check still gets in (in the place of the oldest idle one)
    let health = get(&server.url(), "/healthz", None).unwrap();
    assert!(health.contains(r#""status":"ok""#), "{health}");
    // and every idle one is closed within the header timeout
    let deadline = t0 + Duration::from_secs(3 + 7);
    loop {
        idle.retain_mut(|s| !is_closed(s));
        if idle.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        idle.is_empty(),
        "{} idle sockets still open after {:?}",
        idle.len(),
        t0.elapsed()
    );
    let (evicted, timed_out, refused) = (
        closed(&server, "evicted"),
        closed(&server, "header_timeout"),
        closed(&server, "refused"),
    );
    // How many were evicted rather than timed out depends on how fast the
    // server took them: on a loaded machine 1,100 accepts spread over more
    // than the 3 s timeout, and the first ones time out before the last
    // arrive (160 evicted seen). What does not depend on it: the cap was
    // reached and made room, no arrival was refused while an idle socket
    // could give way, and every idle socket closed for one of the two reasons.
    assert!(evicted >= 1.0, "evicted {evicted}");
    assert_eq!(refused, 0.0, "refused while idle sockets held the cap");
    assert!(timed_out >= 1.0, "timed out {timed_out}");
    assert!(evicted + timed_out >= 1100.0, "{evicted} + {timed_out}");
    // a conversation still works
    let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    crate::serve::send_all(
        &mut client,
        &util::read_16k(&util::fixture("q_capital.wav")),
    );
    let log = collect(&mut client, Duration::from_secs(60));
    assert_eq!(transcripts(&log).len(), 1, "{log:?}");
}

#[test]
fn a_half_sent_request_does_not_hold_sigterm_up() {
    let _g = util::engine_lock();
    // the default header timeout (10 s) is longer than the shutdown's grace
    let server = Server::start(&[]);
    let mut half = TcpStream::connect(&server.addr).unwrap();
    half.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    server.signal("TERM");
    let (code, said) = server.wait(Duration::from_secs(10));
    let took = t.elapsed();
    assert_eq!(code, Some(0), "{said:?}");
    // the grace (3 s) ended it, not the client nor the header timeout
    assert!(took < Duration::from_secs(7), "SIGTERM took {took:?}");
    assert!(is_closed(&mut half));
}

/// A 20 Hz-and-up noise of `secs` at `rate`, s16le: the VAD hears it as
/// nothing, so only the queue is exercised.
fn quiet_s16(rate: u32, secs: f64) -> Vec<u8> {
    let n = (f64::from(rate) * secs) as usize;
    (0..n)
        .flat_map(|i| (((i * 7919) % 64) as i16 - 32).to_le_bytes())
        .collect()
}

#[test]
fn oversized_and_malformed_messages_close_with_their_codes_and_memory_stays_bounded() {
    let _g = util::engine_lock();
    let server = Server::start(&[]);
    let before = server.rss_mb();
    let hello8k = Hello {
        sample_rate: 8_000,
        channels: 1,
        format: SampleFormat::S16le,
    };
    // 200 frames of 512 KiB at 8 kHz: the first closes the connection
    let mut big = WsClient::connect(&server.url(), None, hello8k).unwrap();
    let frame = vec![0u8; 512 * 1024];
    for _ in 0..200 {
        if big.send_binary(frame.clone()).is_err() {
            break;
        }
    }
    while let Ok(Some(_)) = big.next_event(Duration::from_secs(10)) {}
    let (code, reason) = big.close_reason().expect("closed by the server");
    assert_eq!(code, 1009, "{reason}");
    assert!(reason.contains("65536"), "{reason}");
    // 200 of the largest frames allowed (4 s of 8 kHz audio each) as fast
    // as the socket takes them: 800 s of audio against a 20 s queue
    let mut fast = WsClient::connect(&server.url(), None, hello8k).unwrap();
    let frame = quiet_s16(8_000, 4.0);
    assert_eq!(frame.len(), 64_000);
    for _ in 0..200 {
        fast.send_binary(frame.clone()).unwrap();
    }
    let grown = server.rss_mb() - before;
    eprintln!("800 s of audio in 200 frames of 64 KB: the server grew by {grown:.1} MB");
    assert!(grown < 400.0, "the server grew by {grown:.0} MB");
    fast.close();
    // a text message that is not UTF-8
    let mut bad = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    bad.send_raw_text(vec![b'{', 0xff, 0xfe, b'}']).unwrap();
    while let Ok(Some(_)) = bad.next_event(Duration::from_secs(10)) {}
    let (code, reason) = bad.close_reason().expect("closed by the server");
    assert_eq!(code, 1007, "{reason}");
    assert!(reason.contains("UTF-8"), "{reason}");
    let grown = server.rss_mb() - before;
    assert!(grown < 400.0, "the server grew by {grown:.0} MB");
}

#[test]
fn one_sample_frames_lose_nothing() {
    let _g = util::engine_lock();
    let server = Server::start(&[]);
    let audio = util::read_16k(&util::fixture("q_capital.wav"));
    let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    // 2-byte frames, one sample each, at twice real time
    let t0 = Instant::now();
    for (i, block) in audio.chunks(1).enumerate() {
        client.send_samples(block).unwrap();
        if i % 320 == 0 {
            let due = t0 + Duration::from_secs_f64(i as f64 / 32_000.0);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
    }
    client.end_of_stream().unwrap();
    let log = collect(&mut client, Duration::from_secs(60));
    let lost: Vec<_> = log
        .iter()
        .filter(|e| matches!(e, ServerEvent::Dropped { .. }))
        .collect();
    assert!(lost.is_empty(), "{lost:?}");
    let heard = transcripts(&log);
    assert_eq!(heard.len(), 1, "{heard:?}");
    let wer = voxline_stt::word_error_rate("What is the capital of France?", &heard[0]);
    assert!(wer <= 0.2, "{heard:?}");
}

#[test]
fn sigterm_drops_the_queued_audio_and_the_io_threads_never_wait_on_a_full_queue() {
    let _g = util::engine_lock();
    let server = Server::start(&[]);
    // four minutes of speech sent as fast as the socket takes it
    let speech = util::read_16k(&util::fixture("multi_turn.wav"));
    let mut client = WsClient::connect(&server.url(), None, Hello::pcm16k()).unwrap();
    let mut sent = 0usize;
    while sent < 240 * 16_000 {
        for block in speech.chunks(16_000) {
            client.send_samples(block).unwrap();
            sent += block.len();
        }
    }
    // `end` on a full queue, then a health check: answered at once
    client.end_of_stream().unwrap();
    let t = Instant::now();
    let health = get(&server.url(), "/healthz", None).unwrap();
    assert!(health.contains("ok"), "{health}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "/healthz took {:?}",
        t.elapsed()
    );
    // the queue is bounded in audio: most of it was refused (counted)
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let n = sample(
            &server.metrics(None),
            r#"voxline_dropped_total{edge="audio"}"#,
        );
        if n > 0.0 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(refused > 0.0, "no audio refused");
    let t = Instant::now();
    server.signal("TERM");
    let (code, said) = server.wait(Duration::from_secs(60));
    let took = t.elapsed();
    assert_eq!(code, Some(0), "{said:?}");
    // the queued audio and the turns queued in front of the engines are
    // dropped; only the turns in flight finish (1.4 s idle; 67 s before,
    // when the whole queue was transcribed first)
    assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
    let last = said.last().cloned().unwrap_or_default();
    eprintln!("SIGTERM with 240 s uploaded: exit after {took:?}: {last}");
    assert!(
        last.contains("not yet transcribed and was dropped"),
        "{said:?}"
    );
}

#[test]
fn a_token_is_checked_the_same_way_wherever_it_comes() {
    let _g = util::engine_lock();
    let token = "abc+def/ghi=jkl0123";
    let server = Server::start(&["--token", token]);
    let a = &server.addr;
    let q = |t: &str| format!("GET /metrics?token={t} HTTP/1.1");
    assert_eq!(status(a, &q("abc%2Bdef%2Fghi%3Djkl0123")), 200);
    // a `+` is a `+`, as the page passes it on
    assert_eq!(status(a, &q(token)), 200);
    assert_eq!(status(a, &q("abc%20def/ghi=jkl0123")), 401);
    let h = |v: &str| format!("GET /metrics HTTP/1.1\r\nAuthorization: {v}");
    assert_eq!(status(a, &h(&format!("bearer {token}"))), 200);
    assert_eq!(status(a, &h(&format!("BEARER {token}"))), 200);
    assert_eq!(status(a, &h(&format!("Basic {token}"))), 401);
    // a wrong query token is not outvoted by a right header, nor the reverse
    let both = |qt: &str, ht: &str| {
        format!("GET /metrics?token={qt} HTTP/1.1\r\nAuthorization: Bearer {ht}")
    };
    assert_eq!(status(a, &both("wrong-wrong-wrong!", token)), 401);
    assert_eq!(status(a, &both(token, "wrong-wrong-wrong!")), 401);
    assert_eq!(status(a, &both(token, token)), 200);
}

#[test]
fn bench_via_a_server_that_never_answers_says_it_timed_out() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    // takes connections and never answers them
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(16).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let t = Instant::now();
    let out = util::voxline_bin()
        .args(["bench", "--sessions", "1", "--via", &format!("ws://{addr}")])
        .arg("--fixtures")
        .arg(util::fixture("q_capital.wav"))
        .arg("--models-dir")
        .arg(util::models_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no answer to"), "{err}");
    assert!(err.contains(&addr.to_string()), "{err}");
    assert!(!err.contains("os error"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// `secs` of `f(t)` at 16 kHz between a second of silence on each side.
fn write_sound(path: &std::path::Path, secs: f64, f: impl Fn(f64) -> f64) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let n = (secs * 16_000.0) as usize;
    for i in 0..(n + 32_000) {
        let t = (i as f64 - 16_000.0) / 16_000.0;
        let x = if i < 16_000 || i >= n + 16_000 {
            0.0
        } else {
            f(t)
        };
        w.write_sample((x.clamp(-1.0, 1.0) * 20_000.0) as i16)
            .unwrap();
    }
    w.finalize().unwrap();
}

#[test]
fn tones_hums_and_blank_audio_are_never_answered() {
    use std::f64::consts::TAU;
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let sounds: [(&str, &dyn Fn(f64) -> f64); 6] = [
        // a 50 Hz mains buzz (a sawtooth, 6 s): whisper heard "(dramatic
        // music)", and the turn failed as too few words for its audio
        ("buzz", &|t| 0.3 * (2.0 * (50.0 * t).fract() - 1.0)),
        // a 50 Hz hum with its harmonics
        ("mains", &|t| {
            (1..6)
                .map(|k| 0.3 / f64::from(k) * (TAU * 50.0 * f64::from(k) * t).sin())
                .sum()
        }),
        ("tone", &|t| {
            0.5 * (TAU * 440.0 * t).sin() + 0.25 * (TAU * 880.0 * t).sin()
        }),
        ("hum", &|t| {
            (1..8)
                .map(|k| 0.3 / f64::from(k) * (TAU * 120.0 * f64::from(k) * t).sin())
                .sum()
        }),
        ("whistle", &|t| {
            0.6 * (TAU * (1500.0 * t + 40.0 * (TAU * 5.0 * t).sin())).sin()
        }),
        ("chord", &|t| {
            let c = [261.6, 329.6, 392.0]
                .iter()
                .map(|f| (TAU * f * t).sin())
                .sum::<f64>();
            0.3 * c * (0.5 + 0.5 * (TAU * 2.0 * t).sin())
        }),
    ];
    let mut files = Vec::new();
    for (name, f) in sounds {
        let p = dir.path().join(format!("{name}.wav"));
        write_sound(&p, if name == "buzz" { 6.0 } else { 4.0 }, f);
        files.push(p);
    }
    let report = dir.path().join("out").join("report.json");
    std::fs::create_dir_all(report.parent().unwrap()).unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let out = util::voxline_bin()
            .arg("replay")
            .args(args)
            .args([
                "--pace",
                "fast",
                "--quiet",
                "--max-tokens",
                "16",
                "--ctx",
                "512",
            ])
            .arg("--report-json")
            .arg(&report)
            .arg("--models-dir")
            .arg(util::models_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        util::read_json(&report)
    };
    let args: Vec<&std::ffi::OsStr> = files.iter().map(|p| p.as_os_str()).collect();
    let r = run(&args);
    let s = &r["summary"];
    let heard: Vec<_> = r["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["transcript"].clone())
        .collect();
    assert_eq!(s["completed"], 0, "answered a sound: {heard:?}");
    assert_eq!(s["turns"], 0, "{heard:?}");
    assert_eq!(s["errors"], 0, "a sound became a failed turn: {heard:?}");
    assert!(s["non_speech"].as_u64() >= Some(3), "{heard:?}");
    for t in r["turns"].as_array().unwrap() {
        assert_eq!(t["non_speech"], true, "{t}");
        assert!(t["response"].is_null(), "{t}");
        assert!(t["error"].is_null(), "{t}");
    }
    // a real question 30 dB quieter than recorded is still answered
    let quiet = dir.path().join("quiet.wav");
    let question = util::read_16k(&util::fixture("q_capital.wav"));
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&quiet, spec).unwrap();
    for x in question {
        w.write_sample((x * 0.0316 * 32_767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
    let r = run(&[quiet.as_os_str()]);
    assert_eq!(r["summary"]["completed"], 1, "{}", r["turns"]);
    assert_eq!(r["turns"][0]["non_speech"], false, "{}", r["turns"]);
    // utterances cut to 233 ms: whisper's [BLANK_AUDIO] pieces are not
    // answered, and the question still is
    let q = util::fixture("q_capital.wav");
    let r = run(&[
        q.as_os_str(),
        "--max-utterance-ms".as_ref(),
        "233".as_ref(),
        "--min-speech-ms".as_ref(),
        "0".as_ref(),
    ]);
    let turns = r["turns"].as_array().unwrap();
    let blank = turns.iter().filter(|t| t["non_speech"] == true).count();
    assert!(blank >= 3, "{turns:?}");
    for t in turns {
        let answered = !t["response"].is_null();
        assert_eq!(answered, t["non_speech"] == false, "{t}");
    }
    assert_eq!(r["summary"]["non_speech"], blank);
}

/// A named pipe `in.wav` in `dir`.
fn mkfifo(dir: &std::path::Path) -> std::path::PathBuf {
    let fifo = dir.join("in.wav");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    fifo
}

/// `voxline replay FIFO`, its stderr lines on a channel.
fn replay_fifo(fifo: &std::path::Path) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let mut child = util::voxline_bin()
        .arg("replay")
        .arg(fifo)
        .args(["--max-tokens", "8", "--ctx", "512"])
        .arg("--models-dir")
        .arg(util::models_dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    (child, rx)
}

/// Waits for a line containing `what`; every line seen.
fn wait_line(rx: &std::sync::mpsc::Receiver<String>, what: &str, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let hit = l.contains(what);
        seen.push(l);
        if hit {
            return seen;
        }
    }
    panic!("no line with {what:?} within {within:?}: {seen:?}");
}

/// Sends SIGINT to `child` and waits for its exit: its code and how long it took.
fn interrupt(child: &mut std::process::Child) -> (Option<i32>, Duration) {
    util::signal_and_wait(child, "-INT")
}

#[test]
fn a_named_pipe_without_a_writer_is_waited_for_out_loud_and_ctrl_c_ends_it() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let fifo = mkfifo(dir.path());
    let (mut child, lines) = replay_fifo(&fifo);
    wait_line(
        &lines,
        "waiting for one (Ctrl-C stops)",
        Duration::from_secs(10),
    );
    let (code, took) = interrupt(&mut child);
    assert_eq!(code, Some(130));
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_writer_that_stalls_after_the_header_does_not_hold_ctrl_c_up() {
    let _g = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let fifo = mkfifo(dir.path());
    let wav = std::fs::read(util::fixture("q_capital.wav")).unwrap();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            // the header and a little audio, then nothing until released
            let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            w.write_all(&wav[..20_000]).unwrap();
            w.flush().unwrap();
            let _ = held.recv();
        })
    };
    let (mut child, lines) = replay_fifo(&fifo);
    wait_line(&lines, "loading models", Duration::from_secs(20));
    // the models load; the pipeline then waits on the stalled writer
    std::thread::sleep(Duration::from_secs(6));
    let (code, took) = interrupt(&mut child);
    assert_eq!(code, Some(130));
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(release);
    writer.join().unwrap();
}
