//! Live mode holds memory flat: a few hours of audio through ALSA's `file`
//! plugin, fed from a FIFO with a real recording in a loop, hundreds of
//! times faster than real time (`cargo bench --bench live_soak` runs the
//! 100-hour version; see the README).

#[path = "../../benches/support/live_soak.rs"]
#[allow(dead_code)]
mod driver;

use crate::util;

#[test]
fn live_rss_stays_flat_over_hours_of_accelerated_audio() {
    let _g = util::engine_lock();
    let out = driver::run(&driver::Soak {
        bin: env!("CARGO_BIN_EXE_voxline").into(),
        models: util::models_dir(),
        speech: util::fixture("multi_turn.wav"),
        hours: 4.0,
        max_wall: std::time::Duration::from_secs(300),
    });
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (first, last) = (out.at_hours(1.0).unwrap(), out.last().unwrap());
    assert!(last.audio_h >= 3.9, "only {:.2} h fed", last.audio_h);
    // Keeping every span grew RSS by ~20 MB per hour of audio; what is left
    // (allocator and engine buffers settling as turns come) is a few MB.
    let growth_mb = (last.rss_kb as f64 - first.rss_kb as f64) / 1024.0;
    assert!(
        growth_mb < 16.0,
        "RSS grew {growth_mb:.1} MB from {:.1} h to {:.1} h of audio: {:?}",
        first.audio_h,
        last.audio_h,
        out.samples
    );
    // turns happened, and what could not be listened to was counted
    let s = &out.report["summary"];
    assert!(s["completed"].as_u64().unwrap() >= 2, "{s}");
    assert!(s["dropped"].as_u64().unwrap() > 0, "{s}");
    assert!(s["audio_s"].as_f64().unwrap() >= 3.9 * 3600.0, "{s}");
}
