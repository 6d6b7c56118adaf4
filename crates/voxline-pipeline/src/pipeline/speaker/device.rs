//! What the loudspeaker itself did: the times it stopped taking audio
//! (stalls), their events, and how the session's play-out ended.

use std::time::{Duration, Instant};

use serde::Serialize;
use voxline_core::{Clock, EngineEvent, UtteranceId};

/// The most a live session plays out once it has ended (a stop asked for
/// cuts it at once): from the end of the run, when capture stops.
pub(crate) const PLAY_OUT_LIMIT: Duration = Duration::from_secs(30);

/// The loudspeaker has taken no audio for
/// [`voxline_audio::playback::STALL_AFTER`] while the voice was queued on
/// it (a suspended sink, a stream the sound server stopped, a device gone):
/// the rest of the answer playing is not played, nor any voice until the
/// device takes audio again (the event's instant: when this was seen).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpeakerStalled {
    /// The turn whose answer was playing, if one was.
    #[serde(skip)]
    pub id: Option<UtteranceId>,
    /// How long the device had asked for no audio, ms.
    pub silent_ms: f64,
    /// The voice queued on the device then, which it never took, ms.
    pub queued_ms: f64,
}

/// `"type": "speaker_stalled"`.
impl EngineEvent for SpeakerStalled {
    fn kind(&self) -> &'static str {
        "speaker_stalled"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        self.id
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// The loudspeaker asks for audio again after a stall (the event's
/// instant: when this was seen); the next answers play.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpeakerRecovered {
    /// How long it took no audio, ms.
    pub stalled_ms: f64,
}

/// `"type": "speaker_recovered"`.
impl EngineEvent for SpeakerRecovered {
    fn kind(&self) -> &'static str {
        "speaker_recovered"
    }
    fn utterance_id(&self) -> Option<UtteranceId> {
        None
    }
    fn fields_json(&self, _: &Clock) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// How the session's play-out ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PlayOut {
    /// All of the voice played (or there was none left).
    Played,
    /// A stop was asked for (Ctrl-C, SIGTERM): what was left is dropped.
    Stopped,
    /// [`PLAY_OUT_LIMIT`] after the run ended: what was left is dropped.
    TimeLimit,
    /// The loudspeaker had stalled: what was left could not be played.
    Stalled,
}

impl PlayOut {
    /// Its name in the report.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Played => "played",
            Self::Stopped => "stopped",
            Self::TimeLimit => "time_limit",
            Self::Stalled => "stalled",
        }
    }
}

/// The loudspeaker's stalls so far.
#[derive(Debug, Default)]
pub(super) struct Stalls {
    /// The stall going on: when the device last asked for audio.
    pub(super) current: Option<Instant>,
    /// Stalls begun.
    pub(super) count: u64,
    /// The time of those that ended.
    pub(super) ended: Duration,
    /// The voice lost to them, in seconds: queued on the device when it
    /// stalled, and given to it while it was stalled.
    pub(super) lost_s: f64,
}

impl Stalls {
    /// A stall seen at `now`, the device silent since `since`, with
    /// `queued_s` of the voice on it.
    pub(super) fn begin(&mut self, since: Instant, queued_s: f64) {
        self.current = Some(since);
        self.count += 1;
        self.lost_s += queued_s;
    }

    /// The stall going on ended at `now`: how long it lasted.
    pub(super) fn end(&mut self, now: Instant) -> Option<Duration> {
        let since = self.current.take()?;
        let d = now.saturating_duration_since(since);
        self.ended += d;
        Some(d)
    }

    /// The time stalled, the one going on included up to `now`.
    pub(super) fn total(&self, now: Instant) -> Duration {
        self.ended
            + self
                .current
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_until_it_ends_and_once() {
        let t0 = Instant::now();
        let mut s = Stalls::default();
        s.begin(t0, 4.0);
        assert_eq!(s.total(t0 + Duration::from_secs(3)), Duration::from_secs(3));
        assert_eq!(
            s.end(t0 + Duration::from_secs(5)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(s.end(t0 + Duration::from_secs(6)), None);
        assert_eq!(
            s.total(t0 + Duration::from_secs(60)),
            Duration::from_secs(5)
        );
        assert_eq!((s.count, s.lost_s), (1, 4.0));
    }

    #[test]
    fn the_events_say_what_the_device_did() {
        let clock = Clock::start();
        let e = SpeakerStalled {
            id: Some(3),
            silent_ms: 2000.5,
            queued_ms: 4000.0,
        };
        assert_eq!(e.kind(), "speaker_stalled");
        assert_eq!(e.utterance_id(), Some(3));
        let f: serde_json::Value = serde_json::from_str(&e.fields_json(&clock).unwrap()).unwrap();
        assert_eq!(f["silent_ms"], 2000.5);
        assert_eq!(f["queued_ms"], 4000.0);
        assert!(f.get("id").is_none(), "the envelope carries the turn");
        let r = SpeakerRecovered { stalled_ms: 5.0 };
        assert_eq!(r.kind(), "speaker_recovered");
        assert_eq!(r.fields_json(&clock).unwrap(), r#"{"stalled_ms":5.0}"#);
    }
}
