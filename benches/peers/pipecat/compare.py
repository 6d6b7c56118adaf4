#!/usr/bin/env python3
"""voxline against Pipecat 1.14.0's local cascade, same models, same audio, real time.

    bash benches/peers/pipecat/compare.sh [--rounds N] [--set NAME=A.wav,B.wav ...] [--out DIR]

For each round and each fixture set, runs one after the other (A B A B ...):
  A: ./target/release/voxline replay --pace realtime --voice piper FILES
       --report-json R --models-dir models
  B: llama-server (SmolLM2, 2 threads) started for the session, warmed with one
     request, then run_pipecat.py on the same FILES; llama-server stopped.
Both get the same bytes: every recording with --tail-ms of silence appended
(written under OUT/audio/ with its sidecar .json), and 1 s between recordings
(voxline replay's gap; run_pipecat.py's --gap-ms).

Prints a markdown table per set: turns, response latency p50/p95 (true end of
speech -> first LLM text), voice latency p50 (-> first synthesized audio), CPU
seconds per session (in the session, and whole processes), and voxline ÷
Pipecat; and the machine (nproc, load average before and after).
Not part of CI.
"""

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
VENV_PY = HERE / ".venv" / "bin" / "python"
LLAMA = ROOT / "target" / "llama-server" / "bin" / "llama-server"
LLM_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM_PROMPT = "You are a helpful voice assistant. Answer in one or two short sentences."
CLK = os.sysconf("SC_CLK_TCK")

DEFAULT_SETS = {
    "human": sorted(glob.glob(str(ROOT / "audio-fixtures/human/*.wav"))),
    "espeak": [str(ROOT / f"audio-fixtures/{q}.wav") for q in ("q_capital", "q_moon", "q_weather")],
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="NAME=A.wav,B.wav",
                   help="a fixture set played as one session (repeatable; default: human, espeak)")
    p.add_argument("--out", help="where the reports go (default: benches/peers/pipecat/out/TIMESTAMP)")
    p.add_argument("--voxline", default=str(ROOT / "target/release/voxline"))
    p.add_argument("--models-dir", default=str(ROOT / "models"))
    p.add_argument("--whisper-model", default=str(ROOT / "target/whisper-server/model"))
    p.add_argument("--threads", type=int, default=2, help="llama-server -t/-tb and CTranslate2 cpu_threads")
    p.add_argument("--tail-ms", type=int, default=3000, help="silence appended to each recording")
    p.add_argument("--only", choices=["voxline", "pipecat"], help="run one side only")
    p.add_argument("--voxline-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for voxline replay (repeatable), e.g. --voxline-arg=--no-speculation")
    p.add_argument("--hog", choices=["normal", "lowest"],
                   help="keep one core busy beside each run: a shell loop at normal priority (nice 0) "
                        "or at the lowest (nice 19)")
    p.add_argument("--verbose", action="store_true", help="show both sides' transcripts and answers")
    return p.parse_args()


# ---------------------------------------------------------------- helpers

def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / CLK


def loadavg():
    return open("/proc/loadavg").read().split()[:3]


def busy_s():
    """CPU seconds the whole machine has been busy (all cores; /proc/stat), and the wall time."""
    x = open("/proc/stat").readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in x[:8])
    return (user + nice + system + irq + softirq + steal) / CLK


def machine():
    model = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return dict(nproc=os.cpu_count(), cpu=model)


