#!/usr/bin/env bash
# Runs voxline's whole test suite, installing what is missing first.
# Inference runs in the optimised profile (a debug-built ggml is unusably slow).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
since() { echo "   ($(( $(date +%s) - t0 )) s since the test command started)"; }
bash .ci/setup.sh --tests
# the same C++ configuration as setup.sh's build (see .ci/llama-trim.cmake)
export CMAKE_PROJECT_INCLUDE_BEFORE="$PWD/.ci/llama-trim.cmake"
since
echo "== format and lints"
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo fmt --all --check
cargo clippy --release --locked --workspace --all-targets -- -D warnings
since
echo "== tests: both tiers (the fast one alone: cargo test --release --locked --workspace)"
cargo test --release --locked --workspace --features voxline/slow-tests 2>&1 | tee target/test-output.txt
since
echo "== summary"
grep -E "^test result:" target/test-output.txt | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d skipped\n", p, f, i}'
