//! What the speech-synthesis stage emits, and the events they publish:
//! blocks of audio as each chunk is spoken, then one [`VoiceDone`] per turn.

use std::sync::Arc;

use serde::Serialize;
use voxline_core::{Clock, EngineEvent, Message, PipelineEvent, UtteranceId};

/// One block of the spoken answer.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceAudio {
    /// The utterance answered.
    pub id: UtteranceId,
    /// Which chunk of the answer, from 0.
    pub chunk: u32,
    /// Which block of the chunk, from 0.
    pub block: u32,
    /// The block's samples' rate (mono).
    pub sample_rate: u32,
    /// The samples, in [-1, 1].
    pub samples: Arc<[f32]>,
    /// The chunk's text, on its first block.
    pub text: Option<Arc<str>>,
}

/// The end of a turn's voice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VoiceDone {
    /// The utterance answered.
    pub id: UtteranceId,
    /// The voice (`espeak`, `piper`).
    pub voice: &'static str,
    /// Chunks spoken.
    pub chunks: u32,
    /// Characters spoken.
    pub chars: u32,
    /// Samples of audio made.
    pub audio_samples: u64,
    /// Their rate.
    pub sample_rate: u32,
    /// Chunks that failed to speak (each a turn error too).
    pub failed_chunks: u32,
}

impl VoiceDone {
    /// Seconds of audio made.
    #[must_use]
    pub fn audio_s(&self) -> f64 {
        self.audio_samples as f64 / f64::from(self.sample_rate.max(1))
    }
}

/// The first sample of a turn's spoken answer reached the output device (a
/// live session; the event's instant is the device's, from the output
/// stream's timestamps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VoicePlayed {
    /// The utterance answered.
    pub id: UtteranceId,
}

/// `"type": "voice_played"`: when the answer's first sound reached the device.
impl EngineEvent for VoicePlayed {
    fn kind(&self) -> &'static str {
        "voice_played"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        Ok("{}".into())
    }
}

/// The answer to turn `id` has played to its end on the output device (a
/// live session; the event's instant is when the output found nothing more
/// of it to play).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VoiceEnded {
    /// The utterance answered.
    pub id: UtteranceId,
}

/// `"type": "voice_ended"`: the answer played to its end.
impl EngineEvent for VoiceEnded {
    fn kind(&self) -> &'static str {
        "voice_ended"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        Ok("{}".into())
    }
}

/// Barge-in: the user spoke over the answer to turn `id`, and its playback
/// stopped (the event's instant: when the stop was decided; `stopped`: when
/// the device fell silent, which for an answer first paused for the words
/// heard over it is when it paused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoiceInterrupted {
    /// The turn whose answer was stopped.
    pub id: UtteranceId,
    /// What the user heard of it (the chunks whose playback began).
    pub heard: String,
    /// When the user's speech began.
    pub speech_start: std::time::Instant,
    /// When the endpointer was sure of it.
    pub detected: std::time::Instant,
    /// When the playback was silent at the device.
    pub stopped: std::time::Instant,
}

impl VoiceInterrupted {
    /// The user's speech start → playback stopped, ms.
    #[must_use]
    pub fn barge_in_ms(&self) -> f64 {
        self.stopped
            .saturating_duration_since(self.speech_start)
            .as_secs_f64()
            * 1000.0
    }

    /// Detected → playback stopped, ms.
    #[must_use]
    pub fn stop_ms(&self) -> f64 {
        self.stopped
            .saturating_duration_since(self.detected)
            .as_secs_f64()
            * 1000.0
    }
}

/// `"type": "voice_interrupted"`: what was heard, and how fast it stopped.
impl EngineEvent for VoiceInterrupted {
    fn kind(&self) -> &'static str {
        "voice_interrupted"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, clock: &Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(&serde_json::json!({
            "heard": self.heard,
            "speech_start_ms": clock.ms_since_origin(self.speech_start),
            "detected_ms": clock.ms_since_origin(self.detected),
            "barge_in_ms": self.barge_in_ms(),
            "stop_ms": self.stop_ms(),
        }))
    }
}

