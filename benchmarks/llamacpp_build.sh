#!/usr/bin/env bash
# Build llama.cpp's `llama-bench`, `llama-server` and `llama-quantize` from the
# llama-cpp-python source package's vendored llama.cpp, into a cache directory
# outside the repository.
#
# This is a benchmark helper, not a dependency of numawb.  Idempotent: a second
# run with the binaries already built only prints the llama-bench path.
#
#   bash benchmarks/llamacpp_build.sh             # builds if needed, prints the llama-bench path
#   bash benchmarks/llamacpp_build.sh --amx-check # prints the CPU and the AMX decision only
#   LLAMA_CPP_PY_VERSION=0.3.36 NUMAWB_CACHE=~/.cache/numawb LLAMA_TARGETS="llama-bench" bash ...
#
# AMX: GGML_NATIVE builds with -march=native, which turns on AMX code when the CPU
# flags list amx_tile.  Under some hypervisors the flag is listed but the tiles are
# not enabled (XCR0 / XFD), and the first tile instruction dies with SIGILL.  When
# the flags list amx_tile, a tiny probe asks the kernel for AMX permission
# (arch_prctl(ARCH_REQ_XCOMP_PERM)) and loads one tile; if it does not survive,
# llama.cpp is built with -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 (the rest of
# -march=native stays), in its own build directory.  The decision is written to
# build-info.txt next to bin/ (compare_llamacpp.py puts it in its results header).
#
# Needs: pip (PyPI reachable), cmake, a C/C++ compiler (gcc/g++), make or ninja.
# Takes roughly 10-20 minutes on 2 cores; runs under `nice`.
set -euo pipefail

VERSION="${LLAMA_CPP_PY_VERSION:-0.3.36}"
CACHE="${NUMAWB_CACHE:-$HOME/.cache/numawb}"
ROOT="$CACHE/llama.cpp-$VERSION"
SRC="$ROOT/src"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
TARGETS="${LLAMA_TARGETS:-llama-bench llama-server llama-quantize}"
CPUINFO="${NUMAWB_CPUINFO:-/proc/cpuinfo}"   # a fake one for tests
CC_BIN="${CC:-cc}"
NO_AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

cpu_model() {
    local m
    m="$(grep -m1 '^model name' "$CPUINFO" 2>/dev/null | cut -d: -f2- | sed 's/^[[:space:]]*//')" || true
    echo "${m:-unknown CPU}"
}

amx_listed() {
    grep -m1 '^flags' "$CPUINFO" 2>/dev/null | tr ' \t' '\n\n' | grep -qx 'amx_tile'
}

# Compile and run the AMX probe. Status: 0 tiles usable, 1 probe failed or died
# (permission refused, SIGILL), 2 the compiler cannot build AMX code at all.
amx_probe() {
    local dir rc
    dir="$(mktemp -d)"
    cat > "$dir/amx_probe.c" <<'CEOF'
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tile_config { uint8_t palette_id, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };

__attribute__((target("amx-tile"))) static int load_one_tile(void) {
    static uint8_t data[16 * 64] __attribute__((aligned(64)));
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = 16;
    cfg.colsb[0] = 64;
    _tile_loadconfig(&cfg);
    _tile_loadd(0, data, 64);
    _tile_release();
    return 0;
}

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return 3; /* the kernel refuses AMX state to this process */
    return load_one_tile();
}
CEOF
    if ! "$CC_BIN" -O1 -o "$dir/amx_probe" "$dir/amx_probe.c" >/dev/null 2>&1; then
        rm -rf "$dir"
        return 2
    fi
    ( "$dir/amx_probe" ) >/dev/null 2>&1 && rc=0 || rc=1
    rm -rf "$dir"
    return "$rc"
}

# Sets AMX_STATE (none | usable | unusable | no-compiler), AMX_REASON and EXTRA_FLAGS.
# NUMAWB_AMX_PROBE_STATUS=0|1|2 stands in for the probe (tests of the decision only).
amx_decision() {
    EXTRA_FLAGS=""
    if ! amx_listed; then
        AMX_STATE="none"; AMX_REASON="CPU flags list no amx_tile"
        return
    fi
    local st=0
    if [[ -n "${NUMAWB_AMX_PROBE_STATUS:-}" ]]; then
        st="$NUMAWB_AMX_PROBE_STATUS"
    else
        amx_probe || st=$?
    fi
    case "$st" in
        0) AMX_STATE="usable"; AMX_REASON="amx_tile listed and a tile load ran" ;;
        2) AMX_STATE="no-compiler"; AMX_REASON="amx_tile listed but $CC_BIN cannot build AMX code (so -march=native emits none)" ;;
        *) AMX_STATE="unusable"
           AMX_REASON="amx_tile listed but the tile probe failed (AMX state not enabled here, e.g. by the hypervisor): building with $NO_AMX_FLAGS"
           EXTRA_FLAGS="$NO_AMX_FLAGS" ;;
    esac
}

amx_decision
CPU_MODEL="$(cpu_model)"
if [[ "${1:-}" == "--amx-check" ]]; then
    echo "cpu: $CPU_MODEL"
    echo "amx: $AMX_STATE ($AMX_REASON)"
    echo "extra flags: ${EXTRA_FLAGS:-none}"
    exit 0
fi

# a build without AMX lives apart, so a binary built where the tiles work is never reused where they fault
if [[ "$AMX_STATE" == "unusable" ]]; then BUILD="$ROOT/build-noamx"; else BUILD="$ROOT/build"; fi
BIN="$BUILD/bin/llama-bench"

all_built() {
    local t
    for t in $TARGETS; do [[ -x "$BUILD/bin/$t" ]] || return 1; done
}

if all_built; then
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

echo "cpu: $CPU_MODEL; amx: $AMX_STATE ($AMX_REASON)" >&2
echo "configuring llama.cpp in $BUILD ..." >&2
# -mno-amx-* in the flags beat -march=native whatever their order (explicit ISA flags win in gcc/clang)
nice -n 10 cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$EXTRA_FLAGS" -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" \
    -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DBUILD_SHARED_LIBS=OFF >&2
echo "building $TARGETS with $JOBS jobs ..." >&2
# shellcheck disable=SC2086
nice -n 10 cmake --build "$BUILD" --config Release --target $TARGETS -j "$JOBS" >&2

if [[ ! -x "$BIN" ]]; then
    BIN="$(find "$BUILD" -type f -name llama-bench -perm -u+x | head -1)"
fi
[[ -x "$BIN" ]] || { echo "llama-bench not found after build" >&2; exit 1; }
{
    echo "cpu: $CPU_MODEL"
    echo "amx: $AMX_STATE ($AMX_REASON)"
    echo "extra flags: ${EXTRA_FLAGS:-none}"
    echo "targets: $TARGETS"
    echo "built: $(date -u '+%Y-%m-%d %H:%M UTC')"
} > "$BUILD/build-info.txt"
echo "$BIN"
