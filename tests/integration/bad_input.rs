//! The bad-input corpus: every malformed file, model or flag must end the
//! binary with exit code 2, one `voxline:` line on stderr that names the
//! file or flag and the problem, no panic, and nothing half-written.
//!
//! The bad files are generated here (hand-written RIFF headers, raw bytes,
//! cut-down copies of the installed models) in a temporary directory.
//! Also: odd but valid audio (silence, noise, clipping) must run cleanly, and
//! a long file must stream in bounded memory.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use crate::util;

// ---------------------------------------------------------------- WAV bytes

/// A WAV `fmt ` description written by hand, so that any field can be wrong.
#[derive(Clone, Copy)]
struct Fmt {
    format_tag: u16,
    channels: u16,
    rate: u32,
    bits: u16,
}

impl Fmt {
    const PCM16_MONO_16K: Fmt = Fmt {
        format_tag: 1,
        channels: 1,
        rate: 16_000,
        bits: 16,
    };
}

/// A RIFF/WAVE file: `fmt ` then `data`. `data_len` overrides the declared
/// data size (to claim more than is present); `riff_len` the RIFF size.
fn wav_bytes(fmt: Fmt, data: &[u8], data_len: Option<u32>, riff_len: Option<u32>) -> Vec<u8> {
    let bytes_per_sample = u32::from(fmt.bits).div_ceil(8);
    let block_align = u32::from(fmt.channels) * bytes_per_sample;
    let mut body = Vec::with_capacity(36 + data.len());
    body.extend_from_slice(b"WAVE");
    body.extend_from_slice(b"fmt ");
    body.extend_from_slice(&16u32.to_le_bytes());
    body.extend_from_slice(&fmt.format_tag.to_le_bytes());
    body.extend_from_slice(&fmt.channels.to_le_bytes());
    body.extend_from_slice(&fmt.rate.to_le_bytes());
    body.extend_from_slice(&fmt.rate.wrapping_mul(block_align).to_le_bytes());
    body.extend_from_slice(&(block_align as u16).to_le_bytes());
    body.extend_from_slice(&fmt.bits.to_le_bytes());
    body.extend_from_slice(b"data");
    let declared = data_len.unwrap_or(data.len() as u32);
    body.extend_from_slice(&declared.to_le_bytes());
    body.extend_from_slice(data);
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&riff_len.unwrap_or(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// 16 kHz mono 16-bit PCM from samples in [-1, 1].
fn pcm16_wav(samples: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = samples
        .iter()
        .flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
        .collect();
    wav_bytes(Fmt::PCM16_MONO_16K, &data, None, None)
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failing case can be replayed.
fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// The first `n` bytes of a file.
fn head(path: &Path, n: usize) -> Vec<u8> {
    use std::io::Read as _;
    let mut buf = Vec::with_capacity(n);
    std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .take(n as u64)
        .read_to_end(&mut buf)
        .unwrap();
    buf
}

// ---------------------------------------------------------------- running

fn os(s: impl AsRef<OsStr>) -> OsString {
    s.as_ref().to_os_string()
}

/// Runs the binary from the repository root with the given arguments.
fn voxline(args: &[OsString]) -> Output {
    util::voxline_bin()
        .current_dir(util::root())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the voxline binary runs")
}

/// Every entry below `dir` (files and directories), relative paths.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            out.extend(entries(&p));
        }
        out.push(p);
    }
    out
}

/// Files (not directories) below `dir`.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    entries(dir).into_iter().filter(|p| p.is_file()).collect()
}

fn partial_files(dir: &Path) -> Vec<PathBuf> {
    entries(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".partial"))
        .collect()
}

/// How a case's stderr must look.
#[derive(Clone, Copy, PartialEq)]
enum Style {
    /// voxline's own validation: exactly one line, starting with `voxline:`.
    OneLine,
    /// clap's usage error: `error: ...`, a usage block, exit 2.
    Clap,
}

/// One bad input: the arguments and the (lower-case) words its error line must contain.
struct Case {
    name: &'static str,
    args: Vec<OsString>,
    expect: Vec<String>,
    style: Style,
}

/// The standard outputs a replay gets, so the test can see whether anything was left behind.
fn outputs(out: &Path) -> Vec<OsString> {
    vec![
        os("--quiet"),
        os("--pace"),
        os("fast"),
        os("--report-json"),
        os(out.join("report.json")),
        os("--events"),
        os(out.join("events.jsonl")),
    ]
}

/// Sets `flag`'s value in `args`, replacing the one already there.
fn set_flag(mut args: Vec<OsString>, flag: &str, value: impl AsRef<OsStr>) -> Vec<OsString> {
    let i = args
        .iter()
        .position(|x| x == flag)
        .unwrap_or_else(|| panic!("{flag} is not in {args:?}"));
    args[i + 1] = os(value);
    args
}

