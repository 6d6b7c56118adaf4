//! The report as CSV (`report.csv`): one row per turn.

use std::fmt::Write as _;

use super::schema::Report;
use voxline_pipeline::topology::{LLM, SINK, STT, VAD};

/// The stages of `r`'s topology that the fixed columns and rows do not
/// cover (any stage added to the standard pipeline), in flow order.
fn added_stages(r: &Report) -> Vec<&str> {
    r.topology
        .stages()
        .iter()
        .filter(|s| ![VAD, STT, LLM, SINK].contains(&s.id) && !s.is_sink())
        .map(|s| s.id.as_str())
        .collect()
}

/// One row per turn: a `<term>_ms` column for each term of the response
/// latency the topology declares (in critical-path order, so they add up to
/// `response_latency_ms`), the engines' figures, and a `<stage>_busy_ms`
/// column for each stage added to the standard pipeline (its measured busy
/// time on the turn).
#[must_use]
pub fn to_csv(r: &Report) -> String {
    let added = added_stages(r);
    let terms = r.topology.latency_terms();
    let mut s =
        String::from("id,warmup,file,transcript,expected,wer,response_chars,endpoint_delay_ms");
    for term in &terms {
        let _ = write!(s, ",{}_ms", term.name);
    }
    s.push_str(",stt_rtfx,stt_tokens,llm_ttft_ms,llm_prefill_tokens,llm_prefill_tps,llm_generated_tokens,llm_decode_tps,response_latency_ms,error");
    for stage in &added {
        let _ = write!(s, ",{stage}_busy_ms");
    }
    // a pipeline that speaks: the voice's figures
    let speaks = r.topology.stage_spec(voxline_tts::STAGE_NAME).is_some();
    if speaks {
        s.push_str(",voice_latency_ms,tts_first_audio_ms,tts_rtfx,voice_chunks,voice_audio_s");
    }
    s.push('\n');
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    let q =
        |v: Option<&str>| v.map_or(String::new(), |x| format!("\"{}\"", x.replace('"', "\"\"")));
    let n = |v: Option<u32>| v.map_or(String::new(), |n| n.to_string());
    for t in &r.turns {
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{}",
            t.id,
            t.warmup,
            q(t.file.as_ref().map(|p| p.display().to_string()).as_deref()),
            q(t.transcript.as_deref()),
            q(t.expected.as_deref()),
            f(t.wer),
            t.response.as_ref().map_or(0, String::len),
            f(t.endpoint_delay_ms),
        );
        for term in &terms {
            let _ = write!(s, ",{}", f(t.terms_ms.get(&term.name).copied()));
        }
        let _ = write!(
            s,
            ",{},{},{},{},{},{},{},{},{}",
            f(t.stt_rtfx),
            n(t.stt_tokens),
            f(t.llm_ttft_ms),
            n(t.llm_prefill_tokens),
            f(t.llm_prefill_tps),
            n(t.llm_generated_tokens),
            f(t.llm_decode_tps),
            f(t.response_latency_ms),
            q(t.error.as_deref()),
        );
        for stage in &added {
            let _ = write!(s, ",{}", f(t.work.get(*stage).map(|w| w.busy_ms)));
        }
        if speaks {
            let _ = write!(
                s,
                ",{},{},{},{},{}",
                f(t.voice_latency_ms),
                f(t.tts_first_audio_ms),
                f(t.tts_rtfx),
                n(t.voice_chunks),
                f(t.voice_audio_s)
            );
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StageWork, TurnReport};
    use voxline_core::{FullPolicy, StageId};
    use voxline_pipeline::topology::{self, AudioEdge};

    const HEADER: &str = "id,warmup,file,transcript,expected,wer,response_chars,endpoint_delay_ms,endpoint_ms,stt_queue_ms,stt_ms,llm_queue_ms,llm_first_token_ms,commit_wait_ms,stt_rtfx,stt_tokens,llm_ttft_ms,llm_prefill_tokens,llm_prefill_tps,llm_generated_tokens,llm_decode_tps,response_latency_ms,error";

    fn turn() -> TurnReport {
        TurnReport {
            id: 3,
            file: Some("a b.wav".into()),
            transcript: Some("say \"hi\", then stop".into()),
            response: Some("héllo".into()),
            terms_ms: [("stt".to_string(), 540.0)].into(),
            stt_tokens: Some(5),
            llm_decode_tps: Some(20.0),
            ..TurnReport::default()
        }
    }

    #[test]
    fn a_row_per_turn_quoted_and_with_empty_fields_for_what_is_missing() {
        let r = Report {
            topology: topology::standard(AudioEdge::Replay, 4),
            turns: vec![turn()],
            ..Report::default()
        };
        let csv = to_csv(&r);
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(HEADER));
        // the response's length in bytes; the quotes in the transcript doubled
        assert_eq!(
            lines.next(),
            Some(
                "3,false,\"a b.wav\",\"say \"\"hi\"\", then stop\",,,6,,,,540.000,,,,,5,,,,,20.000,,"
            )
        );
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn a_stage_added_to_the_pipeline_gets_its_busy_column() {
        let upper = StageId::owned("upper".into());
        let topology = topology::standard(AudioEdge::Replay, 4)
            .edge(topology::edge_into(&upper), 4, FullPolicy::Block)
            .insert_after(&STT, upper.clone(), topology::edge_into(&upper));
        let mut with_work = turn();
        with_work.work.insert(
            "upper".into(),
            StageWork {
                start_ms: 10.0,
                end_ms: 12.5,
                busy_ms: 2.5,
            },
        );
        let r = Report {
            topology,
            turns: vec![with_work, TurnReport::default()],
            ..Report::default()
        };
        let csv = to_csv(&r);
        let lines: Vec<&str> = csv.lines().collect();
        // its terms in their place on the path, its busy time at the end
        let header = HEADER.replace(",stt_ms,", ",stt_ms,upper_queue_ms,upper_ms,");
        assert_eq!(lines[0], format!("{header},upper_busy_ms"));
        assert!(lines[1].ends_with(",20.000,,,2.500"), "{}", lines[1]);
        // a turn the stage never saw has an empty cell
        assert!(lines[2].ends_with(",,"), "{}", lines[2]);
        assert_eq!(lines[2].split(',').count(), lines[0].split(',').count());
    }
}
