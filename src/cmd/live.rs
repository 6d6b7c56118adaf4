//! `voxline live` and `voxline devices`: the microphone and the loudspeaker.

use voxline_pipeline::output::Output;
use voxline_pipeline::pipeline::{LiveOptions, Pace, Source};
use voxline_pipeline::BadInput;

use super::session::{finish_report, outcome_of, Run, Session};
use crate::cli::{DevicesArgs, LiveArgs};
use crate::Outcome;

pub(crate) fn devices(args: &DevicesArgs) -> anyhow::Result<Outcome> {
    let inputs = voxline_audio::list_input_devices().map_err(BadInput::from_display)?;
    if !list_devices(args, inputs, "input", "capture") {
        return Ok(Outcome::Ok);
    }
    // the outputs are where the voice plays (`live --output-device`)
    let outputs = voxline_audio::list_output_devices().map_err(BadInput::from_display)?;
    println!();
    if list_devices(args, outputs, "output", "play") {
        println!();
        println!(
            "echo cancellation: on with `live --voice` (WebRTC's AEC3: what the output plays is taken \
             out of the input before the VAD), so the voice may play on a loudspeaker; `--no-aec` turns it off"
        );
    }
    Ok(Outcome::Ok)
}

/// Prints one direction's devices; false when standard output is closed.
fn list_devices(
    args: &DevicesArgs,
    all: Vec<voxline_audio::InputDeviceInfo>,
    what: &str,
    verb: &str,
) -> bool {
    use std::io::Write as _;
    let hidden = all.iter().filter(|d| !d.is_usable()).count();
    let list: Vec<_> = all
        .into_iter()
        .filter(|d| args.all || d.is_usable())
        .collect();
    let mut out = std::io::stdout().lock();
    // a closed pipe (`voxline devices | head`) is not an error worth a panic
    macro_rules! say { ($($t:tt)*) => { if writeln!(out, $($t)*).is_err() { return false; } } }
    if list.is_empty() {
        if hidden > 0 && !args.all {
            say!("no usable audio {what} devices found ({hidden} more cannot {verb} here: `voxline devices --all` lists them)");
        } else {
            say!("no audio {what} devices found");
        }
        return true;
    }
    for d in list {
        say!(
            "{} {} — {}",
            if d.is_default { "*" } else { " " },
            d.id,
            d.name
        );
        if let Some(c) = &d.default_config {
            say!(
                "      default: {} Hz, {} ch, {}",
                c.min_sample_rate,
                c.channels,
                c.sample_format
            );
        }
        if !d.configs.is_empty() {
            // a device may list hundreds of (format, channels, rates) triples: summarise them
            let mut formats: Vec<&str> = Vec::new();
            for c in &d.configs {
                if !formats.contains(&c.sample_format.as_str()) {
                    formats.push(&c.sample_format);
                }
            }
            let ch = (
                d.configs.iter().map(|c| c.channels).min().unwrap_or(0),
                d.configs.iter().map(|c| c.channels).max().unwrap_or(0),
            );
            let hz = (
                d.configs
                    .iter()
                    .map(|c| c.min_sample_rate)
                    .min()
                    .unwrap_or(0),
                d.configs
                    .iter()
                    .map(|c| c.max_sample_rate)
                    .max()
                    .unwrap_or(0),
            );
            let span = |(a, b): (u32, u32), unit: &str| {
                if a == b {
                    format!("{a}{unit}")
                } else {
                    format!("{a}–{b}{unit}")
                }
            };
            say!(
                "      supports: {} · {} ch · {}",
                span(hz, " Hz"),
                span((u32::from(ch.0), u32::from(ch.1)), ""),
                formats.join(", ")
            );
        }
        if let Some(e) = &d.config_error {
            say!("      (configurations unavailable: {e})");
        }
    }
    say!("(* = default {what})");
    if hidden > 0 && !args.all {
        say!("({hidden} more cannot {verb} here; `voxline devices --all` lists them)");
    }
    true
}

/// The first option given that acts on the voice alone (so is refused
/// without `--voice`), if any.
fn voice_only_flag(args: &LiveArgs) -> Option<&'static str> {
    [
        ("--output-device", args.output_device.is_some()),
        ("--no-aec", args.no_aec),
        ("--noise-suppression", args.noise_suppression),
        ("--no-barge-in", args.no_barge_in),
        ("--barge-in-threshold", args.barge_in_threshold.is_some()),
        ("--barge-in-ms", args.barge_in_ms.is_some()),
        ("--backchannel-max-ms", args.backchannel_max_ms.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag))
}

