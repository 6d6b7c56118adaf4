//! The shape of voxline's pipeline, declared once: the stages (VAD → STT →
//! LLM → sink, plus any added ones), the edges between them, their
//! capacities and full-queue policies. [`crate::pipeline`] builds the
//! pipeline from it; the report, the timeline, the CSV and the live
//! fall-behind warning walk it (a run carries it in
//! [`RunResult::topology`](crate::pipeline::RunResult)).

use voxline_core::{EdgeId, FullPolicy, Latency, StageId, Topology};

/// The echo canceller: the microphone's audio in, the same audio with the
/// loudspeaker's echo taken out (a live pipeline that speaks;
/// [`with_echo_cancellation`]).
pub const AEC: StageId = voxline_audio::AEC_STAGE;
/// The voice-activity detector: audio in, utterances out.
pub const VAD: StageId = voxline_audio::VAD_STAGE;
/// Speech to text: utterances in, transcripts out.
pub const STT: StageId = voxline_stt::STAGE;
/// The language model: transcripts in, tokens and completed turns out.
pub const LLM: StageId = voxline_llm::STAGE;
/// Speech synthesis: the LLM's streamed answer in, spoken audio out (a
/// pipeline with a voice; [`with_voice`]).
pub const TTS: StageId = voxline_tts::STAGE;
/// Where the answers end (the events carry them to the console and the log).
pub const SINK: StageId = StageId::new("sink");

/// Audio frames, from the source to the VAD.
pub const AUDIO: EdgeId = EdgeId::new("audio");
/// Utterances, from the VAD to the STT.
pub const UTTERANCES: EdgeId = EdgeId::new("utterances");
/// Transcripts, from the STT to the LLM.
pub const TRANSCRIPTS: EdgeId = EdgeId::new("transcripts");
/// The LLM's output, to the sink.
pub const RESPONSES: EdgeId = EdgeId::new("responses");

/// Frames the audio edge holds when replaying (it blocks when full).
const REPLAY_AUDIO_FRAMES: usize = 64;
/// Items the responses edge holds (tokens: an answer streams into it).
const RESPONSE_ITEMS: usize = 1024;

/// How the audio edge behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioEdge {
    /// Recorded audio: never lose any; a full queue slows the source.
    Replay,
    /// A device: the callback must never wait; a full queue of this many
    /// frames (at least 16) drops the oldest.
    Live(usize),
}

/// The standard pipeline: VAD → STT → LLM → sink, with `queue_capacity`
/// utterances and transcripts queued in front of the engines.
#[must_use]
pub fn standard(audio: AudioEdge, queue_capacity: usize) -> Topology {
    let (audio_capacity, audio_policy) = match audio {
        AudioEdge::Replay => (REPLAY_AUDIO_FRAMES, FullPolicy::Block),
        AudioEdge::Live(frames) => (frames.max(16), FullPolicy::DropOldest),
    };
    let cap = queue_capacity.max(1);
    Topology::new()
        .edge(AUDIO, audio_capacity, audio_policy)
        .edge(UTTERANCES, cap, FullPolicy::Block)
        .edge(TRANSCRIPTS, cap, FullPolicy::Block)
        .edge(RESPONSES, RESPONSE_ITEMS, FullPolicy::Block)
        .stage(VAD, AUDIO, Some(UTTERANCES))
        .stage(STT, UTTERANCES, Some(TRANSCRIPTS))
        .stage(LLM, TRANSCRIPTS, Some(RESPONSES))
        .stage(SINK, RESPONSES, None)
        // the parts of a turn's latency each owns (the STT, like any stage
        // added between, owns its queue and its service)
        .latency(&VAD, Latency::Endpoint)
        .latency(&LLM, Latency::FirstOutput("token"))
}

/// `t` with the voice: the TTS stage between the LLM and the sink, on its
/// own edge (`to_tts`, as deep as the responses edge: an answer's tokens
/// wait there while a chunk is spoken). It is off the response latency's
/// path (the response is the first token); its own figures are the voice
/// latency's.
#[must_use]
pub fn with_voice(t: Topology) -> Topology {
    t.edge(edge_into(&TTS), RESPONSE_ITEMS, FullPolicy::Block)
        .insert_after(&LLM, TTS, edge_into(&TTS))
        .latency(&TTS, Latency::Off)
}

/// `t` with the echo canceller in front of the VAD, on an edge (`to_vad`)
/// like the audio edge. It works on the audio, not on turns: no latency
/// term of its own (the ≤ 10 ms it holds audio back is in the endpoint's).
#[must_use]
pub fn with_echo_cancellation(t: Topology) -> Topology {
    let (capacity, policy) = t
        .edge_spec(&AUDIO)
        .map_or((REPLAY_AUDIO_FRAMES, FullPolicy::Block), |e| {
            (e.capacity, e.policy)
        });
    t.edge(edge_into(&VAD), capacity, policy)
        .insert_before(&VAD, AEC, edge_into(&VAD))
}

