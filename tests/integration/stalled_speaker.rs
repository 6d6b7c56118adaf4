//! A loudspeaker that stops taking audio, through a real sound server: a
//! private PulseAudio whose voice sink is suspended (`pactl suspend-sink`)
//! while the first answer plays, then a second question. `voxline live`
//! must still end within its play-out limit (30 s after the run), write its
//! report, and end on the first SIGTERM within 5 s — the run hung
//! past 105 s with its speaker, sink and barge-in threads waiting forever,
//! and only a second signal ended it, with no report.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::pulse::{
    is_loud, live_reader, live_session, read_events, recorder, Line, Pulse, QUIET_LOG,
};
use crate::util;

/// The play-out limit of docs/limits.md.
const PLAY_OUT: Duration = Duration::from_secs(30);

/// `voxline live --voice espeak` on `pulse` (the microphone on `voxsink`'s
/// monitor, the voice to `voxout`) with `extra` flags, waited for until it
/// listens: the child, its lines as they come, and when it listened.
fn live(
    pulse: &Pulse,
    extra: &[&str],
    report: &Path,
    events: &Path,
) -> (std::process::Child, Receiver<Line>, Instant) {
    let mut args: Vec<&OsStr> = vec![OsStr::new("--voice"), OsStr::new("espeak")];
    args.extend(extra.iter().map(OsStr::new));
    args.extend([
        OsStr::new("--report-json"),
        report.as_os_str(),
        OsStr::new("--events"),
        events.as_os_str(),
    ]);
    let s = live_session(pulse, None, &args, QUIET_LOG);
    (s.child, s.lines, s.listening)
}

/// Reads `lines` into `seen` until one matches (when it came) or `within` passes.
fn wait_for(
    lines: &Receiver<Line>,
    seen: &mut Vec<String>,
    within: Duration,
    matches: impl Fn(bool, &str) -> bool,
) -> Option<Instant> {
    let deadline = Instant::now() + within;
    loop {
        let (at, out, l) = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .ok()?;
        let hit = matches(out, &l);
        seen.push(l);
        if hit {
            return Some(at);
        }
    }
}