/// Shortest `--max-duration`: less ends the session before a word could be
/// heard.
const MIN_MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) fn live(args: LiveArgs) -> anyhow::Result<Outcome> {
    let session = Session::new(
        &args.engine,
        &args.vad,
        args.out.budget.as_deref(),
        crate::cli::VoiceArg::Off,
    )?;
    let max_duration = args
        .max_duration
        .as_deref()
        .map(|d| {
            humantime::parse_duration(d)
                .map_err(|e| {
                    BadInput(format!(
                        "--max-duration {d}: {e} (write e.g. `90s` or `5m`)"
                    ))
                })
                .and_then(|t| {
                    if t < MIN_MAX_DURATION {
                        Err(BadInput(format!(
                            "--max-duration {d}: too short to hear a word; give at least 1s \
                         (e.g. `90s` or `5m`)"
                        )))
                    } else {
                        Ok(t)
                    }
                })
        })
        .transpose()?;
    let fault = voxline_pipeline::fault::from_env()?;
    if args.max_turns == Some(0) {
        return Err(BadInput("--max-turns 0: allow at least one turn".into()).into());
    }
    let barge_default = voxline_audio::BargeInOptions::default();
    let barge_in_threshold = args.barge_in_threshold.unwrap_or(barge_default.threshold);
    if !(0.0..=1.0).contains(&barge_in_threshold) {
        return Err(BadInput(format!(
            "--barge-in-threshold {barge_in_threshold}: give a speech probability from 0 to 1"
        ))
        .into());
    }
    if session.voice.is_some() {
        voxline_audio::check_output_device(args.output_device.as_deref())?;
    } else if let Some(flag) = voice_only_flag(&args) {
        // each of these acts on the voice alone: without it, it would be
        // taken and do nothing
        return Err(BadInput(format!(
            "{flag} with no voice: give --voice too (e.g. --voice auto)"
        ))
        .into());
    }
    if let Some(ms) = args
        .capture_buffer_ms
        .filter(|ms| !(1..=voxline_audio::capture::MAX_BUFFER_MS).contains(ms))
    {
        return Err(BadInput(format!(
            "--capture-buffer-ms {ms}: give 1 to {} ms (10 to 30 suits speech)",
            voxline_audio::capture::MAX_BUFFER_MS
        ))
        .into());
    }
    let [report_out, events_out] = <[Option<Output>; 2]>::try_from(session.plan_outputs(
        &[
            ("--report-json", args.out.report_json.as_deref()),
            ("--events", args.out.events.as_deref()),
        ],
        &[],
        &[],
    )?)
    .map_err(|_| anyhow::anyhow!("internal: two outputs planned"))?;
    // A missing or unusable device is refused before the models load (and
    // before "listening" is printed); the capture itself opens in run_source.
    voxline_audio::check_input_device(args.device.as_deref())?;
    let quiet = args.out.quiet;
    let source = Source::Live(LiveOptions {
        device: args.device.clone(),
        max_turns: args.max_turns,
        max_duration,
        // ~1 minute of 10 ms device blocks: a stalled VAD thread must not lose speech
        audio_queue_frames: 6000,
        capture_buffer_ms: args.capture_buffer_ms,
        output_device: args.output_device.clone(),
    });
    let Some(ran) = session.run(Run {
        source,
        pace: Pace::Realtime,
        files: Vec::new(),
        warmup: args.out.warmup,
        gap_ms: None,
        events: events_out,
        console: !quiet,
        on_event: None,
        fault,
        cancel_on_stop: args.cancel_on_stop,
        barge_in: (!args.no_barge_in).then_some(voxline_audio::BargeInOptions {
            threshold: barge_in_threshold,
            min_speech_ms: args.barge_in_ms.unwrap_or(barge_default.min_speech_ms),
            backchannel_max_ms: args
                .backchannel_max_ms
                .unwrap_or(barge_default.backchannel_max_ms),
        }),
        echo_cancellation: (!args.no_aec).then_some(voxline_audio::AecOptions {
            noise_suppression: args.noise_suppression,
        }),
        probe_host: false,
        before_load: &|| {
            if !quiet {
                eprintln!("voxline: loading models");
            }
        },
        after_load: &|| {
            if !quiet {
                eprintln!(
                    "voxline: listening{} — speak; Ctrl-C to stop",
                    args.device
                        .as_deref()
                        .map_or(String::new(), |d| format!(" on {d}"))
                );
            }
        },
    })?
    else {
        // stopped before listening: no session happened
        return Ok(Outcome::Interrupted);
    };
    let rep = ran.report;
    if let Some(l) = &rep.live {
        if l.frames_dropped_in_ring > 0 {
            eprintln!(
                "voxline: warning: {:.1} s of audio ({} device frames) was dropped because capture fell behind",
                l.frames_dropped_in_ring_16k as f64 / 16_000.0,
                l.frames_dropped_in_ring
            );
        }
        if let Some(note) = &l.buffer_note {
            eprintln!("voxline: warning: capture buffer: {note}");
        }
        if l.timing.clock_gaps > 0 {
            eprintln!(
                "voxline: warning: the input device delivered no audio for {:.0} ms ({} clock gap{}: a suspended source or overruns); positions skip it and latencies follow the device's timestamps",
                l.timing.clock_gap_ms,
                l.timing.clock_gaps,
                if l.timing.clock_gaps == 1 { "" } else { "s" }
            );
        }
        let aec = l
            .voice_output
            .as_ref()
            .and_then(|v| v.echo_cancellation.as_ref());
        if let (Some(a), false) = (aec, quiet) {
            let fig = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} dB"));
            eprintln!(
                "voxline: echo cancellation: the voice played {:.1} s; the microphone heard it in {} of {} answers (in the others, headphones, the canceller stood aside); echo return loss enhancement {}, echo delay {}",
                a.blocks_with_voice as f64 / 100.0,
                a.stretches_with_echo,
                a.stretches_with_echo + a.stretches_without_echo,
                fig(a.erle_db),
                a.delay_ms.map_or("-".to_owned(), |d| format!("{d} ms")),
            );
            if a.far_end_back_ms > 0 {
                eprintln!(
                    "voxline: echo cancellation: the echo came later than the devices report their playback; the canceller read the voice {} ms further back",
                    a.far_end_back_ms
                );
            }
        }
    }
    finish_report(&rep, report_out.as_ref(), args.out.quiet)?;
    Ok(outcome_of(&rep))
}
