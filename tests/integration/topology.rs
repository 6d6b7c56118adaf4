//! A stage added through the public API, in about 40 lines: its row shows
//! in the report, the timeline and the CSV, and its terms in the latency
//! decomposition, with no change to their code.

use voxline_core::{Emitter, Stage, StageError, Transcript};
use voxline_llm::TurnComplete;

use crate::util;

/// Upper-cases transcripts on their way to the LLM.
struct Upper;

impl Stage for Upper {
    type In = Transcript;
    type Out = Transcript;
    fn name(&self) -> &str {
        "upper"
    }
    fn process(
        &mut self,
        t: Transcript,
        out: &mut Emitter<'_, Transcript>,
    ) -> Result<(), StageError> {
        let text = t.text.to_uppercase();
        out.emit(Transcript { text, ..t });
        Ok(())
    }
}

#[test]
fn an_added_stage_has_its_row_in_the_report_the_timeline_and_the_csv() {
    let _g = util::engine_lock();
    let (stt, llm) = util::stages(&util::settings(8));
    let inputs =
        voxline_pipeline::pipeline::open_inputs(&[util::fixture("q_capital.wav")]).unwrap();
    let extras = voxline_pipeline::pipeline::Extras::default().after_stt(Upper);
    let run =
        voxline_pipeline::pipeline::run_with(inputs, stt, llm, extras, &Default::default(), None)
            .unwrap();
    assert!(run.outcome.failed.is_none(), "{:?}", run.outcome.failed);
    let report = voxline_report::build(&run, Default::default(), 0.0, None);
    // the LLM answered what the added stage made of the transcript
    let heard: Vec<&str> = (run.events.iter())
        .filter_map(|e| e.event.engine::<TurnComplete>())
        .map(|c| c.transcript.as_str())
        .collect();
    assert!(
        !heard.is_empty()
            && heard
                .iter()
                .all(|t| *t == t.to_uppercase() && !t.is_empty())
    );
    let names: Vec<&str> = report.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["vad", "stt", "upper", "llm", "sink"]);
    let row = &report.stages[2];
    assert_eq!(row.items, heard.len());
    assert!(row.busy_ms > 0.0 && row.queue_capacity > 0, "{row:?}");
    // its terms, in their place on the path, in every turn, the summary's
    // decomposition and the bottleneck's means
    let declared: Vec<String> = (report.topology.latency_terms().into_iter())
        .map(|t| t.name)
        .collect();
    assert_eq!(
        declared,
        [
            "endpoint",
            "stt_queue",
            "stt",
            "upper_queue",
            "upper",
            "llm_queue",
            "llm_first_token",
            "commit_wait"
        ]
    );
    for t in report.turns.iter().filter(|t| t.response.is_some()) {
        assert_eq!(t.terms_ms.len(), declared.len(), "{:?}", t.terms_ms);
        let sum: f64 = t.terms_ms.values().sum();
        assert!(
            (sum - t.response_latency_ms.unwrap()).abs() < 0.01,
            "{:?}",
            t.terms_ms
        );
    }
    for name in ["upper_queue", "upper"] {
        assert!(report.summary.terms_ms.contains_key(name), "{name}");
        assert!(
            report
                .summary
                .bottleneck
                .latency_terms_ms
                .contains_key(name),
            "{name}"
        );
    }
    let csv = voxline_report::bench::to_csv(&report);
    let header = csv.lines().next().unwrap();
    assert!(header.ends_with(",upper_busy_ms"), "{header}");
    assert!(
        header.contains(",stt_ms,upper_queue_ms,upper_ms,llm_queue_ms,"),
        "{header}"
    );
    let md = voxline_report::bench::to_markdown(&report);
    assert!(
        md.lines().any(|l| l.starts_with("| upper | upper | ")),
        "{md}"
    );
    for line in csv.lines().skip(1) {
        let busy: f64 = line.rsplit(',').next().unwrap().parse().unwrap();
        assert!(busy >= 0.0, "{line}");
    }
    let svg = voxline_report::bench::timeline_svg(&report).unwrap();
    let labelled = svg.lines().any(|l| l.trim() == "upper");
    assert!(labelled, "no timeline row for the added stage");
}

/// The one line of wiring: the pipeline with the added stage, for every path.
fn with_upper() -> voxline_pipeline::pipeline::Extras {
    voxline_pipeline::pipeline::Extras::default().after_stt(Upper)
}

