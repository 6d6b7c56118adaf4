//! voxline's remote engines: speech to text and the language model on
//! servers that speak the OpenAI HTTP API (vLLM, SGLang, TGI, llama.cpp's
//! `llama-server`, a faster-whisper server), as one more backend of each
//! engine trait ([`voxline_stt::SpeechToText`], [`voxline_llm::ChatBackend`]).
//! The pipeline around them is the same: VAD, turn-taking, speculation, the
//! voice, the budget and the bottleneck stay in voxline, and the runtime
//! times the stages as it does the local engines.
//!
//! The crate's parts: a server's address and key ([`Endpoint`], [`ApiKey`]),
//! the client that talks to it with its waits ([`Client`], [`Timeouts`]) and
//! its start-up check ([`Client::check_model`]); the language model
//! ([`RemoteChat`], streaming `POST /v1/chat/completions`); speech to text
//! ([`RemoteStt`], `POST /v1/audio/transcriptions`); their errors
//! ([`RemoteError`]), each naming the server and never the key.
//!
//! The client is blocking (ureq; https through rustls): each stage computes
//! on its own thread, and a request waits there as an engine call would.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod chat;
mod endpoint;
mod error;
mod sse;
mod transcribe;

pub use chat::{answer_byte_limit, ChatOptions, RemoteChat, MAX_BYTES_PER_TOKEN};
pub use endpoint::{ApiKey, Client, Endpoint, Timeouts};
pub use error::RemoteError;
pub use sse::{MAX_EVENT_BYTES, MAX_LINE_BYTES};
pub use transcribe::{
    transcript_char_limit, RemoteStt, SttOptions, MAX_TRANSCRIPT_CHARS_PER_S,
    MIN_TRANSCRIPT_CHAR_LIMIT,
};
