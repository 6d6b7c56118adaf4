//! The engines a pipeline's stages run, whichever backend the settings
//! name: whisper.cpp or a remote server for speech to text ([`Stt`]),
//! llama.cpp in this process, a client of the shared batching worker, or a
//! remote server for the language model ([`Chat`]). Each is one more
//! backend of the stage's engine trait, so one stage type, one runtime and
//! one report serve them all.

use voxline_llm::serving::BatchClient;
use voxline_llm::{ChatBackend, Checkpoint, LlmEngine, LlmError, Response};
use voxline_remote::{Client, RemoteChat, RemoteError, RemoteStt, SttOptions};
use voxline_stt::{SpeechToText, SttEngine, SttError, Transcription};

use crate::settings::{EngineSettings, LlmBackend, RemoteSettings, SttBackend};
use crate::BadInput;

/// A speech-to-text engine of any backend.
#[derive(Debug)]
pub enum Stt {
    /// whisper.cpp in this process.
    Whisper(SttEngine),
    /// whisper on CTranslate2 in this process.
    Ct2(voxline_ct2::Ct2Engine),
    /// A remote server.
    Remote(RemoteStt),
}

impl SpeechToText for Stt {
    fn transcribe(
        &mut self,
        samples: &[f32],
        chunk: bool,
        abort: &(dyn Fn() -> bool + Sync),
    ) -> Result<Transcription, SttError> {
        match self {
            Self::Whisper(e) => SpeechToText::transcribe(e, samples, chunk, abort),
            Self::Ct2(e) => e.transcribe(samples, chunk, abort),
            Self::Remote(e) => e.transcribe(samples, chunk, abort),
        }
    }

    fn threads(&self) -> usize {
        match self {
            Self::Whisper(e) => SpeechToText::threads(e),
            Self::Ct2(e) => e.threads(),
            Self::Remote(e) => e.threads(),
        }
    }

    fn computes_here(&self) -> bool {
        match self {
            Self::Whisper(e) => e.computes_here(),
            Self::Ct2(e) => e.computes_here(),
            Self::Remote(e) => e.computes_here(),
        }
    }

    fn set_threads(&mut self, threads: usize) {
        match self {
            Self::Whisper(e) => SpeechToText::set_threads(e, threads),
            Self::Ct2(e) => e.set_threads(threads),
            Self::Remote(e) => e.set_threads(threads),
        }
    }
}

/// A conversation with a language model of any backend. llama.cpp's
/// context is bound to the thread that made it, so a `Chat` is made on
/// its stage's thread, from a [`ChatStart`].
pub enum Chat {
    /// llama.cpp in this process.
    Llama(LlmEngine),
    /// A client of the batching worker many conversations share.
    Shared(BatchClient),
    /// A remote server.
    Remote(RemoteChat),
}

impl std::fmt::Debug for Chat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Llama(_) => "Chat::Llama",
            Self::Shared(_) => "Chat::Shared",
            Self::Remote(_) => "Chat::Remote",
        })
    }
}

/// A conversation's backend as it is handed to the pipeline, before its
/// stage starts: what crosses to the stage's thread, where the [`Chat`] is
/// made (llama.cpp's context, with the system prompt evaluated).
pub enum ChatStart {
    /// llama.cpp in this process: the loaded model, and the governor its
    /// threads follow (priority mode).
    Llama(voxline_llm::LlmModel, Option<voxline_core::CpuGovernor>),
    /// A client of the batching worker.
    Shared(BatchClient),
    /// A conversation on a remote server.
    Remote(RemoteChat),
}

impl voxline_core::StartStage for ChatStart {
    type Stage = voxline_llm::RunningLlmStage<Chat>;

    fn stage_name(&self) -> &str {
        voxline_llm::STAGE_NAME
    }

    fn start(self) -> Result<Self::Stage, voxline_core::StartError> {
        let chat = match self {
            Self::Llama(model, governor) => {
                let mut engine = LlmEngine::new(model)?;
                engine.set_governor(governor)?;
                Chat::Llama(engine)
            }
            Self::Shared(c) => Chat::Shared(c),
            Self::Remote(c) => Chat::Remote(c),
        };
        Ok(voxline_llm::RunningLlmStage::new(chat))
    }
}

/// A [`Chat`]'s checkpoint, of its backend's kind.
pub enum ChatCheckpoint {
    /// llama.cpp's.
    Llama(Checkpoint),
    /// A remote conversation's length.
    Remote(usize),
}

impl ChatBackend for Chat {
    type Checkpoint = ChatCheckpoint;

