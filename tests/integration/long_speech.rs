//! Long continuous speech: nothing is lost at the forced splits. The
//! fixtures' sentences joined with no pause (a monologue, built here, never
//! stored) are cut at the maximum utterance length; the chunks' transcripts,
//! joined, must read as well as the same sentences transcribed one by one.

use voxline_audio::VadConfig;
use voxline_stt::{SttConfig, SttEngine, SttStage};

use crate::monologue;
use crate::util;

/// Length of the monologue in the test; `cargo bench --bench long_speech`
/// measures ten minutes.
const MONOLOGUE_S: f64 = 180.0;

#[test]
fn a_long_monologue_is_transcribed_as_well_as_its_sentences() {
    let _g = util::engine_lock();
    let sentences = monologue::sentences(&util::root().join("audio-fixtures"));
    let order = monologue::order(&sentences, MONOLOGUE_S);
    let audio = monologue::join(&sentences, &order);
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let mut engine = SttEngine::load(SttConfig::new(util::whisper_model(), threads)).unwrap();
    let each = monologue::transcribe_each(&mut engine, &sentences);
    let mut stt = SttStage::new(engine);
    let vad = VadConfig {
        hangover_ms: voxline::settings::DEFAULT_HANGOVER_MS,
        ..VadConfig::default()
    };
    let run = monologue::transcribe_stream(&mut stt, vad, &audio);
    let (long, natural) = monologue::wers(&sentences, &order, &each, &run);
    eprintln!(
        "{:.0} s of speech: {} utterances, {} forced splits, {} errors; WER {long:.4} (sentences alone: {natural:.4})",
        audio.len() as f64 / 16_000.0,
        run.utterances,
        run.forced_splits,
        run.errors.len()
    );
    // One utterance, cut every 20 s or a little sooner.
    let expected_splits = (MONOLOGUE_S / 20.0) as usize;
    assert!(
        run.forced_splits >= expected_splits - 1 && run.utterances == run.forced_splits + 1,
        "{} utterances, {} forced splits",
        run.utterances,
        run.forced_splits
    );
    assert!(run.errors.is_empty(), "{:?}", run.errors);
    assert_eq!(run.short, 0, "a chunk came back implausibly short");
    assert!(
        long <= natural + 0.02,
        "WER {long:.4} against {natural:.4} for the sentences alone:\n{}",
        run.text()
    );
}
