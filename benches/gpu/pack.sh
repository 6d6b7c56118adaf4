#!/usr/bin/env bash
# Packs what the GPU machine needs beyond the git working tree (the CUDA
# binary and the default models) into chunks small enough for one device
# call's carry each (64 MiB a call in all), under target/gpu-pack/:
#
#   c1/part ... cN/part   one gzip'd tar stream cut into CHUNK_MIB pieces
#   meta/unpack.sh        run on the device: checks every part, reassembles,
#                         checks every file, into target/gpu-run/
#   meta/SHA256SUMS       sha256 of each part and of each packed file
#   calls.txt             the device calls to make, with their carry lists
#
#   bash benches/gpu/pack.sh                 # target/cuda/release/voxline
#   VOXLINE_BIN=target/release/voxline bash benches/gpu/pack.sh   # (a CPU test)
#
# audio-fixtures/ is tracked, so it travels with the working tree already.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${VOXLINE_BIN:-target/cuda/release/voxline}
MODELS=${VOXLINE_MODELS_DIR:-models}
# each call sends the working tree (tracked and untracked-not-ignored files)
# beside its carry, 64 MiB in all: a chunk gets what the tree leaves, less
# 2 MiB for meta/ (with the last chunk) and for the tree growing a little
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
CHUNK_MIB=${CHUNK_MIB:-$(( (64 * 1048576 - tree_bytes) / 1048576 - 2 ))}
(( CHUNK_MIB >= 8 )) || { echo "the working tree ($((tree_bytes / 1048576)) MiB) leaves no room in a 64 MiB call; ignore what need not travel" >&2; exit 2; }
OUTDIR=${PACK_DIR:-target/gpu-pack}
# what `voxline bench` loads with its default models: the default whisper
# (tiny.en q8_0) and LLM, and the manifest that lets voxline check them
# (sizes always, sha256 once per file version). .verified.json is only a
# cache keyed by modification time, which unpacking changes: not packed.
model_files=(ggml-tiny.en-q8_0.bin SmolLM2-135M-Instruct.Q4_1.gguf manifest.json)

[[ -x $BIN ]] || { echo "no binary at $BIN (build it: bash benches/gpu/build.sh)" >&2; exit 2; }
for f in "${model_files[@]}"; do
  [[ -f $MODELS/$f ]] || { echo "missing $MODELS/$f (voxline models fetch --dir $MODELS)" >&2; exit 2; }
done

rm -rf "$OUTDIR"
stage=$OUTDIR/.stage
mkdir -p "$stage/models" "$OUTDIR/meta"
# hard links where possible (same file system), else copies
cp -l "$BIN" "$stage/voxline" 2>/dev/null || cp "$BIN" "$stage/voxline"
for f in "${model_files[@]}"; do
  cp -l "$MODELS/$f" "$stage/models/$f" 2>/dev/null || cp "$MODELS/$f" "$stage/models/$f"
done
# the binary's own libraries beyond glibc and CUDA (libasound for cpal,
# libstdc++, libgcc_s), from this machine: device.sh uses one only where
# the device lacks it (ldd says "not found")
mkdir -p "$stage/lib-fallback"
fallback=()
while read -r name _ path _; do
  case $name in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|linux-vdso*|libcuda*|libcublas*|libcudart*) continue ;;
  esac
  [[ -f $path ]] || continue
  cp -L "$path" "$stage/lib-fallback/$name"
  fallback+=("lib-fallback/$name")
done < <(ldd "$BIN" | grep '=>')
files=(voxline "${model_files[@]/#/models/}" "${fallback[@]}")
(cd "$stage" && sha256sum "${files[@]}") >"$OUTDIR/meta/files.sha256"

# one stream: tar | gzip (the binary shrinks ~3x, the models ~7 %), cut into pieces
tar -C "$stage" -cf - "${files[@]}" | gzip -6 | split -b "${CHUNK_MIB}M" -d -a 3 - "$OUTDIR/.part."
rm -rf "$stage"
n=0
for p in "$OUTDIR"/.part.*; do
  n=$((n + 1))
  mkdir -p "$OUTDIR/c$n"
  mv "$p" "$OUTDIR/c$n/part"
done
(cd "$OUTDIR" && for i in $(seq 1 "$n"); do sha256sum "c$i/part"; done) >"$OUTDIR/meta/parts.sha256"
cat "$OUTDIR/meta/parts.sha256" "$OUTDIR/meta/files.sha256" >"$OUTDIR/meta/SHA256SUMS"

cat >"$OUTDIR/meta/unpack.sh" <<'EOF'
#!/bin/sh
# Reassembles what benches/gpu/pack.sh packed: checks each part, joins and
# unpacks them, checks each file, into target/gpu-run/ (or $1). Run from
# anywhere; paths are relative to the repository root.
set -eu
meta=$(cd "$(dirname "$0")" && pwd)
pack=$(dirname "$meta")
cd "$pack/../.."
dest=${1:-target/gpu-run}
sums=$meta/files.sha256
if [ -f "$dest/.complete" ] && (cd "$dest" && sha256sum -c --quiet "$sums") 2>/dev/null; then
  echo "unpack: $dest already complete"; exit 0
fi
missing=""
for p in $(cut -d' ' -f3 "$meta/parts.sha256"); do
  [ -f "$pack/$p" ] || missing="$missing ${p%/part}"
done
if [ -n "$missing" ]; then
  echo "unpack: missing chunk(s):$missing (carry them again: the machine forgets ignored files when it goes idle)" >&2
  exit 3
fi
(cd "$pack" && sha256sum -c --quiet "$meta/parts.sha256") || { echo "unpack: a part is damaged (see above); carry it again" >&2; exit 3; }
rm -rf "$dest"; mkdir -p "$dest"
for p in $(cut -d' ' -f3 "$meta/parts.sha256"); do cat "$pack/$p"; done | gzip -dc | tar -C "$dest" -xf -
(cd "$dest" && sha256sum -c "$sums")
chmod +x "$dest/voxline"
touch "$dest/.complete"
echo "unpack: $dest ready ($(du -sh "$dest" | cut -f1))"
EOF
chmod +x "$OUTDIR/meta/unpack.sh"

{
  echo "# device calls, each within 30 s of the last (the machine keeps ignored files only while warm)"
  for i in $(seq 1 $((n - 1))); do
    echo "call $i: carry [\"$OUTDIR/c$i\"]  command: du -sh $OUTDIR/c$i"
  done
  echo "call $n: carry [\"$OUTDIR/c$n\", \"$OUTDIR/meta\"]  command: sh $OUTDIR/meta/unpack.sh && bash benches/gpu/device.sh"
} >"$OUTDIR/calls.txt"

echo "== $OUTDIR: $n chunk(s) of at most $CHUNK_MIB MiB (the working tree that travels with each: $((tree_bytes / 1024)) KiB)"
(cd "$OUTDIR" && ls -l c*/part meta/* | awk '{print $5, $NF}')
cat "$OUTDIR/calls.txt"
