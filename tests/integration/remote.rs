//! The remote engines against real servers on the loopback (llama.cpp's
//! llama-server, a faster-whisper server): the same transcripts and
//! answers as the local engines, a server killed or stalled mid-answer is a
//! turn error and the next turn is answered, a server down at start is one
//! line and exit 2, the API key never shows, and the capacity bench runs
//! on them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use voxline_core::{PipelineEvent, TimedEvent};
use voxline_pipeline::engines::ChatStart;
use voxline_pipeline::pipeline::{self, Pace, RunOptions};
use voxline_remote::{Client, Endpoint, RemoteChat, Timeouts};

use crate::servers::{free_port, Server};
use crate::util;

/// A conversation with the language model on `server`.
fn chat(server: &Server, timeouts: Timeouts) -> RemoteChat {
    let client = Client::new(
        Endpoint::parse("--llm-url", &server.url(), None).unwrap(),
        timeouts,
    );
    RemoteChat::new(client, util::settings(64).chat_options("smollm2".into()))
}

/// Replays `files` at real-time pace through whisper here and `chat`,
/// calling `hook` with every event; the report.
fn replay_with(
    chat: RemoteChat,
    files: &[&str],
    hook: impl Fn(&TimedEvent) + Send + Sync + 'static,
) -> voxline_report::Report {
    let s = util::settings(64);
    let stt = voxline_stt::SttStage::new(
        voxline_stt::SttEngine::load(s.stt_config().expect("whisper settings")).unwrap(),
    );
    let paths: Vec<PathBuf> = files.iter().map(|f| util::fixture(f)).collect();
    let opts = RunOptions {
        pace: Pace::Realtime,
        on_event: Some(Arc::new(hook)),
        ..RunOptions::default()
    };
    let run = pipeline::run(
        pipeline::open_inputs(&paths).unwrap(),
        stt,
        ChatStart::Remote(chat),
        &opts,
        None,
    )
    .unwrap();
    voxline_report::build(&run, voxline_report::RunConfig::default(), 0.0, None)
}

/// Whether `e` is the `index`th token of turn `id`'s answer.
fn token(e: &TimedEvent, id: u64, index: u32) -> bool {
    matches!(&e.event, PipelineEvent::Engine(x)
        if x.downcast_ref::<voxline_llm::Token>().is_some_and(|t| t.id == id && t.index == index))
}

