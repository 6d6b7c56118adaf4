#!/usr/bin/env python3
"""The two speech-to-text engines on the same clips, greedy and beam, in one run.

    python3 benches/stt_engines.py [--rounds N] [--beam B] [--fixtures DIR ...] [--out DIR]

For each round, runs `voxline bench --pace fast` on each fixture directory
with each configuration in turn (whisper.cpp greedy, CTranslate2 greedy in
float32 and in int8, whisper.cpp beam B, CTranslate2 beam B; the order
rotates every round), with the CLI's defaults otherwise. From each run's report.json: every turn's STT time (warm-up turn
excluded), the pooled WER, response latency p50, and the process's CPU
seconds (user + system, from the operating system's accounting of the
finished process). Prints per configuration the medians over rounds, and the
per-round ratio to whisper greedy (median): ratios taken within a round hold
when the shared machine's speed drifts. Not part of CI.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, fixtures, engine, beam, extra, out):
    cmd = [binary, "bench", "--fixtures", fixtures, "--stt-engine", engine,
           "--stt-beam", str(beam), "--out", out] + list(extra)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err}")
    report = json.load(open(os.path.join(out, "report.json")))
    turns = [t for t in report["turns"] if not t.get("warmup") and t.get("stt_ms")]
    stt = sorted(t["stt_ms"] for t in turns)
    p95 = stt[min(len(stt) - 1, round(0.95 * (len(stt) - 1)))]
    lat = [t["response_latency_ms"] for t in turns if t.get("response_latency_ms") is not None]
    return {
        "stt_p50": statistics.median(stt),
        "stt_p95": p95,
        "wer": report["summary"]["wer"],
        "resp_p50": statistics.median(lat) if lat else float("nan"),
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--fixtures", nargs="+", default=["audio-fixtures/human", "audio-fixtures"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/voxline"))
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="stt-engines-")
    configs = [("whisper", 1, ()), ("ct2", 1, ()), ("ct2", 1, ("--ct2-compute", "int8")),
               ("whisper", a.beam, ()), ("ct2", a.beam, ())]
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} before")
    for fixtures in a.fixtures:
        rows = {c: [] for c in configs}
        for r in range(a.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for engine, beam, extra in order:
                name = f"{engine}-b{beam}{''.join(x.strip('-') for x in extra)}-r{r}"
                d = os.path.join(out, os.path.basename(fixtures.rstrip("/")), name)
                rows[(engine, beam, extra)].append(run(a.binary, fixtures, engine, beam, extra, d))
        base = rows[configs[0]]
        print(f"\n{fixtures} ({a.rounds} rounds; medians, and the median per-round ratio to whisper greedy)\n")
        print("| engine | beam | options | STT p50 ms | STT p95 ms | WER | response p50 ms | CPU s | STT p50 ÷ whisper | CPU ÷ whisper |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for c in configs:
            v = rows[c]
            med = lambda k: statistics.median(x[k] for x in v)
            ratio = lambda k: statistics.median(x[k] / b[k] for x, b in zip(v, base))
            print(f"| {c[0]} | {c[1]} | {' '.join(c[2])} | {med('stt_p50'):.0f} | {med('stt_p95'):.0f} | "
                  f"{100 * med('wer'):.1f} % | {med('resp_p50'):.0f} | {med('cpu_s'):.1f} | "
                  f"×{ratio('stt_p50'):.2f} | ×{ratio('cpu_s'):.2f} |")
    print(f"\nload {os.getloadavg()[0]:.2f} after; reports under {out}")


if __name__ == "__main__":
    main()