/// The edge into a stage added after `after`: `to_<stage>`.
#[must_use]
pub fn edge_into(stage: &StageId) -> EdgeId {
    EdgeId::owned(format!("to_{stage}"))
}

/// The stages whose falling behind real time a live session warns about,
/// each with the edge it reads: those that take whole turns (utterances,
/// transcripts), from after the VAD up to the LLM, added stages among them.
/// Not the stages after the LLM (the voice, the sink): an answer's tokens
/// wait on their edge by design while a chunk is spoken, so its depth says
/// nothing of real time, and it counts tokens, not turns.
#[must_use]
pub fn watched(topology: &Topology) -> Vec<(StageId, EdgeId)> {
    let stages = topology.stages();
    let upto = stages
        .iter()
        .position(|s| s.id == LLM)
        .map_or(stages.len(), |i| i + 1);
    stages[..upto]
        .iter()
        .filter(|s| s.id != VAD && s.id != AEC && !s.is_sink())
        .map(|s| (s.id.clone(), s.input.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_pipeline_is_a_line_from_audio_to_the_sink() {
        let t = standard(AudioEdge::Replay, 4);
        let names: Vec<&str> = t.stages().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["vad", "stt", "llm", "sink"]);
        for pair in t.stages().windows(2) {
            assert_eq!(pair[0].output.as_ref(), Some(&pair[1].input));
        }
        assert!(t.is_sink("sink"));
        assert_eq!(t.edge_spec(&UTTERANCES).map(|e| e.capacity), Some(4));
        assert_eq!(
            t.edge_spec(&AUDIO).map(|e| e.policy),
            Some(FullPolicy::Block)
        );
    }

    #[test]
    fn live_audio_drops_the_oldest_and_holds_at_least_16_frames() {
        let t = standard(AudioEdge::Live(4), 1);
        let audio = t.edge_spec(&AUDIO).unwrap();
        assert_eq!((audio.capacity, audio.policy), (16, FullPolicy::DropOldest));
        let w: Vec<String> = watched(&t)
            .iter()
            .map(|(s, e)| format!("{s}<{e}"))
            .collect();
        assert_eq!(w, ["stt<utterances", "llm<transcripts"]);
    }

    #[test]
    fn the_voice_goes_between_the_llm_and_the_sink_off_the_response_path() {
        let plain = standard(AudioEdge::Replay, 2);
        let t = with_voice(plain.clone());
        let names: Vec<&str> = t.stages().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["vad", "stt", "llm", "tts", "sink"]);
        assert_eq!(t.output_of("llm"), Some(&edge_into(&TTS)));
        assert_eq!(t.output_of("tts"), Some(&RESPONSES));
        assert_eq!(t.latency_terms(), plain.latency_terms());
        let w: Vec<String> = watched(&t).iter().map(|(s, _)| s.to_string()).collect();
        // the voice's edge holds an answer's tokens: not turns falling behind
        assert_eq!(w, ["stt", "llm"]);
    }

    #[test]
    fn the_echo_canceller_goes_in_front_of_the_vad_off_the_latency_terms() {
        let plain = with_voice(standard(AudioEdge::Live(32), 2));
        let t = with_echo_cancellation(plain.clone());
        let names: Vec<&str> = t.stages().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["aec", "vad", "stt", "llm", "tts", "sink"]);
        assert_eq!(t.input_of("aec"), Some(&AUDIO));
        assert_eq!(t.output_of("aec"), Some(&edge_into(&VAD)));
        assert_eq!(t.input_of("vad"), Some(&edge_into(&VAD)));
        let into = t.edge_spec(&edge_into(&VAD)).unwrap();
        assert_eq!((into.capacity, into.policy), (32, FullPolicy::DropOldest));
        assert_eq!(t.latency_terms(), plain.latency_terms());
        let w: Vec<String> = watched(&t).iter().map(|(s, _)| s.to_string()).collect();
        assert_eq!(w, ["stt", "llm"]);
    }

    #[test]
    fn an_added_stage_is_watched_on_its_own_edge() {
        let upper = StageId::owned("upper".into());
        let t = standard(AudioEdge::Replay, 2)
            .edge(edge_into(&upper), 2, FullPolicy::Block)
            .insert_after(&STT, upper.clone(), edge_into(&upper));
        let w: Vec<String> = watched(&t)
            .iter()
            .map(|(s, e)| format!("{s}<{e}"))
            .collect();
        assert_eq!(w, ["stt<utterances", "upper<to_upper", "llm<transcripts"]);
    }
}
