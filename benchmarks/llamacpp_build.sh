#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` from the llama-cpp-python source package's
# vendored llama.cpp, into a cache directory outside the repository.
#
# This is a benchmark helper, not a dependency of numawb.  Idempotent: a second
# run with the binary already built only prints its path.
#
#   bash benchmarks/llamacpp_build.sh            # prints the llama-bench path
#   LLAMA_CPP_PY_VERSION=0.3.36 NUMAWB_CACHE=~/.cache/numawb bash ...
#
# Needs: pip (PyPI reachable), cmake, a C/C++ compiler (gcc/g++), make or ninja.
# Takes roughly 10-20 minutes on 2 cores; runs under `nice`.
set -euo pipefail

VERSION="${LLAMA_CPP_PY_VERSION:-0.3.36}"
CACHE="${NUMAWB_CACHE:-$HOME/.cache/numawb}"
ROOT="$CACHE/llama.cpp-$VERSION"
SRC="$ROOT/src"
BUILD="$ROOT/build"
BIN="$BUILD/bin/llama-bench"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$ROOT"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    DL="$ROOT/sdist"
    mkdir -p "$DL"
    if ! ls "$DL"/llama_cpp_python-"$VERSION".tar.gz >/dev/null 2>&1; then
        echo "downloading llama-cpp-python==$VERSION sdist ..." >&2
        python3 -m pip download --no-deps --no-binary :all: \
            "llama-cpp-python==$VERSION" -d "$DL" >&2
    fi
    TARBALL="$(ls "$DL"/llama_cpp_python-"$VERSION".tar.gz | head -1)"
    rm -rf "$ROOT/unpack"
    mkdir -p "$ROOT/unpack"
    tar -xzf "$TARBALL" -C "$ROOT/unpack"
    rm -rf "$SRC"
    mv "$ROOT/unpack"/llama_cpp_python-"$VERSION"/vendor/llama.cpp "$SRC"
    rm -rf "$ROOT/unpack"
fi

GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi

echo "configuring llama.cpp in $BUILD ..." >&2
nice -n 10 cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DBUILD_SHARED_LIBS=OFF >&2
echo "building llama-bench with $JOBS jobs ..." >&2
nice -n 10 cmake --build "$BUILD" --config Release --target llama-bench -j "$JOBS" >&2

if [[ ! -x "$BIN" ]]; then
    BIN="$(find "$BUILD" -type f -name llama-bench -perm -u+x | head -1)"
fi
[[ -x "$BIN" ]] || { echo "llama-bench not found after build" >&2; exit 1; }
echo "$BIN"
