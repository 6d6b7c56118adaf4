#!/usr/bin/env bash
# Installs what voxline needs on a Debian/Ubuntu machine (system packages
# when run as root), builds the binary and fetches the models. Safe to
# run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_t0=$(date +%s)

# cmake/clang/libclang: whisper.cpp and llama.cpp builds (bindgen);
# libasound2-dev + pkg-config: the microphone (cpal's ALSA backend);
# espeak-ng: the instant voice and the neural voice's phonemes (run as a program), and with sox
# regenerating the audio fixtures; python3-pip: `models fetch`; python3-venv: the speech server the tests start;
# alsa-utils (arecord), pulseaudio + pulseaudio-utils (paplay, pactl) and
# libasound2-plugins (ALSA's pulse plugin): the live tests through a real sound server;
# chromium: the browser test of `voxline serve`'s page; ffmpeg: the compressed recordings
# (MP3, Ogg, M4A) the decoding tests join and cut, and the reference for what they hold.
packages=(cmake clang libclang-dev libasound2-dev pkg-config espeak-ng sox ffmpeg python3 python3-pip python3-venv alsa-utils
          pulseaudio pulseaudio-utils libasound2-plugins)
# `--tests` (the test command): also what only the tests need (the browser
# test's chromium, the real servers the remote-engine tests start), never
# before a newcomer's first answer
tests=false
[[ "${1:-}" == --tests ]] && tests=true
$tests && packages+=(chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# pip may come from another Python than Debian's (e.g. pyenv): accept any working one.
# (and venv with it, where that Python has its venv module)
if python3 -m pip --version >/dev/null 2>&1; then
  have=(python3 python3-pip)
  python3 -c "import venv, ensurepip" 2>/dev/null && have+=(python3-venv)
  kept=()
  for p in "${missing[@]}"; do
    [[ " ${have[*]} " == *" $p "* ]] || kept+=("$p")
  done
  missing=("${kept[@]}")
fi
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "voxline needs these Debian packages: ${missing[*]}" >&2
    echo "install them (sudo apt-get install ${missing[*]}) and run this again" >&2
    exit 2
  fi
fi
command -v cargo >/dev/null || { echo "voxline needs a Rust toolchain (cargo); install it with rustup and run this again" >&2; exit 2; }

# what the C++ builds leave out (see the file)
export CMAKE_PROJECT_INCLUDE_BEFORE="$PWD/.ci/llama-trim.cmake"
echo "== building voxline (optimised; the first build compiles whisper.cpp and llama.cpp, ~5-10 min)"
cargo build --release --locked --bin voxline
echo "== models"
./target/release/voxline models fetch --dir models
echo "   ($(( $(date +%s) - setup_t0 )) s: packages, build and models; the first answer can run)"
# the real servers the remote-engine tests start on loopback: llama.cpp's
# llama-server (built once from source, ~12 min on 2 cores) and a
# faster-whisper server (a pinned venv on the tiny.en `models fetch` installed)
if $tests; then
  bash .ci/llama-server.sh
  bash .ci/whisper-server.sh
fi
