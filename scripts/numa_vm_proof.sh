#!/usr/bin/env bash
# The multi-node proofs of issues 46 and 47 in a 2-node virtme-ng guest (QEMU TCG: emulated, so
# its rates mean nothing), written to benchmarks/results-numa-vm.md:
#   1. attention: a decoded token's KV reads per worker (a dense GQA llama and a deepseek2 with
#      MLA): KV pages per owner (move_pages) and the positions / bytes each node's workers read;
#   2. experts: a short R1-shaped file (make_moe_model.py --shape r1 --layers 5) decoded in every
#      weights mode: pages per node per tensor class and the expert bytes each worker read;
#   3. placement: the full R1-shaped file (61 blocks, 256 experts) loaded in every weights mode,
#      pages per node per tensor class and the expert bytes each worker is handed; no decode;
#   tests: tests/numa_vm's suite in the same guest, with this cache and files;
#   4. record: `numawb --record` of docs/screenshot-2node.session (the instruct model of
#      `numawb pull`) in the guest; its last screenshot becomes docs/screenshot-2node.svg.
#
#   scripts/numa_vm_proof.sh [attention] [experts] [placement] [tests] [record]   (default: all)
#
# The code that runs is a snapshot of the last commit (git archive HEAD), so edits in the working
# tree while the guest runs change nothing. The Numba cache: the guest's CPU (QEMU's "max" under
# TCG: AVX2, no AVX-512) differs from the host's, so both run numawb's AVX2 kernels compiled for
# one fixed LLVM target (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES below) into one cache folder: the host
# runs each proof once first (`--warm`, its CPUs seen as the guest's two nodes by
# benchmarks/numa_vm_fake.py, so weights split or copied per node take the guest's calls), and the
# guest loads that code instead of compiling it under emulation. The cache keys on llama.cpp's SIMD width
# (`kernels/llama_build.py`): the host (AVX-512) would take 512, the guest 256, so both are told 256.
# In the guest no compile helper (NUMAWB_PARALLEL_COMPILE=0): under emulation even a cache load
# takes longer than a compile's threshold, so the engine took every start for a first one and its
# helper compiled each kernel of the file's types on the other vCPU meanwhile. qemu runs on CPU 1 only (taskset), the other
# core stays free.
set -u -o pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$(python3 -c 'import sys; print(sys.executable)')"
export PATH="$(dirname "$PY"):$PATH"
WHAT="${*:-attention experts placement tests record}"
WORK="${NUMA_VM_PROOF_DIR:-$HOME/.cache/numawb/vm-proof}"     # outside /tmp: the guest sees it
SRC="$WORK/src"
MODELS="$WORK/models"
OUT="${NUMA_VM_PROOF_OUT:-$ROOT/benchmarks/results-numa-vm.md}"
R1="${R1_FILE:-$HOME/.cache/numawb/bench-models/deepseek2-synth-r1-q4_k.gguf}"
MODES="${MODES:-none,interleave,mirror,slice,auto,experts}"   # the decoded file's
PLACEMENT_MODES="${PLACEMENT_MODES:-none,interleave,mirror,slice,auto,experts}"   # R1's (no decode)
GUEST_TIMEOUT="${GUEST_TIMEOUT:-5400}"
KERNEL="$(ls /boot/vmlinuz-* | sort -V | tail -1)"
export NUMAWB_LLAMA_SIMD=256 NUMAWB_KERNEL_PATH=avx2 NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt"
export NUMBA_CACHE_DIR="$WORK/numba"
ENVS="NUMAWB_PARALLEL_COMPILE=0 NUMAWB_LLAMA_SIMD=$NUMAWB_LLAMA_SIMD NUMAWB_KERNEL_PATH=$NUMAWB_KERNEL_PATH NUMBA_CPU_NAME=$NUMBA_CPU_NAME NUMBA_CPU_FEATURES=$NUMBA_CPU_FEATURES NUMBA_CACHE_DIR=$NUMBA_CACHE_DIR"

mkdir -p "$WORK" "$MODELS" "$NUMBA_CACHE_DIR"
rm -rf "$SRC" && mkdir -p "$SRC"
(cd "$ROOT" && git archive HEAD | tar -x -C "$SRC") || exit 2
COMMIT="$(cd "$ROOT" && git rev-parse --short HEAD)"

# the files: a llama (GQA, Q4_K) and a deepseek2 (MLA, Q8_0) from the test factory; a short R1
(cd "$SRC" && "$PY" tests/numa_vm/vm_models.py "$MODELS" >/dev/null) || exit 2
R1S="$MODELS/deepseek2-synth-r1-L5-q4_k.gguf"
[ -f "$R1S" ] || (cd "$SRC" && "$PY" benchmarks/make_moe_model.py --shape r1 --layers 5 --out "$R1S") || exit 2
[ -f "$R1" ] || (cd "$SRC" && "$PY" benchmarks/make_moe_model.py --shape r1 --out "$R1") || exit 2

cmds=()
for w in $WHAT; do
    case "$w" in
        attention) cmds+=("attention $MODELS/llama-tiny-q4_k.gguf $MODELS/deepseek2-tiny-q8_0.gguf") ;;
        experts) cmds+=("experts $R1S --modes $MODES") ;;
        placement) cmds+=("placement $R1 --modes $PLACEMENT_MODES") ;;
        tests) cmds+=("tests") ;;
        record) SMOL="$(ls "${XDG_DATA_HOME:-$HOME/.local/share}"/numawb/models/SmolLM2-135M-Instruct*.gguf 2>/dev/null | head -1)"
                [ -n "$SMOL" ] || { echo "numa_vm_proof: record needs \`numawb pull\` first" >&2; exit 2; }
                cmds+=("record $SMOL") ;;
        *) echo "numa_vm_proof: unknown proof $w" >&2; exit 2 ;;
    esac
