//! What a run was configured with, as the report records it (`config` in
//! `report.json`): built from the engine settings, then completed with
//! what the pipeline ran.

use std::path::PathBuf;

use serde::Serialize;

/// What the run was configured with (for comparing runs).
#[derive(Debug, Clone, Serialize, Default)]
pub struct RunConfig {
    /// Pacing: `realtime`, `fast` or `live`.
    pub pace: voxline_pipeline::pipeline::Pace,
    /// Threads in all / whisper / LLM.
    pub threads: [usize; 3],
    /// `split`, `shared` (engines take turns on all threads) or `priority` (take turns, critical path first).
    pub cpu_share: voxline_pipeline::settings::CpuShare,
    /// whisper encoder window policy.
    pub audio_ctx: String,
    /// Max tokens per answer.
    pub max_tokens: u32,
    /// LLM context.
    pub n_ctx: u32,
    /// System prompt / history KV reuse.
    pub cache_prompt: bool,
    /// Multi-turn memory.
    pub memory: bool,
    /// The speech-to-text backend (`whisper`, `remote`).
    pub stt_backend: String,
    /// The language model's backend (`llama`, `remote`).
    pub llm_backend: String,
    /// The speech server, `host:port`, when speech to text is remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stt_server: Option<String>,
    /// The language model's server, `host:port`, when it is remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_server: Option<String>,
    /// The voice that spoke the answers (`piper`, `espeak`), if any.
    pub voice: Option<String>,
    /// whisper model file name (a remote engine's: the model asked for).
    pub whisper_model: String,
    /// LLM file name (a remote engine's: the model asked for).
    pub llm_model: String,
    /// Inputs.
    pub inputs: Vec<PathBuf>,
    /// Warm-up turns excluded.
    pub warmup: usize,
    /// Silence put between two replayed recordings, ms (`--think-ms`,
    /// raised with the semantic end of turn); `null` for live audio.
    pub gap_ms: Option<u32>,
    /// Silence that ends a turn, ms.
    pub hangover_ms: u32,
    /// Silence after which a turn is sent early (speculation), ms; `null` = off.
    pub spec_silence_ms: Option<u32>,
    /// The semantic end of turn's policy; `null` = off (silence alone ends a turn).
    pub semantic_turn: Option<voxline_audio::turn::TurnPolicy>,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Sampling seed.
    pub seed: u32,
}

impl RunConfig {
    /// Records what the pipeline ran with: the hangover, the speculative
    /// silence that took effect and the semantic end of turn's policy.
    pub fn record_pipeline(&mut self, pipeline: &voxline_pipeline::pipeline::PipelineConfig) {
        self.hangover_ms = pipeline.vad.hangover_ms;
        self.spec_silence_ms = pipeline.speculation();
        self.semantic_turn = pipeline.semantic_turn.as_ref().map(|(_, p)| *p);
    }

    /// The configuration of a run with these engine settings.
    #[must_use]
    pub fn from_settings(
        settings: &voxline_pipeline::settings::EngineSettings,
        pace: voxline_pipeline::pipeline::Pace,
        inputs: Vec<PathBuf>,
        warmup: usize,
    ) -> Self {
        let name = |p: &std::path::Path| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        };
        Self {
            pace,
            threads: [
                settings.threads.total,
                settings.threads.stt,
                settings.threads.llm,
            ],
            cpu_share: settings.threads.share,
            audio_ctx: settings
                .whisper()
                .map_or_else(|| "server".to_owned(), |w| w.audio_ctx.to_string()),
            max_tokens: settings.max_tokens,
            n_ctx: settings.llm.n_ctx(),
            // a remote conversation sends its prefix byte for byte: the server's cache decides
            cache_prompt: settings.llama().is_none_or(|l| l.cache_prompt),
            memory: settings.memory,
            stt_backend: settings.stt.name().into(),
            llm_backend: settings.llm.name().into(),
            stt_server: settings
                .stt
                .remote()
                .map(|r| r.endpoint.server().to_owned()),
            llm_server: settings
                .llm
                .remote()
                .map(|r| r.endpoint.server().to_owned()),
            voice: None,
            whisper_model: match (settings.stt.model(), settings.stt.remote()) {
                (Some(p), _) => name(p),
                (None, r) => r.and_then(|r| r.model.clone()).unwrap_or_default(),
            },
            llm_model: match (settings.llm.model(), settings.llm.remote()) {
                (Some(p), _) => name(p),
                (None, r) => r.and_then(|r| r.model.clone()).unwrap_or_default(),
            },
            inputs,
            warmup,
            // through its shortest decimal form, so 0.7 is written 0.7, not 0.699999988
            temperature: settings
                .sampling
                .temperature
                .to_string()
                .parse()
                .unwrap_or_default(),
            seed: settings.sampling.seed,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxline_pipeline::settings::{
        EngineSettings, LlamaSettings, LlmBackend, SttBackend, ThreadBudget, WhisperSettings,
    };

    #[test]
    fn a_run_config_names_the_models_by_file_and_keeps_the_shortest_temperature() {
        let threads = ThreadBudget::priority(Some(2)).expect("a budget");
        let settings = EngineSettings {
            stt: SttBackend::Whisper(WhisperSettings {
                model: PathBuf::from("models/ggml-tiny.en-q8_0.bin"),
                audio_ctx: voxline_stt::AudioCtx::Auto { pad: 64 },
                gpu: false,
                flash_attn: false,
                beam: 1,
            }),
            llm: LlmBackend::Llama(LlamaSettings {
                model: PathBuf::from("downloads/llm/SmolLM2.gguf"),
                n_gpu_layers: 0,
                n_ctx: 2048,
                cache_prompt: true,
            }),
            threads,
            max_tokens: 48,
            system_prompt: String::new(),
            memory: false,
            sampling: voxline_llm::Sampling {
                temperature: 0.7,
                seed: 7,
                ..voxline_llm::Sampling::default()
            },
        };
        let c = RunConfig::from_settings(
            &settings,
            voxline_pipeline::pipeline::Pace::Fast,
            vec!["a.wav".into()],
            2,
        );
        assert_eq!(c.pace, voxline_pipeline::pipeline::Pace::Fast);
        assert_eq!(c.threads, [threads.total, threads.stt, threads.llm]);
        assert_eq!(c.cpu_share, voxline_pipeline::settings::CpuShare::Priority);
        assert_eq!(c.audio_ctx, "auto+64");
        assert_eq!((c.max_tokens, c.n_ctx), (48, 2048));
        assert!(c.cache_prompt && !c.memory);
        assert_eq!(c.whisper_model, "ggml-tiny.en-q8_0.bin");
        assert_eq!(
            (c.stt_backend.as_str(), c.llm_backend.as_str()),
            ("whisper", "llama")
        );
        assert_eq!(c.llm_model, "SmolLM2.gguf");
        assert_eq!(c.inputs, [PathBuf::from("a.wav")]);
        assert_eq!(c.warmup, 2);
        // 0.7 as f32 is 0.699999988; the report says what was asked
        assert_eq!(c.temperature, 0.7);
        assert_eq!(c.seed, 7);
        // not taken from the engine settings
        assert_eq!((c.hangover_ms, c.spec_silence_ms), (0, None));
    }
}
