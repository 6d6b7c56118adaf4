//! Live mode holds memory flat: a few hours of audio through ALSA's `file`
//! plugin, fed from a FIFO with a real recording in a loop, hundreds of
//! times faster than real time (`cargo bench --bench live_soak` runs the
//! 100-hour version; see the README).

#[path = "../../benches/support/live_soak.rs"]
#[allow(dead_code)]
mod driver;

use crate::util;

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn live_rss_stays_flat_over_hours_of_accelerated_audio() {
    let _g = util::engine_lock();
    let out = driver::run(&driver::Soak {
        bin: env!("CARGO_BIN_EXE_voxline").into(),
        models: util::models_dir(),
        speech: util::fixture("multi_turn.wav"),
        hours: 4.0,
        max_wall: std::time::Duration::from_secs(300),
    });
    // the last 2,000 characters of stderr: a failure's cause, short enough
    // to survive a CI log's cut
    let tail: String = {
        let c: Vec<char> = out.stderr.chars().collect();
        c[c.len().saturating_sub(2000)..].iter().collect()
    };
    assert_eq!(out.code, Some(0), "{tail}");
    let first = out.at_hours(1.0).unwrap();
    let last = out.last().unwrap();
    assert!(last.audio_h >= 3.9, "only {:.2} h fed", last.audio_h);
    let after: Vec<_> = out
        .samples
        .iter()
        .filter(|s| s.audio_h >= first.audio_h)
        .collect();
    // A leak grows with the audio, a little in every stretch of it; keeping
    // every span grew RSS by ~20 MB per hour of audio. Between readings RSS
    // also swings by 50-100 MB as a transcription's working memory (its
    // attention buffers) is mapped for a call and given back after it, and
    // steps once or twice (an engine buffer touched for the first time when
    // some turn first needs it: 49 MB once, at 1.3 h, on a loaded machine,
    // flat for the 3 h after). Reading-to-reading rates follow the swing
    // (their median was 6-15 MB per hour in runs whose RSS ended lower than
    // it began), so each third of the audio after the first hour is read at
    // its floor, the lowest reading in it (between calls): a leak lifts
    // every third's floor, a swing none, a step one; the steady rate is the
    // lesser rise from one third's floor to the next, and the steps
    // together are bounded.
    let third = (last.audio_h - first.audio_h) / 3.0;
    let mut floors = [f64::INFINITY; 3];
    for s in &after {
        let k = (((s.audio_h - first.audio_h) / third) as usize).min(2);
        floors[k] = floors[k].min(s.rss_kb as f64 / 1024.0);
    }
    assert!(
        floors.iter().all(|f| f.is_finite()),
        "a third of the audio without a reading; hours:MB {}",
        digest(&out.samples)
    );
    let mb_per_h = ((floors[1] - floors[0]).min(floors[2] - floors[1])) / third;
    let growth_mb = (last.rss_kb as f64 - first.rss_kb as f64) / 1024.0;
    // One line, a reading per quarter hour: the whole list (four a second)
    // made the message so long that a CI log's cut hid it.
    let digest = digest(&out.samples);
    eprintln!("soak: {mb_per_h:.1} MB/h, {growth_mb:.1} MB in all; {digest}");
    assert!(
        mb_per_h < 4.0 && growth_mb < 80.0,
        "RSS grew at {mb_per_h:.1} MB per hour of audio (floors of its thirds {floors:.0?} MB), {growth_mb:.1} MB in all, from {:.1} h to {:.1} h; hours:MB {digest}",
        first.audio_h,
        last.audio_h,
    );
    // turns happened, and what could not be listened to was counted
    let s = &out.report["summary"];
    assert!(s["completed"].as_u64().unwrap() >= 2, "{s}");
    assert!(s["dropped"].as_u64().unwrap() > 0, "{s}");
    assert!(s["audio_s"].as_f64().unwrap() >= 3.9 * 3600.0, "{s}");
}

/// The first reading in each quarter hour of audio, as `hours:MB`.
fn digest(samples: &[driver::Sample]) -> String {
    let mut quarter = -1_i64;
    let mut out = Vec::new();
    for s in samples {
        let q = (s.audio_h * 4.0) as i64;
        if q > quarter {
            quarter = q;
            out.push(format!("{:.2}:{:.0}", s.audio_h, s.rss_kb as f64 / 1024.0));
        }
    }
    out.push(format!("({} readings)", samples.len()));
    out.join(" ")
}
