#!/usr/bin/env python3
"""Helper for generate.sh: noise mixing, sidecar JSON and self-checks.

Standard library only. The WAV reader here is deliberately independent of
sox so that `check` verifies sox's output against the sidecars rather than
trusting the tool that wrote it.

Subcommands:
  noise IN OUT --snr DB --seed N --start S --end E
      Mix seeded white Gaussian noise into a 16-bit mono WAV so that the
      speech region [S, E) has the requested signal-to-noise ratio.
  sidecar JSON --wav WAV --file NAME [--turn TEXT START END]...
      Write NAME's sidecar; rate, channels, format and length are read from
      the WAV header.
  check DIR
      Verify every sidecar in DIR against its WAV and the fixture contract.
  human SRC DEST
      Copy the real recordings listed in SRC/truth.json into DEST, write
      each one's sidecar (boundaries from `speech_bounds`) and DEST/SHA256SUMS.
  check-human DIR
      Verify the recordings in DIR against their sidecars: header fields, and
      boundaries equal to what `speech_bounds` finds in the audio now.
"""

import argparse
import array
import hashlib
import json
import math
import os
import random
import shutil
import struct
import sys

# WAVE format tags.
TAG_PCM = 0x0001
TAG_FLOAT = 0x0003
TAG_EXTENSIBLE = 0xFFFE


class WavError(Exception):
    """A WAV file this helper cannot read."""


