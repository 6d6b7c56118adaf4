#!/usr/bin/env bash
# Regenerate every audio fixture in this directory, deterministically.
#
#   ./generate.sh          rebuild all WAVs, sidecars and SHA256SUMS, then verify
#   ./generate.sh --check  only verify the files already here (no rebuild)
#
# human/ and speakers/{tune,held-out}/ hold real recordings that are copied,
# not generated (see the README): both modes verify them (sidecar boundaries
# re-derived from the audio, and each folder's SHA256SUMS) and neither
# rewrites them.
#
# Needs espeak-ng, sox (with soxi) and python3 (standard library only).
# Speech comes from espeak-ng with a fixed voice, speed, pitch and amplitude;
# sox runs with -R (fixed random seed) and -D (no dither), and noise is drawn
# from a seeded generator, so the same tool versions give the same bytes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

die() { echo "generate.sh: $*" >&2; exit 1; }

for tool in python3 sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is required"
done

# The copied human recordings: checked, never rebuilt.
check_human() {
  for d in human speakers/tune speakers/held-out; do
    python3 fixtures.py check-human "$d"
    (cd "$d" && sha256sum --quiet -c SHA256SUMS)
    echo "$d checksums: ok"
  done
}

if [[ "${1:-}" == "--check" ]]; then
  python3 fixtures.py check .
  sha256sum --quiet -c SHA256SUMS
  echo "checksums: ok"
  check_human
  exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [--check]"

for tool in espeak-ng sox soxi; do
  command -v "$tool" >/dev/null || die "$tool is required"
done

# Synthesis settings. Changing any of these changes every fixture.
VOICE=en-us
SPEED=155       # words per minute
PITCH=50
AMPLITUDE=100
NOISE_SNR_DB=18
NOISE_SEED=20261129
SOX=(sox -R -D -V1)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out="$work/out"
mkdir "$out"

# speak KEY TEXT
# Synthesise TEXT to $work/KEY.src.wav: 22050 Hz mono, peak-normalised to
# -3 dBFS, with leading and trailing silence below 0.1 % of full scale removed.
speak() {
  espeak-ng -v "$VOICE" -s "$SPEED" -p "$PITCH" -a "$AMPLITUDE" \
    -w "$work/$1.raw.wav" "$2"
  "${SOX[@]}" "$work/$1.raw.wav" "$work/$1.src.wav" norm -3 \
    silence 1 0.01 0.1% reverse silence 1 0.01 0.1% reverse
}

# segment KEY RATE DEST [OUTPUT-FORMAT-OPTIONS...]
# Resample the trimmed speech KEY to RATE, written to DEST in the given format.
segment() {
  local key=$1 rate=$2 dest=$3
  shift 3
  "${SOX[@]}" "$work/$key.src.wav" "$@" "$dest" rate -v "$rate"
}

# sidecar NAME [--turn TEXT START END]...
sidecar() {
  local name=$1
  shift
  python3 fixtures.py sidecar "$out/$name.json" --wav "$out/$name.wav" \
    --file "$name.wav" "$@"
}

# single NAME KEY TEXT RATE [OUTPUT-FORMAT-OPTIONS...]
# One utterance padded with 0.5 s of silence before and 0.8 s after.
# Sets TURN_START and TURN_END (samples at RATE).
single() {
  local name=$1 key=$2 text=$3 rate=$4
  shift 4
  local seg="$work/$name.seg.wav"
  segment "$key" "$rate" "$seg" "$@"
  local n pre post
  n=$(soxi -s "$seg")
  pre=$((rate * 5 / 10))
  post=$((rate * 8 / 10))
  "${SOX[@]}" "$seg" "$out/$name.wav" pad "${pre}s" "${post}s"
  TURN_START=$pre
  TURN_END=$((pre + n))
  sidecar "$name" --turn "$text" "$TURN_START" "$TURN_END"
}

S16=(-e signed-integer -b 16)

