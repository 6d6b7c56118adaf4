//! The VAD stage: audio frames in, utterances out.

use std::collections::VecDeque;
use std::time::Instant;

use voxline_core::{
    AudioFrame, Clock, Emitter, PipelineEvent, SpecBoard, Stage, StageError, Utterance, UtteranceId,
};

use crate::barge::{BargeInOptions, BargeWatch};
use crate::vad::{Endpointer, Segment, VadConfig, FRAME_SAMPLES};
use crate::AudioError;

/// A speculative attempt in flight.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: UtteranceId,
    start: u64,
    /// The end of the audio it sent (the position it was sent at).
    end: u64,
    /// The end of the last confident speech frame when it was sent.
    confident_end: Option<u64>,
    sent_at: u64,
}

/// How far the detector's decaying tail (frames at or above the speech
/// threshold but below the confident one) may run past the end of an
/// attempt's audio and the attempt still commit: 64 ms, four detector frames.
/// A tail that runs on is speech going on softly, and cancels it.
const SPEC_TAIL_GRACE: u64 = 4 * FRAME_SAMPLES as u64;

/// Frames whose capture instants [`VadStage`] keeps for placing utterance
/// ends in time (about 40 s of 10 ms capture blocks).
const RECENT_FRAMES: usize = 4_096;

/// Cuts the 16 kHz stream into [`Utterance`]s with an [`Endpointer`],
/// numbering them from 1 and placing each on the session clock: the wall
/// time of its end sample is the capture time of the frame holding it plus
/// the audio before it in that frame. Where the capture skipped positions
/// (a clock gap or dropped audio) the frames on either side carry their own
/// instants, so an end before the skip is not moved by it.
///
/// With [`VadStage::with_speculation`], an utterance is also sent early, as
/// a speculative attempt under its own id, once a short silence follows
/// speech; the hangover then commits it, or resumed speech cancels it (see
/// [`voxline_core::spec`]). Ids therefore number attempts, and a turn's id
/// may skip the ids of cancelled attempts.
///
/// An utterance cut at the maximum length is sent at once, as an ordinary
/// utterance with `forced_split` set (a pending attempt is cancelled first);
/// the rest, and any attempt on the rest, names it in `continues` and
/// carries the lead-in before the cut as `overlap_samples`.
pub struct VadStage {
    endpointer: Endpointer,
    next_id: UtteranceId,
    /// The board and the silence (in samples) after which to speculate.
    spec: Option<(SpecBoard, u64)>,
    /// The confident end whose soft tail cancelled an attempt (see `speculate`).
    soft_tail: Option<u64>,
    pending: Option<Pending>,
    /// Recent frames, oldest first: the endpointer position (plus origin) of
    /// each one's first sample and its capture instant.
    recent: VecDeque<(u64, Instant)>,
    /// Offset from endpointer positions to stream positions (the first frame's start,
    /// moved on by any audio dropped before a frame).
    origin: Option<u64>,
    /// Stream samples missing before frames (dropped upstream).
    gap_samples: u64,
    /// The id of the latest forced split, which a continuation names.
    last_forced: Option<UtteranceId>,
    /// Barge-in, when the pipeline speaks.
    barge: Option<BargeWatch>,
}

impl std::fmt::Debug for VadStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VadStage")
            .field("next_id", &self.next_id)
            .finish_non_exhaustive()
    }
}

impl VadStage {
    /// A stage with a fresh endpointer.
    ///
    /// # Errors
    /// [`AudioError::InvalidVadConfig`] for an invalid configuration.
    pub fn new(config: VadConfig) -> Result<Self, AudioError> {
        Ok(Self {
            endpointer: Endpointer::new(config)?,
            next_id: 1,
            spec: None,
            soft_tail: None,
            pending: None,
            recent: VecDeque::new(),
            origin: None,
            gap_samples: 0,
            last_forced: None,
            barge: None,
        })
    }