/// Checks one case; returns what was wrong with it (empty when it passed).
fn check(case: &Case, out: &Path, output: &Output) -> Vec<String> {
    let mut problems = Vec::new();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    if code != Some(2) {
        problems.push(format!("exit code {code:?}, expected 2"));
    }
    if stderr.contains("panicked") {
        problems.push("stderr reports a panic".into());
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    match case.style {
        Style::OneLine => {
            if lines.len() != 1 {
                problems.push(format!(
                    "{} stderr lines, expected exactly one",
                    lines.len()
                ));
            }
            if !lines.first().is_some_and(|l| l.starts_with("voxline: ")) {
                problems.push("stderr does not start with `voxline: `".into());
            }
        }
        Style::Clap => {
            if !lines.first().is_some_and(|l| l.starts_with("error:")) {
                problems.push("clap's first line does not start with `error:`".into());
            }
        }
    }
    if stderr.contains('\u{1b}') {
        problems.push("stderr holds terminal escape codes although it is not a terminal".into());
    }
    // Rust's own wording must not reach the user
    for leak in ["Some(", "None", "os error"] {
        if case.style == Style::OneLine && stderr.contains(leak) {
            problems.push(format!("stderr shows internal wording {leak:?}"));
        }
    }
    let lower = stderr.to_lowercase();
    for want in &case.expect {
        if !lower.contains(&want.to_lowercase()) {
            problems.push(format!("stderr does not mention {want:?}"));
        }
    }
    let left = files_below(out);
    if !left.is_empty() {
        problems.push(format!("files left behind: {left:?}"));
    }
    let partial = partial_files(out);
    if !partial.is_empty() {
        problems.push(format!(".partial files left behind: {partial:?}"));
    }
    if !output.stdout.is_empty() && case.style == Style::OneLine {
        problems.push(format!(
            "unexpected stdout: {:?}",
            String::from_utf8_lossy(&output.stdout)
        ));
    }
    problems
}

/// Writes a file into `dir` and returns its path.
fn put(dir: &Path, name: impl AsRef<OsStr>, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name.as_ref());
    std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    p
}

