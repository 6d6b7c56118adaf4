#!/usr/bin/env bash
# The GPU measurement, in one device call of at most ~8 minutes. Needs what
# benches/gpu/pack.sh packed, unpacked by its unpack.sh into target/gpu-run/.
#
#   1. nvidia-smi, before
#   2. voxline bench on the fixtures, both engines on the device's CPU
#      cores (--threads 16): $OUT/cpu
#   3. the same with both engines on the GPU (--n-gpu-layers 99 --stt-gpu),
#      compared with the CPU run (--baseline): $OUT/gpu
#   4. voxline bench --sessions 1,8,32,64 on the GPU: $OUT/sessions
#   5. nvidia-smi, after; a summary: STT ms and decode tokens/s against the
#      memory-bandwidth bound of the LLM's weights, per session count
#
# $OUT ends with at most 8 files, at most one folder deep (what the device
# tool returns): summary.md, summary.json, cpu/report.json, gpu/report.json,
# gpu/report.md, sessions/sessions.json, sessions/sessions.md, and
# all.tar.gz with everything else (logs, nvidia-smi, csv, svg, cpu/report.md).
#
# Without a GPU (to check the script): GPU=0 VOXLINE_BIN=target/release/voxline
# VOXLINE_MODELS_DIR=models CPU_THREADS=2 SESSIONS=1 OUT=target/gpu-out-cpu bash benches/gpu/device.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)

BIN=${VOXLINE_BIN:-target/gpu-run/voxline}
MODELS=${VOXLINE_MODELS_DIR:-target/gpu-run/models}
OUT=${OUT:-target/gpu-out}
FIXTURES=${FIXTURES:-audio-fixtures}
CPU_THREADS=${CPU_THREADS:-16}
SESSIONS=${SESSIONS:-1,8,32,64}
GPU=${GPU:-1}
BUDGET_S=${BUDGET_S:-470}          # the whole script, leaving the call's margin
HBM_GBPS=${HBM_GBPS:-4800}         # H200 HBM3e, GB/s (10^9 B/s)
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[[ -x $PY ]] || PY=python3

mkdir -p "$OUT"
log=$OUT/run.log
say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$log"; }
left() { echo $((BUDGET_S - ($(date +%s) - t0))); }

