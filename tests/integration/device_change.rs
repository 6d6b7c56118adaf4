//! A microphone that goes away and an echo path that appears, through a
//! real sound server (issue 65, item 6). A private PulseAudio: the
//! questions are played into `voxsink`, the voice goes to `voxout`.
//!
//! - The capture source (`mic`, a remap of `voxsink`'s monitor) is
//!   unloaded while the first answer plays: PulseAudio moves the capture to
//!   the default source, the loudspeaker's monitor, so voxline hears its
//!   own voice at full level. It must say the device changed (a warning
//!   line, an event, the report) and answer none of its own words.
//! - The voice goes nowhere the microphone hears for the first answer; then
//!   a loopback routes the loudspeaker into the microphone (headphones
//!   taken off) and a second question is asked: the canceller must engage
//!   in that answer.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::pulse::{
    is_loud, live_reader, live_session, read_events, recorder, Line, Pulse, QUIET_LOG,
};
use crate::util;

/// `pactl` with `args` on `pulse`; its standard output.
fn pactl(pulse: &Pulse, args: &[&str]) -> String {
    let out = pulse
        .client(std::process::Command::new("pactl").args(args))
        .output()
        .expect("pactl (pulseaudio-utils) runs");
    assert!(out.status.success(), "pactl {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `voxline live --voice espeak` capturing `source`, the voice to
/// `voxout`, for `run`; waited for until it listens. The child and its
/// lines as they come.
fn live(
    pulse: &Pulse,
    source: &str,
    run: Duration,
    report: &Path,
    events: &Path,
) -> (std::process::Child, Receiver<Line>) {
    let run = format!("{}s", run.as_secs());
    let args: Vec<&OsStr> = vec![
        OsStr::new("--voice"),
        OsStr::new("espeak"),
        OsStr::new("--max-duration"),
        OsStr::new(&run),
        OsStr::new("--report-json"),
        report.as_os_str(),
        OsStr::new("--events"),
        events.as_os_str(),
    ];
    let s = live_session(pulse, Some(source), &args, QUIET_LOG);
    (s.child, s.lines)
}

/// Waits until the voice sounds on `voxout`'s monitor (`heard`), up to 60 s.
fn voice_starts(heard: &Receiver<(Instant, Vec<u8>)>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, bytes) = heard
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("no answer was heard");
        if is_loud(&bytes) {
            return;
        }
    }
}

/// Waits until the voice has been silent for `quiet` (after sounding), up to 90 s.
fn voice_ends(heard: &Receiver<(Instant, Vec<u8>)>, quiet: Duration) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last_loud = Instant::now();
    while Instant::now() < deadline {
        match heard.recv_timeout(Duration::from_millis(100)) {
            Ok((at, bytes)) if is_loud(&bytes) => last_loud = at,
            _ => {}
        }
        if last_loud.elapsed() >= quiet {
            return;
        }
    }
    panic!("the voice never stopped");
}