    /// Barge-in: while an answer plays ([`voxline_core::BargeIn::playing`])
    /// frames are judged against `options.threshold`, and once
    /// `options.min_speech_ms` of speech is heard over it the stage asks
    /// for the voice to stop ([`voxline_core::BargeIn::request`]), naming
    /// when the speech began.
    #[must_use]
    pub fn with_barge_in(mut self, barge: voxline_core::BargeIn, options: BargeInOptions) -> Self {
        let base = self.endpointer.config().threshold;
        self.barge = Some(BargeWatch::new(barge, options, base));
        self
    }

    /// While an answer plays, the frames about to be pushed are judged
    /// against the raised threshold.
    fn barge_threshold(&mut self) {
        if let Some(w) = &self.barge {
            self.endpointer.set_threshold(w.threshold());
        }
    }

    /// Once enough speech is heard over the answer: the request to stop it.
    fn barge_in(&mut self, origin: u64) {
        let Some(w) = self.barge.as_mut() else {
            return;
        };
        if let Some(first_speech) = w.speech_over_answer(self.endpointer.open_utterance()) {
            let start = self.wall_of(first_speech + origin);
            if let Some(w) = &self.barge {
                w.request(start);
            }
        }
    }

    /// Stream samples that never arrived (dropped before the VAD); positions
    /// after a gap are still true stream positions.
    #[must_use]
    pub fn gap_samples(&self) -> u64 {
        self.gap_samples
    }

    /// Sends each utterance early, as a speculative attempt registered on
    /// `board`, once `silence_ms` of non-speech follows its speech (0 = never).
    /// A silence as long as the hangover or longer never fires: the utterance
    /// closes first.
    #[must_use]
    pub fn with_speculation(mut self, board: SpecBoard, silence_ms: u32) -> Self {
        self.spec = (silence_ms > 0).then(|| {
            (
                board,
                u64::from(silence_ms) * u64::from(voxline_core::SAMPLE_RATE) / 1000,
            )
        });
        self
    }

    /// Handles a closed segment: commits the attempt that sent it (the same
    /// start; its speech ending within [`SPEC_TAIL_GRACE`] of the attempt's
    /// audio), or cancels a stale attempt and sends the segment as an
    /// ordinary utterance.
    fn close(&mut self, seg: Segment, closed: u64, out: &mut Emitter<'_, Utterance>) {
        let origin = self.origin.unwrap_or(0);
        if let Some(p) = self.pending.take() {
            let same = !seg.forced_split
                && p.start == seg.start_sample + origin
                && seg.end_sample + origin <= p.end + SPEC_TAIL_GRACE;
            if let Some((board, _)) = &self.spec {
                if same {
                    board.commit(p.id);
                    out.publish(PipelineEvent::Commit {
                        id: p.id,
                        spec_sample: p.sent_at,
                        sample: closed,
                    });
                    return;
                }
                board.cancel(p.id);
                out.publish(PipelineEvent::SpecCancel {
                    id: p.id,
                    sample: closed,
                });
            }
        }
        self.emit(seg, closed, out);
    }

    /// After each detector frame: cancels an attempt whose utterance went on
    /// (a confident speech frame after it, or the detector's tail running more
    /// than [`SPEC_TAIL_GRACE`] past its audio), and starts one, with the audio
    /// up to now, when the silence after the last confident speech frame is
    /// long enough.
    fn speculate(&mut self, pos: u64, out: &mut Emitter<'_, Utterance>) {
        let Some((board, silence)) = self.spec.clone() else {
            return;
        };
        let origin = self.origin.unwrap_or(0);
        let open = self.endpointer.open_utterance().map(|o| {
            (
                o.start_sample + origin,
                o.end_sample + origin,
                o.confident_end.map(|c| c + origin),
                o.keepable,
                o.continues_previous,
                o.overlap_samples,
            )
        });
        if let Some(p) = self.pending {
            let went_on = open.is_none_or(|(start, end, confident, ..)| {
                start != p.start || confident > p.confident_end || end > p.end + SPEC_TAIL_GRACE
            });
            if went_on {
                // Speech went on softly (no new confident frame): until the
                // next confident frame, wait for silence after the last
                // speech frame instead, so a long soft tail is not chased
                // with an attempt every few frames.
                self.soft_tail = open
                    .filter(|&(start, _, confident, ..)| {
                        start == p.start && confident == p.confident_end
                    })
                    .and_then(|(_, _, confident, ..)| confident);
                board.cancel(p.id);
                out.publish(PipelineEvent::SpecCancel {
                    id: p.id,
                    sample: pos,
                });
                self.pending = None;
            }
        }
        let Some((start, speech_end, confident_end, keepable, continues_previous, overlap_samples)) =
            open
        else {
            return;
        };
        // After the last confident frame; after the last speech frame when
        // there is none, or its soft tail already cancelled an attempt.
        let after = confident_end
            .filter(|c| self.soft_tail != Some(*c))
            .unwrap_or(speech_end);
        if self.pending.is_some() || !keepable || pos < after + silence {
            return;
        }
        let samples = self
            .endpointer
            .open_utterance()
            .map(|o| o.samples_to_now.to_vec())
            .unwrap_or_default();
        let end = start + samples.len() as u64;
        let id = self.next_id;
        self.next_id += 1;
        board.start(id);
        out.publish(PipelineEvent::SpecStart { id, sample: pos });
        self.pending = Some(Pending {
            id,
            start,
            end,
            confident_end,
            sent_at: pos,
        });
        out.emit(Utterance {
            id,
            start_sample: start,
            end_sample: end,
            end_wall: self.wall_of(end),
            samples,
            forced_split: false,
            closed_sample: pos,
            continues: self.last_forced.filter(|_| continues_previous),
            overlap_samples,
        });
    }

