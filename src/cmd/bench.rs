//! `voxline bench`: the pipeline on the fixtures, or (`--sessions`) the capacity of shared engines.

#[allow(clippy::wildcard_imports)]
use crate::*;

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
            voxline::io_reason(&e)
        ))
    })
}

/// `bench --sessions`: the capacity of shared engines (see `voxline::capacity`).
pub(crate) fn bench_sessions(args: &BenchArgs) -> anyhow::Result<Outcome> {
    use voxline::capacity;
    if let Some(bad) = args.sessions.iter().find(|&&n| n == 0 || n > 64) {
        return Err(BadInput(format!(
            "--sessions {bad}: give session counts from 1 to 64, e.g. --sessions 1,2,4,8"
        ))
        .into());
    }
    if let Some(url) = &args.via {
        voxline::serve::client::check_url(url).map_err(BadInput::from_display)?;
    }
    let (settings, warnings) = args.engine.settings()?;
    let vad = args.vad.config()?;
    let budget = args.budget.as_deref().map(Budget::load).transpose()?;
    let files = collect_wavs(&args.fixtures)?;
    let think = std::time::Duration::from_millis(args.think_ms);
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
    let planned = plan_outputs(
        &[
            ("--out", Some(outs[0].as_path())),
            ("--out", Some(outs[1].as_path())),
            ("--out", Some(outs[2].as_path())),
        ],
        &settings,
        &files,
        &[args.budget.as_deref()],
    )?;
    for w in &warnings {
        eprintln!("voxline: warning: {w}");
    }
    let opts = capacity::CapacityOptions {
        sessions: args.sessions.clone(),
        stagger: std::time::Duration::from_millis(args.stagger_ms),
        think,
        spec_silence_ms: args.vad.speculation(),
    };
    let say = |m: &str| eprintln!("voxline: {m}");
    let report = match &args.via {
        Some(url) => capacity::remote::run_via(
            url,
            args.token.as_deref(),
            &script,
            &files,
            &opts,
            budget.as_ref(),
            &say,
        )
        .map_err(|e| match e {
            capacity::CapacityError::Remote(
                voxline::serve::client::ClientError::Url { .. }
                | voxline::serve::client::ClientError::Connect { .. },
            ) => anyhow::Error::new(BadInput(e.to_string())),
            other => other.into(),
        })?,
        None => capacity::run(
            &settings,
            &vad,
            &script,
            &files,
            &opts,
            budget.as_ref(),
            &say,
        )?,
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
    Ok(match (&budget, report.capacity) {
        (Some(_), None) => Outcome::BudgetBroken,
        _ => Outcome::Ok,
    })
}

pub(crate) fn bench(args: BenchArgs) -> anyhow::Result<Outcome> {
    if !args.sessions.is_empty() {
        return bench_sessions(&args);
    }
    let pace = args.pace;
    let (settings, warnings) = args.engine.settings()?;
    let vad = args.vad.config()?;
    let budget = args.budget.as_deref().map(Budget::load).transpose()?;
    if args.repeat == 0 {
        return Err(BadInput("--repeat 0: play the fixtures at least once".into()).into());
    }
    let files = collect_wavs(&args.fixtures)?;
    let fault = voxline::fault::Fault::from_env()?;
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
        .map(|b| voxline::bench::load_baseline(b).map(|v| (b.to_path_buf(), v)))
        .transpose()?;
    make_out_dir(&args.out)?;
    let names = ["report.json", "report.md", "report.csv", "timeline.svg"];
    let in_out: Vec<PathBuf> = names.iter().map(|n| args.out.join(n)).collect();
    let mut planned = plan_outputs(
        &[
            ("--out", Some(in_out[0].as_path())),
            ("--out", Some(in_out[1].as_path())),
            ("--out", Some(in_out[2].as_path())),
            ("--out", Some(in_out[3].as_path())),
            ("--trace", args.trace.as_deref()),
            ("--events", args.events.as_deref()),
        ],
        &settings,
        &files,
        &[args.budget.as_deref(), args.baseline.as_deref()],
    )?
    .into_iter();
    let mut next = || planned.next().flatten();
    let (json_out, md_out, csv_out, svg_out, trace_out, events_out) =
        (next(), next(), next(), next(), next(), next());
    let shutdown = ShutdownHandle::new();
    install_signal_handler(shutdown.clone());

    for w in &warnings {
        eprintln!("voxline: warning: {w}");
    }
    let bar = indicatif::ProgressBar::new(expected_turns as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} loading models {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let (stt, llm, model_load_ms) = load_engines(&settings, &[], true)?;
    if shutdown.is_requested() {
        bar.finish_and_clear();
        return Ok(Outcome::Interrupted);
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {bar:40} {pos}/{len} turns {elapsed} (eta {eta}) {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress = bar.clone();
    let hook: pipeline::EventHook =
        std::sync::Arc::new(move |ev: &voxline_core::PipelineEvent| match ev {
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
    let board = voxline_core::SpecBoard::new();
    let opts = RunOptions {
        pace,
        vad,
        events: events_out,
        console: false,
        on_event: Some(hook),
        cpu_shared: settings.threads.shared,
        speculation: args.vad.speculation().map(|ms| (board.clone(), ms)),
        ..RunOptions::default()
    };
    let (stt, llm) = engine_stages(
        stt,
        voxline_llm::LlmStage::new(llm),
        &fault,
        &opts,
        &settings.threads,
    );
    let result = pipeline::run(inputs, stt, llm, &opts, Some(shutdown))?;
    bar.finish_and_clear();
    let mut config =
        RunConfig::from_settings(&settings, pace_name(pace), files.clone(), args.warmup);
    args.vad.record(&mut config);
    let mut rep = report::build(
        &result,
        config,
        model_load_ms + result.outcome.startup.as_secs_f64() * 1000.0,
        budget.as_ref(),
    );
    if let Some((path, base)) = &baseline {
        let (metrics, verdict) = voxline::bench::compare_values(&serde_json::to_value(&rep)?, base);
        rep.baseline = Some(report::BaselineResult {
            path: path.clone(),
            verdict,
            metrics,
        });
    }
    let svg = voxline::bench::timeline_svg(&rep)
        .map_err(|e| anyhow::anyhow!("drawing the timeline: {e}"))?;
    for (out, bytes) in [
        (&json_out, serde_json::to_vec_pretty(&rep)?),
        (&md_out, report::to_markdown(&rep).into_bytes()),
        (&csv_out, voxline::bench::to_csv(&rep).into_bytes()),
        (&svg_out, svg.into_bytes()),
    ] {
        if let Some(o) = out {
            write_output(o, &bytes)?;
        }
    }
    if let Some(t) = &trace_out {
        write_output(t, voxline::bench::chrome_trace(&result).as_bytes())?;
    }
    finish_report(&rep, None, false)?;
    if let Some(b) = &rep.baseline {
        eprintln!("voxline: against {}: {}", b.path.display(), b.verdict);
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
