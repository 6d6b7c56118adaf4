#!/usr/bin/env python3
"""Pipecat 1.14.0's local cascade on recorded WAVs at real-time pace.

The peer voxline is compared with (issue 61): Silero VAD + smart-turn v3.2
(both bundled in the pipecat-ai wheel; Pipecat's default user-turn
strategies), faster-whisper on the local CTranslate2 tiny.en
(WhisperSTTService, int8), SmolLM2-135M on llama-server through
OpenAILLMService(base_url=...), and Piper in-process (PiperTTSService) on
models/en_US-joe-medium.onnx. Everything else is Pipecat's default.

Pipecat has no file transport, so this file brings one: the input side pushes
20 ms InputAudioRawFrames on a wall-clock schedule (frame k leaves when its
last sample would have been captured, as a microphone delivers it); the
output side is a loudspeaker that takes audio at real-time pace and discards
it. Each recording is followed by --tail-ms of silence (so its turn can end
on Pipecat's own timers) and --gap-ms more (voxline replay's gap between
recordings), and the microphone goes on giving silence until the assistant
is done.

An observer timestamps frames (time.monotonic). For each question (the
sidecar .json's "turns", sample positions on the recording's timeline):
  response latency = true end of speech -> the first LLMTextFrame of the first
                     LLM response that started after it;
  voice latency    = true end of speech -> that response's first TTSAudioRawFrame.
A response counts for a question only if it starts before the next question's
speech does. CPU: this process (os.times) and llama-server (/proc/PID/stat,
with --llama-pid) over the session, from the first audio frame to the end.

Writes one JSON (--out) with per-question figures and the session's events.
"""

import argparse
import asyncio
import json
import os
import sys
import time
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
FRAME_SAMPLES = SAMPLE_RATE // 50  # 20 ms
# voxline's defaults (see `voxline replay --help`), so both LLMs get the same request
SYSTEM_PROMPT = "You are a helpful voice assistant. Answer in one or two short sentences."