# the CUDA 13 libraries the binary needs (libcudart, libcublas, libcublasLt)
# are the PyTorch venv's nvidia-* wheels: put every nvidia/*/lib on the path
if libs=$("$PY" -c 'import nvidia, os; print(":".join(os.path.join(d, s, "lib") for d in nvidia.__path__ for s in sorted(os.listdir(d)) if os.path.isdir(os.path.join(d, s, "lib"))))' 2>/dev/null) && [[ -n $libs ]]; then
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# a library the device lacks (libasound, an old libstdc++): the copy that
# pack.sh took from the build machine, and only that one
fb=$(dirname "$BIN")/lib-fallback
if [[ -d $fb ]]; then
  mkdir -p "$fb/missing"
  for l in $(ldd "$BIN" 2>/dev/null | awk '/not found/ {print $1}'); do
    [[ -f $fb/$l ]] && ln -sfn "../$l" "$fb/missing/$l"
  done
  [[ -n $(ls "$fb/missing") ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(cd "$fb/missing" && pwd)
fi
# the engines' load logs (off by default) say where each computes: ggml's
# CUDA devices, llama.cpp's "offloaded N/N layers", voxline's "computes on
# the GPU" for an engine that takes no CPU lease
export VOXLINE_LOG=${VOXLINE_LOG:-warn,voxline_stt=info,voxline_llm=info,llama-cpp-2=info,whisper_rs=info}
say "binary $BIN, models $MODELS, python $PY, LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
{ ldd "$BIN" | grep -Ei 'cuda|cublas|not found'; "$BIN" --version; } >>"$log" 2>&1

smi() {
  command -v nvidia-smi >/dev/null || { echo "(no nvidia-smi)"; return; }
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.used,memory.total,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
}
smi >"$OUT/smi-before.txt" 2>&1
sampler=
if [[ $GPU == 1 ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm \
    --format=csv,noheader -l 1 >"$OUT/smi-samples.csv" 2>&1 &
  sampler=$!
fi

# a step gets what is left of the budget (minus a reserve for the summary)
step() { # name timeout-cap command...
  local name=$1 cap=$2; shift 2
  local t=$(($(left) - 25)); ((t > cap)) && t=$cap
  if ((t < 10)); then say "$name: skipped, budget spent"; return 124; fi
  say "$name: $* (timeout ${t} s)"
  local s=$(date +%s)
  timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  say "$name: exit $rc after $(($(date +%s) - s)) s"
  tail -3 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$log"
  return $rc
}

common=(--fixtures "$FIXTURES" --models-dir "$MODELS")
step cpu 120 "$BIN" bench "${common[@]}" --threads "$CPU_THREADS" --out "$OUT/cpu"
if [[ $GPU == 1 ]]; then
  gpu=(--n-gpu-layers 99 --stt-gpu)
  base=()
  [[ -f $OUT/cpu/report.json ]] && base=(--baseline "$OUT/cpu/report.json")
  step gpu 90 "$BIN" bench "${common[@]}" "${gpu[@]}" "${base[@]}" --out "$OUT/gpu"
else
  gpu=()
fi
step sessions 400 "$BIN" bench --sessions "$SESSIONS" "${common[@]}" "${gpu[@]}" --out "$OUT/sessions"

[[ -n $sampler ]] && kill "$sampler" 2>/dev/null
smi >"$OUT/smi-after.txt" 2>&1

# -- summary: STT ms, decode tokens/s against the bandwidth bound ------------
llm=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
"$PY" - "$OUT" "$llm" "$HBM_GBPS" "$CPU_THREADS" <<'EOF' >>"$log" 2>&1
import json, os, struct, sys
out, gguf, gbps, cpu_threads = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]

def tensor_bytes(path):
    """Bytes of the GGUF's tensor data (all weights; the embedding is tied to
    the output layer, so a decode step reads all of it), from its header."""
    f = open(path, "rb")
    rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
    rs = lambda: f.read(rd("Q")).decode("utf-8", "replace")
    assert f.read(4) == b"GGUF"
    rd("I"); n_t, n_kv = rd("Q"), rd("Q")
    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def val(t):
        if t == 8: return rs()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [val(et) for _ in range(n)]
        return rd(sizes[t])
    align = 32
    for _ in range(n_kv):
        k = rs(); v = val(rd("I"))
        if k == "general.alignment": align = v
    for _ in range(n_t):
        rs(); nd = rd("I"); [rd("Q") for _ in range(nd)]; rd("I"); rd("Q")
    start = (f.tell() + align - 1) // align * align
    return os.path.getsize(path) - start

def load(p):
    try: return json.load(open(os.path.join(out, p)))
    except Exception as e: return None

w = tensor_bytes(gguf) if os.path.exists(gguf) else 97e6
bound1 = gbps * 1e9 / w  # one sequence: every token reads every weight once
res = {"hbm_gb_per_s": gbps, "weight_bytes": w,
       "bound_decode_tps_one_sequence": bound1, "runs": {}, "sessions": []}
def pct(d, k, q="p50"):
    v = (d or {}).get(k)
    return v.get(q) if isinstance(v, dict) else v
for name in ("cpu", "gpu"):
    r = load(f"{name}/report.json")
    if not r: continue
    s = r["summary"]
    res["runs"][name] = {
        "stt_ms_p50": pct(s, "stt_ms"), "stt_ms_p90": pct(s, "stt_ms", "p90"),
        "decode_tps_p50": pct(s, "llm_decode_tps"),
        "prefill_tps_p50": pct(s, "llm_prefill_tps"),
        "ttft_ms_p50": pct(s, "llm_ttft_ms"),
        "response_latency_ms_p50": pct(s, "response_latency_ms"),
        "response_latency_ms_p90": pct(s, "response_latency_ms", "p90"),
        "model_load_ms": r.get("cold_start", {}).get("model_load_ms"),
        "turns": s.get("turns"), "errors": s.get("errors"),
        "decode_fraction_of_bound": (pct(s, "llm_decode_tps") or 0) / bound1,
    }
sess = load("sessions/sessions.json")
for row in (sess or {}).get("rows", []):
    n = row["sessions"]
    agg = row.get("aggregate_decode_tps")
    # n sequences decoded in one batch read the weights once per step: the
    # bound is n times one sequence's (ignoring KV-cache reads)
    res["sessions"].append({
        "sessions": n, "turns": row.get("turns"), "errors": row.get("errors"),
        "stt_ms_p50": pct(row, "stt_ms"), "stt_ms_p90": pct(row, "stt_ms", "p90"),
        "session_decode_tps_p50": pct(row, "session_decode_tps"),
        "aggregate_decode_tps": agg,
        "bound_one_sequence_tps": bound1, "bound_batched_tps": n * bound1,
        "aggregate_fraction_of_batched_bound": (agg or 0) / (n * bound1),
        "response_latency_ms_p50": pct(row, "response_latency_ms"),
        "response_latency_ms_p90": pct(row, "response_latency_ms", "p90"),
        "saturating_stage": row.get("saturating_stage"), "wall_s": row.get("wall_s"),
    })
json.dump(res, open(os.path.join(out, "summary.json"), "w"), indent=2)

f = lambda v, d=1: "–" if v is None else f"{v:,.{d}f}"
md = ["# voxline on the GPU machine", "",
      f"LLM weights {w/1e6:.1f} MB; at {gbps/1e3:.1f} TB/s one sequence's decode bound is "
      f"{bound1:,.0f} tokens/s (bandwidth / weight bytes per token).", "",
      "| run | STT ms p50 | p90 | decode tok/s p50 | of bound | prefill tok/s | TTFT ms | response ms p50 | p90 | load ms | turns | errors |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for k, v in res["runs"].items():
    md.append(f"| {k} | {f(v['stt_ms_p50'])} | {f(v['stt_ms_p90'])} | {f(v['decode_tps_p50'])} | "
              f"{100*v['decode_fraction_of_bound']:.2f} % | {f(v['prefill_tps_p50'])} | {f(v['ttft_ms_p50'])} | "
              f"{f(v['response_latency_ms_p50'])} | {f(v['response_latency_ms_p90'])} | {f(v['model_load_ms'],0)} | "
              f"{v['turns']} | {v['errors']} |")
if "cpu" in res["runs"] and "gpu" in res["runs"]:
    c, g = res["runs"]["cpu"], res["runs"]["gpu"]
    if c["stt_ms_p50"] and g["stt_ms_p50"]:
        md.append(f"\nSTT: GPU {c['stt_ms_p50']/g['stt_ms_p50']:.1f}x faster than {cpu_threads} CPU threads (p50).")
    if c["decode_tps_p50"] and g["decode_tps_p50"]:
        md.append(f"Decode: GPU {g['decode_tps_p50']/c['decode_tps_p50']:.1f}x the CPU's tokens/s (p50).")
if res["sessions"]:
    md += ["", "| sessions | STT ms p50 | p90 | decode tok/s per session p50 | aggregate tok/s | batched bound | of bound | response ms p50 | p90 | saturating | turns | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in res["sessions"]:
        md.append(f"| {v['sessions']} | {f(v['stt_ms_p50'])} | {f(v['stt_ms_p90'])} | {f(v['session_decode_tps_p50'])} | "
                  f"{f(v['aggregate_decode_tps'])} | {f(v['bound_batched_tps'],0)} | {100*v['aggregate_fraction_of_batched_bound']:.2f} % | "
                  f"{f(v['response_latency_ms_p50'])} | {f(v['response_latency_ms_p90'])} | {v['saturating_stage']} | {v['turns']} | {v['errors']} |")
open(os.path.join(out, "summary.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF
{
  echo; echo "## run"; echo '```'; cat "$log"; echo '```'
  echo; echo "## nvidia-smi before / after"; echo '```'
  tail -3 "$OUT/smi-before.txt"; tail -3 "$OUT/smi-after.txt"; echo '```'
  if [[ -s $OUT/smi-samples.csv ]]; then
    echo; echo "GPU utilisation while running (1 s samples): max $(cut -d, -f2 "$OUT/smi-samples.csv" | tr -dc '0-9\n' | sort -n | tail -1) %"
  fi
  echo; echo "## CUDA lines from the engines"; echo '```'
  grep -hE 'ggml_cuda|CUDA|cuBLAS|cublas|offload|GPU' "$OUT"/{cpu,gpu,sessions}.log 2>/dev/null | sort | uniq -c | sort -rn | head -25; echo '```'
} >>"$OUT/summary.md"

# -- at most 8 files come back: keep 7, tar the rest ---------------------------
keep=(summary.md summary.json cpu/report.json gpu/report.json gpu/report.md sessions/sessions.json sessions/sessions.md)
stash=$(mktemp -d)
for k in "${keep[@]}"; do [[ -f $OUT/$k ]] && { mkdir -p "$stash/$(dirname "$k")"; cp "$OUT/$k" "$stash/$k"; }; done
tar -C "$OUT" -czf "$stash/all.tar.gz" --exclude=all.tar.gz .
find "$OUT" -mindepth 1 -delete
cp -r "$stash"/. "$OUT"/
rm -rf "$stash"
echo "done in $(($(date +%s) - t0)) s: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
cat "$OUT/summary.md" | head -30