/// What the server does to the first answer, from a thread of its own (the
/// event hook must not wait on a server).
fn control(
    server: Server,
    act: impl FnOnce(&mut Server) + Send + 'static,
) -> (
    crossbeam_channel::Sender<()>,
    std::thread::JoinHandle<Server>,
) {
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    let handle = std::thread::spawn(move || {
        let mut server = server;
        if rx.recv_timeout(Duration::from_secs(60)).is_ok() {
            act(&mut server);
        }
        server
    });
    (tx, handle)
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn a_server_killed_mid_answer_is_a_turn_error_and_the_next_turn_is_answered() {
    let _cpu = util::engine_lock();
    let server = Server::llama(&[]);
    let name = server.name();
    let talk = chat(&server, Timeouts::default());
    let (kill, controller) = control(server, |s| {
        s.kill();
        std::thread::sleep(Duration::from_millis(200));
        s.restart();
    });
    let once = AtomicBool::new(false);
    let report = replay_with(talk, &["q_capital.wav", "q_moon.wav"], move |e| {
        if token(e, 1, 1) && !once.swap(true, Ordering::SeqCst) {
            let _ = kill.send(());
        }
    });
    let _server = controller.join().unwrap();
    let turns = &report.turns;
    assert_eq!(turns.len(), 2, "{turns:#?}");
    let error = turns[0].error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "llm: {name}: /v1/chat/completions: the reply was cut short"
        )),
        "turn 1: {error:?}"
    );
    assert_eq!(turns[1].error, None, "turn 2 after the restart");
    let answer = turns[1].response.as_deref().unwrap_or_default();
    assert!(!answer.trim().is_empty(), "turn 2 is answered");
    let server = turns[1].llm_server.as_ref().expect("the server's counts");
    assert_eq!(server.server, name);
    assert_eq!(server.tokens_from, voxline_llm::TokenSource::Usage);
    assert!(server.completion_tokens > 0 && server.server_prompt_ms.is_some());
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn a_stalled_stream_times_out_as_a_turn_error_and_the_next_turn_is_answered() {
    let _cpu = util::engine_lock();
    let server = Server::llama(&[]);
    let talk = chat(
        &server,
        Timeouts {
            read: Duration::from_secs(1),
            ..Timeouts::default()
        },
    );
    // the server stops mid-answer, and runs again once the turn has failed
    let (tx, rx) = crossbeam_channel::bounded::<()>(2);
    let controller = std::thread::spawn(move || {
        for signal in ["STOP", "CONT"] {
            if rx.recv_timeout(Duration::from_secs(60)).is_ok() {
                server.signal(signal);
            }
        }
        server
    });
    let (once, failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let report = replay_with(talk, &["q_capital.wav", "q_moon.wav"], move |e| {
        if token(e, 1, 1) && !once.swap(true, Ordering::SeqCst) {
            let _ = tx.send(());
        }
        if matches!(&e.event, PipelineEvent::TurnError(t) if t.id == 1)
            && !failed.swap(true, Ordering::SeqCst)
        {
            let _ = tx.send(());
        }
    });
    let _server = controller.join().unwrap();
    assert_eq!(report.turns.len(), 2, "{:#?}", report.turns);
    let error = report.turns[0].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("within 1 s (the reply stalled)"),
        "turn 1: {error:?}"
    );
    assert_eq!(
        report.turns[1].error, None,
        "turn 2, the server running again"
    );
    assert!(report.turns[1].response.is_some());
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn a_cancelled_answer_closes_the_stream_and_the_server_stops_generating() {
    use voxline_llm::ChatBackend;
    let _cpu = util::engine_lock();
    let server = Server::llama(&["--metrics"]);
    let mut talk = chat(&server, Timeouts::default());
    let mut pieces = 0;
    let r = talk
        .respond("Tell me a long story about a cat and a dog.", &mut |_| {
            pieces += 1;
            pieces < 3
        })
        .unwrap();
    assert_eq!((r.stop, pieces), (voxline_llm::Stop::Cancelled, 3));
    assert!(talk.history().is_empty(), "a cancelled answer is not kept");
    // the server noticed the closed stream: far fewer than the 64 tokens it was allowed
    std::thread::sleep(Duration::from_millis(1500));
    let predicted = server.metric("llamacpp:tokens_predicted_total");
    assert!(predicted < 20.0, "the server generated {predicted} tokens");
    // the conversation goes on, and the server counts what it generates
    let r = talk.respond("Say hello.", &mut |_| true).unwrap();
    assert!(r.n_sampled > 0 && !r.text.trim().is_empty(), "{r:?}");
    assert_eq!(talk.history().len(), 2);
    let after = server.metric("llamacpp:tokens_predicted_total");
    assert!(
        after - predicted >= f64::from(r.n_sampled),
        "the count grew by {} for {} tokens",
        after - predicted,
        r.n_sampled
    );
}

/// `voxline` with the API keys' variables cleared, then `args`.
fn voxline(args: &[&str]) -> std::process::Command {
    let mut c = util::voxline_bin();
    c.env_remove("VOXLINE_LLM_API_KEY")
        .env_remove("VOXLINE_STT_API_KEY")
        .args(args);
    c
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_lowercase).collect()
}

/// The fixtures replayed in both tests: a question, a conversation, a long
/// passage and a noisy one.
const FIXTURES: &[&str] = &[
    "q_capital.wav",
    "q_moon.wav",
    "multi_turn.wav",
    "long_10s.wav",
    "q_capital_noisy.wav",
];