def read_wav(path):
    """Return (rate, channels, fmt, frames, channel0) for a RIFF/WAVE file.

    fmt is "s16", "s24" or "f32"; channel0 is a list of floats in [-1, 1]
    holding the first channel.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 12 or data[0:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise WavError(f"{path}: not a RIFF/WAVE file")
    pos = 12
    fmt_chunk = None
    payload = None
    while pos + 8 <= len(data):
        cid = data[pos:pos + 4]
        size = struct.unpack_from("<I", data, pos + 4)[0]
        body = data[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt_chunk = body
        elif cid == b"data":
            payload = body
        pos += 8 + size + (size & 1)
    if fmt_chunk is None or payload is None:
        raise WavError(f"{path}: missing fmt or data chunk")
    tag, channels, rate, _byte_rate, block_align, bits = struct.unpack_from(
        "<HHIIHH", fmt_chunk, 0)
    if tag == TAG_EXTENSIBLE:
        # The sub-format GUID starts with the real format tag.
        tag = struct.unpack_from("<H", fmt_chunk, 24)[0]
    if tag == TAG_PCM and bits == 16:
        fmt = "s16"
    elif tag == TAG_PCM and bits == 24:
        fmt = "s24"
    elif tag == TAG_FLOAT and bits == 32:
        fmt = "f32"
    else:
        raise WavError(f"{path}: unsupported format tag {tag} / {bits} bits")
    if block_align != channels * bits // 8 or len(payload) % block_align:
        raise WavError(f"{path}: inconsistent block alignment")
    frames = len(payload) // block_align
    width = bits // 8
    if fmt == "s16":
        samples = array.array("h")
        samples.frombytes(payload)
        if sys.byteorder != "little":
            samples.byteswap()
        ch0 = [s / 32768.0 for s in samples[::channels]]
    elif fmt == "f32":
        samples = array.array("f")
        samples.frombytes(payload)
        if sys.byteorder != "little":
            samples.byteswap()
        ch0 = list(samples[::channels])
    else:
        step = block_align
        ch0 = [
            int.from_bytes(payload[i:i + width], "little", signed=True) / 8388608.0
            for i in range(0, len(payload), step)
        ]
    return rate, channels, fmt, frames, ch0


def cmd_noise(args):
    import wave

    with wave.open(args.input, "rb") as src:
        if src.getnchannels() != 1 or src.getsampwidth() != 2:
            sys.exit(f"{args.input}: expected 16-bit mono")
        rate = src.getframerate()
        samples = array.array("h")
        samples.frombytes(src.readframes(src.getnframes()))
    if sys.byteorder != "little":
        samples.byteswap()
    speech = samples[args.start:args.end]
    if not speech:
        sys.exit("noise: empty speech region")
    speech_rms = math.sqrt(sum(s * s for s in speech) / len(speech))
    noise_rms = speech_rms / (10.0 ** (args.snr / 20.0))
    rng = random.Random(args.seed)
    noise = [rng.gauss(0.0, 1.0) for _ in samples]
    # Scale to the exact RMS wanted over the speech region, so the SNR holds
    # regardless of the random draw.
    region = noise[args.start:args.end]
    drawn = math.sqrt(sum(n * n for n in region) / len(region))
    scale = noise_rms / drawn
    out = array.array("h")
    for s, n in zip(samples, noise):
        v = int(round(s + n * scale))
        out.append(max(-32768, min(32767, v)))
    if sys.byteorder != "little":
        out.byteswap()
    with wave.open(args.output, "wb") as dst:
        dst.setnchannels(1)
        dst.setsampwidth(2)
        dst.setframerate(rate)
        dst.writeframes(out.tobytes())


def cmd_sidecar(args):
    rate, channels, fmt, frames, _ = read_wav(args.wav)
    turns = []
    for text, start, end in args.turn:
        turns.append({"text": text, "start_sample": int(start), "end_sample": int(end)})
    doc = {
        "file": args.file,
        "sample_rate": rate,
        "channels": channels,
        "format": fmt,
        "duration_samples": frames,
        "turns": turns,
    }
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


def peak(x, start, end):
    """Largest absolute sample in x[start:end]; 0.0 for an empty range."""
    return max((abs(v) for v in x[start:end]), default=0.0)


def longest_quiet_run(x, start, end, threshold):
    """Longest run of samples in x[start:end] with |x| <= threshold."""
    best = run = 0
    for v in x[start:end]:
        if abs(v) <= threshold:
            run += 1
            best = max(best, run)
        else:
            run = 0
    return best


def check_one(directory, name, problems):
    def fail(msg):
        problems.append(f"{name}: {msg}")

    with open(os.path.join(directory, name), encoding="utf-8") as fh:
        doc = json.load(fh)
    wav = os.path.join(directory, doc["file"])
    if os.path.splitext(name)[0] != os.path.splitext(doc["file"])[0]:
        fail("sidecar name does not match its file")
    rate, channels, fmt, frames, x = read_wav(wav)
    for key, actual in (("sample_rate", rate), ("channels", channels),
                        ("format", fmt), ("duration_samples", frames)):
        if doc[key] != actual:
            fail(f"{key} is {doc[key]!r} in JSON but {actual!r} in the WAV")
    noisy = "noisy" in doc["file"]
    # 0.1 % of full scale: the threshold the trimming used.
    quiet = 0.001
    edge = int(0.02 * rate)
    prev_end = 0
    for i, turn in enumerate(doc["turns"]):
        s, e = turn["start_sample"], turn["end_sample"]
        if not turn["text"].strip():
            fail(f"turn {i} has no text")
        if not (prev_end <= s < e <= frames):
            fail(f"turn {i} bounds {s}..{e} out of order or range")
            continue
        if not noisy:
            if any(x[prev_end:s]):
                fail(f"non-silent audio before turn {i}")
            if peak(x, s, min(e, s + edge)) <= quiet:
                fail(f"turn {i} does not start with speech")
            if peak(x, max(s, e - edge), e) <= quiet:
                fail(f"turn {i} does not end with speech")
        prev_end = e
    if doc["turns"] and not noisy and any(x[prev_end:]):
        fail("non-silent audio after the last turn")
    if not doc["turns"] and any(x):
        fail("no turns declared but the audio is not digital silence")
    if doc["file"] == "silence.wav" and frames != 3 * rate:
        fail(f"lasts {frames / rate:.2f} s, expected 3 s")
    if doc["file"] == "long_10s.wav":
        (turn,) = doc["turns"]
        s, e = turn["start_sample"], turn["end_sample"]
        secs = (e - s) / rate
        if not 9.0 <= secs <= 11.0:
            fail(f"speech lasts {secs:.2f} s, expected about 10 s")
        gap = longest_quiet_run(x, s, e, quiet) / rate
        if gap > 0.3:
            fail(f"internal pause of {gap:.3f} s exceeds 0.3 s")
    if doc["file"] == "multi_turn.wav":
        turns = doc["turns"]
        if len(turns) != 3:
            fail("expected 3 turns")
        for a, b in zip(turns, turns[1:]):
            if b["start_sample"] - a["end_sample"] != int(1.5 * rate):
                fail("pause between turns is not 1.5 s")
    return doc


def cmd_check(args):
    problems = []
    names = sorted(n for n in os.listdir(args.dir) if n.endswith(".json"))
    for name in names:
        try:
            check_one(args.dir, name, problems)
        except (OSError, ValueError, KeyError, WavError) as err:
            problems.append(f"{name}: {err}")
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"checked {len(names)} fixtures: ok")


# Speech boundaries of a real recording (which, unlike the synthetic files,
# has a noise floor rather than digital silence around the speech).
FRAME_S = 0.010      # analysis frame: 10 ms
RUN_FRAMES = 3       # speech = at least 30 ms in a row above the threshold
BELOW_PEAK_DB = 35.0  # the threshold is at most this far below the loudest frame
ABOVE_FLOOR_DB = 10.0  # ... and at least this far above the noise floor


def frame_levels(x, rate):
    """RMS level of each whole 10 ms frame of x, in dBFS (floor -140)."""
    n = int(rate * FRAME_S)
    levels = []
    for i in range(0, len(x) - n + 1, n):
        power = sum(v * v for v in x[i:i + n]) / n
        levels.append(10.0 * math.log10(max(power, 1e-14)))
    return n, levels


def speech_bounds(x, rate):
    """(start_sample, end_sample) of the speech in x, or None.

    The noise floor is the 5th percentile of the frame levels; the threshold
    is the higher of (floor + ABOVE_FLOOR_DB) and (loudest frame -
    BELOW_PEAK_DB). Speech starts at the first frame of the first run of
    RUN_FRAMES frames at or above the threshold and ends after the last frame
    of the last such run (end exclusive).
    """
    n, levels = frame_levels(x, rate)
    if not levels:
        return None
    ordered = sorted(levels)
    floor = ordered[len(ordered) // 20]
    threshold = max(floor + ABOVE_FLOOR_DB, ordered[-1] - BELOW_PEAK_DB)
    loud = [lv >= threshold for lv in levels]
    runs = []
    i = 0
    while i < len(loud):
        if loud[i]:
            j = i
            while j < len(loud) and loud[j]:
                j += 1
            if j - i >= RUN_FRAMES:
                runs.append((i, j))
            i = j
        else:
            i += 1
    if not runs:
        return None
    return runs[0][0] * n, min(runs[-1][1] * n, len(x))


def sha256(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def cmd_human(args):
    with open(os.path.join(args.src, "truth.json"), encoding="utf-8") as fh:
        truth = json.load(fh)
    os.makedirs(args.dest, exist_ok=True)
    sums = []
    for entry in sorted(truth, key=lambda e: e["file"]):
        name = entry["file"]
        wav = os.path.join(args.dest, name)
        shutil.copyfile(os.path.join(args.src, name), wav)
        rate, channels, fmt, frames, x = read_wav(wav)
        bounds = speech_bounds(x, rate)
        if bounds is None:
            sys.exit(f"{name}: no speech found")
        doc = {
            "file": name,
            "sample_rate": rate,
            "channels": channels,
            "format": fmt,
            "duration_samples": frames,
            "turns": [{"text": entry["text"], "start_sample": bounds[0],
                       "end_sample": bounds[1]}],
        }
        side = os.path.splitext(wav)[0] + ".json"
        with open(side, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        sums.append((sha256(wav), name))
        sums.append((sha256(side), os.path.basename(side)))
        print(f"{name}: speech {bounds[0] / rate:.2f}-{bounds[1] / rate:.2f} s "
              f"of {frames / rate:.2f} s")
    with open(os.path.join(args.dest, "SHA256SUMS"), "w", encoding="utf-8") as fh:
        for digest, name in sums:
            fh.write(f"{digest}  {name}\n")


def cmd_check_human(args):
    problems = []
    names = sorted(n for n in os.listdir(args.dir) if n.endswith(".json"))
    for name in names:
        try:
            with open(os.path.join(args.dir, name), encoding="utf-8") as fh:
                doc = json.load(fh)
            rate, channels, fmt, frames, x = read_wav(os.path.join(args.dir, doc["file"]))
            for key, actual in (("sample_rate", rate), ("channels", channels),
                                ("format", fmt), ("duration_samples", frames)):
                if doc[key] != actual:
                    problems.append(f"{name}: {key} is {doc[key]!r} in JSON but {actual!r} in the WAV")
            if len(doc["turns"]) != 1 or not doc["turns"][0]["text"].strip():
                problems.append(f"{name}: expected one turn with text")
                continue
            turn = doc["turns"][0]
            found = speech_bounds(x, rate)
            if found != (turn["start_sample"], turn["end_sample"]):
                problems.append(f"{name}: boundaries {turn['start_sample']}..{turn['end_sample']} "
                                f"but the audio gives {found}")
        except (OSError, ValueError, KeyError, WavError) as err:
            problems.append(f"{name}: {err}")
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"checked {len(names)} human recordings: ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("noise")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--snr", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--start", type=int, required=True)
    p.add_argument("--end", type=int, required=True)
    p.set_defaults(func=cmd_noise)

    p = sub.add_parser("sidecar")
    p.add_argument("json")
    p.add_argument("--wav", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--turn", nargs=3, action="append", default=[],
                   metavar=("TEXT", "START", "END"))
    p.set_defaults(func=cmd_sidecar)

    p = sub.add_parser("check")
    p.add_argument("dir")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("human")
    p.add_argument("src")
    p.add_argument("dest")
    p.set_defaults(func=cmd_human)

    p = sub.add_parser("check-human")
    p.add_argument("dir")
    p.set_defaults(func=cmd_check_human)

    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
