//! `voxline replay` end to end on the fixtures, real models, fast pace.

use crate::util;
use voxline_core::{PipelineEvent, Stage};
use voxline_llm::{LlmOut, Token, TurnComplete};

const MAX_WER: f64 = 0.1;

#[test]
fn single_question_is_transcribed_and_answered() {
    let _g = util::engine_lock();
    let (run, report) = util::replay(&["q_capital.wav"], 24);
    assert!(run.outcome.failed.is_none());
    assert_eq!(report.turns.len(), 1, "{:#?}", report.turns);
    let t = &report.turns[0];
    assert!(
        t.wer.unwrap() <= MAX_WER,
        "{:?} vs {:?}",
        t.transcript,
        t.expected
    );
    assert!(!t.response.as_deref().unwrap_or("").is_empty());
    // tokens streamed are the answer, in order
    let streamed: String = run
        .events
        .iter()
        .filter_map(|e| e.event.engine::<Token>())
        .filter(|tok| tok.id == t.id)
        .map(|tok| tok.text.clone())
        .collect();
    assert_eq!(streamed.trim(), t.response.as_deref().unwrap());
    // the response latency is the sum of its parts (with speculation, the
    // default, the answer may start before the hangover has passed)
    let parts: f64 = t.terms_ms.values().sum();
    assert!(t.terms_ms.len() >= 4, "{:?}", t.terms_ms);
    assert!(
        (parts - t.response_latency_ms.unwrap()).abs() < 0.01,
        "{parts} vs {:?}: {:?}",
        t.response_latency_ms,
        t.terms_ms
    );
    // the turn closes about the hangover past the true end of speech
    let ep = t.endpoint_delay_ms.unwrap();
    let hangover = f64::from(voxline_pipeline::settings::DEFAULT_HANGOVER_MS);
    assert!(
        (hangover - 150.0..=hangover + 300.0).contains(&ep),
        "endpoint delay {ep}"
    );
}

#[test]
fn multi_turn_gives_each_turn_in_order() {
    let _g = util::engine_lock();
    let (run, report) = util::replay(&["multi_turn.wav"], 16);
    assert!(run.outcome.failed.is_none());
    let expected = util::expected_texts("multi_turn.wav");
    assert_eq!(report.turns.len(), expected.len(), "{:#?}", report.turns);
    for (t, e) in report.turns.iter().zip(&expected) {
        assert_eq!(
            t.expected.as_deref(),
            Some(e.as_str()),
            "turn {} matched to the wrong sidecar turn",
            t.id
        );
        assert!(
            t.wer.unwrap() <= MAX_WER,
            "turn {}: {:?} vs {e:?}",
            t.id,
            t.transcript
        );
        assert!(t.response.is_some() && t.error.is_none());
    }
    let ids: Vec<u64> = report.turns.iter().map(|t| t.id).collect();
    assert_eq!(ids, (1..=expected.len() as u64).collect::<Vec<_>>());
    // turn-complete events come in utterance order
    let done: Vec<u64> = run
        .events
        .iter()
        .filter_map(|e| e.event.engine::<TurnComplete>())
        .map(|c| c.id)
        .collect();
    assert_eq!(done, ids);
}

#[test]
fn every_format_variant_gives_the_same_transcript() {
    let _g = util::engine_lock();
    let s = util::settings(1);
    let mut stt = voxline_stt::SttEngine::load(s.stt_config().expect("whisper settings")).unwrap();
    let reference = stt
        .transcribe(&util::read_16k(&util::fixture("q_capital.wav")))
        .unwrap()
        .text;
    assert!(
        voxline_stt::word_error_rate(&util::expected_texts("q_capital.wav")[0], &reference)
            <= MAX_WER,
        "{reference}"
    );
    for v in [
        "q_capital_44k_stereo.wav",
        "q_capital_48k_f32.wav",
        "q_capital_8k.wav",
        "q_capital_24bit.wav",
        "q_capital_noisy.wav",
    ] {
        let text = stt
            .transcribe(&util::read_16k(&util::fixture(v)))
            .unwrap()
            .text;
        let wer = voxline_stt::word_error_rate(&reference, &text);
        assert!(wer <= MAX_WER, "{v}: {text:?} vs {reference:?}");
    }
}

#[test]
fn silence_gives_no_turns_and_a_clean_exit() {
    let _g = util::engine_lock();
    let (run, report) = util::replay(&["silence.wav"], 8);
    assert!(run.outcome.failed.is_none());
    assert!(report.turns.is_empty());
    assert!(run.input_errors.is_empty());
    assert_eq!(report.summary.turns, 0);
    assert!(report.summary.response_latency_ms.is_none());
}

/// The real LLM stage, slowed down: every call first sleeps.
struct Slow<S>(S, std::time::Duration);

impl<S: Stage> Stage for Slow<S> {
    type In = S::In;
    type Out = S::Out;
    fn name(&self) -> &str {
        self.0.name()
    }
    fn process(
        &mut self,
        input: S::In,
        out: &mut voxline_core::Emitter<'_, S::Out>,
    ) -> Result<(), voxline_core::StageError> {
        std::thread::sleep(self.1);
        self.0.process(input, out)
    }
}

#[test]
fn a_slow_llm_loses_nothing_and_queues_stay_bounded() {
    let _g = util::engine_lock();
    let s = util::settings(4);
    let (stt, llm) = util::stages(&s);
    let files: Vec<_> = ["multi_turn.wav", "q_tea.wav", "q_weather.wav", "q_moon.wav"]
        .iter()
        .map(|f| util::fixture(f))
        .collect();
    let inputs = voxline_pipeline::pipeline::open_inputs(&files).unwrap();
    let opts = voxline_pipeline::pipeline::RunOptions {
        queue_capacity: 1,
        ..Default::default()
    };
    // the real stage starts (makes its context) on its thread, slowed down there
    let slow_llm = voxline_core::on_thread("llm", move || {
        let llm = voxline_core::StartStage::start(llm)?;
        Ok(Slow(llm, std::time::Duration::from_millis(3000)))
    });
    let run = voxline_pipeline::pipeline::run(inputs, stt, slow_llm, &opts, None).unwrap();
    assert!(run.outcome.failed.is_none());
    let utterances: Vec<u64> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            PipelineEvent::Utterance(u) => Some(u.id),
            _ => None,
        })
        .collect();
    assert_eq!(utterances.len(), 6, "3 + 1 + 1 + 1 questions");
    for id in &utterances {
        let ended = run.events.iter().any(|e| match &e.event {
            PipelineEvent::TurnError(t) => t.id == *id,
            other => other.engine::<TurnComplete>().is_some_and(|c| c.id == *id),
        });
        assert!(
            ended,
            "utterance {id} never reached turn-complete or an error"
        );
    }
    for e in &run.outcome.edges {
        assert!(
            e.max_depth <= e.capacity,
            "{}: depth {} > capacity {}",
            e.name,
            e.max_depth,
            e.capacity
        );
        assert_eq!(e.dropped, 0, "{}", e.name);
    }
    // the transcripts queue really was full at some point: the test exercised backpressure
    let tq = run
        .outcome
        .edges
        .iter()
        .find(|e| e.name == "transcripts")
        .unwrap();
    assert_eq!(tq.max_depth, tq.capacity, "{tq:?}");
    let _ = LlmOut::Token; // the LLM output type is what the sink drained
}
