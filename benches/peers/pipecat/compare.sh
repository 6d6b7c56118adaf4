#!/usr/bin/env bash
# The one command: voxline against Pipecat 1.14.0's local cascade on the
# project's fixtures, interleaved rounds, a markdown table at the end.
#   bash benches/peers/pipecat/compare.sh [--rounds 3] [--set NAME=A.wav,B.wav] [--out DIR] [--verbose]
# Sets up the peer's venv first (a no-op once done). Not part of CI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh" >&2
exec python3 "$here/compare.py" "$@"