/// A false interruption: the user's speech over the answer to turn `id`
/// paused it, and was a backchannel ("uh-huh", a cough, see
/// [`voxline_core::backchannel`]), so it played on where it paused (the
/// event's instant: when it resumed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoiceResumed {
    /// The turn whose answer played on.
    pub id: UtteranceId,
    /// What was heard over it (`None`: no words came in time).
    pub words: Option<String>,
    /// When the user's speech began.
    pub speech_start: std::time::Instant,
    /// When the playback was silent at the device.
    pub stopped: std::time::Instant,
    /// When it played on.
    pub resumed: std::time::Instant,
}

impl VoiceResumed {
    /// How long the answer was silent, ms.
    #[must_use]
    pub fn paused_ms(&self) -> f64 {
        self.resumed
            .saturating_duration_since(self.stopped)
            .as_secs_f64()
            * 1000.0
    }
}

/// `"type": "voice_resumed"`: what was heard over the answer, and how long
/// it was paused.
impl EngineEvent for VoiceResumed {
    fn kind(&self) -> &'static str {
        "voice_resumed"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, clock: &Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(&serde_json::json!({
            "words": self.words,
            "speech_start_ms": clock.ms_since_origin(self.speech_start),
            "paused_ms": self.paused_ms(),
        }))
    }
}

/// What the speech-synthesis stage emits.
#[derive(Debug, Clone, PartialEq)]
pub enum VoiceOut {
    /// A block of audio.
    Audio(VoiceAudio),
    /// The turn's voice is complete.
    Done(VoiceDone),
}

impl Message for VoiceOut {
    fn utterance_id(&self) -> Option<UtteranceId> {
        match self {
            Self::Audio(a) => Some(a.id),
            Self::Done(d) => Some(d.id),
        }
    }
    fn event(&self) -> Option<PipelineEvent> {
        Some(match self {
            Self::Audio(a) => PipelineEvent::engine_event(a.clone()),
            Self::Done(d) => PipelineEvent::engine_event(d.clone()),
        })
    }
}

/// A block's event: `"type": "voice_audio"` with its place, its rate and
/// its length (the samples travel beside the event log, not in it).
impl EngineEvent for VoiceAudio {
    fn kind(&self) -> &'static str {
        "voice_audio"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        #[derive(Serialize)]
        struct Fields<'a> {
            chunk: u32,
            block: u32,
            sample_rate: u32,
            samples: usize,
            #[serde(skip_serializing_if = "Option::is_none")]
            text: Option<&'a str>,
        }
        serde_json::to_string(&Fields {
            chunk: self.chunk,
            block: self.block,
            sample_rate: self.sample_rate,
            samples: self.samples.len(),
            text: self.text.as_deref(),
        })
    }
}

/// The turn's voice summary: `"type": "voice_done"`.
impl EngineEvent for VoiceDone {
    fn kind(&self) -> &'static str {
        "voice_done"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        Some(self.id)
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        let mut v = serde_json::to_value(self)?;
        if let Some(o) = v.as_object_mut() {
            o.remove("id");
            o.insert("audio_s".into(), self.audio_s().into());
        }
        serde_json::to_string(&v)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn voice_events_say_where_the_audio_is_and_not_what_it_is() {
        let c = Clock::start();
        let at = c.origin() + Duration::from_millis(5);
        let a = VoiceOut::Audio(VoiceAudio {
            id: 3,
            chunk: 0,
            block: 0,
            sample_rate: 22_050,
            samples: vec![0.0; 512].into(),
            text: Some("Sure.".into()),
        });
        assert_eq!(a.utterance_id(), Some(3));
        assert_eq!(
            a.event().unwrap().to_json_line(&c, at).unwrap(),
            r#"{"type":"voice_audio","id":3,"sample":null,"t_ms":5.0,"chunk":0,"block":0,"sample_rate":22050,"samples":512,"text":"Sure."}"#
        );
        let d = VoiceOut::Done(VoiceDone {
            id: 3,
            voice: "espeak",
            chunks: 1,
            chars: 5,
            audio_samples: 11_025,
            sample_rate: 22_050,
            failed_chunks: 0,
        });
        let v = d.event().unwrap().to_json_value(&c, at).unwrap();
        assert_eq!(v["type"], "voice_done");
        assert_eq!(v["audio_s"], 0.5);
        assert_eq!(v["voice"], "espeak");
    }
}