    fn respond(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Response, LlmError> {
        match self {
            Self::Llama(e) => ChatBackend::respond(e, user, on_token),
            Self::Shared(e) => e.respond(user, on_token),
            Self::Remote(e) => e.respond(user, on_token),
        }
    }

    fn respond_until(
        &mut self,
        user: &str,
        on_token: &mut dyn FnMut(&str) -> bool,
        stop: &dyn Fn() -> bool,
    ) -> Result<Response, LlmError> {
        match self {
            Self::Remote(e) => e.respond_until(user, on_token, stop),
            _ => self.respond(user, on_token),
        }
    }

    fn can_roll_back(&self) -> bool {
        match self {
            Self::Llama(e) => ChatBackend::can_roll_back(e),
            Self::Shared(e) => e.can_roll_back(),
            Self::Remote(e) => e.can_roll_back(),
        }
    }

    fn checkpoint(&mut self) -> Option<ChatCheckpoint> {
        match self {
            Self::Llama(e) => ChatBackend::checkpoint(e).map(ChatCheckpoint::Llama),
            Self::Shared(_) => None,
            Self::Remote(e) => e.checkpoint().map(ChatCheckpoint::Remote),
        }
    }

    fn rollback(&mut self, checkpoint: ChatCheckpoint) -> Result<(), LlmError> {
        match (self, checkpoint) {
            (Self::Llama(e), ChatCheckpoint::Llama(c)) => ChatBackend::rollback(e, c),
            (Self::Remote(e), ChatCheckpoint::Remote(c)) => e.rollback(c),
            _ => Err(LlmError::Failed(
                "a checkpoint of another backend cannot be returned to".into(),
            )),
        }
    }

    fn computes_here(&self) -> bool {
        match self {
            Self::Llama(e) => ChatBackend::computes_here(e),
            Self::Shared(e) => e.computes_here(),
            Self::Remote(e) => e.computes_here(),
        }
    }

    fn amend_answer(&mut self, back: usize, answer: &str) {
        match self {
            Self::Llama(e) => ChatBackend::amend_answer(e, back, answer),
            Self::Shared(e) => e.amend_answer(back, answer),
            Self::Remote(e) => e.amend_answer(back, answer),
        }
    }

    fn adapt_threads(&mut self) -> Result<usize, LlmError> {
        match self {
            Self::Llama(e) => ChatBackend::adapt_threads(e),
            Self::Shared(e) => e.adapt_threads(),
            Self::Remote(e) => e.adapt_threads(),
        }
    }
}

/// The remote engines, checked and ready: a client of each server and the
/// model it serves.
#[derive(Debug, Clone, Default)]
pub struct Remotes {
    /// Speech to text's server and model, if it is remote.
    pub stt: Option<(Client, String)>,
    /// The language model's server and model, if it is remote.
    pub llm: Option<(Client, String)>,
}

impl Remotes {
    /// A speech-to-text engine on the remote server, if it is remote.
    #[must_use]
    pub fn stt(&self) -> Option<RemoteStt> {
        self.stt.as_ref().map(|(c, model)| {
            RemoteStt::new(
                c.clone(),
                SttOptions {
                    model: model.clone(),
                    ..SttOptions::default()
                },
            )
        })
    }

    /// A new conversation on the remote server, if it is remote.
    #[must_use]
    pub fn chat(&self, settings: &EngineSettings) -> Option<RemoteChat> {
        self.llm
            .as_ref()
            .map(|(c, model)| RemoteChat::new(c.clone(), settings.chat_options(model.clone())))
    }
}

/// Checks every remote server the settings name before any audio: each
/// must answer, accept the key and serve the model (or, none named, list
/// one). Local engines are left alone.
///
/// # Errors
/// [`BadInput`]: one line naming the server and what is wrong.
pub fn connect(settings: &EngineSettings) -> Result<Remotes, BadInput> {
    let check = |r: &RemoteSettings, flag: &'static str, default: Option<&str>| {
        let client = Client::new(r.endpoint.clone(), r.timeouts);
        let model = client
            .check_model(r.model.as_deref(), flag)
            .map_err(|e| BadInput(unreachable(&e)))?;
        let model = model.or(default.map(str::to_owned)).ok_or_else(|| {
            BadInput(format!(
                "{}: lists no model; name the one to use with {flag}",
                r.endpoint.server()
            ))
        })?;
        Ok::<_, BadInput>((client, model))
    };
    let stt = match &settings.stt {
        SttBackend::Remote(r) => Some(check(r, "--stt-model", Some("whisper-1"))?),
        SttBackend::Whisper(_) | SttBackend::Ct2(_) => None,
    };
    let llm = match &settings.llm {
        LlmBackend::Remote(r, _) => Some(check(r, "--llm-model", None)?),
        LlmBackend::Llama(_) => None,
    };
    Ok(Remotes { stt, llm })
}

/// A start-up check's failure, as one line.
fn unreachable(e: &RemoteError) -> String {
    match e {
        RemoteError::Status {
            status: 401 | 403, ..
        } => format!("{e} — the server refused the key; set the right one in the environment"),
        _ => e.to_string(),
    }
}