/// Waits for `child` to end, `by` at the latest (then it is killed and
/// this panics with `what` and what it printed): its exit code and when
/// it ended.
fn ended_by(
    child: &mut std::process::Child,
    by: Instant,
    lines: &Receiver<Line>,
    seen: &mut Vec<String>,
    what: &str,
) -> (Option<i32>, Instant) {
    loop {
        seen.extend(lines.try_iter().map(|(_, _, l)| l));
        if let Some(s) = child.try_wait().unwrap() {
            let at = Instant::now();
            std::thread::sleep(Duration::from_millis(200));
            seen.extend(lines.try_iter().map(|(_, _, l)| l));
            return (s.code(), at);
        }
        if Instant::now() > by {
            let _ = child.kill();
            let _ = child.wait();
            seen.extend(lines.try_iter().map(|(_, _, l)| l));
            panic!("{what}; killed. It printed:\n{}", seen.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pactl suspend-sink voxout`: the voice's sink stops taking audio.
fn suspend_the_voice_sink(pulse: &Pulse) {
    let status = pulse
        .client(std::process::Command::new("pactl").args(["suspend-sink", "voxout", "1"]))
        .status()
        .expect("pactl (pulseaudio-utils) runs");
    assert!(status.success(), "pactl suspend-sink failed");
}

/// Asks for a story, waits until its answer is heard on the voice's sink
/// and has played half a second, and suspends the sink; then waits for
/// voxline's warning that the loudspeaker stopped taking audio (how long
/// after the suspension it came) and asks how far away the moon is.
fn stall_during_the_first_answer(
    pulse: &Pulse,
    lines: &Receiver<Line>,
    seen: &mut Vec<String>,
) -> Duration {
    let mut rec = recorder(pulse, "voxout.monitor");
    let heard = live_reader(rec.stdout.take().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    pulse.play(&util::fixture("q_story.wav"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, bytes) = heard
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no answer was heard:\n{}", seen.join("\n")));
        if is_loud(&bytes) {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    suspend_the_voice_sink(pulse);
    let suspended = Instant::now();
    let _ = rec.kill();
    let _ = rec.wait();
    let warned = wait_for(lines, seen, Duration::from_secs(15), |out, l| {
        !out && l.contains("the loudspeaker") && l.contains("has taken no audio")
    })
    .unwrap_or_else(|| {
        panic!(
            "no warning that the loudspeaker stopped taking audio:\n{}",
            seen.join("\n")
        )
    });
    pulse.play(&util::fixture("q_moon.wav"));
    warned.duration_since(suspended)
}

/// What the report and the events say of the stall, and that the second
/// question was answered; the report's `voice_output`.
fn the_stall_was_reported(report: &Path, events: &Path, seen: &[String]) -> serde_json::Value {
    let r = util::read_json(report);
    let output = r["live"]["voice_output"].clone();
    assert!(output["stalls"].as_u64() >= Some(1), "{output}");
    assert!(output["stalled_ms"].as_f64() >= Some(2_000.0), "{output}");
    let turns = r["turns"].as_array().expect("the report lists turns");
    let story = turns
        .iter()
        .find(|t| {
            t["transcript"]
                .as_str()
                .is_some_and(|s| s.contains("story"))
        })
        .unwrap_or_else(|| panic!("no story turn: {turns:?}"));
    let stalled: Vec<serde_json::Value> = read_events(events)
        .into_iter()
        .filter(|e| e["type"] == "speaker_stalled")
        .collect();
    assert!(
        stalled
            .first()
            .is_some_and(|e| e["id"] == story["id"] && e["silent_ms"].as_f64() >= Some(2_000.0)),
        "the stall of the story's answer: {stalled:?}"
    );
    let moon = turns
        .iter()
        .find(|t| t["transcript"].as_str().is_some_and(|s| s.contains("moon")))
        .unwrap_or_else(|| {
            panic!(
                "the second question was not heard: {turns:?}\n{}",
                seen.join("\n")
            )
        });
    assert!(
        moon["response"].as_str().is_some_and(|s| !s.is_empty()),
        "the second question was not answered: {moon}"
    );
    output
}

/// The run: the voice's sink suspended during the first answer,
/// then a second question; `--max-duration` ends the run, and the play-out
/// that follows is bounded: the session exits within 30 s of the run's end,
/// exit 0, with its report (the stall counted, `play_out: stalled`) and its
/// events (`speaker_stalled` for the answer that was playing).
#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn a_stalled_loudspeaker_ends_live_within_its_play_out_time_with_a_report() {
    let _g = util::engine_lock();
    let pulse = Pulse::start_with_output();
    let dir = pulse.dir.path().to_path_buf();
    let (report, events) = (dir.join("report.json"), dir.join("events.jsonl"));
    let run = Duration::from_secs(35);
    let (mut vox, lines, listening) = live(
        &pulse,
        &["--max-duration", &format!("{}s", run.as_secs())],
        &report,
        &events,
    );
    let mut seen = Vec::new();
    let warned_after = stall_during_the_first_answer(&pulse, &lines, &mut seen);
    let run_ends = listening + run;
    let (code, ended) = ended_by(
        &mut vox,
        run_ends + PLAY_OUT,
        &lines,
        &mut seen,
        "still running 30 s after --max-duration with a stalled loudspeaker",
    );
    let err = seen.join("\n");
    assert_eq!(code, Some(0), "{err}");
    let output = the_stall_was_reported(&report, &events, &seen);
    assert_eq!(output["play_out"], "stalled", "{output}");
    eprintln!(
        "stalled loudspeaker: warned {:.1} s after the suspension; exited {:.1} s after --max-duration; {output}",
        warned_after.as_secs_f64(),
        ended.saturating_duration_since(run_ends).as_secs_f64()
    );
}

/// The same stall, then SIGTERM once the second question is answered
/// (its voice queued on the stalled device): the first signal ends the
/// session within 5 s, exit 0, with its report.
#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn sigterm_ends_live_on_a_stalled_loudspeaker_within_5_s_with_a_report() {
    let _g = util::engine_lock();
    let pulse = Pulse::start_with_output();
    let dir = pulse.dir.path().to_path_buf();
    let (report, events) = (dir.join("report.json"), dir.join("events.jsonl"));
    let (mut vox, lines, _) = live(&pulse, &["--max-duration", "150s"], &report, &events);
    let mut seen = Vec::new();
    stall_during_the_first_answer(&pulse, &lines, &mut seen);
    // the moon's turn, then its answer whole (the console ends its line then)
    let asked = wait_for(&lines, &mut seen, Duration::from_secs(60), |out, l| {
        out && l.contains("] you:") && l.contains("moon")
    });
    let answer = seen
        .last()
        .and_then(|l| l.split_once(']'))
        .map(|(id, _)| format!("{id}] voxline:"))
        .filter(|_| asked.is_some())
        .unwrap_or_else(|| panic!("the second question was not heard:\n{}", seen.join("\n")));
    let answered = wait_for(&lines, &mut seen, Duration::from_secs(60), |out, l| {
        out && l.starts_with(&answer)
    });
    assert!(
        answered.is_some(),
        "the second question was not answered:\n{}",
        seen.join("\n")
    );
    let (code, took) = util::signal_and_wait(&mut vox, "-TERM");
    seen.extend(lines.try_iter().map(|(_, _, l)| l));
    let err = seen.join("\n");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        took <= Duration::from_secs(5),
        "SIGTERM → exit took {:.1} s:\n{err}",
        took.as_secs_f64()
    );
    let output = the_stall_was_reported(&report, &events, &seen);
    assert_eq!(output["play_out"], "stopped", "{output}");
    eprintln!(
        "stalled loudspeaker: SIGTERM → exit {:.2} s; {output}",
        took.as_secs_f64()
    );
}

/// A loudspeaker that plays: SIGTERM while a long answer plays out (all of
/// its text is in, most of its voice still to come) cuts the play-out
/// short: exit 0 within 5 s, with the report (`play_out: stopped`). Before,
/// the sink fed the rest of the answer at the pace it played, and the
/// session waited for it.
#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn sigterm_while_the_voice_plays_out_cuts_it_short() {
    let _g = util::engine_lock();
    let pulse = Pulse::start_with_output();
    let dir = pulse.dir.path().to_path_buf();
    let (report, events) = (dir.join("report.json"), dir.join("events.jsonl"));
    let (mut vox, lines, _) = live(
        &pulse,
        &["--max-duration", "150s", "--max-tokens", "200"],
        &report,
        &events,
    );
    let mut seen = Vec::new();
    let mut rec = recorder(&pulse, "voxout.monitor");
    let heard = live_reader(rec.stdout.take().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    pulse.play(&util::fixture("q_story.wav"));
    // the story's answer, whole on the console
    let answered = wait_for(&lines, &mut seen, Duration::from_secs(90), |out, l| {
        out && l.contains("] voxline:")
    });
    assert!(answered.is_some(), "no answer:\n{}", seen.join("\n"));
    // its voice still plays
    std::thread::sleep(Duration::from_millis(500));
    let playing = heard
        .try_iter()
        .any(|(at, bytes)| at.elapsed() < Duration::from_millis(400) && is_loud(&bytes));
    assert!(
        playing,
        "the answer's voice was not playing any more:\n{}",
        seen.join("\n")
    );
    let (code, took) = util::signal_and_wait(&mut vox, "-TERM");
    seen.extend(lines.try_iter().map(|(_, _, l)| l));
    let err = seen.join("\n");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        took <= Duration::from_secs(5),
        "SIGTERM → exit took {:.1} s while the voice played out:\n{err}",
        took.as_secs_f64()
    );
    let _ = rec.kill();
    let _ = rec.wait();
    let r = util::read_json(&report);
    let output = &r["live"]["voice_output"];
    assert_eq!(output["play_out"], "stopped", "{output}");
    assert_eq!(output["stalls"], 0, "{output}");
    // the turn in flight finished: its answer is in the report whole
    let turns = r["turns"].as_array().expect("the report lists turns");
    assert!(
        turns
            .iter()
            .any(|t| t["response"].as_str().is_some_and(|s| !s.is_empty())),
        "{turns:?}"
    );
    eprintln!(
        "voice playing out: SIGTERM → exit {:.2} s; {output}",
        took.as_secs_f64()
    );
}
