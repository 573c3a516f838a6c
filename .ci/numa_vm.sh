#!/usr/bin/env bash
# Run tests/numa_vm inside virtme-ng guests with a real multi-node kernel:
#   guest A: 2 nodes (1 CPU each)
#   guest B: 4 nodes: 3 with one CPU each + 1 memory-only node (CXL-like)
# Installs what the guests need (as root), boots each guest with a hard timeout,
# and exits non-zero when any guest's suite fails or a guest does not come back.
# Software emulation (--disable-kvm): KVM hangs in early boot on nested hosts.
set -u -o pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$(command -v python3)}"
PY="$("$PY" -c 'import sys; print(sys.executable)')"   # absolute, usable inside the guest
export PATH="$(dirname "$PY"):$PATH"   # vng and the virtme-run it calls live next to the interpreter
GUEST_TIMEOUT="${NUMA_VM_TIMEOUT:-900}"   # the advisor tests add ~3 min per guest (probe + advise, emulated)

need_install=0
command -v vng >/dev/null 2>&1 || need_install=1
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_install=1
command -v busybox >/dev/null 2>&1 || need_install=1
ls /boot/vmlinuz-* >/dev/null 2>&1 || need_install=1
if [ "$need_install" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "numa_vm: missing qemu/busybox/kernel/vng and not root to install them" >&2
        exit 2
    fi
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -q || exit 2
    timeout 900 apt-get install -y -q qemu-system-x86 busybox-static linux-image-amd64 || exit 2
    timeout 300 "$PY" -m pip install -q virtme-ng || exit 2
fi
VNG="$(command -v vng || true)"
[ -x "$VNG" ] || { echo "numa_vm: vng not found (pip install virtme-ng)" >&2; exit 2; }
KERNEL="$(ls /boot/vmlinuz-* | sort -V | tail -1)"
echo "numa_vm: kernel $KERNEL, python $PY, timeout ${GUEST_TIMEOUT}s per guest"

# The engine's in-guest test (tests/numa_vm/test_attention_vm.py) decodes two small files: the
# guest's CPU (QEMU's "max" under TCG: AVX2, no AVX-512) would compile the engine for minutes, so
# the host writes the files and runs the same decode once (`--warm`) into a Numba cache built for
# one fixed target (AVX2 kernels, llama.cpp's 256-bit float orders, LLVM's haswell), and the guest
# loads that code (no compile helper there: under emulation a cache load looks like a compile and
# starts one). ~2-4 min of host time, ~3 min in the 2-node guest.
VM_WORK="${XDG_CACHE_HOME:-$HOME/.cache}/numawb/numa-vm-ci"   # outside /tmp: the guest sees it
rm -rf "$VM_WORK" && mkdir -p "$VM_WORK/numba"
VM_ENV="NUMAWB_PARALLEL_COMPILE=0 NUMAWB_LLAMA_SIMD=256 NUMAWB_KERNEL_PATH=avx2 NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt NUMBA_CACHE_DIR=$VM_WORK/numba NUMAWB_VM_MODELS=$VM_WORK/models"
warm_start=$SECONDS
# shellcheck disable=SC2086
if ! (cd "$ROOT" && env $VM_ENV "$PY" tests/numa_vm/vm_models.py "$VM_WORK/models" >/dev/null \
        && env $VM_ENV "$PY" benchmarks/numa_vm_proof.py attention "$VM_WORK"/models/*.gguf --warm --decode 3 \
        > "$VM_WORK/warm.log" 2>&1); then
    tail -30 "$VM_WORK/warm.log"
    echo "numa_vm: the host's warm-up of the engine's guest test failed"
    exit 1
fi
echo "numa_vm: engine code for the guests compiled on the host in $((SECONDS - warm_start))s"

run_guest() {  # name, then vng machine options
    local name="$1"; shift
    local log; log="$(mktemp)"
    local start=$SECONDS
    echo "=== numa_vm: $name guest ==="
    timeout --kill-after=20 "$GUEST_TIMEOUT" "$VNG" -r "$KERNEL" --disable-kvm -m 4G "$@" \
        --rwdir "$VM_WORK/numba" \
        --exec "cd $ROOT && env $VM_ENV PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $PY -m pytest tests/numa_vm -q -p no:cacheprovider -rs; echo NUMA_VM_RC=\$?" \
        </dev/null 2>&1 | tee "$log"
    local rc
    rc="$(sed -n 's/.*NUMA_VM_RC=\([0-9]*\).*/\1/p' "$log" | tail -1)"
    rm -f "$log"
    if [ -z "$rc" ]; then
        echo "numa_vm: $name guest FAILED (no result: boot failure or timeout) after $((SECONDS - start))s"
        return 1
    fi
    echo "numa_vm: $name guest pytest exit $rc after $((SECONDS - start))s"
    [ "$rc" = 0 ]
}

fail=0
run_guest "2-node" --cpus 2 \
    --numa 2G,cpus=0 --numa 2G,cpus=1 --numa-distance 0,1=21 || fail=1
run_guest "4-node (node 3 memory-only)" --cpus 3 \
    --numa 1G,cpus=0 --numa 1G,cpus=1 --numa 1G,cpus=2 --numa 1G \
    --numa-distance 0,1=21 --numa-distance 0,2=21 --numa-distance 1,2=21 \
    --numa-distance 0,3=30 --numa-distance 1,3=30 --numa-distance 2,3=30 || fail=1

if [ "$fail" = 0 ]; then echo "numa_vm: PASSED on 2 and 4 nodes"; else echo "numa_vm: FAILED"; fi
exit "$fail"
