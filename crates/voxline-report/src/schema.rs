//! The report's schema: what `report.json` holds (every field is
//! serialised as named here; [`SCHEMA_VERSION`] changes when a field
//! changes meaning or disappears, and the golden schema test holds it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use voxline_core::EdgeStatsSnapshot;
use voxline_llm::Stop;

pub use crate::config::RunConfig;
pub use crate::server::{ServerSummary, ServerTurnReport};
use crate::stats::Percentiles;

/// Version of the report schema.
pub const SCHEMA_VERSION: u32 = 3;

/// One turn: an utterance and what became of it.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TurnReport {
    /// Utterance id (from 1).
    pub id: u64,
    /// Excluded from the summary as warm-up.
    pub warmup: bool,
    /// The recording it came from.
    pub file: Option<PathBuf>,
    /// What whisper heard.
    pub transcript: Option<String>,
    /// Whisper heard no words (silence, a tone, music: only annotations
    /// such as `[BLANK_AUDIO]`), or what it heard was judged other than the
    /// user's words ([`TurnReport::heard`]): not a turn, not answered, and
    /// not counted in the summary's turns or figures.
    pub non_speech: bool,
    /// What the speech-to-text stage judged was heard, with its evidence:
    /// `{"kind": "words"}`, `noise` (`no_speech`, `avg_logprob`),
    /// `hesitation`, `echo` (`likeness`, `by_words`) or `backchannel`
    /// (`null`: no transcript).
    pub heard: Option<voxline_core::Heard>,
    /// What the sidecar says was said.
    pub expected: Option<String>,
    /// How the semantic end of turn ended it (`null`: off).
    pub end_of_turn: Option<EndOfTurnReport>,
    /// What the language model's server reported for this answer (only
    /// with a remote language model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_server: Option<ServerTurnReport>,
    /// Word error rate against `expected`.
    pub wer: Option<f64>,
    /// The answer.
    pub response: Option<String>,
    /// Stream position of the utterance start (16 kHz).
    pub start_sample: u64,
    /// End of speech as the VAD saw it.
    pub end_sample: u64,
    /// End of speech per the sidecar (else the VAD's).
    pub true_end_sample: u64,
    /// Where the VAD closed the utterance (confirmed the end, for a speculative turn).
    pub closed_sample: u64,
    /// Where the speculative attempt that became this turn was sent.
    pub spec_sample: Option<u64>,
    /// Utterance length.
    pub audio_ms: f64,
    /// True end of speech → utterance closed (for a speculative turn: its end confirmed, the commit).
    pub endpoint_delay_ms: Option<f64>,
    /// Speculative turns: true end of speech → the attempt was sent downstream.
    pub spec_delay_ms: Option<f64>,
    /// Speculative turns: the first token was ready this long before the commit released it.
    pub commit_wait_ms: Option<f64>,
    /// Utterance committed (closed) → first token shown: the processing the user waits for after the endpointer decided.
    pub processing_ms: Option<f64>,
    /// Utterance closed → STT started.
    pub stt_queue_ms: Option<f64>,
    /// STT started → transcript.
    pub stt_ms: Option<f64>,
    /// Audio seconds per STT second.
    pub stt_rtfx: Option<f64>,
    /// Transcript tokens.
    pub stt_tokens: Option<u32>,
    /// Transcript tokens per STT second.
    pub stt_tps: Option<f64>,
    /// Transcript ready → LLM started.
    pub llm_queue_ms: Option<f64>,
    /// Transcript ready → first token (queue wait included).
    pub llm_ttft_ms: Option<f64>,
    /// LLM started → first token (prefill and first sample).
    pub llm_first_token_ms: Option<f64>,
    /// Tokens of the rendered prompt.
    pub llm_prompt_tokens: Option<u32>,
    /// Prompt tokens evaluated this turn (the rest came from the KV cache), per llama.cpp.
    pub llm_prefill_tokens: Option<u32>,
    /// Prefill tokens per second.
    pub llm_prefill_tps: Option<f64>,
    /// Tokens sampled (end-of-generation included).
    pub llm_generated_tokens: Option<u32>,
    /// Tokens streamed as text.
    pub llm_streamed_tokens: usize,
    /// Decode tokens per second: (n − 1) / (t_last − t_first).
    pub llm_decode_tps: Option<f64>,
    /// Gaps between streamed tokens.
    pub inter_token_ms: Option<Percentiles>,
    /// LLM started → turn complete.
    pub llm_ms: Option<f64>,
    /// End of speech → first token.
    pub response_latency_ms: Option<f64>,
    /// The response latency's terms, by name, as the topology declares them
    /// ([`voxline_core::Topology::latency_terms`]: `endpoint`, then each
    /// stage's `<stage>_queue` and `<stage>`, the last stage's
    /// `<stage>_first_<output>`, `commit_wait`); when the turn has them all,
    /// they add up to `response_latency_ms` exactly. `stt_queue_ms`, `stt_ms`,
    /// `llm_queue_ms` and `llm_first_token_ms` are the engines' terms again,
    /// under the names they had before the terms were declared.
    pub terms_ms: BTreeMap<String, f64>,
    /// The voice: end of speech → the first sample of the spoken answer
    /// leaving voxline (the response latency, then the first chunk's text
    /// completing and being spoken).
    pub voice_latency_ms: Option<f64>,
    /// The voice: the first chunk's text complete → its first audio.
    pub tts_first_audio_ms: Option<f64>,
    /// The voice: audio seconds made per second of synthesis.
    pub tts_rtfx: Option<f64>,
    /// The voice: chunks spoken.
    pub voice_chunks: Option<u32>,
    /// The voice: characters spoken.
    pub voice_chars: Option<u32>,
    /// The voice: seconds of audio made.
    pub voice_audio_s: Option<f64>,
    /// Barge-in: the user's speech over the answer began → its playback
    /// stopped at the device.
    pub barge_in_ms: Option<f64>,
    /// Barge-in: what the user heard of the answer (what the conversation
    /// keeps of it, marked interrupted); null when it was not interrupted.
    pub voice_heard: Option<String>,
    /// False interruptions: times the user's speech over the answer paused
    /// it and was a backchannel, so it played on.
    pub false_interruptions: u32,
    /// The response shown → the first audio (both clocks; not in the JSON).
    #[serde(skip)]
    pub voice_after_shown_ms: Option<f64>,
    /// Why generation stopped.
    pub stop: Option<Stop>,
    /// Earlier turns of the conversation the LLM dropped from this turn's
    /// prompt to fit its context (0: the whole history was kept).
    pub llm_history_dropped: Option<u32>,
    /// The error that ended the turn, as `stage: message`.
    pub error: Option<String>,
    /// Why a figure of this turn was left out (e.g. a latency that came out
    /// negative because the recorded end of speech is after the answer began).
    pub note: Option<String>,
    /// When things happened, in ms on the report's clock (for timelines).
    pub timeline: TurnTimeline,
    /// Each stage's measured work on this turn, by stage (not in the JSON;
    /// the CSV and the timeline show it for every stage of the topology).
    #[serde(skip)]
    pub work: BTreeMap<String, StageWork>,
}

