//! The report as CSV (`report.csv`): one row per turn.

use std::fmt::Write as _;

use super::schema::Report;
use crate::topology::{LLM, SINK, STT, VAD};

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

/// One row per turn; a `<stage>_busy_ms` column for each stage added to
/// the standard pipeline (its measured busy time on the turn).
#[must_use]
pub fn to_csv(r: &Report) -> String {
    let added = added_stages(r);
    let mut s = String::from("id,warmup,file,transcript,expected,wer,response_chars,endpoint_delay_ms,stt_queue_ms,stt_ms,stt_rtfx,stt_tokens,llm_queue_ms,llm_ttft_ms,llm_first_token_ms,llm_prefill_tokens,llm_prefill_tps,llm_generated_tokens,llm_decode_tps,response_latency_ms,error");
    for stage in &added {
        let _ = write!(s, ",{stage}_busy_ms");
    }
    s.push('\n');
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    let q =
        |v: Option<&str>| v.map_or(String::new(), |x| format!("\"{}\"", x.replace('"', "\"\"")));
    for t in &r.turns {
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            t.id,
            t.warmup,
            q(t.file.as_ref().map(|p| p.display().to_string()).as_deref()),
            q(t.transcript.as_deref()),
            q(t.expected.as_deref()),
            f(t.wer),
            t.response.as_ref().map_or(0, String::len),
            f(t.endpoint_delay_ms),
            f(t.stt_queue_ms),
            f(t.stt_ms),
            f(t.stt_rtfx),
            t.stt_tokens.map_or(String::new(), |n| n.to_string()),
            f(t.llm_queue_ms),
            f(t.llm_ttft_ms),
            f(t.llm_first_token_ms),
            t.llm_prefill_tokens
                .map_or(String::new(), |n| n.to_string()),
            f(t.llm_prefill_tps),
            t.llm_generated_tokens
                .map_or(String::new(), |n| n.to_string()),
            f(t.llm_decode_tps),
            f(t.response_latency_ms),
            q(t.error.as_deref()),
        );
        for stage in &added {
            let _ = write!(s, ",{}", f(t.work.get(*stage).map(|w| w.busy_ms)));
        }
        s.push('\n');
    }
    s
}