done

echo "numa_vm_proof: commit $COMMIT, warming the cache on the host ($NUMBA_CACHE_DIR)"
REC="$WORK/record"
rm -rf "$REC" && mkdir -p "$REC"
run_cmd() {  # a proof's command line: the record runs the app, the others the proof script
    case "$1" in
        record) echo "-m workbench -m $2 --record $REC --script docs/screenshot-2node.session" ;;
        tests) echo "-m pytest tests/numa_vm/test_attention_vm.py tests/numa_vm/test_placement_vm.py -q -p no:cacheprovider -rs" ;;
        *) echo "benchmarks/numa_vm_proof.py $*" ;;
    esac
}
for c in "${cmds[@]}"; do
    start=$SECONDS
    # shellcheck disable=SC2086
    set -- $c
    if [ "$1" = tests ]; then   # the attention proof's code is the engine test's
        warm=(benchmarks/numa_vm_proof.py attention "$MODELS/llama-tiny-q4_k.gguf" "$MODELS/deepseek2-tiny-q8_0.gguf" --warm)
    elif [ "$1" = record ]; then
        warm=(-c "import sys; sys.path.insert(0, 'benchmarks'); import numa_vm_fake; numa_vm_fake.two_nodes(); from workbench.cli import main; sys.exit(main(sys.argv[1:]))" -m "$2" --record "$WORK/record-warm" --script docs/screenshot-2node.session)
    else
        # shellcheck disable=SC2206
        warm=(benchmarks/numa_vm_proof.py $c --warm)
    fi
    # both host CPUs: the app takes a worker per CPU, and the guest has two
    (cd "$SRC" && "$PY" "${warm[@]}" > "$WORK/warm-$1.log" 2>&1) \
        || { tail -30 "$WORK/warm-$1.log"; echo "numa_vm_proof: warm-up of '$c' failed"; exit 1; }
    echo "  warm $c: $((SECONDS - start)) s"
done

script="$WORK/guest.sh"
{
    echo "cd $SRC"
    echo "echo 0 > /proc/sys/kernel/numa_balancing 2>/dev/null"
    for c in "${cmds[@]}"; do
        echo "echo '=== $c'; t0=\$(date +%s)"
        echo "sync; echo 3 > /proc/sys/vm/drop_caches"
        # shellcheck disable=SC2086
        echo "env $ENVS NUMAWB_VM_MODELS=$MODELS PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $PY $(run_cmd $c) 2>&1; echo \"=== rc \$? after \$((\$(date +%s) - t0)) s in the guest\""
    done
} > "$script"
log="$WORK/guest.log"
start=$SECONDS
echo "numa_vm_proof: booting the 2-node guest (emulated; qemu on CPU 1)"
timeout --kill-after=20 "$GUEST_TIMEOUT" taskset -c 1 vng -r "$KERNEL" --disable-kvm --cpus 2 -m 8G \
    --numa 4G,cpus=0 --numa 4G,cpus=1 --numa-distance 0,1=21 --rwdir "$NUMBA_CACHE_DIR" --rwdir "$REC" \
    --exec "bash $script" </dev/null > "$log" 2>&1
echo "numa_vm_proof: guest done after $((SECONDS - start)) s"

host="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') (cpuinfo family $(grep -m1 '^cpu family' /proc/cpuinfo | awk '{print $NF}') model $(grep -m1 -E '^model\s' /proc/cpuinfo | awk '{print $NF}'))"
{
    echo "# Multi-node proofs in a 2-node guest (issues 46, 47)"
    echo
    echo "Written by \`scripts/numa_vm_proof.sh $WHAT\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT."
    echo "Host: $host, one NUMA node, 2 cores."
    echo "Guest: virtme-ng with QEMU $(qemu-system-x86_64 --version | head -1 | awk '{print $4}') **software"
    echo "emulation** (TCG, \`-cpu max\`: AVX2, no AVX-512), 2 vCPUs on host CPU 1, 2 NUMA nodes of 4 GiB"
    echo "(distance 21), kernel $(basename "$KERNEL"). The guest is emulated: no rate measured in it"
    echo "means anything, and none is given. Pages per node are move_pages(2) in the guest; reads per"
    echo "worker are the crew's chunks logged with the CPU that ran them (\`workbench/engine/chunk_log.py\`),"
    echo "their bytes' nodes again from move_pages. numawb ran its AVX2 kernels, compiled on the host"
    echo "for a fixed LLVM target (haswell) and loaded from that cache in the guest."
    echo
    sed -e '/^\[ *[0-9.]*\]/d' -e '/^numawb: /d' "$log"
} > "$OUT"
echo "numa_vm_proof: wrote $OUT"
last="$(ls "$REC"/*.svg 2>/dev/null | sort | tail -1)"
if [ -n "$last" ]; then
    cp "$last" "$ROOT/docs/screenshot-2node.svg"
    echo "numa_vm_proof: $last -> docs/screenshot-2node.svg"
fi
grep -E "^PROOF|^=== rc" "$log"
! grep -q "PROOF FAILED" "$log" && grep -q "PROOF PASSED" "$log"