def pct(xs, q):
    """Linear-interpolated percentile (numpy's default), None for no data."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(xs):
    return pct(xs, 50)


def pad_set(name, files, out, tail_ms):
    """Copies of the recordings with tail_ms of silence after each, sidecars beside them."""
    d = out / "audio" / name
    d.mkdir(parents=True, exist_ok=True)
    padded = []
    for f in files:
        f = Path(f)
        with wave.open(str(f), "rb") as w:
            params = w.getparams()
            data = w.readframes(w.getnframes())
        if (params.framerate, params.nchannels, params.sampwidth) != (16000, 1, 2):
            sys.exit(f"{f}: the comparison needs 16 kHz mono s16 recordings")
        tail = bytes(2 * 16000 * tail_ms // 1000)
        dst = d / f.name
        with wave.open(str(dst), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(data + tail)
        side = f.with_suffix(".json")
        if side.exists():
            j = json.loads(side.read_text())
            j["file"] = dst.name
            j["duration_samples"] = (len(data) + len(tail)) // 2
            dst.with_suffix(".json").write_text(json.dumps(j, indent=2))
        padded.append(str(dst))
    return padded


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_hog(kind):
    """One core kept busy by another process (a shell loop), at normal or the lowest priority."""
    if kind is None:
        return None
    nice = "0" if kind == "normal" else "19"
    return subprocess.Popen(["nice", "-n", nice, "sh", "-c", "while :; do :; done"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_hog(proc):
    if proc is not None:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the two sides

def run_voxline(args, name, files, out, rnd):
    rep = out / f"voxline-{name}-r{rnd}.json"
    ev = out / f"voxline-{name}-r{rnd}.events.jsonl"
    cmd = [args.voxline, "replay", "--pace", "realtime", "--voice", "piper", *files,
           "--report-json", str(rep), "--events", str(ev), "--models-dir", args.models_dir,
           *args.voxline_arg]
    if not args.verbose:
        cmd.append("--quiet")
    log = open(out / f"voxline-{name}-r{rnd}.log", "w")
    t_spawn = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=None if args.verbose else log, stderr=log)
    samples = []  # (seconds since spawn, CPU s): to find the CPU spent once the models were loaded
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            samples.append((time.monotonic() - t_spawn, cpu_of(proc.pid)))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    if proc.returncode != 0:
        sys.exit(f"voxline failed ({proc.returncode}); see {log.name}")
    d = json.loads(rep.read_text())
    total = ru.ru_utime + ru.ru_stime
    # the session starts once the models are loaded (the report's cold_start.model_load_ms,
    # from the spawn: approximate by the argument parsing before it); CPU then from /proc
    load_s = d["cold_start"]["model_load_ms"] / 1000
    at_load = next((c for (t, c) in samples if t >= load_s), None)
    # answers per question: turns with a true end of speech from the sidecar; a question
    # cut in two counts its last turn (the one that answers all of it)
    by_q = {}
    for t in d["turns"]:
        if t.get("non_speech") or t.get("true_end_sample") is None:
            continue
        by_q[t["true_end_sample"]] = t
    qs = list(by_q.values())
    # Latencies read off the report's clock (at real-time pace its 0 is the stream's first
    # sample): the first token, and the first voice sample (events), minus the true end of
    # speech. The same as the report's response/voice_latency_ms, which leave out a turn
    # whose utterance the detector closed before the sidecar's end of speech; Pipecat's
    # side measures such turns, so they are measured here too.
    first_voice = {}
    for line in ev.read_text().splitlines():
        e = json.loads(line)
        if e.get("type") == "voice_audio" and e.get("id") not in first_voice:
            first_voice[e["id"]] = e["t_ms"]
    resp, voice = [], []
    for t in qs:
        end_ms = t["true_end_sample"] / 16.0
        ft = (t.get("timeline") or {}).get("first_token_ms")
        resp.append(ft - end_ms if ft is not None else t.get("response_latency_ms"))
        fv = first_voice.get(t["id"])
        voice.append(fv - end_ms if fv is not None else t.get("voice_latency_ms"))
    return dict(
        side="voxline", set=name, round=rnd, report=str(rep),
        turns=sum(1 for t in d["turns"] if not t.get("non_speech")),
        answered=sum(1 for x in resp if x is not None),
        response_ms=resp,
        voice_ms=voice,
        cpu_session_s=None if at_load is None else total - at_load,
        cpu_process_s=total,
        session_s=d["summary"].get("session_s"),
        voice_s=sum(t.get("voice_audio_s") or 0.0 for t in d["turns"]),
        texts=[(t.get("transcript"), t.get("response")) for t in d["turns"]],
    )


def start_llama(args, port, log):
    cmd = [str(LLAMA), "-m", LLM_MODEL, "-t", str(args.threads), "-tb", str(args.threads), "-c", "2048",
           "-np", "1", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        time.sleep(0.1)
    else:
        sys.exit("llama-server did not become healthy in 60 s")
    # warm it as voxline's start-up warms its in-process LLM (the system prompt prefilled):
    # llama-server's first request runs ~1.8 s of one-off work otherwise
    body = json.dumps(dict(model="x", max_tokens=1, temperature=0,
                           messages=[dict(role="system", content=SYSTEM_PROMPT),
                                     dict(role="user", content="Hello.")])).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
    return proc, url


def run_pipecat(args, name, files, out, rnd):
    rep = out / f"pipecat-{name}-r{rnd}.json"
    llog = open(out / f"llama-server-{name}-r{rnd}.log", "w")
    port = free_port()
    llama, url = start_llama(args, port, llog)
    log = open(out / f"pipecat-{name}-r{rnd}.log", "w")
    cmd = [str(VENV_PY), str(HERE / "run_pipecat.py"), *files, "--out", str(rep),
           "--llm-url", url + "/v1", "--llama-pid", str(llama.pid),
           "--whisper-model", args.whisper_model, "--stt-threads", str(args.threads),
           "--models-dir", args.models_dir, "--tail-ms", "0", "--gap-ms", "1000"]
    if not args.verbose:
        cmd.append("--quiet")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=None if args.verbose else log, stderr=log, env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        llama_total = cpu_of(llama.pid)
    finally:
        llama.terminate()
        try:
            llama.wait(10)
        except subprocess.TimeoutExpired:
            llama.kill()
        llog.close()
        log.close()
    if proc.returncode != 0:
        sys.exit(f"run_pipecat.py failed ({proc.returncode}); see {log.name}")
    d = json.loads(rep.read_text())
    qs = d["questions"]
    return dict(
        side="pipecat", set=name, round=rnd, report=str(rep),
        turns=d["user_turns"],
        answered=sum(1 for q in qs if q["response_latency_ms"] is not None),
        response_ms=[q["response_latency_ms"] for q in qs],
        voice_ms=[q["voice_latency_ms"] for q in qs],
        cpu_session_s=d["cpu_s"]["total"],
        cpu_process_s=ru.ru_utime + ru.ru_stime + llama_total,
        session_s=d["session_s"],
        voice_s=d.get("voice_s"),
        texts=[(" | ".join(x.strip() for x in q["transcripts"]), q["response"]) for q in qs],
    )


# ---------------------------------------------------------------- the table

def fmt(x, nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def ratio(a, b, nd=2):
    if a is None or b is None or b == 0:
        return "–"
    return f"×{a / b:.{nd}f}"


def summarize(runs, n_questions):
    resp = [x for r in runs for x in r["response_ms"]]
    voice = [x for r in runs for x in r["voice_ms"]]
    return dict(
        turns=f"{median([r['turns'] for r in runs]):g} ({sum(r['answered'] for r in runs)}/{n_questions * len(runs)} answered)",
        p50=pct(resp, 50), p95=pct(resp, 95), v50=pct(voice, 50),
        cpu_session=median([r["cpu_session_s"] for r in runs]),
        cpu_process=median([r["cpu_process_s"] for r in runs]),
        voice_s=median([r.get("voice_s") for r in runs]),
        others=max(r["others_cpu_s"] for r in runs),
        n=sum(1 for x in resp if x is not None),
    )


def table(results, sets, rounds):
    lines = []
    lines.append("| set | system | turns / session (answered) | response p50 / p95 ms | voice p50 ms "
                 "| voice synthesized s / session | CPU s / session (in session) "
                 "| CPU s / session (whole processes, start-up included) | other processes' CPU s (max) |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, files in sets.items():
        nq = sum(len(json.loads(Path(f).with_suffix(".json").read_text()).get("turns", []))
                 for f in files if Path(f).with_suffix(".json").exists())
        s = {}
        for side in ("voxline", "pipecat"):
            runs = [r for r in results if r["set"] == name and r["side"] == side]
            if runs:
                s[side] = summarize(runs, nq)
                v = s[side]
                lines.append(f"| {name} ({nq} q × {len(runs)}) | {side} | {v['turns']} | "
                             f"{fmt(v['p50'])} / {fmt(v['p95'])} | {fmt(v['v50'])} | {fmt(v['voice_s'], 1)} | "
                             f"{fmt(v['cpu_session'], 1)} | {fmt(v['cpu_process'], 1)} | {fmt(v['others'], 1)} |")
        if len(s) == 2:
            a, b = s["voxline"], s["pipecat"]
            lines.append(f"| {name} | **voxline ÷ Pipecat** | | {ratio(a['p50'], b['p50'])} / "
                         f"{ratio(a['p95'], b['p95'])} | {ratio(a['v50'], b['v50'])} | "
                         f"{ratio(a['voice_s'], b['voice_s'])} | "
                         f"{ratio(a['cpu_session'], b['cpu_session'])} | {ratio(a['cpu_process'], b['cpu_process'])} | |")
    return "\n".join(lines)


def main():
    args = parse_args()
    os.chdir(ROOT)
    if args.set:
        sets = {}
        for s in args.set:
            name, _, fl = s.partition("=")
            sets[name] = [str(Path(f).resolve()) for f in fl.split(",") if f]
    else:
        sets = DEFAULT_SETS
    for need in ([] if args.only == "pipecat" else [Path(args.voxline)]) + \
                ([] if args.only == "voxline" else [VENV_PY, LLAMA, Path(args.whisper_model) / "model.bin"]):
        if not Path(need).exists():
            sys.exit(f"missing {need}: run bash benches/peers/pipecat/setup.sh "
                     "(and build voxline: cargo build --release)")
    out = Path(args.out) if args.out else HERE / "out" / time.strftime("%Y%m%dT%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    padded = {name: pad_set(name, files, out, args.tail_ms) for name, files in sets.items()}

    m = machine()
    load0 = loadavg()
    print(f"machine: {m['cpu']}, nproc {m['nproc']}, load average {' '.join(load0)} (before)", flush=True)
    results = []
    t_start = time.monotonic()
    for rnd in range(1, args.rounds + 1):
        for name, files in padded.items():
            for side, fn in (("voxline", run_voxline), ("pipecat", run_pipecat)):
                if args.only and side != args.only:
                    continue
                hog = start_hog(args.hog)
                b0, me0 = busy_s(), os.times()
                try:
                    r = fn(args, name, files, out, rnd)
                    b1, me1 = busy_s(), os.times()
                finally:
                    stop_hog(hog)
                r["load_after"] = loadavg()
                # what else ran meanwhile: the machine's busy CPU less this side's processes and
                # this script's own (its polling); about 0 on an otherwise idle machine, ~1 s a
                # second with --hog normal (the loop is counted here)
                mine = (me1.user + me1.system) - (me0.user + me0.system)
                r["others_cpu_s"] = max(0.0, (b1 - b0) - r["cpu_process_s"] - mine)
                results.append(r)
                print(f"  round {rnd} {name:8s} {side:8s} answered {r['answered']}, response ms "
                      f"{[None if x is None else round(x) for x in r['response_ms']]}, "
                      f"CPU {fmt(r['cpu_session_s'], 1)} s in session; other processes {fmt(r['others_cpu_s'], 1)} s, "
                      f"load {r['load_after'][0]}", flush=True)
                if args.verbose:
                    for heard, said in r["texts"]:
                        print(f"      {heard!r} -> {said!r}")
    load1 = loadavg()
    tbl = table(results, padded, args.rounds)
    head = (f"machine: {m['cpu']}, nproc {m['nproc']}; load average {' '.join(load0)} before, "
            f"{' '.join(load1)} after; {args.rounds} round(s), {round(time.monotonic() - t_start)} s"
            + (f"; a one-core loop at {args.hog} priority beside each run" if args.hog else "")
            + (f"; voxline with {' '.join(args.voxline_arg)}" if args.voxline_arg else ""))
    print()
    print(head)
    print()
    print(tbl)
    peak = max(float(x) for x in [load0[0], load1[0]] + [r["load_after"][0] for r in results])
    if peak > 1.0:
        print(f"\n(measured under load: the 1-minute load average, this run's own processes included, "
              f"reached {peak:.2f} on {os.cpu_count()} cores; see the other processes' CPU column)")
    (out / "table.md").write_text(head + "\n\n" + tbl + "\n")
    (out / "results.json").write_text(json.dumps(dict(machine=m, load_before=load0, load_after=load1,
                                                       rounds=args.rounds, hog=args.hog, tail_ms=args.tail_ms,
                                                       voxline_args=args.voxline_arg,
                                                       runs=results), indent=1))
    print(f"\nreports: {out}")


if __name__ == "__main__":
    main()
