//! `voxline bench`: the pipeline on the fixtures, or (`--sessions`) the capacity of shared engines.

use std::path::{Path, PathBuf};

use voxline_pipeline::pipeline::{self, Source};
use voxline_pipeline::BadInput;
use voxline_report as report;

use super::session::{finish_report, outcome_of, write_output, Run, Session};
use crate::cli::BenchArgs;
use crate::Outcome;

/// Makes `--out`, a directory for the bench's report files.
pub(crate) fn make_out_dir(out: &Path) -> Result<(), BadInput> {
    if out.exists() && !out.is_dir() {
        return Err(BadInput(format!(
            "--out {}: is a file, not a directory; give --out a directory for the report files",
            out.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(|e| {
        BadInput(format!(
            "--out {}: cannot create the output directory ({}); give --out a writable directory",
            out.display(),
            voxline_pipeline::io_reason(&e)
        ))
    })
}

/// The longest `--think-ms`: a minute of silence between two recordings.
const MAX_THINK_MS: u32 = 60_000;

/// `--think-ms`, or `default` when it is not given.
///
/// # Errors
/// [`BadInput`] when it is longer than [`MAX_THINK_MS`].
fn think_ms(args: &BenchArgs, default: u32) -> Result<u32, BadInput> {
    match args.think_ms {
        Some(ms) if ms > MAX_THINK_MS => Err(BadInput(format!(
            "--think-ms {ms}: a pause between recordings of at most {MAX_THINK_MS} ms, e.g. --think-ms 2500"
        ))),
        given => Ok(given.unwrap_or(default)),
    }
}

/// `bench --sessions`: the capacity of shared engines (see `voxline_capacity`).
pub(crate) fn bench_sessions(args: &BenchArgs) -> anyhow::Result<Outcome> {
    use voxline_capacity as capacity;
    if let Some(bad) = args.sessions.iter().find(|&&n| n == 0 || n > 64) {
        return Err(BadInput(format!(
            "--sessions {bad}: give session counts from 1 to 64, e.g. --sessions 1,2,4,8"
        ))
        .into());
    }
    if let Some(url) = &args.via {
        voxline_serve::client::check_url(url).map_err(BadInput::from_display)?;
    }
    let session = Session::new(
        &args.engine,
        &args.vad,
        args.budget.as_deref(),
        crate::cli::VoiceArg::Off,
    )?;
    let files = collect_wavs(&args.fixtures)?;
    // a user thinks as a person does, whatever the end-of-turn policy:
    // the words of each question end its turn (see docs/turn-taking.md)
    let think = std::time::Duration::from_millis(u64::from(think_ms(args, 1500)?));
    let script = capacity::Script::load(&files, think)?;
    for (flag, given) in [
        ("--baseline", args.baseline.is_some()),
        ("--trace", args.trace.is_some()),
        ("--events", args.events.is_some()),
        ("--repeat", args.repeat != 1),
    ] {
        if given {
            return Err(BadInput(format!(
                "{flag} does not apply to --sessions (a capacity run writes sessions.json/md/svg); drop one of them"
            ))
            .into());
        }
    }
    make_out_dir(&args.out)?;
    let outs: Vec<PathBuf> = ["sessions.json", "sessions.md", "sessions.svg"]
        .iter()
        .map(|n| args.out.join(n))
        .collect();
    let planned = session.plan_outputs(
        &[
            ("--out", Some(outs[0].as_path())),
            ("--out", Some(outs[1].as_path())),
            ("--out", Some(outs[2].as_path())),
        ],
        &files,
        &[],
    )?;
    for w in &session.warnings {
        eprintln!("voxline: warning: {w}");
    }
    let opts = capacity::CapacityOptions {
        sessions: args.sessions.clone(),
        stagger: std::time::Duration::from_millis(args.stagger_ms),
        think,
        pipeline: session.pipeline.clone(),
    };
    let say = |m: &str| eprintln!("voxline: {m}");
    let report = match &args.via {
        Some(url) => capacity::remote::run_via(
            url,
            args.token.as_deref(),
            &script,
            &files,
            &opts,
            session.budget.as_ref(),
            &say,
        )
        .map_err(|e| match e {
            capacity::CapacityError::Remote(
                voxline_serve::client::ClientError::Url { .. }
                | voxline_serve::client::ClientError::Connect { .. }
                | voxline_serve::client::ClientError::Timeout { .. },
            ) => anyhow::Error::new(BadInput(e.to_string())),
            other => other.into(),
        })?,
        None => {
            // a remote engine's server is checked before anything loads: one line, exit 2
            voxline_pipeline::engines::connect(&session.settings)?;
            // each simulated user hears its answers spoken, on the same cores
            let stages: Option<capacity::StagesFn> = match session.voice.clone() {
                Some(v) => {
                    let threads = session.settings.threads.total;
                    drop(v.load(threads)?);
                    Some(std::sync::Arc::new(move || match v.load(threads) {
                        Ok(stage) => voxline_pipeline::pipeline::Extras::default().voice(stage),
                        Err(_) => voxline_pipeline::pipeline::Extras::default(),
                    }))
                }
                None => None,
            };
            capacity::run_with(
                &session.settings,
                &script,
                &files,
                &opts,
                session.budget.as_ref(),
                stages,
                &say,
            )?
        }
    };
    let json = serde_json::to_string_pretty(&report)?;
    let md = capacity::to_markdown(&report);
    let svg =
        capacity::plot_svg(&report).map_err(|e| anyhow::anyhow!("drawing sessions.svg: {e}"))?;
    for (out, text) in planned.iter().zip([json, md.clone(), svg]) {
        if let Some(o) = out {
            write_output(o, text.as_bytes())?;
        }
    }
    print!("{md}");
    Ok(match (&session.budget, report.capacity) {
        (Some(_), None) => Outcome::BudgetBroken,
        _ => Outcome::Ok,
    })
}

pub(crate) fn bench(args: BenchArgs) -> anyhow::Result<Outcome> {
    if !args.sessions.is_empty() {
        return bench_sessions(&args);
    }
    let session = Session::new(
        &args.engine,
        &args.vad,
        args.budget.as_deref(),
        crate::cli::VoiceArg::Off,
    )?;
    if args.repeat == 0 {
        return Err(BadInput("--repeat 0: play the fixtures at least once".into()).into());
    }
    let gap_ms = think_ms(
        &args,
        voxline_pipeline::pipeline::RunOptions::default().gap_ms,
    )?;
    let files = collect_wavs(&args.fixtures)?;
    let fault = voxline_pipeline::fault::from_env()?;
    let all: Vec<PathBuf> = (0..args.repeat)
        .flat_map(|_| files.iter().cloned())
        .collect();
    let inputs = pipeline::open_inputs(&all)?;
    let expected_turns: usize = inputs
        .iter()
        .map(|i| i.sidecar.as_ref().map_or(1, |s| s.turns.len()))
        .sum();
    // Fail on a bad baseline before spending minutes on the run.
    let baseline = args
        .baseline
        .as_deref()
        .map(|b| voxline_report::bench::load_baseline(b).map(|v| (b.to_path_buf(), v)))
        .transpose()?;
    make_out_dir(&args.out)?;
    let names = ["report.json", "report.md", "report.csv", "timeline.svg"];
    let in_out: Vec<PathBuf> = names.iter().map(|n| args.out.join(n)).collect();
    let mut planned = session
        .plan_outputs(
            &[
                ("--out", Some(in_out[0].as_path())),
                ("--out", Some(in_out[1].as_path())),
                ("--out", Some(in_out[2].as_path())),
                ("--out", Some(in_out[3].as_path())),
                ("--trace", args.trace.as_deref()),
                ("--events", args.events.as_deref()),
            ],
            &files,
            &[args.baseline.as_deref()],
        )?
        .into_iter();
    let mut next = || planned.next().flatten();
    let (json_out, md_out, csv_out, svg_out, trace_out, events_out) =
        (next(), next(), next(), next(), next(), next());

    let bar = indicatif::ProgressBar::new(expected_turns as u64);
    let progress = bar.clone();
    let hook: pipeline::EventHook =
        std::sync::Arc::new(move |ev: &voxline_core::TimedEvent| match &ev.event {
            voxline_core::PipelineEvent::Engine(e)
                if e.downcast_ref::<voxline_llm::TurnComplete>().is_some() =>
            {
                progress.inc(1)
            }
            voxline_core::PipelineEvent::TurnError(_) => progress.inc(1),
            voxline_core::PipelineEvent::Transcript(t) => {
                progress.set_message(t.text.chars().take(40).collect::<String>())
            }
            _ => {}
        });
    let ran = session.run(Run {
        source: Source::Replay(inputs),
        pace: args.pace,
        files: files.clone(),
        warmup: args.warmup,
        gap_ms: Some(gap_ms),
        events: events_out,
        console: false,
        on_event: Some(hook),
        fault,
        cancel_on_stop: false,
        barge_in: None,
        echo_cancellation: None,
        probe_host: true,
        before_load: &|| {
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} loading models {elapsed}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
        },
        after_load: &|| {
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {bar:40} {pos}/{len} turns {elapsed} (eta {eta}) {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        },
    })?;
    bar.finish_and_clear();
    let Some(ran) = ran else {
        return Ok(Outcome::Interrupted);
    };
    let (result, mut rep) = (ran.result, ran.report);
    if let Some((path, base)) = &baseline {
        let (metrics, verdict) =
            voxline_report::bench::compare_values(&serde_json::to_value(&rep)?, base);
        let probe = |v: &serde_json::Value| {
            v.pointer("/host/probe_ms")
                .and_then(serde_json::Value::as_f64)
        };
        let host_ratio = rep
            .host
            .map(|h| h.probe_ms)
            .zip(probe(base))
            .map(|(now, then)| now / then);
        rep.baseline = Some(report::BaselineResult {
            path: path.clone(),
            verdict,
            metrics,
            host_ratio,
        });
    }
    let svg = voxline_report::bench::timeline_svg(&rep)
        .map_err(|e| anyhow::anyhow!("drawing the timeline: {e}"))?;
    for (out, bytes) in [
        (&json_out, serde_json::to_vec_pretty(&rep)?),
        (&md_out, report::to_markdown(&rep).into_bytes()),
        (&csv_out, voxline_report::bench::to_csv(&rep).into_bytes()),
        (&svg_out, svg.into_bytes()),
    ] {
        if let Some(o) = out {
            write_output(o, &bytes)?;
        }
    }
    if let Some(t) = &trace_out {
        write_output(t, voxline_report::bench::chrome_trace(&result).as_bytes())?;
    }
    finish_report(&rep, None, false)?;
    if let Some(b) = &rep.baseline {
        eprintln!("voxline: against {}: {}", b.path.display(), b.verdict);
        if let Some(h) = b.host_ratio.filter(|h| !(0.9..=1.1).contains(h)) {
            eprintln!("voxline:   the host's probe is ×{h:.2} the baseline's: the two runs' hosts differ in speed, and the ratios below measure that too");
        }
        for c in &b.metrics {
            eprintln!(
                "voxline:   {:<34} {:>10.1} → {:>10.1}  ×{:.2}  {}",
                c.metric, c.baseline, c.current, c.ratio, c.verdict
            );
        }
    }
    eprintln!(
        "voxline: wrote {}/report.{{json,md,csv}} and timeline.svg",
        args.out.display()
    );
    Ok(outcome_of(&rep))
}

/// The WAV files named or contained in `items`, sorted per directory.
pub(crate) fn collect_wavs(items: &[PathBuf]) -> Result<Vec<PathBuf>, BadInput> {
    let mut out = Vec::new();
    for item in items {
        if item.is_dir() {
            let rd = std::fs::read_dir(item).map_err(|e| {
                BadInput(format!(
                    "{}: cannot list the directory ({}); check its permissions",
                    item.display(),
                    voxline_pipeline::io_reason(&e)
                ))
            })?;
            let mut wavs: Vec<PathBuf> = rd
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("wav")))
                .collect();
            wavs.sort();
            if wavs.is_empty() {
                return Err(BadInput(format!(
                    "{}: no .wav files in this directory",
                    item.display()
                )));
            }
            out.extend(wavs);
        } else {
            out.push(item.clone());
        }
    }
    Ok(out)
}
