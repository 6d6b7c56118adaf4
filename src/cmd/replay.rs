//! `voxline replay`: recorded audio through the whole pipeline.

#[allow(clippy::wildcard_imports)]
use crate::*;

pub(crate) fn replay(args: ReplayArgs) -> anyhow::Result<Outcome> {
    // Everything the user gave is checked before any model loads.
    let pace = args.pace;
    let (settings, warnings) = args.engine.settings()?;
    let vad = args.vad.config()?;
    let budget = args.out.budget.as_deref().map(Budget::load).transpose()?;
    let [report_out, events_out] = <[Option<Output>; 2]>::try_from(plan_outputs(
        &[
            ("--report-json", args.out.report_json.as_deref()),
            ("--events", args.out.events.as_deref()),
        ],
        &settings,
        &args.files,
        &[args.out.budget.as_deref()],
    )?)
    .map_err(|_| anyhow::anyhow!("internal: two outputs planned"))?;
    let inputs = pipeline::open_inputs(&args.files)?;
    let fault = voxline::fault::Fault::from_env()?;
    let shutdown = ShutdownHandle::new();
    install_signal_handler(shutdown.clone());

    let (stt, llm, model_load_ms) = load_engines(&settings, &warnings, args.out.quiet)?;
    if shutdown.is_requested() {
        return Ok(Outcome::Interrupted);
    }
    let board = voxline_core::SpecBoard::new();
    let opts = RunOptions {
        pace,
        vad,
        events: events_out,
        console: !args.out.quiet,
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
    let mut config = RunConfig::from_settings(
        &settings,
        pace_name(pace),
        args.files.clone(),
        args.out.warmup,
    );
    args.vad.record(&mut config);
    let rep = report::build(
        &result,
        config,
        model_load_ms + result.outcome.startup.as_secs_f64() * 1000.0,
        budget.as_ref(),
    );
    finish_report(&rep, report_out.as_ref(), args.out.quiet)?;
    Ok(outcome_of(&rep))
}