impl TurnReport {
    /// Whether what was heard is the assistant's own voice come back
    /// through the microphone, as the speech-to-text stage judged it
    /// ([`voxline_core::Heard::Echo`]).
    #[must_use]
    pub fn is_echo(&self) -> bool {
        matches!(self.heard, Some(voxline_core::Heard::Echo { .. }))
    }
}

/// One stage's work on one turn, as measured: its calls for the turn, from
/// the first start to the last end on the session clock (ms since its
/// origin), and the time they computed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageWork {
    /// The first call's start.
    pub start_ms: f64,
    /// The last call's end.
    pub end_ms: f64,
    /// Busy time (waits for room downstream or for the cores excluded).
    pub busy_ms: f64,
}

/// A turn's moments on the report's clock (ms since the session origin; the
/// virtual clock at fast pace).
#[derive(Debug, Clone, Serialize, Default)]
pub struct TurnTimeline {
    /// True end of speech.
    pub end_of_speech_ms: f64,
    /// Utterance closed by the VAD.
    pub closed_ms: f64,
    /// Each stage on the response's path (those that own a queue term):
    /// started / finished.
    pub stages: BTreeMap<String, [f64; 2]>,
    /// First token (the response's first output) shown.
    pub first_token_ms: Option<f64>,
}

/// One stage over the whole run.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// Stage name.
    pub name: String,
    /// Items processed.
    pub items: usize,
    /// Time busy (blocked output excluded).
    pub busy_ms: f64,
    /// busy / session time: above 1.0 the stage cannot keep up with real time.
    pub utilization: f64,
    /// Tokens produced (STT: transcript tokens; LLM: tokens streamed as
    /// text, the end-of-generation token excluded).
    pub tokens: Option<u64>,
    /// STT: tokens per busy second. LLM: decode tokens/s, the definition of
    /// `llm_decode_tps` ((n − 1) / (t_last − t_first) over a turn's streamed
    /// tokens) pooled over the turns: their gaps over their decode time.
    pub tokens_per_s: Option<f64>,
    /// Time items waited in the stage's input queue.
    pub queue_wait_ms: Option<Percentiles>,
    /// Deepest the input queue got.
    pub queue_max_depth: usize,
    /// Input queue capacity.
    pub queue_capacity: usize,
    /// Items dropped from the input queue.
    pub dropped: u64,
}

