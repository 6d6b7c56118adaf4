//! Live mode holds memory flat: an accelerated soak of `voxline live`
//! through ALSA's `file` plugin (see `support/live_soak.rs`), with a real
//! speech recording fed in a loop, RSS read from `/proc/PID/status` once a
//! second. Not a CI test; run it by hand:
//!
//! `cargo bench --bench live_soak` (100 hours of audio; `VOXLINE_SOAK_HOURS`
//! to change, `VOXLINE_SOAK_WALL_S` caps the wall time, default 3600;
//! `VOXLINE_SOAK_BIN` soaks another build of `voxline`)
//!
//! Prints the RSS after each hour of audio (a line every tenth of the run
//! for long runs), then the verdict: RSS at the end within 5 % of its value
//! after the first hour of audio.

#[path = "../tests/integration/util.rs"]
#[allow(dead_code)] // the benches use some of the tests' helpers
mod util;

#[path = "support/live_soak.rs"]
mod live_soak;

use std::time::Duration;

fn main() {
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let hours = env("VOXLINE_SOAK_HOURS", 100.0);
    let soak = live_soak::Soak {
        // another build to compare with (e.g. before a change)
        bin: std::env::var_os("VOXLINE_SOAK_BIN")
            .map_or_else(|| env!("CARGO_BIN_EXE_voxline").into(), Into::into),
        models: util::models_dir(),
        speech: util::fixture("multi_turn.wav"),
        hours,
        max_wall: Duration::from_secs_f64(env("VOXLINE_SOAK_WALL_S", 3600.0)),
    };
    let out = live_soak::run(&soak);
    println!("audio_h  wall_s  rss_mb");
    let step = (hours / 10.0).max(1.0);
    let mut next = 1.0;
    for s in &out.samples {
        if s.audio_h >= next {
            println!(
                "{:>7.1}  {:>6.0}  {:>6.1}",
                s.audio_h,
                s.wall_s,
                s.rss_kb as f64 / 1024.0
            );
            next = if next < step { step } else { next + step };
        }
    }
    let r = &out.report;
    let s = &r["summary"];
    println!(
        "exit {:?}; fed {:.1} h of audio in {:.0} s; report: audio {:.1} h, turns {} (completed {}, errors {}), dropped {}, live.frames_captured {}, event log {} bytes",
        out.code,
        out.fed_h,
        out.last().map_or(0.0, |l| l.wall_s),
        s["audio_s"].as_f64().unwrap_or(0.0) / 3600.0,
        s["turns"],
        s["completed"],
        s["errors"],
        s["dropped"],
        r["live"]["frames_captured"],
        out.events_bytes
    );
    match (out.at_hours(1.0), out.last()) {
        (Some(first), Some(last)) => {
            let change = (last.rss_kb as f64 - first.rss_kb as f64) / first.rss_kb as f64;
            println!(
                "RSS after the first hour of audio {:.1} MB, at {:.1} h {:.1} MB: {:+.2} % ({})",
                first.rss_kb as f64 / 1024.0,
                last.audio_h,
                last.rss_kb as f64 / 1024.0,
                change * 100.0,
                if change.abs() <= 0.05 {
                    "within 5 %"
                } else {
                    "NOT within 5 %"
                }
            );
        }
        _ => println!("too few readings: {}", out.stderr),
    }
}