# --- short questions, 16 kHz mono s16 ---------------------------------------
declare -A QUESTIONS=(
  [q_capital]="What is the capital of France?"
  [q_weather]="Will it be sunny tomorrow?"
  [q_tea]="How do I make a cup of tea?"
  [q_story]="Tell me a short story about a cat."
  [q_moon]="How far away is the moon?"
)
for name in q_capital q_weather q_tea q_story q_moon; do
  speak "$name" "${QUESTIONS[$name]}"
  single "$name" "$name" "${QUESTIONS[$name]}" 16000 -c 1 "${S16[@]}"
done

# --- q_capital in other rates, layouts and encodings --------------------------
capital=${QUESTIONS[q_capital]}
single q_capital_44k_stereo q_capital "$capital" 44100 -c 2 "${S16[@]}"
single q_capital_48k_f32 q_capital "$capital" 48000 -c 1 -e floating-point -b 32
single q_capital_8k q_capital "$capital" 8000 -c 1 "${S16[@]}"
single q_capital_24bit q_capital "$capital" 16000 -c 1 -e signed-integer -b 24

# Noisy copy: white noise over the whole file, scaled so the speech region
# has NOISE_SNR_DB signal-to-noise ratio. Boundaries are those of q_capital.
single q_capital q_capital "$capital" 16000 -c 1 "${S16[@]}"
python3 fixtures.py noise "$out/q_capital.wav" "$out/q_capital_noisy.wav" \
  --snr "$NOISE_SNR_DB" --seed "$NOISE_SEED" --start "$TURN_START" --end "$TURN_END"
sidecar q_capital_noisy --turn "$capital" "$TURN_START" "$TURN_END"

# --- long_10s: two sentences joined by a 150 ms breath, ~10 s of speech ------
long_a="Every morning the old man walked slowly along the river with his small brown dog."
long_b="They always stopped near the bridge to watch the little boats go by in the warm summer sun."
speak long_a "$long_a"
speak long_b "$long_b"
segment long_a 16000 "$work/long_a.seg.wav" -c 1 "${S16[@]}"
segment long_b 16000 "$work/long_b.seg.wav" -c 1 "${S16[@]}"
"${SOX[@]}" "$work/long_a.seg.wav" "$work/long_a.pad.wav" pad 0s 2400s
"${SOX[@]}" "$work/long_a.pad.wav" "$work/long_b.seg.wav" "$out/long_10s.wav" \
  pad 8000s 12800s
long_n=$(soxi -s "$work/long_a.pad.wav")
long_n=$((long_n + $(soxi -s "$work/long_b.seg.wav")))
sidecar long_10s --turn "$long_a $long_b" 8000 $((8000 + long_n))

# --- multi_turn: three questions, 1.5 s of silence between them --------------
turn_texts=(
  "What time is it now?"
  "How many legs does a spider have?"
  "Why is the sky blue?"
)
pre=8000 gap=24000 post=12800
pos=$pre
turn_args=()
parts=()
for i in 0 1 2; do
  speak "turn$i" "${turn_texts[$i]}"
  segment "turn$i" 16000 "$work/turn$i.seg.wav" -c 1 "${S16[@]}"
  n=$(soxi -s "$work/turn$i.seg.wav")
  case $i in
    0) before=$pre after=$gap ;;
    1) before=0 after=$gap ;;
    2) before=0 after=$post ;;
  esac
  "${SOX[@]}" "$work/turn$i.seg.wav" "$work/turn$i.pad.wav" pad "${before}s" "${after}s"
  parts+=("$work/turn$i.pad.wav")
  turn_args+=(--turn "${turn_texts[$i]}" "$pos" $((pos + n)))
  pos=$((pos + n + after))
done
"${SOX[@]}" "${parts[@]}" "$out/multi_turn.wav"
sidecar multi_turn "${turn_args[@]}"

# --- silence: 3 s of digital zeros --------------------------------------------
"${SOX[@]}" -r 16000 -c 1 -n "${S16[@]}" "$out/silence.wav" trim 0s 48000s
sidecar silence

# --- verify, then install ------------------------------------------------------
python3 fixtures.py check "$out"
(cd "$out" && sha256sum -- *.wav *.json > SHA256SUMS)
cp -- "$out"/* "$here"/
echo "wrote $(ls "$out" | wc -l) files to $here ($(du -ch "$out"/*.wav | tail -n1 | cut -f1) of audio)"
check_human
