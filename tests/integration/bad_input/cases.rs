//! The table of bad inputs: one row each. A row's `setup` makes what it needs
//! in its own scratch directory and returns the arguments; `expect` lists the
//! words its one error line must hold (the file or flag, and the problem).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;

use voxline_models::registry::{self, Role};

use super::bytes::{head, pseudo_random, tone, wav_bytes, Fmt};
use super::{good_wav, set_flag, Case, Scratch};
use crate::util;

const PCM16: Fmt = Fmt::PCM16_MONO_16K;

/// The good fixture's bytes, to corrupt or to pair with a bad sidecar.
fn q_capital() -> Vec<u8> {
    std::fs::read(good_wav()).unwrap()
}

/// The good fixture with `bytes` written over it at `at`.
fn q_capital_with(at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut b = q_capital();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    b
}

/// A copy of the good fixture as `NAME.wav` beside the sidecar `NAME.json`
/// holding `json`; returns the replay arguments.
fn with_sidecar(s: &Scratch, name: &str, json: &str) -> Vec<std::ffi::OsString> {
    let wav = s.put(format!("{name}.wav"), &q_capital());
    s.put(format!("{name}.json"), json.as_bytes());
    s.replay(wav, &[])
}

/// Every bad input, in the order they run.
#[allow(clippy::too_many_lines)] // a table: one row per case
pub(super) fn cases() -> Vec<Case> {
    let whisper = registry::for_role(Role::Stt).file;
    let gguf = registry::for_role(Role::Llm).file;
    vec![
        // ---- audio
        Case {
            name: "empty file",
            setup: |s| s.replay(s.put("empty.wav", b""), &[]),
            expect: vec!["empty.wav", "empty"],
            ..Case::ONE_LINE
        },
        Case {
            name: "header only, data size 0",
            setup: |s| {
                let wav = wav_bytes(PCM16, &[], None, None);
                s.replay(s.put("header_only_zero_data.wav", &wav), &[])
            },
            expect: vec!["header_only_zero_data.wav", "no audio"],
            ..Case::ONE_LINE
        },
        Case {
            // a real header that declares audio the file does not hold
            name: "44-byte header claiming data, none present",
            setup: |s| s.replay(s.put("header_claiming_data.wav", &q_capital()[..44]), &[]),
            expect: vec!["header_claiming_data.wav", "no audio"],
            ..Case::ONE_LINE
        },
        Case {
            name: "wrong magic",
            setup: |s| s.replay(s.put("wrong_magic.wav", &q_capital_with(0, b"XQZW")), &[]),
            expect: vec!["wrong_magic.wav", "riff"],
            ..Case::ONE_LINE
        },
        Case {
            name: "big-endian RIFX",
            setup: |s| s.replay(s.put("rifx.wav", &q_capital_with(0, b"RIFX")), &[]),
            expect: vec!["rifx.wav", "rifx"],
            ..Case::ONE_LINE
        },
        Case {
            name: "RIFF but not WAVE",
            setup: |s| s.replay(s.put("riff_not_wave.wav", &q_capital_with(8, b"AVI ")), &[]),
            expect: vec!["riff_not_wave.wav", "wave"],
            ..Case::ONE_LINE
        },
        Case {
            name: "text file named .wav",
            setup: |s| s.replay(s.put("notes.wav", NOTES), &[]),
            expect: vec!["notes.wav", "wav"],
            ..Case::ONE_LINE
        },
        Case {
            name: "random bytes named .wav",
            setup: |s| s.replay(s.put("random.wav", &pseudo_random(64 * 1024, 0x5eed)), &[]),
            expect: vec!["random.wav", "wav"],
            ..Case::ONE_LINE
        },
        Case {
            name: "0 channels",
            setup: |s| {
                let wav = wav_bytes(
                    Fmt {
                        channels: 0,
                        ..PCM16
                    },
                    &tone(),
                    None,
                    None,
                );
                s.replay(s.put("zero_channels.wav", &wav), &[])
            },
            expect: vec!["zero_channels.wav", "0 channels"],
            ..Case::ONE_LINE
        },
        Case {
            name: "0 Hz",
            setup: |s| {
                let wav = wav_bytes(Fmt { rate: 0, ..PCM16 }, &tone(), None, None);
                s.replay(s.put("zero_hz.wav", &wav), &[])
            },
            expect: vec!["zero_hz.wav", "sample rate"],
            ..Case::ONE_LINE
        },
        Case {
            name: "1 Hz (too low to hold speech)",
            setup: |s| {
                let wav = wav_bytes(Fmt { rate: 1, ..PCM16 }, &tone(), None, None);
                s.replay(s.put("one_hz.wav", &wav), &[])
            },
            expect: vec!["one_hz.wav", "1 Hz", "4000"],
            ..Case::ONE_LINE
        },
        Case {
            name: "`-` (standard input) twice",
            setup: |s| {
                let mut a = s.replay("-", &[]);
                a.insert(2, "-".into());
                a
            },
            expect: vec!["standard input", "once"],
            ..Case::ONE_LINE
        },
        Case {
            name: "empty standard input",
            setup: |s| s.replay("-", &[]),
            expect: vec!["standard input", "empty"],
            ..Case::ONE_LINE
        },
        Case {
            name: "10 MHz",
            setup: |s| {
                let fmt = Fmt {
                    rate: 10_000_000,
                    ..PCM16
                };
                s.replay(
                    s.put("ten_mhz.wav", &wav_bytes(fmt, &tone(), None, None)),
                    &[],
                )
            },
            expect: vec!["ten_mhz.wav", "10000000"],
            ..Case::ONE_LINE
        },
        Case {
            name: "300 channels",
            setup: |s| {
                let fmt = Fmt {
                    channels: 300,
                    ..PCM16
                };
                let wav = wav_bytes(fmt, &pseudo_random(600 * 40, 3), None, None);
                s.replay(s.put("300_channels.wav", &wav), &[])
            },
            expect: vec!["300_channels.wav", "300 channels"],
            ..Case::ONE_LINE
        },
        Case {
            name: "A-law",
            setup: |s| {
                let wav = coded(6, 8, &pseudo_random(16_000, 4));
                s.replay(s.put("alaw.wav", &wav), &[])
            },
            expect: vec!["alaw.wav", "a-law"],
            ..Case::ONE_LINE
        },
        Case {
            name: "mu-law",
            setup: |s| {
                let wav = coded(7, 8, &pseudo_random(16_000, 5));
                s.replay(s.put("mulaw.wav", &wav), &[])
            },
            expect: vec!["mulaw.wav", "law"],
            ..Case::ONE_LINE
        },
        Case {
            name: "MS ADPCM",
            setup: |s| {
                let wav = coded(2, 4, &pseudo_random(8000, 6));
                s.replay(s.put("ms_adpcm.wav", &wav), &[])
            },
            expect: vec!["ms_adpcm.wav", "adpcm"],
            ..Case::ONE_LINE
        },
        Case {
            name: "12-bit PCM",
            setup: |s| {
                let wav = wav_bytes(Fmt { bits: 12, ..PCM16 }, &tone(), None, None);
                s.replay(s.put("12bit.wav", &wav), &[])
            },
            expect: vec!["12bit.wav", "12-bit"],
            ..Case::ONE_LINE
        },
        Case {
            name: "64-bit float",
            setup: |s| {
                let data: Vec<u8> = (0..16_000)
                    .flat_map(|i| (f64::from(i) * 0.01).sin().to_le_bytes())
                    .collect();
                s.replay(s.put("float64.wav", &coded(3, 64, &data)), &[])
            },
            expect: vec!["float64.wav", "64-bit"],
            ..Case::ONE_LINE
        },
        Case {
            name: "no data chunk",
            setup: |s| {
                // a valid `fmt ` chunk and no `data` chunk at all
                let full = wav_bytes(PCM16, &[], None, None);
                let mut b = full[..36].to_vec();
                b[4..8].copy_from_slice(&28u32.to_le_bytes());
                s.replay(s.put("no_data_chunk.wav", &b), &[])
            },
            expect: vec!["no_data_chunk.wav", "data"],
            ..Case::ONE_LINE
        },
        Case {
            name: "non-UTF-8 file name",
            setup: |s| {
                let name = OsStr::from_bytes(b"bad-\xff\xfe-name.wav");
                s.replay(s.put(name, &pseudo_random(4096, 7)), &[])
            },
            expect: vec!["bad-", "-name.wav"],
            ..Case::ONE_LINE
        },
        Case {
            name: "missing path",
            setup: |s| s.replay(s.path("does-not-exist.wav"), &[]),
            expect: vec!["does-not-exist.wav", "no such file"],
            ..Case::ONE_LINE
        },
        Case {
            name: "directory as the file",
            setup: |s| s.replay(s.mkdir("a-directory.wav"), &[]),
            expect: vec!["a-directory.wav", "directory"],
            ..Case::ONE_LINE
        },
        // ---- sidecars that do not match their audio (beside copies of a good fixture)
        Case {
            name: "sidecar: end_sample past the audio",
            setup: |s| {
                with_sidecar(
                    s,
                    "late_end",
                    r#"{"sample_rate":16000,"turns":[{"text":"What is the capital of France?","start_sample":8000,"end_sample":999999999}]}"#,
                )
            },
            expect: vec!["late_end.json", "end_sample", "past the end"],
            ..Case::ONE_LINE
        },
        Case {
            name: "sidecar: another sample rate",
            setup: |s| {
                with_sidecar(
                    s,
                    "other_rate",
                    r#"{"sample_rate":44100,"turns":[{"text":"What is the capital of France?","start_sample":8000,"end_sample":35577}]}"#,
                )
            },
            expect: vec!["other_rate.json", "sample_rate", "16000 hz"],
            ..Case::ONE_LINE
        },
        Case {
            name: "sidecar: a directory",
            setup: |s| {
                let wav = s.put("dir_sidecar.wav", &q_capital());
                s.mkdir("dir_sidecar.json");
                s.replay(wav, &[])
            },
            expect: vec![
                "dir_sidecar.json",
                "sidecar",
                "is a directory, not a json file",
            ],
            ..Case::ONE_LINE
        },
        // ---- models
        Case {
            name: "missing whisper model",
            setup: |s| s.replay_good(&[&"--whisper-model", &"/nonexistent/ggml.bin"]),
            expect: vec!["/nonexistent/ggml.bin", "--whisper-model"],
            ..Case::ONE_LINE
        },
        Case {
            name: "truncated whisper model",
            setup: |s| {
                let m = s.put("ggml-truncated.bin", &head(&util::whisper_model(), 1 << 20));
                s.replay_good(&[&"--whisper-model", &m])
            },
            expect: vec!["ggml-truncated.bin", "whisper"],
            ..Case::ONE_LINE
        },
        Case {
            name: "truncated GGUF",
            setup: |s| {
                let m = s.put("truncated.gguf", &head(&util::llm_model(), 1 << 20));
                s.replay_good(&[&"--llm-model", &m])
            },
            expect: vec!["truncated.gguf", "gguf"],
            ..Case::ONE_LINE
        },
        Case {
            name: "GGUF as the whisper model",
            setup: |s| s.replay_good(&[&"--whisper-model", &util::llm_model()]),
            expect: vec![gguf, "gguf", "whisper"],
            ..Case::ONE_LINE
        },
        Case {
            name: "whisper model as the LLM",
            setup: |s| s.replay_good(&[&"--llm-model", &util::whisper_model()]),
            expect: vec![whisper, "gguf"],
            ..Case::ONE_LINE
        },
        Case {
            name: "text file as the whisper model",
            setup: |s| s.replay_good(&[&"--whisper-model", &s.put("model.bin", NOT_A_MODEL)]),
            expect: vec!["model.bin", "whisper"],
            ..Case::ONE_LINE
        },
        Case {
            name: "text file as the LLM",
            setup: |s| s.replay_good(&[&"--llm-model", &s.put("model.bin", NOT_A_MODEL)]),
            expect: vec!["model.bin", "gguf"],
            ..Case::ONE_LINE
        },
        // ---- budgets
        Case {
            name: "budget: TOML syntax error",
            setup: |s| budget(s, "syntax.toml", b"[response_latency_ms\np50 = 2500\n"),
            expect: vec!["syntax.toml"],
            ..Case::ONE_LINE
        },
        Case {
            name: "budget: unknown key",
            setup: |s| budget(s, "unknown.toml", b"[max]\nerorrs = 0\n"),
            expect: vec!["unknown.toml", "erorrs"],
            ..Case::ONE_LINE
        },
        Case {
            name: "budget: wrong type",
            setup: |s| budget(s, "type.toml", b"[response_latency_ms]\np50 = \"fast\"\n"),
            expect: vec!["type.toml", "invalid type"],
            ..Case::ONE_LINE
        },
        Case {
            name: "budget: negative limit",
            setup: |s| budget(s, "negative.toml", b"[response_latency_ms]\np50 = -5\n"),
            expect: vec!["negative.toml", "response_latency_ms.p50 = -5", "from 0 up"],
            ..Case::ONE_LINE
        },
        Case {
            name: "budget: NaN latency limit",
            setup: |s| budget(s, "nan.toml", b"[response_latency_ms]\np50 = nan\n"),
            expect: vec!["nan.toml", "response_latency_ms.p50 = nan"],
            ..Case::ONE_LINE
        },
        Case {
            name: "budget: NaN tokens/s limit",
            setup: |s| budget(s, "tps_nan.toml", b"[min]\nllm_decode_tps = nan\n"),
            expect: vec!["tps_nan.toml", "min.llm_decode_tps = nan"],
            ..Case::ONE_LINE
        },
        Case {
            name: "budget: missing file",
            setup: |s| s.replay_good(&[&"--budget", &s.path("no-budget.toml")]),
            expect: vec!["no-budget.toml"],
            ..Case::ONE_LINE
        },
        // ---- flags
        Case {
            name: "unknown flag",
            setup: |s| s.replay_good(&[&"--bogus-flag"]),
            expect: vec!["--bogus-flag"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--threads not a number",
            setup: |s| s.replay_good(&[&"--threads", &"two"]),
            expect: vec!["--threads", "two"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--threads 0",
            setup: |s| s.replay_good(&[&"--threads", &"0"]),
            expect: vec!["--threads 0"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--stt-threads above --threads",
            setup: |s| s.replay_good(&[&"--threads", &"2", &"--stt-threads", &"5"]),
            expect: vec!["--stt-threads"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--pace sideways",
            setup: |s| set_flag(s.replay_good(&[]), "--pace", "sideways"),
            expect: vec!["--pace", "sideways", "realtime", "fast"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--audio-ctx 5000",
            setup: |s| s.replay_good(&[&"--audio-ctx", &"5000"]),
            expect: vec!["--audio-ctx", "5000"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--audio-ctx auto+4294967295",
            setup: |s| s.replay_good(&[&"--audio-ctx", &"auto+4294967295"]),
            expect: vec!["--audio-ctx", "auto+4294967295", "at most 1500", "full"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--cpu-share sometimes",
            setup: |s| s.replay_good(&[&"--cpu-share", &"sometimes"]),
            expect: vec!["--cpu-share", "sometimes", "split", "shared"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--temperature -1",
            setup: |s| s.replay_good(&[&"--temperature", &"-1"]),
            expect: vec!["--temperature -1", "from 0 (greedy"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--temperature=-1",
            setup: |s| s.replay_good(&[&"--temperature=-1"]),
            expect: vec!["--temperature -1", "from 0 (greedy"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--seed past 32 bits",
            setup: |s| s.replay_good(&[&"--seed", &"18446744073709551615"]),
            expect: vec!["--seed 18446744073709551615", "0 to 4294967295"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--vad-threshold -0.5",
            setup: |s| s.replay_good(&[&"--vad-threshold", &"-0.5"]),
            expect: vec!["threshold", "-0.5", "[0, 1]"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--spec-threshold -0.5",
            setup: |s| s.replay_good(&[&"--spec-threshold", &"-0.5"]),
            expect: vec!["spec_threshold", "-0.5", "[0, 1]"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--hangover-ms -5",
            setup: |s| s.replay_good(&[&"--hangover-ms", &"-5"]),
            expect: vec!["--hangover-ms -5"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--temperature nan",
            setup: |s| s.replay_good(&[&"--temperature", &"nan"]),
            expect: vec!["--temperature nan", "from 0 (greedy"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--temperature 3",
            setup: |s| s.replay_good(&[&"--temperature", &"3"]),
            expect: vec!["--temperature 3", "to 2"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--ctx 4000000000",
            setup: |s| s.replay_good(&[&"--ctx", &"4000000000"]),
            expect: vec!["--ctx 4000000000", "8192"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--ctx 10",
            setup: |s| s.replay_good(&[&"--ctx", &"10"]),
            expect: vec!["--ctx 10", "at least 64"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--max-tokens 0",
            setup: |s| s.replay_good(&[&"--max-tokens", &"0"]),
            expect: vec!["--max-tokens 0"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--max-tokens above --ctx",
            setup: |s| s.replay_good(&[&"--max-tokens", &"4096", &"--ctx", &"2048"]),
            expect: vec!["--max-tokens 4096 with --ctx 2048"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--vad-threshold 7",
            setup: |s| s.replay_good(&[&"--vad-threshold", &"7"]),
            expect: vec!["threshold"],
            ..Case::ONE_LINE
        },
        // ---- outputs that cannot be written (root ignores permissions: a
        // regular file as a parent, or /proc)
        Case {
            name: "--report-json into a missing directory",
            setup: |s| {
                let to = s.path("no-such-dir").join("report.json");
                set_flag(s.replay_good(&[]), "--report-json", to)
            },
            expect: vec!["--report-json", "no-such-dir"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--report-json under a regular file",
            setup: |s| {
                let to = s.put("somefile.txt", PLAIN).join("report.json");
                set_flag(s.replay_good(&[]), "--report-json", to)
            },
            expect: vec!["--report-json", "somefile.txt"],
            ..Case::ONE_LINE
        },
        Case {
            name: "--report-json under /proc",
            setup: |s| {
                let to = "/proc/voxline-report.json";
                set_flag(s.replay_good(&[]), "--report-json", to)
            },
            expect: vec!["--report-json", "/proc/voxline-report.json"],
            ..Case::ONE_LINE
        },
        Case {
            // a file that is there but is the kernel's: it said "No such
            // file or directory"
            name: "--voice-out /proc/version",
            setup: |s| s.replay_good(&[&"--voice-out", &"/proc/version"]),
            expect: vec![
                "--voice-out",
                "/proc/version",
                "the kernel's proc filesystem",
                "cannot be replaced",
            ],
            ..Case::ONE_LINE
        },
        Case {
            name: "--events under a regular file",
            setup: |s| {
                let to = s.put("somefile.txt", PLAIN).join("events.jsonl");
                set_flag(s.replay_good(&[]), "--events", to)
            },
            expect: vec!["--events", "somefile.txt"],
            ..Case::ONE_LINE
        },
        // ---- bench
        Case {
            name: "bench --fixtures an empty directory",
            setup: |s| s.bench(&[&"--fixtures", &s.mkdir("no-fixtures")]),
            expect: vec!["no-fixtures", "no .wav"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --baseline not JSON",
            setup: |s| baseline(s, "baseline.json", b"p50 = 12 ms, looked fine\n"),
            expect: vec!["baseline.json"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --baseline of another schema version",
            setup: |s| {
                baseline(
                    s,
                    "schema1.json",
                    br#"{"schema_version": 1, "summary": {}}"#,
                )
            },
            expect: vec!["schema1.json", "schema version 1", "writes version 3"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --baseline without a schema version",
            setup: |s| baseline(s, "noschema.json", br#"{"summary": {}}"#),
            expect: vec!["noschema.json", "has no schema_version"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --repeat 0",
            setup: |s| s.bench(&[&"--fixtures", &good_wav(), &"--repeat", &"0"]),
            expect: vec!["--repeat 0"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --think-ms past a minute",
            setup: |s| s.bench(&[&"--fixtures", &good_wav(), &"--think-ms", &"60001"]),
            expect: vec!["--think-ms 60001", "at most 60000 ms"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --fixtures a bad WAV",
            setup: |s| s.bench(&[&"--fixtures", &s.put("notes.wav", NOTES)]),
            expect: vec!["notes.wav"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --sessions 0",
            setup: |s| s.bench(&[&"--fixtures", &good_wav(), &"--sessions", &"0"]),
            expect: vec!["--sessions 0", "1 to 64"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --sessions with --baseline",
            setup: |s| {
                let base = s.put("base.json", b"{}");
                s.bench(&[
                    &"--fixtures",
                    &good_wav(),
                    &"--sessions",
                    &"2",
                    &"--baseline",
                    &base,
                ])
            },
            expect: vec!["--baseline", "--sessions"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --sessions on a recording without a sidecar",
            setup: |s| {
                let wav = s.put("no_sidecar.wav", &q_capital());
                s.bench(&[&"--fixtures", &wav, &"--sessions", &"1"])
            },
            expect: vec!["no_sidecar.wav", "no sidecar"],
            ..Case::ONE_LINE
        },
        Case {
            name: "bench --via an address that is not ws://",
            setup: |s| {
                let mut a = vec![
                    super::os("bench"),
                    super::os("--out"),
                    super::os(s.out.join("bench")),
                ];
                a.extend(super::models_args());
                a.extend(
                    [
                        &"--fixtures" as &dyn AsRef<OsStr>,
                        &good_wav(),
                        &"--sessions",
                        &"1",
                        &"--via",
                        &"http://127.0.0.1:1",
                    ]
                    .iter()
                    .map(super::os),
                );
                a
            },
            expect: vec!["http://127.0.0.1:1", "ws://"],
            ..Case::ONE_LINE
        },
        // ---- serve (refused before any model loads or any port is bound)
        Case {
            name: "serve --listen without a port",
            setup: |s| s.serve(&[&"--listen", &"localhost"]),
            expect: vec!["--listen localhost", "address and port"],
            ..Case::ONE_LINE
        },
        Case {
            name: "serve on a non-local address without a token",
            setup: |s| s.serve(&[&"--listen", &"0.0.0.0:8787"]),
            expect: vec!["--listen 0.0.0.0:8787", "needs --token"],
            ..Case::ONE_LINE
        },
        Case {
            name: "serve --token too short",
            setup: |s| s.serve(&[&"--token", &"secret"]),
            expect: vec!["--token", "16 characters"],
            ..Case::ONE_LINE
        },
        Case {
            name: "serve --max-sessions 0",
            setup: |s| s.serve(&[&"--max-sessions", &"0"]),
            expect: vec!["--max-sessions 0", "1 to 64"],
            ..Case::ONE_LINE
        },
        Case {
            name: "serve --client-queue past what a queue can hold",
            setup: |s| s.serve(&[&"--client-queue", &"18446744073709551615"]),
            expect: vec!["--client-queue 18446744073709551615", "1 to 1048576"],
            ..Case::ONE_LINE
        },
        Case {
            name: "serve --max-connections below the sessions and the spare",
            setup: |s| s.serve(&[&"--max-connections", &"10"]),
            expect: vec!["--max-connections 10", "16 (--max-sessions + 8"],
            ..Case::ONE_LINE
        },
        Case {
            name: "serve --header-timeout-s 0",
            setup: |s| s.serve(&[&"--header-timeout-s", &"0"]),
            expect: vec!["--header-timeout-s 0", "1 to 86400"],
            ..Case::ONE_LINE
        },
        // ---- live (fails on the flag before any audio device is opened)
        Case {
            name: "live --max-duration soon",
            setup: |s| {
                let events = s.out.join("events.jsonl");
                s.live(&[&"--max-duration", &"soon", &"--events", &events])
            },
            expect: vec!["--max-duration", "soon"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --max-duration 0s, 0 and 1ns (over before a word is heard)",
            setup: |s| s.live(&[&"--max-duration", &"1ns"]),
            expect: vec!["--max-duration 1ns", "at least 1s"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --max-duration 0",
            setup: |s| s.live(&[&"--max-duration", &"0"]),
            expect: vec!["--max-duration 0", "at least 1s"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --no-aec with no voice (it acts on the voice alone)",
            setup: |s| s.live(&[&"--no-aec"]),
            expect: vec!["--no-aec with no voice", "--voice"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --noise-suppression with no voice",
            setup: |s| s.live(&[&"--noise-suppression"]),
            expect: vec!["--noise-suppression with no voice", "--voice"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --barge-in-threshold with no voice",
            setup: |s| s.live(&[&"--barge-in-threshold", &"0.9"]),
            expect: vec!["--barge-in-threshold with no voice", "--voice"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --output-device with no voice",
            setup: |s| s.live(&[&"--output-device", &"default"]),
            expect: vec!["--output-device with no voice", "--voice"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --no-barge-in with --barge-in-ms (contradictory)",
            setup: |s| {
                s.live(&[
                    &"--voice",
                    &"espeak",
                    &"--no-barge-in",
                    &"--barge-in-ms",
                    &"300",
                ])
            },
            expect: vec!["--no-barge-in", "--barge-in-ms"],
            ..Case::ONE_LINE
        },
        Case {
            name: "replay --semantic-turn --no-semantic-turn (contradictory)",
            setup: |s| s.replay_good(&[&"--semantic-turn", &"--no-semantic-turn"]),
            expect: vec!["--semantic-turn", "--no-semantic-turn"],
            ..Case::ONE_LINE
        },
        Case {
            name: "replay --no-semantic-turn with --turn-threshold nan (sets what is off)",
            setup: |s| s.replay_good(&[&"--no-semantic-turn", &"--turn-threshold", &"nan"]),
            expect: vec!["--no-semantic-turn", "--turn-threshold"],
            ..Case::ONE_LINE
        },
        Case {
            name: "replay --no-semantic-turn with --turn-model (a file that is not there)",
            setup: |s| s.replay_good(&[&"--no-semantic-turn", &"--turn-model", &"nowhere.onnx"]),
            expect: vec!["--no-semantic-turn", "--turn-model"],
            ..Case::ONE_LINE
        },
        Case {
            name: "replay --no-semantic-turn with --no-turn-words",
            setup: |s| s.replay_good(&[&"--no-turn-words", &"--no-semantic-turn"]),
            expect: vec!["--no-semantic-turn", "--no-turn-words"],
            ..Case::ONE_LINE
        },
        Case {
            name: "replay --no-speculation with --turn-merge-ms (taking back needs speculation)",
            setup: |s| s.replay_good(&[&"--no-speculation", &"--turn-merge-ms", &"2000"]),
            expect: vec!["--no-speculation", "--turn-merge-ms"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --max-turns 0",
            setup: |s| s.live(&[&"--max-turns", &"0"]),
            expect: vec!["--max-turns"],
            ..Case::ONE_LINE
        },
        Case {
            name: "live --capture-buffer-ms 0",
            setup: |s| s.live(&[&"--capture-buffer-ms", &"0"]),
            expect: vec!["--capture-buffer-ms", "1 to 1000"],
            ..Case::ONE_LINE
        },
    ]
}

/// Text in a file named `.wav`.
const NOTES: &[u8] = b"These are meeting notes, not audio.\nSecond line.\n";

/// Text given as a model.
const NOT_A_MODEL: &[u8] = b"this is not a model\n";

/// A regular file, made the parent of an output.
const PLAIN: &[u8] = b"a regular file\n";

/// A 16 kHz mono WAV of `data` in another coding (`format_tag`, `bits`).
fn coded(format_tag: u16, bits: u16, data: &[u8]) -> Vec<u8> {
    let fmt = Fmt {
        format_tag,
        bits,
        ..PCM16
    };
    wav_bytes(fmt, data, None, None)
}

/// A replay of the good fixture with the budget file `name` holding `toml`.
fn budget(s: &Scratch, name: &str, toml: &[u8]) -> Vec<std::ffi::OsString> {
    s.replay_good(&[&"--budget", &s.put(name, toml)])
}

/// A bench of the good fixture against the baseline file `name` holding `json`.
fn baseline(s: &Scratch, name: &str, json: &[u8]) -> Vec<std::ffi::OsString> {
    s.bench(&[
        &"--fixtures",
        &good_wav(),
        &"--baseline",
        &s.put(name, json),
    ])
}