    fn wall_of(&self, sample: u64) -> Instant {
        let i = self.recent.partition_point(|&(pos, _)| pos <= sample);
        match (
            i.checked_sub(1).map(|j| self.recent[j]),
            self.recent.front(),
        ) {
            (Some((pos, at)), _) => at + Clock::samples_to_duration(sample - pos),
            (None, Some(&(pos, at))) => at
                .checked_sub(Clock::samples_to_duration(pos - sample))
                .unwrap_or(at),
            (None, None) => Instant::now(),
        }
    }

    fn emit(&mut self, seg: Segment, closed: u64, out: &mut Emitter<'_, Utterance>) {
        let origin = self.origin.unwrap_or(0);
        let end_sample = seg.end_sample + origin;
        let id = self.next_id;
        self.next_id += 1;
        let continues = self.last_forced.filter(|_| seg.continues_previous);
        self.last_forced = seg.forced_split.then_some(id);
        out.emit(Utterance {
            id,
            start_sample: seg.start_sample + origin,
            end_sample,
            end_wall: self.wall_of(end_sample),
            samples: seg.samples,
            forced_split: seg.forced_split,
            closed_sample: closed.max(end_sample),
            continues,
            overlap_samples: seg.overlap_samples,
        });
    }
}

/// The VAD stage's name in the pipeline.
pub const VAD_STAGE_NAME: &str = "vad";

/// The VAD stage's identity in the pipeline's topology.
pub const VAD_STAGE: voxline_core::StageId = voxline_core::StageId::new(VAD_STAGE_NAME);

impl Stage for VadStage {
    type In = AudioFrame;
    type Out = Utterance;

    fn name(&self) -> &str {
        VAD_STAGE_NAME
    }