/// The stages that limit the pipeline.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Bottleneck {
    /// Stage with the highest utilisation (limits throughput).
    pub throughput: Option<String>,
    /// Largest term of the response latency (limits latency): endpoint, stt_queue, stt, llm_queue or llm_first_token.
    pub latency: Option<String>,
    /// The server the throughput stage's engine runs on, when it is remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput_server: Option<String>,
    /// The server the latency term's engine runs on, when it is remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_server: Option<String>,
    /// One line on each, with the numbers.
    pub reason: String,
    /// Mean of each latency term over the counted turns, ms.
    pub latency_terms_ms: BTreeMap<String, f64>,
}

/// One limit checked against a budget.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetCheck {
    /// The limit, e.g. `response_latency_ms.p95 <= 3000`.
    pub limit: String,
    /// The measured value (null when there was nothing to measure).
    pub measured: Option<f64>,
    /// Whether it held.
    pub passed: bool,
}

/// The budget verdict.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BudgetResult {
    /// Whether a budget was given.
    pub given: bool,
    /// True when every limit held (or no budget was given).
    pub passed: bool,
    /// Every limit checked.
    pub checks: Vec<BudgetCheck>,
    /// The limits that failed.
    pub violations: Vec<BudgetCheck>,
    /// How the limits were scaled for the host, when the budget has `[host]`.
    pub host: Option<crate::budget::HostScale>,
}

/// Cold start: what the first turn costs beyond a warm one.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ColdStart {
    /// Loading both models (and evaluating the system prompt).
    pub model_load_ms: f64,
    /// Response latency of the first turn.
    pub first_turn_response_latency_ms: Option<f64>,
}

/// Run-wide figures.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Summary {
    /// Turns: utterances seen in which whisper heard words.
    pub turns: usize,
    /// Utterances in which whisper heard no words (see
    /// [`TurnReport::non_speech`]): not answered.
    pub non_speech: usize,
    /// Of those, the assistant's own voice heard back through the
    /// microphone (echo, `[echo: …]`): never answered, so it cannot answer
    /// itself in a loop.
    pub echoes: usize,
    /// Turns answered.
    pub completed: usize,
    /// Turns that ended in an error.
    pub errors: usize,
    /// Turns excluded as warm-up.
    pub warmup_turns: usize,
    /// Audio replayed, seconds.
    pub audio_s: f64,
    /// Session length on the report's clock, seconds.
    pub session_s: f64,
    /// End of speech → first token.
    pub response_latency_ms: Option<Percentiles>,
    /// Turn committed (closed) → first token.
    pub processing_ms: Option<Percentiles>,
    /// Speculative turn-taking: attempts started, committed, cancelled, and
    /// the CPU time (stage busy time) cancelled attempts cost.
    pub speculation: SpecSummary,
    /// What the semantic end of turn did (`null`: off).
    pub end_of_turn: Option<EndOfTurnSummary>,
    /// A remote language model's figures (only with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_server: Option<ServerSummary>,
    /// Endpoint delay.
    pub endpoint_delay_ms: Option<Percentiles>,
    /// The response latency's decomposition: each declared term's
    /// percentiles (and mean) over the counted turns, by term name.
    pub terms_ms: BTreeMap<String, Percentiles>,
    /// STT latency.
    pub stt_ms: Option<Percentiles>,
    /// STT real-time factor (audio s / STT s), per turn.
    pub stt_rtfx: Option<Percentiles>,
    /// LLM time to first token.
    pub llm_ttft_ms: Option<Percentiles>,
    /// LLM decode tokens/s, per turn.
    pub llm_decode_tps: Option<Percentiles>,
    /// LLM prefill tokens/s, per turn.
    pub llm_prefill_tps: Option<Percentiles>,
    /// The voice: end of speech → first audio (with a voice).
    pub voice_latency_ms: Option<Percentiles>,
    /// The voice: first chunk complete → its first audio.
    pub tts_first_audio_ms: Option<Percentiles>,
    /// The voice: real-time factor per turn.
    pub tts_rtfx: Option<Percentiles>,
    /// Barge-in: the user's speech start → playback stopped, per interrupted turn.
    pub barge_in_ms: Option<Percentiles>,
    /// False interruptions over all answers: speech over the voice that
    /// paused it and was a backchannel ("uh-huh", a cough), so it played on.
    pub false_interruptions: u32,
    /// Mean word error rate over turns with a sidecar.
    pub wer: Option<f64>,
    /// Audio dropped (capture ring and audio queue together), in 16 kHz
    /// frames: 16 000 is a second.
    pub dropped: u64,
    /// The most engine threads that computed at once (never above the thread budget).
    pub engine_threads_peak: usize,
    /// The bottlenecks.
    pub bottleneck: Bottleneck,
    /// The budget verdict.
    pub budget: BudgetResult,
}