/// Waits for `child` to exit (killing it after `within`); all it printed on
/// stderr since it listened.
fn finish(child: &mut std::process::Child, lines: &Receiver<Line>, within: Duration) -> String {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    lines
        .try_iter()
        .filter(|(_, out, _)| !out)
        .map(|(_, _, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The capture source unloaded while the first answer plays: the capture
/// moves to the loudspeaker's monitor. The change is reported (warning,
/// `capture_device_changed` event, `live.device_changes`), and no turn is
/// made of the assistant's own voice.
#[test]
fn a_microphone_that_goes_away_is_reported_and_its_own_voice_is_not_answered() {
    let _g = util::engine_lock();
    let pulse = Pulse::start_with(
        "load-module module-null-sink sink_name=voxout rate=22050 channels=1 format=s16le\n\
         load-module module-remap-source source_name=mic master=voxsink.monitor\n",
    );
    // where PulseAudio moves a capture whose source goes away
    pactl(&pulse, &["set-default-source", "voxout.monitor"]);
    let dir = pulse.dir.path().to_path_buf();
    let (report, events) = (dir.join("report.json"), dir.join("events.jsonl"));
    let (mut vox, lines) = live(&pulse, "mic", Duration::from_secs(45), &report, &events);
    let mut rec = recorder(&pulse, "voxout.monitor");
    let heard = live_reader(rec.stdout.take().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    pulse.play(&util::fixture("q_story.wav"));
    voice_starts(&heard);
    std::thread::sleep(Duration::from_millis(500));
    let modules = pactl(&pulse, &["list", "short", "modules"]);
    let remap = modules
        .lines()
        .find(|l| l.contains("module-remap-source"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no remap source among {modules}"))
        .to_owned();
    pactl(&pulse, &["unload-module", &remap]);
    let err = finish(&mut vox, &lines, Duration::from_secs(90));
    let _ = rec.kill();
    let _ = rec.wait();
    let r = util::read_json(&report);
    let changes = r["live"]["device_changes"].as_u64().unwrap_or(0);
    let evs = read_events(&events);
    let changed = evs
        .iter()
        .filter(|e| e["type"] == "capture_device_changed")
        .count();
    let turns = r["turns"].as_array().expect("the report lists turns");
    let own: Vec<&serde_json::Value> = turns
        .iter()
        .filter(|t| {
            !t["transcript"]
                .as_str()
                .is_some_and(|s| s.to_lowercase().contains("story"))
                && t["response"].as_str().is_some_and(|s| !s.is_empty())
        })
        .collect();
    eprintln!(
        "device change: {changes} in the report, {changed} events; clock gaps {}; turns {}; answered of its own voice: {}; aec {}",
        r["live"]["timing"]["gaps"],
        turns.len(),
        own.len(),
        r["live"]["voice_output"]["echo_cancellation"]
    );
    assert!(
        err.contains("capture device changed"),
        "no warning line:\n{err}"
    );
    assert!(changes >= 1, "not in the report: {}", r["live"]);
    assert!(changed >= 1, "no capture_device_changed event");
    assert!(
        own.is_empty(),
        "the assistant answered its own voice: {own:?}\n{err}"
    );
}

/// The first answer goes nowhere the microphone hears; then the
/// loudspeaker is routed into it (-6 dB, 40 ms) and a second question
/// asked: the canceller hears its answer and takes it out.
#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn an_echo_path_that_appears_mid_session_engages_the_canceller_in_the_next_answer() {
    let _g = util::engine_lock();
    let pulse = Pulse::start_with_output();
    let dir = pulse.dir.path().to_path_buf();
    let (report, events) = (dir.join("report.json"), dir.join("events.jsonl"));
    let (mut vox, lines) = live(
        &pulse,
        "voxsink.monitor",
        Duration::from_secs(70),
        &report,
        &events,
    );
    let mut rec = recorder(&pulse, "voxout.monitor");
    let heard = live_reader(rec.stdout.take().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    pulse.play(&util::fixture("q_story.wav"));
    voice_starts(&heard);
    voice_ends(&heard, Duration::from_millis(2500));
    // headphones taken off: the loudspeaker reaches the microphone
    pactl(
        &pulse,
        &[
            "load-module",
            "module-loopback",
            "source=voxout.monitor",
            "sink=voxsink",
            "latency_msec=40",
        ],
    );
    let inputs = pactl(&pulse, &["list", "short", "sink-inputs"]);
    let loopback = inputs
        .lines()
        .find(|l| l.contains("loopback"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no loopback among {inputs}"))
        .to_owned();
    pactl(&pulse, &["set-sink-input-volume", &loopback, "0.5012"]);
    std::thread::sleep(Duration::from_millis(500));
    pulse.play(&util::fixture("q_moon.wav"));
    voice_starts(&heard);
    voice_ends(&heard, Duration::from_millis(2500));
    let err = finish(&mut vox, &lines, Duration::from_secs(90));
    let _ = rec.kill();
    let _ = rec.wait();
    let r = util::read_json(&report);
    let aec = r["live"]["voice_output"]["echo_cancellation"].clone();
    let turns = r["turns"].as_array().expect("the report lists turns");
    let transcripts: Vec<&str> = turns
        .iter()
        .filter_map(|t| t["transcript"].as_str())
        .collect();
    eprintln!("echo path appears: aec {aec}; turns {transcripts:?}");
    assert!(
        transcripts
            .iter()
            .any(|t| t.to_lowercase().contains("moon")),
        "the second question was not heard: {transcripts:?}\n{err}"
    );
    assert!(
        aec["stretches_with_echo"].as_u64() >= Some(1),
        "the canceller never heard the voice: {aec}\n{err}"
    );
    assert!(
        aec["erle_db"].as_f64() >= Some(10.0),
        "the canceller did not take the echo out: {aec}\n{err}"
    );
}