    fn process(
        &mut self,
        frame: AudioFrame,
        out: &mut Emitter<'_, Utterance>,
    ) -> Result<(), StageError> {
        let mut origin = *self.origin.get_or_insert(frame.start_sample);
        let expected = origin + self.endpointer.position();
        if frame.start_sample > expected {
            // Audio was dropped before this frame (a live queue that overflowed):
            // the utterance it interrupted ends where the audio stopped, and the
            // stream goes on at the frame's true position.
            let closed = expected;
            if let Some(seg) = self.endpointer.finish() {
                self.close(seg, closed, out);
            }
            if let (Some(p), Some((board, _))) = (self.pending.take(), &self.spec) {
                board.cancel(p.id);
                out.publish(voxline_core::PipelineEvent::SpecCancel {
                    id: p.id,
                    sample: closed,
                });
            }
            self.gap_samples += frame.start_sample - expected;
            self.origin = Some(frame.start_sample);
            origin = frame.start_sample;
        }
        if frame.new_recording {
            // a new recording: the pre-roll must not reach into what came before it
            self.endpointer.clear_pre_roll();
        }
        // Where the frame starts in the endpointer's count, and when it was captured.
        if self.recent.len() == RECENT_FRAMES {
            self.recent.pop_front();
        }
        self.recent
            .push_back((self.endpointer.position() + origin, frame.captured));
        self.barge_threshold();
        if self.spec.is_none() {
            let segments = self.endpointer.push(&frame.samples);
            let closed = self.endpointer.position() + origin;
            for seg in segments {
                self.emit(seg, closed, out);
            }
        } else {
            // Detector frame by detector frame, so an attempt starts (or is
            // cancelled) at the frame where the silence reached its length.
            for part in frame.samples.chunks(FRAME_SAMPLES) {
                let segments = self.endpointer.push(part);
                let pos = self.endpointer.position() + origin;
                for seg in segments {
                    self.close(seg, pos, out);
                }
                self.speculate(pos, out);
            }
        }
        self.barge_in(origin);
        if frame.end_of_stream {
            // the speaker is done: what is open closes now, as at the end of input
            self.finish(out)?;
            out.publish(PipelineEvent::StreamEnd {
                sample: self.endpointer.position() + origin,
            });
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Emitter<'_, Utterance>) -> Result<(), StageError> {
        let closed = self.endpointer.position() + self.origin.unwrap_or(0);
        if let Some(seg) = self.endpointer.finish() {
            self.close(seg, closed, out);
        }
        if let (Some(p), Some((board, _))) = (self.pending.take(), &self.spec) {
            board.cancel(p.id);
            out.publish(PipelineEvent::SpecCancel {
                id: p.id,
                sample: closed,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn fixture_16k(name: &str) -> Vec<f32> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../audio-fixtures")
            .join(name);
        let mut src = crate::WavSource::open(&path).unwrap();
        let mut out = Vec::new();
        while let Some(c) = src.next_chunk().unwrap() {
            out.extend_from_slice(&c);
        }
        out
    }

    /// A field (`start_sample`, `end_sample`) of q_capital's spoken turn, from its sidecar.
    fn q_capital_turn(field: &str) -> usize {
        let sidecar: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../audio-fixtures/q_capital.json"),
            )
            .unwrap(),
        )
        .unwrap();
        sidecar["turns"][0][field].as_u64().unwrap() as usize
    }

    fn frames(audio: &[f32], offset: u64, clock: &Clock) -> Vec<AudioFrame> {
        audio
            .chunks(320)
            .enumerate()
            .map(|(i, c)| {
                let start = offset + (i * 320) as u64;
                AudioFrame {
                    start_sample: start,
                    samples: c.to_vec(),
                    captured: clock.sample_due(start),
                    new_recording: i == 0,
                    end_of_stream: false,
                }
            })
            .collect()
    }

    #[test]
    fn numbers_utterances_and_places_them_on_the_stream_clock() {
        let clock = Clock::start();
        let audio = fixture_16k("multi_turn.wav");
        // the stream does not start at 0 (a second file, say): positions follow it
        let offset = 48_000;
        let mut stage = VadStage::new(VadConfig::default()).unwrap();
        let out = voxline_core::drive(&mut stage, frames(&audio, offset, &clock)).unwrap();
        assert_eq!(out.iter().map(|u| u.id).collect::<Vec<_>>(), vec![1, 2, 3]);
        for u in &out {
            assert!(u.start_sample >= offset && u.end_sample > u.start_sample);
            assert_eq!(u.samples.len() as u64, u.end_sample - u.start_sample);
            // closed once the 500 ms hangover passed, within a frame or two
            let delay = u.closed_sample - u.end_sample;
            assert!(
                (8_000..=8_000 + 2 * 320 + 256).contains(&delay),
                "closed {delay} samples after the end of speech"
            );
            // the end's wall time is the instant that sample was due
            let due = clock.sample_due(u.end_sample);
            let skew = if u.end_wall > due {
                u.end_wall - due
            } else {
                due - u.end_wall
            };
            assert!(skew < Duration::from_millis(1), "{skew:?}");
        }
    }

    #[test]
    fn positions_stay_true_stream_positions_after_dropped_audio() {
        let clock = Clock::start();
        let audio = fixture_16k("multi_turn.wav");
        let whole = voxline_core::drive(
            &mut VadStage::new(VadConfig::default()).unwrap(),
            frames(&audio, 0, &clock),
        )
        .unwrap();
        // drop five seconds of frames from the silence before the last question
        let gap_start = (whole[2].start_sample - 16_000 * 6) as usize / 320;
        let mut fs = frames(&audio, 0, &clock);
        fs.drain(gap_start..gap_start + 250);
        let mut stage = VadStage::new(VadConfig::default()).unwrap();
        let cut = voxline_core::drive(&mut stage, fs).unwrap();
        assert_eq!(stage.gap_samples(), 250 * 320);
        let last = cut.last().unwrap();
        // the last question is where it is in the stream, not 5 s earlier
        let drift = last.end_sample.abs_diff(whole[2].end_sample);
        assert!(
            drift <= 512,
            "{} vs {}",
            last.end_sample,
            whole[2].end_sample
        );
    }

    #[test]
    fn a_clock_gap_in_the_hangover_does_not_move_the_end_of_speech() {
        let clock = Clock::start();
        let audio = fixture_16k("multi_turn.wav");
        // the device delivered nothing for 500 ms, 200 ms after the first
        // question ended: later frames skip 8 000 positions and were captured
        // 500 ms later than their audio alone says
        let gap_at = 28_197 + 3_200;
        let gap = Duration::from_millis(500);
        let frames: Vec<AudioFrame> = frames(&audio, 0, &clock)
            .into_iter()
            .map(|mut f| {
                if f.start_sample >= gap_at {
                    f.start_sample += 8_000;
                    f.captured += gap;
                }
                f
            })
            .collect();
        let mut stage = VadStage::new(VadConfig::default()).unwrap();
        let out = voxline_core::drive(&mut stage, frames).unwrap();
        assert_eq!(out.len(), 3);
        for u in &out {
            // positions are true stream positions (the gap included), so the
            // end's wall time is simply when that stream sample was due
            let due = clock.sample_due(u.end_sample);
            let skew = if u.end_wall > due {
                u.end_wall - due
            } else {
                due - u.end_wall
            };
            assert!(skew < Duration::from_millis(1), "turn {}: {skew:?}", u.id);
        }
    }

    #[test]
    fn the_pre_roll_never_reaches_back_past_a_new_recording() {
        let clock = Clock::start();
        // a recording whose speech starts 50 ms in, after 1 s of digital silence
        let audio = fixture_16k("q_capital.wav");
        let speech = q_capital_turn("start_sample");
        let clip = &audio[speech - 800..];
        let mut stream = vec![0.0f32; 16_000];
        stream.extend_from_slice(clip);
        let mut fs = frames(&stream, 0, &clock);
        let file_start = 16_000u64;
        for f in &mut fs {
            f.new_recording = f.start_sample == file_start;
        }
        let out =
            voxline_core::drive(&mut VadStage::new(VadConfig::default()).unwrap(), fs).unwrap();
        assert_eq!(out.len(), 1);
        // at most the part of one detector frame that straddles the boundary
        assert!(
            out[0].start_sample + crate::FRAME_SAMPLES as u64 > file_start,
            "the pre-roll reached back to {} before the recording at {file_start}",
            out[0].start_sample
        );
    }

    /// Speculates on `q_capital` with `spec_threshold`; returns (attempts
    /// started, the committed attempt's position after the true end in
    /// samples, the end of the committed attempt's audio, the end of the
    /// closed segment's speech).
    fn speculate_on_q_capital(spec_threshold: f32) -> (usize, u64, u64, u64) {
        let clock = Clock::start();
        let audio = fixture_16k("q_capital.wav");
        let board = SpecBoard::new();
        let config = VadConfig {
            spec_threshold,
            ..VadConfig::default()
        };
        let mut stage = VadStage::new(config.clone())
            .unwrap()
            .with_speculation(board.clone(), 48);
        let out = voxline_core::drive(&mut stage, frames(&audio, 0, &clock)).unwrap();
        let committed: Vec<&Utterance> = out
            .iter()
            .filter(|u| board.state(u.id) == voxline_core::SpecState::Committed)
            .collect();
        assert_eq!(committed.len(), 1, "one turn, committed");
        assert!(
            out.iter()
                .all(|u| board.state(u.id) != voxline_core::SpecState::Final),
            "the committed attempt is not sent again"
        );
        let c = committed[0];
        // The segment the hangover closes (the same audio without speculation).
        let whole = voxline_core::drive(
            &mut VadStage::new(config).unwrap(),
            frames(&audio, 0, &clock),
        )
        .unwrap();
        assert_eq!(whole.len(), 1);
        assert_eq!(c.start_sample, whole[0].start_sample);
        assert_eq!(c.samples.len() as u64, c.end_sample - c.start_sample);
        let true_end = q_capital_turn("end_sample") as u64;
        (
            out.len(),
            c.closed_sample - true_end,
            c.end_sample,
            whole[0].end_sample,
        )
    }

    #[test]
    fn a_confident_threshold_speculates_sooner_and_keeps_the_whole_word() {
        let (n_old, after_old, _, _) = speculate_on_q_capital(0.5);
        let (n_new, after_new, sent_end, seg_end) = speculate_on_q_capital(0.6);
        // The detector's decaying tail is no longer waited for: at least a
        // detector frame sooner.
        assert!(
            after_new + crate::FRAME_SAMPLES as u64 <= after_old,
            "attempt {after_new} samples after the true end, against {after_old}"
        );
        assert!(n_new >= n_old);
        // The attempt sends the audio up to where it was sent: every speech
        // frame of the segment the hangover closes (the tail included).
        assert!(
            sent_end + SPEC_TAIL_GRACE >= seg_end,
            "the attempt's audio ends {} samples before the segment's speech",
            seg_end.saturating_sub(sent_end)
        );
    }

    #[test]
    fn forced_splits_are_never_speculative_and_their_rest_names_them() {
        let clock = Clock::start();
        let audio = fixture_16k("long_10s.wav");
        let board = SpecBoard::new();
        let config = VadConfig {
            max_utterance_ms: 4_000,
            ..VadConfig::default()
        };
        // a short speculation silence, so attempts start inside the long speech too
        let mut stage = VadStage::new(config)
            .unwrap()
            .with_speculation(board.clone(), 50);
        let out = voxline_core::drive(&mut stage, frames(&audio, 16_000, &clock)).unwrap();
        let forced: Vec<&Utterance> = out.iter().filter(|u| u.forced_split).collect();
        assert!(forced.len() >= 2, "{} forced splits", forced.len());
        let mut last_forced: Option<&Utterance> = None;
        let mut continuations = 0;
        for u in &out {
            let attempt = board.state(u.id) != voxline_core::SpecState::Final;
            assert!(
                !(attempt && u.forced_split),
                "attempt {} is a forced split",
                u.id
            );
            assert_eq!(u.samples.len() as u64, u.end_sample - u.start_sample);
            match last_forced {
                Some(f) if u.start_sample < f.end_sample => {
                    continuations += 1;
                    assert_eq!(u.continues, Some(f.id), "utterance {}", u.id);
                    assert_eq!(u.start_sample + u.overlap_samples, f.end_sample);
                    // the lead-in is the same audio as the end of the piece before
                    let lead = usize::try_from(u.overlap_samples).unwrap();
                    assert_eq!(u.samples[..lead], f.samples[f.samples.len() - lead..]);
                }
                _ => {
                    assert_eq!(u.continues, None);
                    assert_eq!(u.overlap_samples, 0);
                }
            }
            if u.forced_split {
                last_forced = Some(u);
            }
        }
        assert!(continuations >= forced.len(), "{continuations}");
    }

    #[test]
    fn end_of_stream_closes_an_open_utterance() {
        let clock = Clock::start();
        let audio = fixture_16k("q_capital.wav");
        // cut the file 100 ms after the speech ends: no hangover left to close it
        let end = q_capital_turn("end_sample") + 1600;
        let mut stage = VadStage::new(VadConfig::default()).unwrap();
        let out = voxline_core::drive(&mut stage, frames(&audio[..end], 0, &clock)).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].closed_sample, end as u64);
    }
}
