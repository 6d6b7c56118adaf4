#!/usr/bin/env bash
# Builds `voxline --features cuda` (ggml's CUDA backend in whisper and in
# llama) on a machine with no GPU and no CUDA install: the CUDA 13.0 toolkit
# comes from pinned PyPI wheels, assembled under target/cuda-toolkit/.
# Output: target/cuda/release/voxline (stripped), for sm_90 (H200) only.
#
#   bash benches/gpu/build.sh            # JOBS=2 NICE=19 by default
#
# The CPU build (.ci/setup.sh, target/release) is not touched: separate
# target directory, and every setting below is an environment variable of
# this script's cargo call. See benches/gpu/README.md for why each is needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
start=$(date +%s)

JOBS=${JOBS:-2}
NICE=${NICE:-19}
# where the device's CUDA 13 libraries are (PyTorch cu130's wheels); device.sh
# also sets LD_LIBRARY_PATH from the device's Python, which wins over this
RPATH=${VOXLINE_CUDA_RPATH:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
ARCHS=${CUDA_ARCHS:-90-real}
tk=target/cuda-toolkit
export CARGO_TARGET_DIR=$repo/target/cuda

# -- 1. the toolkit: CUDA 13.0 wheels, pinned by version and sha256 --------
# (file name, sha256); nvcc, its crt headers and nvvm (cicc, libdevice) are
# three wheels since CUDA 13; cccl holds cub/thrust/libcu++ (include/cccl).
wheels=(
  "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"
  "nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"
  "nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"
  "nvidia_cuda_runtime-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 422a38f7c739ecbdd3a4b6ec7ed0a1d74db43d8e9bc26685f3d845638922b178"
  "nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"
  "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl 0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c"
)
mkdir -p "$tk/wheels"
need=()
for w in "${wheels[@]}"; do
  set -- $w
  if [[ -f $tk/wheels/$1 ]] && echo "$2  $tk/wheels/$1" | sha256sum -c --status; then continue; fi
  # file name -> requirement: nvidia_cuda_nvcc-13.0.88-... -> nvidia-cuda-nvcc==13.0.88
  n=${1%%-py3-*}; need+=("$(echo "${n%-*}" | tr _ -)==${n##*-}")
done
if ((${#need[@]})); then
  echo "== downloading ${need[*]}"
  # every tag the pinned wheels carry, named: an older pip does not widen
  # one --platform to the older manylinux tags it implies
  plats=()
  for p in manylinux_2_27 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010; do plats+=(--platform "${p}_x86_64"); done
  python3 -m pip download --quiet --no-deps --only-binary=:all: "${plats[@]}" \
    -d "$tk/wheels" "${need[@]}"
fi
for w in "${wheels[@]}"; do
  set -- $w
  echo "$2  $tk/wheels/$1" | sha256sum -c --quiet || { echo "sha256 mismatch: $tk/wheels/$1" >&2; exit 1; }
done

# every wheel installs under nvidia/cu13/{bin,include,lib,nvvm}: one tree
root=$tk/unpacked/nvidia/cu13
if [[ ! -x $root/bin/nvcc ]]; then
  echo "== unpacking the toolkit"
  rm -rf "$tk/unpacked"
  # a wheel is a zip; keep the executable bits (nvcc, ptxas, cicc, ...)
  python3 - "$tk/unpacked" "$tk"/wheels/*.whl <<'EOF'
import os, sys, zipfile
dest = sys.argv[1]
for w in sys.argv[2:]:
    with zipfile.ZipFile(w) as z:
        for i in z.infolist():
            if i.is_dir() or ".dist-info/" in i.filename:
                continue
            p = z.extract(i, dest)
            mode = (i.external_attr >> 16) & 0o777
            if mode:
                os.chmod(p, mode)
EOF
fi
# the layout nvcc.profile, CMake's FindCUDAToolkit and find_cuda_helper look
# for: lib64/, targets/x86_64-linux/, unversioned .so names (wheels carry no
# symlinks), and lib64/stubs/libcuda.so (the driver is not in any wheel)
ln -sfn lib "$root/lib64"
mkdir -p "$root/targets/x86_64-linux" "$root/lib/stubs"
for d in include lib lib64; do ln -sfn "../../$d" "$root/targets/x86_64-linux/$d"; done
for l in cudart cublas cublasLt; do ln -sfn "lib$l.so.13" "$root/lib/lib$l.so"; done
if [[ ! -f $root/lib/stubs/libcuda.so ]]; then
  # an empty library with the driver's SONAME: satisfies `-lcuda` (both
  # sys crates ask for it); nothing references it with GGML_CUDA_NO_VMM, so
  # the linker's --as-needed drops it and the binary does not need it
  cc -shared -nostdlib -Wl,-soname,libcuda.so.1 -o "$root/lib/stubs/libcuda.so" -x c /dev/null
fi
"$root/bin/nvcc" --version | tail -2

# -- 2. the link shim --------------------------------------------------------
# llama-cpp-sys-2 links CUDA statically on Linux (static=cudart_static,
# cublas_static, cublasLt_static, culibos); the wheels ship no static cuBLAS
# or culibos, and a static cuBLAS would add ~700 MB to the binary. Empty
# archives under those names satisfy the build script's requests; the real
# symbols come from the shared libcudart/libcublas/libcublasLt that
# whisper-rs-sys links (-lcudart -lcublas -lcublasLt), found at run time on
# the device through the rpath or LD_LIBRARY_PATH.
shim=$tk/link
mkdir -p "$shim"
for a in cudart_static cublas_static cublasLt_static culibos; do printf '!<arch>\n' >"$shim/lib$a.a"; done
for l in cudart cublas cublasLt; do ln -sfn "../unpacked/nvidia/cu13/lib/lib$l.so.13" "$shim/lib$l.so"; done
ln -sfn ../unpacked/nvidia/cu13/lib/stubs/libcuda.so "$shim/libcuda.so"

# `cmake --build` passes `make -jN` when CMAKE_BUILD_PARALLEL_LEVEL is set,
# and llama-cpp-sys-2's build script sets it to the core count: make then
# runs its own N jobs beside cargo's. Dropping -j makes both C++ builds take
# their slots from cargo's jobserver (MAKEFLAGS), so the whole build stays
# within `-j $JOBS`.
mkdir -p "$tk/bin"
cat >"$tk/bin/make-jobserver" <<'EOF'
#!/bin/sh
for a do shift; case $a in -j*) ;; *) set -- "$@" "$a" ;; esac; done
exec make "$@"
EOF
chmod +x "$tk/bin/make-jobserver"

# included before every project() of both vendored trees, as in the CPU
# build: the same trim (.ci/llama-trim.cmake), plus GGML_CUDA_NO_VMM for
# both (llama-cpp-sys-2 forwards only CMAKE_* variables to CMake, so a
# GGML_* environment variable would reach whisper's ggml only)
#
# Only whisper's ggml is linked: each sys crate bundles its tree's static
# libraries into its rlib, and the linker takes ggml's objects from the first
# rlib that defines them, whisper-rs-sys's (traced with -Wl,--trace). So
# llama's tree is built without CUDA: its ~126 CUDA objects (half the C++
# work) would never reach the binary. llama-cpp-sys-2 links the archives it
# finds, so it then asks for no libggml-cuda.a, and llama.cpp's own code
# reaches the GPU through ggml's backend registry (whisper's, with CUDA).
cat >"$tk/cuda-build.cmake" <<EOF
include("$repo/.ci/llama-trim.cmake")
# voxline cuda build: no CUDA driver API (libcuda) at link time, the legacy memory pool
set(GGML_CUDA_NO_VMM ON CACHE BOOL "voxline: no libcuda link" FORCE)
if(CMAKE_SOURCE_DIR MATCHES "llama-cpp-sys-2")
  # llama's ggml is not the one linked (whisper's is): no CUDA kernels for it
  set(GGML_CUDA OFF CACHE BOOL "voxline: whisper's ggml carries CUDA for both" FORCE)
endif()
EOF

# -- 3. build ------------------------------------------------------------------
export CUDA_PATH=$repo/$root CUDAToolkit_ROOT=$repo/$root
export PATH=$repo/$root/bin:$PATH
# CMAKE_* variables reach both trees' CMake (both build scripts forward them)
export CMAKE_CUDA_COMPILER=$repo/$root/bin/nvcc
export CMAKE_CUDA_ARCHITECTURES=$ARCHS
export CMAKE_PROJECT_INCLUDE_BEFORE=$repo/$tk/cuda-build.cmake
export CMAKE_MAKE_PROGRAM=$repo/$tk/bin/make-jobserver
export RUSTFLAGS="-L native=$repo/$shim -C link-arg=-Wl,-rpath,$RPATH"
export CARGO_PROFILE_RELEASE_STRIP=symbols
echo "== cargo build --release --features cuda (sm ${ARCHS}, -j $JOBS, nice $NICE)"
nice -n "$NICE" cargo build --release --locked --features cuda --bin voxline -j "$JOBS"
end=$(date +%s)

# -- 4. what came out ------------------------------------------------------------
bin=target/cuda/release/voxline
echo "== both ggml trees, as configured"
for c in target/cuda/release/build/{whisper-rs-sys,llama-cpp-sys-2}-*/out/build/CMakeCache.txt; do
  [[ -f $c ]] || continue
  echo "$c"; grep -E '^(GGML_CUDA|GGML_CUDA_NO_VMM|CMAKE_CUDA_ARCHITECTURES|LLAMA_BUILD_COMMON|CMAKE_CUDA_COMPILER):' "$c" | sed 's/^/  /'
done
echo "== $bin: $(stat -c %s "$bin") bytes"
# ggml-cuda's own strings are in the binary only if its objects were linked:
# had the linker taken llama's CUDA-less ggml registry instead of whisper's,
# the backend would be missing and the binary would run on the CPU only
if ! grep -q -a 'ggml_cuda_init' "$bin"; then
  echo "error: $bin has no ggml CUDA backend (ggml_cuda_init not found): the linker took a ggml built without CUDA" >&2
  exit 1
fi
echo "ggml's CUDA backend: linked"
ldd "$bin" || true
echo "== build: $((end - start)) s"
