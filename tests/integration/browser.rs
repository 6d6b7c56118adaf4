//! The page at `/` in a real browser: Debian's Chromium, headless, its
//! fake microphone playing a fixture, driven over the DevTools protocol.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions};

use crate::serve::Server;
use crate::util;

/// Where Chromium is: `$CHROMIUM`, else Debian's.
fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

/// The fixture followed by silence, so that the turn ends while the fake
/// microphone plays it once.
fn fixture_then_silence(dir: &Path) -> PathBuf {
    let mut samples = util::read_16k(&util::fixture("q_capital.wav"));
    samples.resize(samples.len() + 3 * 16_000, 0.0);
    let path = dir.join("mic.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for x in samples {
        #[allow(clippy::cast_possible_truncation)]
        w.write_sample((x * 32768.0).round().clamp(-32768.0, 32767.0) as i16)
            .unwrap();
    }
    w.finalize().unwrap();
    path
}

/// The screenshot in the README.
fn screenshot_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("screenshots")
        .join("serve-page.png")
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn the_page_in_a_real_browser_shows_the_transcript_and_a_streamed_answer() {
    let exe = chromium();
    assert!(
        exe.exists(),
        "Chromium is not installed at {}: install Debian's chromium package (.ci/setup.sh does) or set CHROMIUM",
        exe.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let mic = fixture_then_silence(tmp.path());
    let capture = format!("--use-file-for-fake-audio-capture={}%noloop", mic.display());
    let profile = tmp.path().join("profile");
    // the browser shares the machine with the server's engines: it runs at
    // the lowest priority so that what the page shows is the server's speed
    let niced = tmp.path().join("chromium");
    std::fs::write(
        &niced,
        format!("#!/bin/sh\nexec nice -n 19 '{}' \"$@\"\n", exe.display()),
    )
    .unwrap();
    std::fs::set_permissions(&niced, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _g = util::engine_lock();
    let server = Server::start(&["--max-sessions", "2", "--voice", "espeak"]);
    let flags = [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        capture.as_str(),
        "--autoplay-policy=no-user-gesture-required",
        "--disable-quic",
        "--disable-component-update",
        "--no-default-browser-check",
    ];
    let args: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
    let options = LaunchOptions::default_builder()
        .path(Some(niced))
        .headless(true)
        .sandbox(false)
        .window_size(Some((900, 640)))
        .user_data_dir(Some(profile))
        .idle_browser_timeout(Duration::from_secs(300))
        .args(args)
        .build()
        .unwrap();
    let browser = Browser::new(options)
        .unwrap_or_else(|e| panic!("Chromium ({}) could not start: {e}", exe.display()));
    let tab = browser.new_tab().unwrap();
    tab.navigate_to(&format!("http://{}/?autostart=1", server.addr))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    let done = tab
        .wait_for_element_with_custom_timeout(".turn.done", Duration::from_secs(180))
        .unwrap_or_else(|e| {
            let status = tab
                .find_element("#status")
                .and_then(|s| s.get_inner_text())
                .unwrap_or_default();
            panic!("no answered turn on the page ({e}); its status: {status}")
        });
    let heard = tab
        .find_element(".turn.done .you")
        .unwrap()
        .get_inner_text()
        .unwrap();
    let answer = tab
        .find_element(".turn.done .answer")
        .unwrap()
        .get_inner_text()
        .unwrap();
    let latency = tab
        .find_element(".turn.done .latency")
        .unwrap()
        .get_inner_text()
        .unwrap();
    let pieces: u32 = done
        .get_attribute_value("data-tokens")
        .unwrap()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert_eq!(
        voxline_stt::word_error_rate("What is the capital of France?", &heard),
        0.0,
        "the page shows {heard:?}"
    );
    assert!(!answer.trim().is_empty(), "no answer on the page");
    assert!(
        pieces >= 2,
        "the answer came in {pieces} piece(s), not streamed"
    );
    assert!(
        latency.starts_with("response ") && latency.contains(" ms"),
        "{latency}"
    );
    // the answer is spoken: the page played the voice's frames
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let played = loop {
        let played: u64 = tab
            .find_element("body")
            .unwrap()
            .get_attribute_value("data-played")
            .unwrap()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if played > 0 || std::time::Instant::now() > deadline {
            break played;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        played >= 11_025,
        "the page played {played} samples of the voice"
    );
    // the load figures arrive once a second
    std::thread::sleep(Duration::from_millis(1500));
    let bottleneck = tab
        .find_element("#bottleneck")
        .unwrap()
        .get_inner_text()
        .unwrap();
    assert!(
        ["stt", "llm", "tts", "idle"].contains(&bottleneck.as_str()),
        "bottleneck: {bottleneck:?}"
    );
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    std::fs::write(tmp.path().join("page.png"), &png).unwrap();
    if std::env::var_os("VOXLINE_BLESS").is_some() {
        let to = screenshot_path();
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(&to, &png).unwrap();
    }
}