fn replay_report(out: &Path, extra: &[&str]) -> serde_json::Value {
    let json = out.join("report.json");
    let mut args: Vec<String> = FIXTURES
        .iter()
        .map(|f| util::fixture(f).display().to_string())
        .collect();
    args.extend(["--report-json".into(), json.display().to_string()]);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = voxline(&["replay"]).args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    util::read_json(&json)
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn both_engines_remote_give_the_local_transcripts_and_answer_every_turn() {
    let _cpu = util::engine_lock();
    let dir = tempfile::tempdir().unwrap();
    let local = replay_report(dir.path(), &[]);
    let (llm, stt) = (Server::llama(&[]), Server::whisper());
    let remote_dir = dir.path().join("remote");
    std::fs::create_dir_all(&remote_dir).unwrap();
    let remote = replay_report(
        &remote_dir,
        &["--stt-url", &stt.url(), "--llm-url", &llm.url()],
    );
    let (l, r) = (&local["summary"], &remote["summary"]);
    assert_eq!(r["turns"], l["turns"], "the same turns");
    assert_eq!(r["errors"], 0, "{remote:#}");
    assert_eq!(r["completed"], r["turns"], "every turn answered");
    let (wl, wr) = (l["wer"].as_f64().unwrap(), r["wer"].as_f64().unwrap());
    // two implementations of the same model (whisper.cpp here, CTranslate2
    // int8 on the server): seen 0.00-0.02 apart, a word now and then
    assert!(
        (wr - wl).abs() <= 0.035,
        "WER local {wl:.3}, remote {wr:.3}"
    );
    // transcript by transcript, the remote's against the local's
    let texts = |rep: &serde_json::Value| -> Vec<String> {
        rep["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["transcript"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let (tl, tr) = (texts(&local), texts(&remote));
    let (mut errors, mut n) = (0.0, 0.0);
    for (a, b) in tl.iter().zip(&tr) {
        let len = words(a).len() as f64;
        errors += voxline_stt::word_error_rate(a, b) * len;
        n += len;
    }
    assert!(
        errors / n <= 0.05,
        "remote vs local transcripts: {tl:?} / {tr:?}"
    );
    // what the report says of the servers
    assert_eq!(remote["config"]["stt_backend"], "remote");
    assert_eq!(remote["config"]["llm_server"], llm.name());
    assert_eq!(remote["config"]["llm_model"], "smollm2");
    assert_eq!(r["llm_server"]["tokens_from"], "usage");
    assert!(
        r["llm_server"]["cached_share"].as_f64().unwrap() > 0.3,
        "the prefix cache serves the history"
    );
    assert!(local["config"].get("llm_server").is_none() && l.get("llm_server").is_none());
    let reason = r["bottleneck"]["reason"].as_str().unwrap();
    assert!(reason.contains("(remote, 127.0.0.1:"), "{reason}");
    // greedy on the same weights: the same first answer
    assert_eq!(
        local["turns"][0]["response"],
        remote["turns"][0]["response"]
    );
}

#[test]
fn a_server_down_at_start_is_one_line_and_exit_2() {
    let port = free_port();
    let q = util::fixture("q_capital.wav");
    let url = format!("http://127.0.0.1:{port}");
    for (flag, cmd) in [
        ("--llm-url", "replay"),
        ("--stt-url", "replay"),
        ("--llm-url", "bench"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let o = match cmd {
            "replay" => voxline(&["replay", q.to_str().unwrap(), flag, &url]).output(),
            _ => voxline(&[
                "bench",
                "--sessions",
                "1",
                flag,
                &url,
                "--out",
                out.to_str().unwrap(),
            ])
            .arg("--fixtures")
            .arg(util::fixtures_dir())
            .output(),
        }
        .unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd} {flag}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| !l.contains("loading models") && !l.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), 1, "{cmd} {flag}: {err}");
        assert_eq!(
            lines[0],
            format!("voxline: 127.0.0.1:{port}: cannot connect (Connection refused); is the server running, and is the URL right?")
        );
        assert!(!out.join("sessions.json").exists(), "nothing written");
    }
}

/// A fixtures directory holding `names` (recording and sidecar).
fn fixtures(dir: &Path, names: &[&str]) -> PathBuf {
    let d = dir.join("fixtures");
    std::fs::create_dir_all(&d).unwrap();
    for f in names {
        for ext in ["wav", "json"] {
            let name = format!("{f}.{ext}");
            std::fs::copy(util::fixture(&name), d.join(&name)).unwrap();
        }
    }
    d
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn the_api_key_is_sent_and_never_shows() {
    let _cpu = util::engine_lock();
    const KEY: &str = "vx-test-key-6f1c0e9a";
    let llm = Server::llama(&["--api-key", KEY]);
    let dir = tempfile::tempdir().unwrap();
    let (fx, out) = (fixtures(dir.path(), &["q_capital"]), dir.path().join("out"));
    let o = voxline(&["bench", "--llm-url", &llm.url()])
        .arg("--fixtures")
        .arg(&fx)
        .arg("--out")
        .arg(&out)
        .arg("--events")
        .arg(out.join("events.jsonl"))
        .env("VOXLINE_LLM_API_KEY", KEY)
        .env("VOXLINE_LOG", "debug")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{stderr}");
    // the server took the key: the turn was answered
    let report = util::read_json(&out.join("report.json"));
    assert_eq!(report["summary"]["completed"], 1, "{report:#}");
    assert!(!stdout.contains(KEY) && !stderr.contains(KEY), "console");
    let written: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(written.len() >= 3, "{written:?}");
    for f in &written {
        let bytes = std::fs::read(f).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(KEY), "{}", f.display());
    }
    // a wrong key is refused at start: one line, exit 2, and the key is not in it
    let o = voxline(&["replay"])
        .arg(util::fixture("q_capital.wav"))
        .args(["--llm-url", &llm.url()])
        .env("VOXLINE_LLM_API_KEY", "vx-wrong-key-0000")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("answered HTTP 401") && err.contains("refused the key"),
        "{err}"
    );
    assert!(!err.contains("vx-wrong-key-0000"), "{err}");
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn an_http_error_from_the_server_is_a_turn_error_and_the_session_goes_on() {
    let _cpu = util::engine_lock();
    // a real server that refuses transcriptions: llama-server has no audio model
    let not_stt = Server::llama(&[]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let o = voxline(&["replay", "--stt-url", &not_stt.url(), "--report-json"])
        .arg(&json)
        .arg(util::fixture("q_capital.wav"))
        .arg(util::fixture("q_moon.wav"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = util::read_json(&json);
    let turns = report["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "every turn is reported: {report:#}");
    for t in turns {
        let e = t["error"].as_str().unwrap_or_default();
        assert!(
            e.starts_with(&format!(
                "stt: {}: /v1/audio/transcriptions answered HTTP 501",
                not_stt.name()
            )),
            "{e}"
        );
    }
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn the_capacity_bench_runs_on_remote_engines() {
    let _cpu = util::engine_lock();
    let (llm, stt) = (Server::llama(&[]), Server::whisper());
    let dir = tempfile::tempdir().unwrap();
    let fixtures = fixtures(dir.path(), &["q_capital", "q_moon"]);
    let out = dir.path().join("out");
    let o = voxline(&[
        "bench",
        "--sessions",
        "1,2",
        "--stt-url",
        &stt.url(),
        "--llm-url",
        &llm.url(),
    ])
    .arg("--fixtures")
    .arg(&fixtures)
    .arg("--out")
    .arg(&out)
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = util::read_json(&out.join("sessions.json"));
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["errors"], 0, "{row:#}");
        assert!(row["turns"].as_u64().unwrap() >= 1, "{row:#}");
    }
    assert_eq!(r["remote_engines"]["llm"], llm.name());
    assert_eq!(r["remote_engines"]["stt"], stt.name());
    let md = std::fs::read_to_string(out.join("sessions.md")).unwrap();
    assert!(
        md.contains("limiting stage: ") && md.contains("(remote, 127.0.0.1:"),
        "{md}"
    );
}