/// Builds the corpus in `dir`. Each case gets its own output directory `out/<name>`.
fn corpus(dir: &Path) -> Vec<(Case, PathBuf)> {
    let models = util::models_dir();
    let whisper = util::whisper_model();
    let gguf = util::llm_model();
    let good_wav = util::fixture("q_capital.wav");
    let q_capital = std::fs::read(&good_wav).unwrap();
    let tone: Vec<u8> = (0..16_000u32 * 2)
        .flat_map(|i| (((i as f32 * 0.05).sin() * 8000.0) as i16).to_le_bytes())
        .collect();

    // --- bad audio files
    let empty = put(dir, "empty.wav", b"");
    let header_zero = put(
        dir,
        "header_only_zero_data.wav",
        &wav_bytes(Fmt::PCM16_MONO_16K, &[], None, None),
    );
    // a real header that declares audio the file does not hold
    let header_claiming = put(dir, "header_claiming_data.wav", &q_capital[..44]);
    let mut bad_magic_bytes = q_capital.clone();
    bad_magic_bytes[..4].copy_from_slice(b"XQZW");
    let wrong_magic = put(dir, "wrong_magic.wav", &bad_magic_bytes);
    let mut rifx_bytes = q_capital.clone();
    rifx_bytes[..4].copy_from_slice(b"RIFX");
    let rifx = put(dir, "rifx.wav", &rifx_bytes);
    let mut not_wave_bytes = q_capital.clone();
    not_wave_bytes[8..12].copy_from_slice(b"AVI ");
    let not_wave = put(dir, "riff_not_wave.wav", &not_wave_bytes);
    let text = put(
        dir,
        "notes.wav",
        b"These are meeting notes, not audio.\nSecond line.\n",
    );
    let random = put(dir, "random.wav", &pseudo_random(64 * 1024, 0x5eed));
    let fmt = Fmt::PCM16_MONO_16K;
    let ch0 = put(
        dir,
        "zero_channels.wav",
        &wav_bytes(Fmt { channels: 0, ..fmt }, &tone, None, None),
    );
    let hz0 = put(
        dir,
        "zero_hz.wav",
        &wav_bytes(Fmt { rate: 0, ..fmt }, &tone, None, None),
    );
    let hz1 = put(
        dir,
        "one_hz.wav",
        &wav_bytes(Fmt { rate: 1, ..fmt }, &tone, None, None),
    );
    let stdin = PathBuf::from("-");
    let mhz = put(
        dir,
        "ten_mhz.wav",
        &wav_bytes(
            Fmt {
                rate: 10_000_000,
                ..fmt
            },
            &tone,
            None,
            None,
        ),
    );
    let ch300 = put(
        dir,
        "300_channels.wav",
        &wav_bytes(
            Fmt {
                channels: 300,
                ..fmt
            },
            &pseudo_random(600 * 40, 3),
            None,
            None,
        ),
    );
    let alaw = put(
        dir,
        "alaw.wav",
        &wav_bytes(
            Fmt {
                format_tag: 6,
                bits: 8,
                ..fmt
            },
            &pseudo_random(16_000, 4),
            None,
            None,
        ),
    );
    let mulaw = put(
        dir,
        "mulaw.wav",
        &wav_bytes(
            Fmt {
                format_tag: 7,
                bits: 8,
                ..fmt
            },
            &pseudo_random(16_000, 5),
            None,
            None,
        ),
    );
    let bits12 = put(
        dir,
        "12bit.wav",
        &wav_bytes(Fmt { bits: 12, ..fmt }, &tone, None, None),
    );
    let f64_data: Vec<u8> = (0..16_000)
        .flat_map(|i| (f64::from(i) * 0.01).sin().to_le_bytes())
        .collect();
    let float64 = put(
        dir,
        "float64.wav",
        &wav_bytes(
            Fmt {
                format_tag: 3,
                bits: 64,
                ..fmt
            },
            &f64_data,
            None,
            None,
        ),
    );
    let adpcm = put(
        dir,
        "ms_adpcm.wav",
        &wav_bytes(
            Fmt {
                format_tag: 2,
                bits: 4,
                ..fmt
            },
            &pseudo_random(8000, 6),
            None,
            None,
        ),
    );
    let no_data_chunk = {
        // a valid `fmt ` chunk and no `data` chunk at all
        let full = wav_bytes(fmt, &[], None, None);
        let mut b = full[..36].to_vec();
        b[4..8].copy_from_slice(&28u32.to_le_bytes());
        put(dir, "no_data_chunk.wav", &b)
    };
    let bad_name = put(
        dir,
        OsStr::from_bytes(b"bad-\xff\xfe-name.wav"),
        &pseudo_random(4096, 7),
    );
    let missing = dir.join("does-not-exist.wav");
    let a_dir = dir.join("a-directory.wav");
    std::fs::create_dir_all(&a_dir).unwrap();

    // --- bad model files
    let whisper_1mb = put(dir, "ggml-truncated.bin", &head(&whisper, 1 << 20));
    let gguf_1mb = put(dir, "truncated.gguf", &head(&gguf, 1 << 20));
    let text_model = put(dir, "model.bin", b"this is not a model\n");

    // --- bad budgets
    let budget_syntax = put(dir, "syntax.toml", b"[response_latency_ms\np50 = 2500\n");
    let budget_unknown = put(dir, "unknown.toml", b"[max]\nerorrs = 0\n");
    let budget_type = put(dir, "type.toml", b"[response_latency_ms]\np50 = \"fast\"\n");
    let budget_negative = put(dir, "negative.toml", b"[response_latency_ms]\np50 = -5\n");
    let budget_nan = put(dir, "nan.toml", b"[response_latency_ms]\np50 = nan\n");
    let budget_tps_nan = put(dir, "tps_nan.toml", b"[min]\nllm_decode_tps = nan\n");

    // --- sidecars that do not match their audio (next to copies of a good fixture)
    let sidecar_case = |name: &str, json: Option<&str>| -> PathBuf {
        let wav = put(dir, format!("{name}.wav"), &q_capital);
        match json {
            Some(j) => {
                put(dir, format!("{name}.json"), j.as_bytes());
            }
            None => std::fs::create_dir_all(dir.join(format!("{name}.json"))).unwrap(),
        }
        wav
    };
    let late_end = sidecar_case(
        "late_end",
        Some(
            r#"{"sample_rate":16000,"turns":[{"text":"What is the capital of France?","start_sample":8000,"end_sample":999999999}]}"#,
        ),
    );
    let other_rate = sidecar_case(
        "other_rate",
        Some(
            r#"{"sample_rate":44100,"turns":[{"text":"What is the capital of France?","start_sample":8000,"end_sample":35577}]}"#,
        ),
    );
    let dir_sidecar = sidecar_case("dir_sidecar", None);

    // --- bench inputs
    let empty_dir = dir.join("no-fixtures");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let not_json = put(dir, "baseline.json", b"p50 = 12 ms, looked fine\n");
    let schema_1 = put(
        dir,
        "schema1.json",
        br#"{"schema_version": 1, "summary": {}}"#,
    );
    let no_schema = put(dir, "noschema.json", br#"{"summary": {}}"#);

    // --- unwritable outputs (root ignores permissions: use a regular file as a parent, or /proc)
    let plain_file = put(dir, "somefile.txt", b"a regular file\n");

    let wav = |p: &Path| os(p);
    let mut cases: Vec<(Case, PathBuf)> = Vec::new();
    let mut add = |name: &'static str,
                   build: &dyn Fn(&Path) -> Vec<OsString>,
                   expect: &[&dyn AsRef<str>],
                   style: Style| {
        let out = dir.join("out").join(name);
        std::fs::create_dir_all(&out).unwrap();
        cases.push((
            Case {
                name,
                args: build(&out),
                expect: expect.iter().map(|s| s.as_ref().to_string()).collect(),
                style,
            },
            out,
        ));
    };
    let models_args = [os("--models-dir"), os(&models)];
    let replay = |file: &Path, extra: &[OsString], out: &Path| -> Vec<OsString> {
        let mut a = vec![os("replay"), wav(file)];
        a.extend(outputs(out));
        a.extend(models_args.iter().cloned());
        a.extend_from_slice(extra);
        a
    };
    let name_of = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();

    // audio
    add(
        "empty file",
        &|o| replay(&empty, &[], o),
        &[&name_of(&empty), &"empty"],
        Style::OneLine,
    );
    add(
        "header only, data size 0",
        &|o| replay(&header_zero, &[], o),
        &[&name_of(&header_zero), &"no audio"],
        Style::OneLine,
    );
    add(
        "44-byte header claiming data, none present",
        &|o| replay(&header_claiming, &[], o),
        &[&name_of(&header_claiming), &"no audio"],
        Style::OneLine,
    );
    add(
        "wrong magic",
        &|o| replay(&wrong_magic, &[], o),
        &[&name_of(&wrong_magic), &"riff"],
        Style::OneLine,
    );
    add(
        "big-endian RIFX",
        &|o| replay(&rifx, &[], o),
        &[&name_of(&rifx), &"rifx"],
        Style::OneLine,
    );
    add(
        "RIFF but not WAVE",
        &|o| replay(&not_wave, &[], o),
        &[&name_of(&not_wave), &"wave"],
        Style::OneLine,
    );
    add(
        "text file named .wav",
        &|o| replay(&text, &[], o),
        &[&name_of(&text), &"wav"],
        Style::OneLine,
    );
    add(
        "random bytes named .wav",
        &|o| replay(&random, &[], o),
        &[&name_of(&random), &"wav"],
        Style::OneLine,
    );
    add(
        "0 channels",
        &|o| replay(&ch0, &[], o),
        &[&name_of(&ch0), &"0 channels"],
        Style::OneLine,
    );
    add(
        "0 Hz",
        &|o| replay(&hz0, &[], o),
        &[&name_of(&hz0), &"sample rate"],
        Style::OneLine,
    );
    add(
        "1 Hz (too low to hold speech)",
        &|o| replay(&hz1, &[], o),
        &[&name_of(&hz1), &"1 Hz", &"4000"],
        Style::OneLine,
    );
    add(
        "`-` (standard input) twice",
        &|o| {
            let mut a = replay(&stdin, &[], o);
            a.insert(2, os("-"));
            a
        },
        &[&"standard input", &"once"],
        Style::OneLine,
    );
    add(
        "empty standard input",
        &|o| replay(&stdin, &[], o),
        &[&"standard input", &"empty"],
        Style::OneLine,
    );
    add(
        "10 MHz",
        &|o| replay(&mhz, &[], o),
        &[&name_of(&mhz), &"10000000"],
        Style::OneLine,
    );
    add(
        "300 channels",
        &|o| replay(&ch300, &[], o),
        &[&name_of(&ch300), &"300 channels"],
        Style::OneLine,
    );
    add(
        "A-law",
        &|o| replay(&alaw, &[], o),
        &[&name_of(&alaw), &"a-law"],
        Style::OneLine,
    );
    add(
        "mu-law",
        &|o| replay(&mulaw, &[], o),
        &[&name_of(&mulaw), &"law"],
        Style::OneLine,
    );
    add(
        "MS ADPCM",
        &|o| replay(&adpcm, &[], o),
        &[&name_of(&adpcm), &"adpcm"],
        Style::OneLine,
    );
    add(
        "12-bit PCM",
        &|o| replay(&bits12, &[], o),
        &[&name_of(&bits12), &"12-bit"],
        Style::OneLine,
    );
    add(
        "64-bit float",
        &|o| replay(&float64, &[], o),
        &[&name_of(&float64), &"64-bit"],
        Style::OneLine,
    );
    add(
        "no data chunk",
        &|o| replay(&no_data_chunk, &[], o),
        &[&name_of(&no_data_chunk), &"data"],
        Style::OneLine,
    );
    add(
        "non-UTF-8 file name",
        &|o| replay(&bad_name, &[], o),
        &[&"bad-", &"-name.wav"],
        Style::OneLine,
    );
    add(
        "missing path",
        &|o| replay(&missing, &[], o),
        &[&name_of(&missing), &"no such file"],
        Style::OneLine,
    );
    add(
        "directory as the file",
        &|o| replay(&a_dir, &[], o),
        &[&name_of(&a_dir), &"directory"],
        Style::OneLine,
    );

    // sidecars
    add(
        "sidecar: end_sample past the audio",
        &|o| replay(&late_end, &[], o),
        &[&"late_end.json", &"end_sample", &"past the end"],
        Style::OneLine,
    );
    add(
        "sidecar: another sample rate",
        &|o| replay(&other_rate, &[], o),
        &[&"other_rate.json", &"sample_rate", &"16000 hz"],
        Style::OneLine,
    );
    add(
        "sidecar: a directory",
        &|o| replay(&dir_sidecar, &[], o),
        &[
            &"dir_sidecar.json",
            &"sidecar",
            &"is a directory, not a json file",
        ],
        Style::OneLine,
    );

    // models
    let good = good_wav.clone();
    add(
        "missing whisper model",
        &|o| {
            replay(
                &good,
                &[os("--whisper-model"), os("/nonexistent/ggml.bin")],
                o,
            )
        },
        &[&"/nonexistent/ggml.bin", &"--whisper-model"],
        Style::OneLine,
    );
    add(
        "truncated whisper model",
        &|o| replay(&good, &[os("--whisper-model"), os(&whisper_1mb)], o),
        &[&name_of(&whisper_1mb), &"whisper"],
        Style::OneLine,
    );
    add(
        "truncated GGUF",
        &|o| replay(&good, &[os("--llm-model"), os(&gguf_1mb)], o),
        &[&name_of(&gguf_1mb), &"gguf"],
        Style::OneLine,
    );
    add(
        "GGUF as the whisper model",
        &|o| replay(&good, &[os("--whisper-model"), os(&gguf)], o),
        &[&name_of(&gguf), &"gguf", &"whisper"],
        Style::OneLine,
    );
    add(
        "whisper model as the LLM",
        &|o| replay(&good, &[os("--llm-model"), os(&whisper)], o),
        &[&name_of(&whisper), &"gguf"],
        Style::OneLine,
    );
    add(
        "text file as the whisper model",
        &|o| replay(&good, &[os("--whisper-model"), os(&text_model)], o),
        &[&name_of(&text_model), &"whisper"],
        Style::OneLine,
    );
    add(
        "text file as the LLM",
        &|o| replay(&good, &[os("--llm-model"), os(&text_model)], o),
        &[&name_of(&text_model), &"gguf"],
        Style::OneLine,
    );

    // budgets
    add(
        "budget: TOML syntax error",
        &|o| replay(&good, &[os("--budget"), os(&budget_syntax)], o),
        &[&name_of(&budget_syntax)],
        Style::OneLine,
    );
    add(
        "budget: unknown key",
        &|o| replay(&good, &[os("--budget"), os(&budget_unknown)], o),
        &[&name_of(&budget_unknown), &"erorrs"],
        Style::OneLine,
    );
    add(
        "budget: wrong type",
        &|o| replay(&good, &[os("--budget"), os(&budget_type)], o),
        &[&name_of(&budget_type), &"invalid type"],
        Style::OneLine,
    );
    add(
        "budget: negative limit",
        &|o| replay(&good, &[os("--budget"), os(&budget_negative)], o),
        &[
            &name_of(&budget_negative),
            &"response_latency_ms.p50 = -5",
            &"from 0 up",
        ],
        Style::OneLine,
    );
    add(
        "budget: NaN latency limit",
        &|o| replay(&good, &[os("--budget"), os(&budget_nan)], o),
        &[&name_of(&budget_nan), &"response_latency_ms.p50 = nan"],
        Style::OneLine,
    );
    add(
        "budget: NaN tokens/s limit",
        &|o| replay(&good, &[os("--budget"), os(&budget_tps_nan)], o),
        &[&name_of(&budget_tps_nan), &"min.llm_decode_tps = nan"],
        Style::OneLine,
    );
    let missing_budget = dir.join("no-budget.toml");
    add(
        "budget: missing file",
        &|o| replay(&good, &[os("--budget"), os(&missing_budget)], o),
        &[&name_of(&missing_budget)],
        Style::OneLine,
    );

    // flags
    add(
        "unknown flag",
        &|o| replay(&good, &[os("--bogus-flag")], o),
        &[&"--bogus-flag"],
        Style::Clap,
    );
    add(
        "--threads not a number",
        &|o| replay(&good, &[os("--threads"), os("two")], o),
        &[&"--threads", &"two"],
        Style::Clap,
    );
    add(
        "--threads 0",
        &|o| replay(&good, &[os("--threads"), os("0")], o),
        &[&"--threads 0"],
        Style::OneLine,
    );
    add(
        "--stt-threads above --threads",
        &|o| {
            replay(
                &good,
                &[os("--threads"), os("2"), os("--stt-threads"), os("5")],
                o,
            )
        },
        &[&"--stt-threads"],
        Style::OneLine,
    );
    add(
        "--pace sideways",
        &|o| set_flag(replay(&good, &[], o), "--pace", "sideways"),
        &[&"--pace", &"sideways", &"realtime", &"fast"],
        Style::Clap,
    );
    add(
        "--audio-ctx 5000",
        &|o| replay(&good, &[os("--audio-ctx"), os("5000")], o),
        &[&"--audio-ctx", &"5000"],
        Style::OneLine,
    );
    add(
        "--audio-ctx auto+4294967295",
        &|o| replay(&good, &[os("--audio-ctx"), os("auto+4294967295")], o),
        &[&"--audio-ctx", &"auto+4294967295", &"at most 1500", &"full"],
        Style::OneLine,
    );
    add(
        "--cpu-share sometimes",
        &|o| replay(&good, &[os("--cpu-share"), os("sometimes")], o),
        &[&"--cpu-share", &"sometimes", &"split", &"shared"],
        Style::Clap,
    );
    add(
        "--temperature -1",
        &|o| replay(&good, &[os("--temperature"), os("-1")], o),
        &[&"--temperature -1", &"from 0 (greedy"],
        Style::OneLine,
    );
    add(
        "--temperature=-1",
        &|o| replay(&good, &[os("--temperature=-1")], o),
        &[&"--temperature -1", &"from 0 (greedy"],
        Style::OneLine,
    );
    add(
        "--temperature nan",
        &|o| replay(&good, &[os("--temperature"), os("nan")], o),
        &[&"--temperature nan", &"from 0 (greedy"],
        Style::OneLine,
    );
    add(
        "--temperature 3",
        &|o| replay(&good, &[os("--temperature"), os("3")], o),
        &[&"--temperature 3", &"to 2"],
        Style::OneLine,
    );
    add(
        "--ctx 4000000000",
        &|o| replay(&good, &[os("--ctx"), os("4000000000")], o),
        &[&"--ctx 4000000000", &"8192"],
        Style::OneLine,
    );
    add(
        "--ctx 10",
        &|o| replay(&good, &[os("--ctx"), os("10")], o),
        &[&"--ctx 10", &"at least 64"],
        Style::OneLine,
    );
    add(
        "--max-tokens 0",
        &|o| replay(&good, &[os("--max-tokens"), os("0")], o),
        &[&"--max-tokens 0"],
        Style::OneLine,
    );
    add(
        "--max-tokens above --ctx",
        &|o| {
            replay(
                &good,
                &[os("--max-tokens"), os("4096"), os("--ctx"), os("2048")],
                o,
            )
        },
        &[&"--max-tokens 4096 with --ctx 2048"],
        Style::OneLine,
    );
    add(
        "--vad-threshold 7",
        &|o| replay(&good, &[os("--vad-threshold"), os("7")], o),
        &[&"threshold"],
        Style::OneLine,
    );

    // outputs that cannot be written
    let no_dir = dir.join("no-such-dir").join("report.json");
    add(
        "--report-json into a missing directory",
        &|o| set_flag(replay(&good, &[], o), "--report-json", &no_dir),
        &[&"--report-json", &"no-such-dir"],
        Style::OneLine,
    );
    let under_file = plain_file.join("report.json");
    add(
        "--report-json under a regular file",
        &|o| set_flag(replay(&good, &[], o), "--report-json", &under_file),
        &[&"--report-json", &"somefile.txt"],
        Style::OneLine,
    );
    add(
        "--report-json under /proc",
        &|o| {
            set_flag(
                replay(&good, &[], o),
                "--report-json",
                "/proc/voxline-report.json",
            )
        },
        &[&"--report-json", &"/proc/voxline-report.json"],
        Style::OneLine,
    );
    let events_under_file = plain_file.join("events.jsonl");
    add(
        "--events under a regular file",
        &|o| set_flag(replay(&good, &[], o), "--events", &events_under_file),
        &[&"--events", &"somefile.txt"],
        Style::OneLine,
    );

    // bench
    let bench = |extra: &[OsString], out: &Path| -> Vec<OsString> {
        let mut a = vec![
            os("bench"),
            os("--out"),
            os(out.join("bench")),
            os("--events"),
            os(out.join("events.jsonl")),
        ];
        a.extend(models_args.iter().cloned());
        a.extend_from_slice(extra);
        a
    };
    add(
        "bench --fixtures an empty directory",
        &|o| bench(&[os("--fixtures"), os(&empty_dir)], o),
        &[&name_of(&empty_dir), &"no .wav"],
        Style::OneLine,
    );
    add(
        "bench --baseline not JSON",
        &|o| {
            bench(
                &[os("--fixtures"), os(&good), os("--baseline"), os(&not_json)],
                o,
            )
        },
        &[&name_of(&not_json)],
        Style::OneLine,
    );
    add(
        "bench --baseline of another schema version",
        &|o| {
            bench(
                &[os("--fixtures"), os(&good), os("--baseline"), os(&schema_1)],
                o,
            )
        },
        &[
            &name_of(&schema_1),
            &"schema version 1",
            &"writes version 2",
        ],
        Style::OneLine,
    );
    add(
        "bench --baseline without a schema version",
        &|o| {
            bench(
                &[
                    os("--fixtures"),
                    os(&good),
                    os("--baseline"),
                    os(&no_schema),
                ],
                o,
            )
        },
        &[&name_of(&no_schema), &"has no schema_version"],
        Style::OneLine,
    );
    add(
        "bench --repeat 0",
        &|o| bench(&[os("--fixtures"), os(&good), os("--repeat"), os("0")], o),
        &[&"--repeat 0"],
        Style::OneLine,
    );
    add(
        "bench --fixtures a bad WAV",
        &|o| bench(&[os("--fixtures"), os(&text)], o),
        &[&name_of(&text)],
        Style::OneLine,
    );

    // live (fails on the flag before any audio device is opened)
    add(
        "live --max-duration soon",
        &|o| {
            let mut a = vec![
                os("live"),
                os("--max-duration"),
                os("soon"),
                os("--report-json"),
                os(o.join("report.json")),
                os("--events"),
                os(o.join("events.jsonl")),
            ];
            a.extend(models_args.iter().cloned());
            a
        },
        &[&"--max-duration", &"soon"],
        Style::OneLine,
    );
    add(
        "live --max-turns 0",
        &|o| {
            let mut a = vec![
                os("live"),
                os("--max-turns"),
                os("0"),
                os("--report-json"),
                os(o.join("report.json")),
            ];
            a.extend(models_args.iter().cloned());
            a
        },
        &[&"--max-turns"],
        Style::OneLine,
    );
    add(
        "live --capture-buffer-ms 0",
        &|o| {
            let mut a = vec![
                os("live"),
                os("--capture-buffer-ms"),
                os("0"),
                os("--report-json"),
                os(o.join("report.json")),
            ];
            a.extend(models_args.iter().cloned());
            a
        },
        &[&"--capture-buffer-ms", &"1 to 1000"],
        Style::OneLine,
    );
    cases
}

#[test]
fn bad_inputs_exit_2_with_one_line_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = corpus(tmp.path());
    assert!(
        cases.len() >= 25,
        "the corpus has only {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    for (case, out) in &cases {
        let output = voxline(&case.args);
        let problems = check(case, out, &output);
        // the whole corpus's answers, visible with --nocapture or on failure
        eprintln!(
            "[{}] exit {:?}: {}",
            case.name,
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        if !problems.is_empty() {
            failures.push(format!(
                "[{}] {}\n    args: {:?}\n    exit: {:?}\n    stderr: {}",
                case.name,
                problems.join("; "),
                case.args,
                output.status.code(),
                String::from_utf8_lossy(&output.stderr)
                    .trim_end()
                    .replace('\n', "\n            "),
            ));
        }
    }
    // nothing anywhere in the temp dir is a leftover `.partial`
    let partial = partial_files(tmp.path());
    assert!(partial.is_empty(), "partial files left: {partial:?}");
    assert!(
        failures.is_empty(),
        "{} of {} bad-input cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------- truncated audio

/// A WAV whose header claims more data than the file holds is streamed up to
/// the cut and then reported: exit 2, one `voxline:` line naming the file and
/// the truncation, and the report (which records the input error) is written —
/// the audio before the cut was processed, so the run's results are kept.
#[test]
fn truncated_audio_is_played_to_the_cut_then_reported() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let q = std::fs::read(util::fixture("q_capital.wav")).unwrap();
    let cut = put(tmp.path(), "cut.wav", &q[..30_000]);
    let four_gib = put(
        tmp.path(),
        "claims_4gib.wav",
        &wav_bytes(
            Fmt::PCM16_MONO_16K,
            &vec![0u8; 3200],
            Some(0xFFFF_FFF0),
            Some(0xFFFF_FFFF),
        ),
    );
    let mut failures = Vec::new();
    for (name, file) in [
        ("data cut short", &cut),
        ("header claiming 4 GiB", &four_gib),
    ] {
        let out = tmp.path().join("out").join(name.replace(' ', "_"));
        std::fs::create_dir_all(&out).unwrap();
        let mut args = vec![os("replay"), os(file)];
        args.extend(outputs(&out));
        args.extend([
            os("--models-dir"),
            os(util::models_dir()),
            os("--max-tokens"),
            os("4"),
        ]);
        let output = voxline(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let mut problems = Vec::new();
        if output.status.code() != Some(2) {
            problems.push(format!("exit code {:?}, expected 2", output.status.code()));
        }
        if stderr.contains("panicked") {
            problems.push("panic".to_string());
        }
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("voxline: "))
            .collect();
        let file_name = file.file_name().unwrap().to_string_lossy().into_owned();
        if !ours
            .iter()
            .any(|l| l.contains(&file_name) && l.contains("truncated"))
        {
            problems.push("no `voxline:` line naming the file and the truncation".into());
        }
        let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
        if lines > 3 {
            problems.push(format!("{lines} stderr lines, expected at most 3"));
        }
        if stderr.contains('\u{1b}') {
            problems
                .push("stderr holds terminal escape codes although it is not a terminal".into());
        }
        // the documented behaviour: the report is written and records the input error
        match std::fs::read(out.join("report.json")) {
            Ok(bytes) => match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(rep) => {
                    let errs = rep["input_errors"].as_array().cloned().unwrap_or_default();
                    if !errs
                        .iter()
                        .any(|e| e.as_str().is_some_and(|s| s.contains(&file_name)))
                    {
                        problems.push(format!(
                            "report.input_errors does not name the file: {errs:?}"
                        ));
                    }
                }
                Err(e) => problems.push(format!("report.json is not JSON: {e}")),
            },
            Err(e) => problems.push(format!("no report.json: {e}")),
        }
        let partial = partial_files(&out);
        if !partial.is_empty() {
            problems.push(format!(".partial files left: {partial:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!(
                "[{name}] {}\n    stderr: {}",
                problems.join("; "),
                stderr.trim_end().replace('\n', "\n            ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- pipes

/// A WAV written to a pipe (ffmpeg's unknown-length sizes in its header) is
/// replayed from standard input (`voxline replay -`) and from a FIFO: exit 0,
/// and the question in it is heard.
#[test]
fn pipe_written_wav_replays_from_stdin_and_from_a_fifo() {
    use std::io::Write as _;
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let mut wav = std::fs::read(util::fixture("q_capital.wav")).unwrap();
    wav[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let data = wav.windows(4).position(|w| w == b"data").unwrap();
    wav[data + 4..data + 8].copy_from_slice(&u32::MAX.to_le_bytes());

    let fifo = tmp.path().join("mic.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (name, input) in [("stdin", PathBuf::from("-")), ("fifo", fifo.clone())] {
        let report = tmp.path().join(format!("{name}.json"));
        let mut child = util::voxline_bin()
            .current_dir(util::root())
            .arg("replay")
            .arg(&input)
            .args(["--quiet", "--pace", "fast", "--max-tokens", "8"])
            .arg("--report-json")
            .arg(&report)
            .arg("--models-dir")
            .arg(util::models_dir())
            .stdin(if name == "stdin" {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Written from a thread: opening a FIFO for writing waits for its reader.
        let writer = {
            let (bytes, stdin, fifo) = (wav.clone(), child.stdin.take(), fifo.clone());
            std::thread::spawn(move || match stdin {
                Some(mut stdin) => stdin.write_all(&bytes),
                None => std::fs::OpenOptions::new()
                    .write(true)
                    .open(&fifo)?
                    .write_all(&bytes),
            })
        };
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {stderr}");
        writer.join().unwrap().unwrap();
        let rep: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert!(
            rep["summary"]["turns"].as_u64().unwrap_or(0) >= 1,
            "{name}: no turn heard: {rep:#}"
        );
    }
}

// ---------------------------------------------------------------- odd but valid audio

/// Replays one file at fast pace with a report; returns the exit code, stderr and the report.
fn replay_ok(file: &Path, out: &Path, extra: &[&str]) -> (Option<i32>, String, serde_json::Value) {
    let report = out.join("report.json");
    let mut args = vec![
        os("replay"),
        os(file),
        os("--quiet"),
        os("--pace"),
        os("fast"),
        os("--report-json"),
        os(&report),
        os("--models-dir"),
        os(util::models_dir()),
        os("--max-tokens"),
        os("8"),
    ];
    args.extend(extra.iter().map(os));
    let output = voxline(&args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let rep = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    (output.status.code(), stderr, rep)
}

#[test]
fn silence_gives_zero_turns() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let (code, stderr, rep) = replay_ok(&util::fixture("silence.wav"), tmp.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(rep["summary"]["turns"], 0, "{rep:#}");
    assert_eq!(rep["turns"].as_array().map(Vec::len), Some(0));
}

#[test]
fn white_noise_runs_cleanly() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    let noise: Vec<f32> = pseudo_random(16_000 * 3 * 2, 0xa11ce)
        .chunks_exact(2)
        .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0 * 0.5)
        .collect();
    let file = put(tmp.path(), "noise.wav", &pcm16_wav(&noise));
    let (code, stderr, rep) = replay_ok(&file, tmp.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let turns = rep["summary"]["turns"]
        .as_u64()
        .expect("a report with summary.turns");
    // 3 s of noise cannot hold more than a few utterances
    assert!(turns <= 3, "{turns} turns from 3 s of noise");
    assert_eq!(rep["summary"]["errors"], 0, "{rep:#}");
}

#[test]
fn full_scale_square_wave_runs_cleanly() {
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    // 200 Hz square wave at full scale: every sample clips
    let square: Vec<f32> = (0..16_000 * 3)
        .map(|i| if (i / 40) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let file = put(tmp.path(), "square.wav", &pcm16_wav(&square));
    let (code, stderr, rep) = replay_ok(&file, tmp.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(rep["summary"]["turns"].is_u64(), "{rep:#}");
    assert_eq!(rep["summary"]["errors"], 0, "{rep:#}");
}

// ---------------------------------------------------------------- long input, bounded memory

/// The peak resident set (VmHWM) of a running process, in kB.
fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn long_input_streams_in_bounded_memory() {
    const MAX_RSS_MB: u64 = 600;
    let _g = util::engine_lock();
    let tmp = tempfile::tempdir().unwrap();
    // ≥ 90 s of speech and pauses: the fixtures, 16 kHz mono, 1 s of silence between
    let mut samples: Vec<f32> = Vec::new();
    let mut utterances = 0usize;
    while samples.len() < 16_000 * 90 {
        for name in ["multi_turn.wav", "long_10s.wav", "q_moon.wav", "q_tea.wav"] {
            samples.extend(util::read_16k(&util::fixture(name)));
            samples.extend(std::iter::repeat_n(0.0, 16_000));
            utterances += util::expected_texts(name).len();
        }
    }
    let audio_s = samples.len() as f64 / 16_000.0;
    let file = put(tmp.path(), "long.wav", &pcm16_wav(&samples));
    drop(samples);
    let report = tmp.path().join("report.json");
    let mut child = util::voxline_bin()
        .current_dir(util::root())
        .args([
            os("replay"),
            os(&file),
            os("--quiet"),
            os("--pace"),
            os("fast"),
            os("--max-tokens"),
            os("4"),
            os("--audio-ctx"),
            os("auto"),
            os("--report-json"),
            os(&report),
            os("--models-dir"),
            os(util::models_dir()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak_kb = 0;
    let status = loop {
        if let Some(kb) = vm_hwm_kb(pid) {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(peak_kb > 0, "could not read VmHWM of the voxline process");
    assert!(
        peak_kb / 1024 < MAX_RSS_MB,
        "peak RSS {} MB for {audio_s:.0} s of audio (limit {MAX_RSS_MB} MB)",
        peak_kb / 1024
    );
    let rep = util::read_json(&report);
    let turns = rep["summary"]["turns"].as_u64().unwrap() as usize;
    // every utterance of the concatenated fixtures is found (allowing a split or merge or two)
    assert!(
        turns + 2 >= utterances && turns <= utterances + 2,
        "{turns} turns for {utterances} spoken utterances"
    );
    eprintln!(
        "long input: {audio_s:.0} s of audio, {turns} turns, peak RSS {} MB",
        peak_kb / 1024
    );
}