def proc_cpu_s(pid):
    """utime + stime of a process, in seconds, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s():
    t = os.times()
    return t.user + t.system


def read_wav(path):
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (SAMPLE_RATE, 1, 2):
            sys.exit(f"{path}: needs 16 kHz mono s16 (got {w.getframerate()} Hz, "
                     f"{w.getnchannels()} ch, {8 * w.getsampwidth()} bit)")
        return w.readframes(w.getnframes())


def read_turns(path):
    side = Path(path).with_suffix(".json")
    if not side.exists():
        return []
    d = json.loads(side.read_text())
    return [dict(text=t.get("text", ""), start_sample=t["start_sample"], end_sample=t["end_sample"])
            for t in d.get("turns", [])]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="16 kHz mono s16 WAVs, with sidecar .json (turns[].end_sample)")
    p.add_argument("--out", required=True, help="per-turn JSON written here")
    p.add_argument("--llm-url", default="http://127.0.0.1:18181/v1", help="llama-server's OpenAI base URL")
    p.add_argument("--llm-model", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--llama-pid", type=int, help="llama-server's PID, to count its CPU over the session")
    p.add_argument("--whisper-model", default="target/whisper-server/model", help="CTranslate2 model directory")
    p.add_argument("--compute-type", default="int8")
    p.add_argument("--stt-threads", type=int, default=2, help="CTranslate2 cpu_threads")
    p.add_argument("--models-dir", default="models", help="holds en_US-joe-medium.onnx(.json)")
    p.add_argument("--voice", default="en_US-joe-medium")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--tail-ms", type=int, default=3000, help="silence after each recording")
    p.add_argument("--gap-ms", type=int, default=1000, help="more silence between recordings (voxline replay's gap)")
    p.add_argument("--settle-ms", type=int, default=2000,
                   help="after the audio: end once nothing has happened for this long")
    p.add_argument("--max-extra-s", type=float, default=60, help="after the audio: end after this long at most")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args()


async def main(args):
    t_import = time.monotonic()
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")

    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import (
        BotStartedSpeakingFrame,
        BotStoppedSpeakingFrame,
        EndFrame,
        InputAudioRawFrame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        OutputAudioRawFrame,
        StartFrame,
        TranscriptionFrame,
        TTSAudioRawFrame,
        UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame,
    )
    from pipecat.observers.base_observer import BaseObserver, FramePushed
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService
    from pipecat.transports.base_input import BaseInputTransport
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import BaseTransport, TransportParams
    from pipecat.workers.runner import WorkerRunner

    # ---- the timeline: recordings, their tails and gaps, sample positions ----
    pcm = bytearray()
    questions = []
    recordings = []
    for i, f in enumerate(args.files):
        audio = read_wav(f)
        off = len(pcm) // 2
        recordings.append(dict(file=str(f), offset_sample=off, samples=len(audio) // 2))
        for t in read_turns(f):
            questions.append(dict(file=str(f), text=t["text"],
                                  start_sample=off + t["start_sample"], end_sample=off + t["end_sample"]))
        pcm += audio
        pcm += bytes(2 * SAMPLE_RATE * args.tail_ms // 1000)
        if i + 1 < len(args.files):
            pcm += bytes(2 * SAMPLE_RATE * args.gap_ms // 1000)
    pcm += bytes((-len(pcm) // 2) % FRAME_SAMPLES * 2)
    audio_samples = len(pcm) // 2

    events = []  # (t, kind, extra): t on time.monotonic()
    state = dict(t0=None, last_activity=time.monotonic(), bot_speaking=False, audio_done=False, voice_s=0.0)

    # ---- the file "microphone" and the discarding "loudspeaker" ----
    class FileMicrophone(BaseInputTransport):
        async def start(self, frame: StartFrame):
            await super().start(frame)
            await self.set_transport_ready(frame)
            self._feeder = self.create_task(self._feed(), "file-microphone")

        async def _stop_feeder(self):
            if getattr(self, "_feeder", None) is not None:
                await self.cancel_task(self._feeder)
                self._feeder = None

        async def stop(self, frame):
            await self._stop_feeder()
            await super().stop(frame)

        async def cancel(self, frame):
            await self._stop_feeder()
            await super().cancel(frame)

        async def _feed(self):
            silence = bytes(2 * FRAME_SAMPLES)
            t0 = time.monotonic() + 0.2
            state["t0"] = t0
            state["cpu0"] = self_cpu_s()
            state["llama_cpu0"] = proc_cpu_s(args.llama_pid) if args.llama_pid else None
            k = 0
            n_frames = audio_samples // FRAME_SAMPLES
            while True:
                # frame k holds samples [k*320, (k+1)*320): it is captured at their end
                deadline = t0 + (k + 1) * FRAME_SAMPLES / SAMPLE_RATE
                delay = deadline - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if k < n_frames:
                    chunk = bytes(pcm[k * 2 * FRAME_SAMPLES:(k + 1) * 2 * FRAME_SAMPLES])
                else:
                    if not state["audio_done"]:
                        state["audio_done"] = True
                        state["t_audio_end"] = deadline
                    chunk = silence  # the microphone goes on until the session ends
                await self.push_audio_frame(InputAudioRawFrame(audio=chunk, sample_rate=SAMPLE_RATE, num_channels=1))
                k += 1

    class DiscardingSpeaker(BaseOutputTransport):
        """Takes audio as a sound card would (real-time pace, one chunk of buffer), plays nothing."""

        def __init__(self, params):
            super().__init__(params)
            self._play_until = 0.0

        async def start(self, frame: StartFrame):
            await super().start(frame)
            await self.set_transport_ready(frame)

        async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
            dur = len(frame.audio) / (2 * frame.num_channels * frame.sample_rate)
            now = time.monotonic()
            self._play_until = max(self._play_until, now) + dur
            delay = self._play_until - dur - now
            if delay > 0:
                await asyncio.sleep(delay)
            return True

    class FileTransport(BaseTransport):
        def __init__(self, params):
            super().__init__()
            self._in = FileMicrophone(params)
            self._out = DiscardingSpeaker(params)

        def input(self):
            return self._in

        def output(self):
            return self._out

    # ---- the cascade ----
    class LocalWhisperSTT(WhisperSTTService):
        """WhisperSTTService on a local CTranslate2 directory, with cpu_threads set
        (Pipecat's own _load passes only device and compute_type)."""

        def __init__(self, *, cpu_threads, **kwargs):
            self._cpu_threads = cpu_threads
            super().__init__(**kwargs)

        def _load(self):
            from faster_whisper import WhisperModel

            self._model = WhisperModel(str(self._settings.model), device=self._device,
                                       compute_type=self._compute_type, cpu_threads=self._cpu_threads)

    params = TransportParams(audio_in_enabled=True, audio_out_enabled=True)
    transport = FileTransport(params)
    stt = LocalWhisperSTT(cpu_threads=args.stt_threads, device="cpu", compute_type=args.compute_type,
                          settings=WhisperSTTService.Settings(model=str(Path(args.whisper_model).resolve())))
    llm = OpenAILLMService(
        api_key="none",
        base_url=args.llm_url,
        settings=OpenAILLMService.Settings(model=args.llm_model, system_instruction=SYSTEM_PROMPT,
                                           temperature=0.0, seed=42, max_tokens=args.max_tokens),
    )
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice=args.voice),
                          download_dir=Path(args.models_dir).resolve())
    context = LLMContext()
    user_agg, assistant_agg = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer()))
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), assistant_agg])

    class Timestamps(BaseObserver):
        async def on_push_frame(self, data: FramePushed):
            if not data.first_push:
                return
            f, src, now = data.frame, data.source, time.monotonic()
            kind = None
            extra = None
            if isinstance(f, LLMTextFrame) and src is llm:
                kind, extra = "llm_text", f.text
            elif isinstance(f, LLMFullResponseStartFrame) and src is llm:
                kind = "llm_start"
            elif isinstance(f, LLMFullResponseEndFrame) and src is llm:
                kind = "llm_end"
            elif isinstance(f, TTSAudioRawFrame) and src is tts:
                kind = "tts_audio"
                # the seconds of voice synthesized (each frame once: first_push)
                state["voice_s"] += len(f.audio) / 2 / f.sample_rate
            elif isinstance(f, TranscriptionFrame) and src is stt:
                kind, extra = "transcript", f.text
            elif isinstance(f, UserStartedSpeakingFrame):
                kind = "user_started"
            elif isinstance(f, UserStoppedSpeakingFrame):
                kind = "user_stopped"
            elif isinstance(f, InterruptionFrame):
                kind = "interruption"
            elif isinstance(f, BotStartedSpeakingFrame):
                kind = "bot_started"
                state["bot_speaking"] = True
            elif isinstance(f, BotStoppedSpeakingFrame):
                kind = "bot_stopped"
                state["bot_speaking"] = False
            if kind is None:
                return
            # frames broadcast both ways, or passed on by several processors, count once
            if kind in ("user_started", "user_stopped", "interruption", "bot_started", "bot_stopped"):
                if events and events[-1][1] == kind and now - events[-1][0] < 0.05:
                    return
            if kind != "tts_audio" or not events or events[-1][1] != "tts_audio":
                events.append((now, kind, extra))
            state["last_activity"] = now

    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=SAMPLE_RATE),
        observers=[Timestamps()],
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    t_ready = time.monotonic()
    cpu_ready = self_cpu_s()

    async def ender():
        while True:
            await asyncio.sleep(0.1)
            if not state["audio_done"]:
                continue
            now = time.monotonic()
            quiet = now - max(state["last_activity"], state["t_audio_end"]) > args.settle_ms / 1000
            if (quiet and not state["bot_speaking"]) or now - state["t_audio_end"] > args.max_extra_s:
                state["t_end"] = now
                state["cpu1"] = self_cpu_s()
                state["llama_cpu1"] = proc_cpu_s(args.llama_pid) if args.llama_pid else None
                await worker.queue_frame(EndFrame())
                return

    runner = WorkerRunner(handle_sigint=True)
    await runner.add_workers(worker)
    end_task = asyncio.create_task(ender())
    await runner.run()
    end_task.cancel()

    # ---- per question ----
    t0 = state["t0"]
    at = lambda sample: t0 + sample / SAMPLE_RATE
    rel = lambda t: round((t - t0) * 1000, 1)
    out_q = []
    for i, q in enumerate(questions):
        e = at(q["end_sample"])
        s = at(q["start_sample"])
        nxt = at(questions[i + 1]["start_sample"]) if i + 1 < len(questions) else float("inf")
        r = dict(q, end_ms=rel(e), response_latency_ms=None, voice_latency_ms=None,
                 transcripts=[x for (t, k, x) in events if k == "transcript" and s <= t < nxt],
                 response="", responses_started_before_end=0)
        r["responses_started_before_end"] = sum(1 for (t, k, _) in events if k == "llm_start" and s < t < e)
        start = next((t for (t, k, _) in events if k == "llm_start" and e <= t < nxt), None)
        if start is not None:
            first_text = next((t for (t, k, _) in events if k == "llm_text" and t >= start), None)
            if first_text is not None and first_text < nxt:
                r["response_latency_ms"] = round((first_text - e) * 1000, 1)
                stop = next((t for (t, k, _) in events if k in ("llm_end", "llm_start") and t > start), nxt)
                r["response"] = "".join(x for (t, k, x) in events if k == "llm_text" and start <= t <= stop)
                audio = next((t for (t, k, _) in events if k == "tts_audio" and t >= first_text), None)
                if audio is not None and audio < nxt:
                    r["voice_latency_ms"] = round((audio - e) * 1000, 1)
        out_q.append(r)
        if not args.quiet:
            print(f"[{i + 1}] heard: {' | '.join(x.strip() for x in r['transcripts'])}")
            print(f"[{i + 1}] pipecat: {r['response'].strip()}  "
                  f"(response {r['response_latency_ms']} ms, voice {r['voice_latency_ms']} ms)")

    session_s = state["t_end"] - t0
    cpu_py = state["cpu1"] - state["cpu0"]
    cpu_llama = (state["llama_cpu1"] - state["llama_cpu0"]) if args.llama_pid else None
    report = dict(
        peer="pipecat-ai 1.14.0",
        config=dict(stt=f"faster-whisper {args.whisper_model} {args.compute_type} cpu_threads={args.stt_threads}",
                    llm=f"{args.llm_model} via {args.llm_url}", max_tokens=args.max_tokens,
                    tts=f"piper {args.voice}", vad="silero (Pipecat defaults)",
                    turn="smart-turn v3.2 (Pipecat's default stop strategy)",
                    tail_ms=args.tail_ms, gap_ms=args.gap_ms),
        files=[str(f) for f in args.files], recordings=recordings,
        audio_s=audio_samples / SAMPLE_RATE, session_s=round(session_s, 3),
        voice_s=round(state["voice_s"], 3),
        setup_s=round(t_ready - t_import, 3), setup_cpu_s=round(cpu_ready, 3),
        cpu_s=dict(python=round(cpu_py, 3), llama_server=None if cpu_llama is None else round(cpu_llama, 3),
                   total=round(cpu_py + (cpu_llama or 0.0), 3)),
        user_turns=sum(1 for (_, k, _) in events if k == "user_stopped"),
        interruptions=sum(1 for (_, k, _) in events if k == "interruption"),
        llm_responses=sum(1 for (_, k, _) in events if k == "llm_start"),
        questions=out_q,
        events=[dict(t_ms=rel(t), kind=k, **({"text": x} if x is not None else {})) for (t, k, x) in events],
    )
    Path(args.out).write_text(json.dumps(report, indent=1))
    if not args.quiet:
        print(f"session {session_s:.1f} s, audio {report['audio_s']:.1f} s, CPU {report['cpu_s']}, "
              f"user turns {report['user_turns']}, interruptions {report['interruptions']}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    asyncio.run(main(parse_args()))
