//! Stages added to the standard pipeline ([`Extras`]) and the topology
//! the run builds from them.

use voxline_core::{FullPolicy, Stage, StageId, Topology, Transcript};

use crate::topology::{self, AudioEdge};
use crate::BadInput;

/// A transcript stage added to the pipeline (see [`Extras`]).
pub type TranscriptStage = Box<dyn Stage<In = Transcript, Out = Transcript> + Send>;

/// Stages added to the standard pipeline, each on its own thread with its
/// own queue, and its own row in the report, the timeline and the CSV.
#[derive(Default)]
pub struct Extras {
    pub(super) after_stt: Vec<TranscriptStage>,
    pub(super) voice: Option<crate::voice::VoiceStage>,
}

impl std::fmt::Debug for Extras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.after_stt.iter().map(|s| s.name().to_owned()))
            .entries(self.voice.iter().map(|s| s.name().to_owned()))
            .finish()
    }
}

impl Extras {
    /// Adds `stage` between the STT and the LLM (after the ones added
    /// before it): it sees every transcript and passes on what the LLM
    /// answers. Its name must be new to the pipeline.
    #[must_use]
    pub fn after_stt(
        mut self,
        stage: impl Stage<In = Transcript, Out = Transcript> + Send,
    ) -> Self {
        self.after_stt.push(Box::new(stage));
        self
    }

    /// Speaks the answers: `stage` (a speech-synthesis stage, normally
    /// [`voxline_tts::TtsStage`]) goes after the LLM and takes what it
    /// streams, committed text only.
    #[must_use]
    pub fn voice(mut self, stage: crate::voice::VoiceStage) -> Self {
        self.voice = Some(stage);
        self
    }

    /// Whether a voice speaks the answers.
    #[must_use]
    pub fn speaks(&self) -> bool {
        self.voice.is_some()
    }

    /// The pipeline's topology with these stages in it.
    ///
    /// # Errors
    /// [`BadInput`] when an added stage's name is taken.
    pub fn topology(&self, audio: AudioEdge, queue_capacity: usize) -> Result<Topology, BadInput> {
        let mut t = topology::standard(audio, queue_capacity);
        let mut after = topology::STT;
        for stage in &self.after_stt {
            let id = StageId::owned(stage.name().to_owned());
            if t.stage_spec(id.as_str()).is_some() {
                return Err(BadInput(format!(
                    "a stage named `{id}` is already in the pipeline; give the added stage another name"
                )));
            }
            let into = topology::edge_into(&id);
            t = t
                .edge(into.clone(), queue_capacity.max(1), FullPolicy::Block)
                .insert_after(&after, id.clone(), into);
            after = id;
        }
        if self.voice.is_some() {
            t = topology::with_voice(t);
        }
        Ok(t)
    }
}
