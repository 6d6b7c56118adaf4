//! Parses arbitrary bytes as a fixture sidecar (JSON) and, when they are
//! UTF-8, as a budget (TOML).
//!
//! Beyond "never panics", an accepted sidecar must satisfy the invariants
//! `Sidecar::parse` promises (non-zero rate, turns non-empty and in order),
//! and converting its boundaries to 16 kHz must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxline_report::budget::Budget;
use voxline_pipeline::sidecar::Sidecar;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Sidecar::parse(data) {
        assert_ne!(s.sample_rate, 0, "accepted a 0 Hz sidecar");
        let mut prev_end = 0;
        for t in &s.turns {
            assert!(t.start_sample < t.end_sample, "accepted an empty or reversed turn");
            assert!(t.start_sample >= prev_end, "accepted overlapping turns");
            prev_end = t.end_sample;
            let (a, b) = (s.to_16k(t.start_sample), s.to_16k(t.end_sample));
            assert!(a <= b, "to_16k is not monotonic");
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Budget::parse(text);
    }
});