/// The settings and, without speculation, the command line's defaults.
fn hub_settings() -> (
    voxline_pipeline::settings::EngineSettings,
    voxline_pipeline::pipeline::PipelineConfig,
) {
    let mut s = util::settings(8);
    s.llama_mut().expect("llama.cpp settings").n_ctx = 1024;
    s.threads = voxline_pipeline::settings::ThreadBudget::priority(Some(2)).unwrap();
    let pipeline = voxline_pipeline::pipeline::PipelineConfig {
        spec_silence_ms: None,
        ..Default::default()
    };
    (s, pipeline)
}

#[test]
fn the_added_stage_runs_in_serve_and_its_client_hears_what_it_made() {
    use std::time::Duration;
    use voxline_serve::client::WsClient;
    use voxline_serve::metrics::{parse_exposition, sample};
    use voxline_serve::protocol::{Hello, ServerEvent};
    let _g = util::engine_lock();
    let (s, pipeline) = hub_settings();
    let hub = voxline_pipeline::sessions::Hub::start(&s, pipeline, 1)
        .unwrap()
        .with_stages(with_upper)
        .unwrap();
    let stop = voxline_core::ShutdownHandle::new();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let opts = voxline_serve::ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: None,
        idle_timeout: Duration::from_secs(30),
        hello_timeout: Duration::from_secs(10),
        client_queue: 4096,
        allow_origins: Vec::new(),
        limits: voxline_serve::Limits::default(),
    };
    let halt = stop.clone();
    let server = std::thread::spawn(move || {
        voxline_serve::serve_until(hub, opts, |a| addr_tx.send(a).unwrap(), Some(halt))
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let url = format!("ws://{addr}/ws");
    let mut client = WsClient::connect(&url, None, Hello::pcm16k()).unwrap();
    for block in util::read_16k(&util::fixture("q_capital.wav")).chunks(3200) {
        client.send_samples(block).unwrap();
    }
    client.end_of_stream().unwrap();
    let mut heard = Vec::new();
    let answered = loop {
        match client.next_event(Duration::from_secs(60)).unwrap() {
            Some((ServerEvent::Transcript { id, text, .. }, _)) => heard.push((id, text)),
            Some((ServerEvent::TurnComplete { transcript, .. }, _)) => break transcript,
            Some((ServerEvent::TurnError { message, .. }, _)) => panic!("{message}"),
            Some(_) => {}
            None => panic!("the server closed: {:?}", client.close_reason()),
        }
    };
    // the turn's words as the added stage made them, under the turn's own number
    let last = &heard.last().unwrap().1;
    assert!(heard.iter().all(|(id, _)| *id == 1), "{heard:?}");
    assert!(
        !last.is_empty() && *last == last.to_uppercase(),
        "{heard:?}"
    );
    assert_eq!(&answered, last, "the LLM answered what the stage made");
    let metrics = voxline_capacity::remote::scrape(&url, None).unwrap();
    let m = parse_exposition(&metrics);
    assert!(
        metrics.contains(r#"voxline_stage_busy_seconds_total{stage="upper"}"#),
        "{metrics}"
    );
    assert_eq!(
        sample(&m, r#"voxline_stage_runs_total{stage="upper"}"#),
        1.0
    );
    client.close();
    stop.request();
    server.join().unwrap().unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "slow-tests"),
    ignore = "slow tier: --features slow-tests"
)]
fn the_added_stage_runs_in_bench_sessions_and_has_its_share_of_the_run() {
    use std::time::Duration;
    let _g = util::engine_lock();
    let (s, pipeline) = hub_settings();
    let fixtures = vec![util::fixture("multi_turn.wav")];
    let script = voxline_capacity::Script::load(&fixtures, Duration::from_millis(500)).unwrap();
    let opts = voxline_capacity::CapacityOptions {
        sessions: vec![1],
        stagger: Duration::ZERO,
        think: Duration::from_millis(500),
        pipeline,
    };
    let report = voxline_capacity::run_with(
        &s,
        &script,
        &fixtures,
        &opts,
        None,
        Some(std::sync::Arc::new(with_upper)),
        &|_| {},
    )
    .unwrap();
    let row = &report.rows[0];
    assert_eq!((row.turns, row.errors), (2, 0), "{row:?}");
    let stages: Vec<&str> = row.utilisation.keys().map(String::as_str).collect();
    assert!(stages.contains(&"upper"), "{stages:?}");
    assert!(row.utilisation["upper"] >= 0.0 && row.utilisation["stt"] > 0.0);
}