/// How the semantic end of turn ended one turn.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct EndOfTurnReport {
    /// `complete`, `incomplete` (the model judged it so and the speaker
    /// said no more within the patience), `unjudged` (it ended before a
    /// pause was judged: the end of the stream, a split) or `failed`.
    pub decision: String,
    /// The model's probability that the turn was complete, at the pause
    /// that ended it.
    pub probability: Option<f32>,
    /// Pauses the model judged in the turn.
    pub probes: u32,
    /// The model's time over them, ms.
    pub cost_ms: f64,
    /// Silence after the last speech frame when the turn was committed, ms.
    pub silence_ms: f64,
}

/// What the semantic end of turn did over a run.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct EndOfTurnSummary {
    /// Turns by decision (`complete`, `incomplete`, `unjudged`, `failed`).
    pub commits: BTreeMap<String, usize>,
    /// Pauses judged.
    pub probes: u32,
    /// The model's time per pause judged, ms (each turn's mean).
    pub cost_ms: Option<Percentiles>,
    /// Turns the semantic end of turn ended and then took back because the
    /// speaker went on within the merge window: each became the start of
    /// the next turn, and is not among the turns.
    pub merged: usize,
    /// Pauses judged whose verdict ended no turn (the speaker went on):
    /// the model's calls whose result was thrown away.
    pub unused_probes: u32,
    /// The model's time over them, ms.
    pub unused_ms: f64,
}

impl EndOfTurnSummary {
    /// The summary of `turns`, `merged` of them taken back; `None` when
    /// none was judged (off).
    #[must_use]
    pub fn of<'a>(turns: impl IntoIterator<Item = &'a TurnReport>, merged: usize) -> Option<Self> {
        let mut s = Self {
            merged,
            ..Self::default()
        };
        let mut costs = Vec::new();
        let mut any = false;
        for e in turns.into_iter().filter_map(|t| t.end_of_turn.as_ref()) {
            any = true;
            costs.extend(s.add(e));
        }
        s.cost_ms = Percentiles::of(&costs);
        any.then_some(s)
    }

    /// Counts one turn's end; returns the model's mean time per pause it
    /// judged in it, if it judged any (for [`EndOfTurnSummary::cost_ms`]).
    pub fn add(&mut self, e: &EndOfTurnReport) -> Option<f64> {
        *self.commits.entry(e.decision.clone()).or_default() += 1;
        self.probes += e.probes;
        if e.probes == 0 {
            return None;
        }
        // the pause that ended the turn was judged when the model's
        // probability there is known; every other pause's verdict went unused
        let unused = e.probes - u32::from(e.probability.is_some()).min(e.probes);
        let per_probe = e.cost_ms / f64::from(e.probes);
        self.unused_probes += unused;
        self.unused_ms += per_probe * f64::from(unused);
        Some(per_probe)
    }
}

/// Engine calls whose result was thrown away, on one stage.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq)]
pub struct Thrown {
    /// Engine calls (a call without an engine is counted in
    /// [`SpecSummary::cancelled_busy_ms`] only).
    pub calls: usize,
    /// Their busy time, ms.
    pub busy_ms: f64,
    /// The cores they kept busy: busy time times the engine threads each
    /// computed with ([`Span::core_time`](voxline_core::Span::core_time)), ms.
    pub core_ms: f64,
}

impl Thrown {
    /// Adds one call's span: its busy time, and where it computed on
    /// engine threads, the call and its cores.
    pub fn add(&mut self, s: &voxline_core::Span) {
        self.busy_ms += s.busy().as_secs_f64() * 1000.0;
        if s.threads > 0 {
            self.calls += 1;
            self.core_ms += s.core_time().as_secs_f64() * 1000.0;
        }
    }

    /// Adds another's calls.
    pub fn merge(&mut self, other: Thrown) {
        self.calls += other.calls;
        self.busy_ms += other.busy_ms;
        self.core_ms += other.core_ms;
    }
}

/// What speculative turn-taking did over a run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SpecSummary {
    /// Attempts sent early.
    pub started: usize,
    /// Attempts that became turns.
    pub committed: usize,
    /// Attempts thrown away because speech resumed.
    pub cancelled: usize,
    /// Busy time stages spent on cancelled attempts (and on turns taken
    /// back, see [`EndOfTurnSummary::merged`]), ms per stage.
    pub cancelled_busy_ms: BTreeMap<String, f64>,
    /// The engines' part of that work in calls and cores, per stage: every
    /// engine call (one computing on engine threads) whose result a
    /// cancelled attempt or a turn taken back threw away.
    pub thrown: BTreeMap<String, Thrown>,
}

impl SpecSummary {
    /// Counts `thrown` calls of `stage` as thrown away.
    pub fn throw_away(&mut self, stage: &str, thrown: Thrown) {
        *self.cancelled_busy_ms.entry(stage.to_owned()).or_default() += thrown.busy_ms;
        if thrown.calls > 0 {
            self.thrown
                .entry(stage.to_owned())
                .or_default()
                .merge(thrown);
        }
    }
}

/// The clock a report's latencies are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReportClock {
    /// Realtime pace: what was measured on the wall clock.
    Wall,
    /// Fast pace: what a live user would have felt, computed from measured
    /// service times.
    #[default]
    Virtual,
}

impl std::fmt::Display for ReportClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReportClock::Wall => "wall",
            ReportClock::Virtual => "virtual",
        })
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// voxline's version.
    pub voxline_version: String,
    /// The clock the latencies are on.
    pub clock: ReportClock,
    /// Configuration.
    pub config: RunConfig,
    /// The headline figures.
    pub summary: Summary,
    /// Cold start.
    pub cold_start: ColdStart,
    /// Every turn.
    pub turns: Vec<TurnReport>,
    /// Every stage.
    pub stages: Vec<StageReport>,
    /// Every edge.
    pub edges: Vec<EdgeStatsSnapshot>,
    /// Input problems.
    pub input_errors: Vec<String>,
    /// Warnings about the input (a lying header, a near-silent recording).
    pub input_warnings: Vec<String>,
    /// Set when a stage failed and the run stopped.
    pub failed: Option<String>,
    /// Set when the run was interrupted.
    pub interrupted: bool,
    /// The comparison with `--baseline`, when given.
    pub baseline: Option<BaselineResult>,
    /// The host's speed, probed before and after the run (`bench`, and a
    /// budget with `[host]`); `None` when not probed.
    pub host: Option<crate::host::HostSpeed>,
    /// The live capture's figures (live sessions only).
    pub live: Option<voxline_pipeline::pipeline::LiveReport>,
    /// The pipeline's stages and edges (not in the JSON: the renderers walk it).
    #[serde(skip)]
    pub topology: voxline_core::Topology,
}

/// This run against an earlier report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BaselineResult {
    /// The baseline report.
    pub path: PathBuf,
    /// The run as a whole against the baseline.
    pub verdict: crate::bench::Overall,
    /// Each compared metric.
    pub metrics: Vec<crate::bench::Comparison>,
    /// This host's probe ÷ the baseline's, when both were probed: far from 1,
    /// the two runs were on hosts of different speeds (or loads), and the
    /// ratios above measure the hosts as well as the change.
    pub host_ratio: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &serde_json::Value) -> Vec<&str> {
        v.as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn what_serves_the_renderers_stays_out_of_the_json() {
        let mut r = Report::default();
        r.turns.push(TurnReport::default());
        r.turns[0].work.insert("upper".into(), StageWork::default());
        let v = serde_json::to_value(&r).expect("serialisable");
        let mut top = keys(&v);
        top.sort_unstable();
        assert_eq!(
            top,
            [
                "baseline",
                "clock",
                "cold_start",
                "config",
                "edges",
                "failed",
                "host",
                "input_errors",
                "input_warnings",
                "interrupted",
                "live",
                "schema_version",
                "stages",
                "summary",
                "turns",
                "voxline_version"
            ]
        );
        let turn = keys(&v["turns"][0]);
        assert!(
            turn.contains(&"timeline") && !turn.contains(&"work"),
            "{turn:?}"
        );
        assert_eq!(
            keys(&v["turns"][0]["timeline"]),
            ["closed_ms", "end_of_speech_ms", "first_token_ms", "stages"]
        );
    }
}
