"""Where a decoded token's CPU time goes, by compiled function (a benchmark, not a test).

    python3 benchmarks/perf_decode.py [-m MODEL] [-t 1] [-s 6] [--top 25]

Loads the model, decodes a few tokens, then runs Linux `perf record` on this process while it keeps
decoding, and prints `perf report`'s functions by share of the samples. Numba's machine code has no
symbols perf can see, so the script first writes `/tmp/perf-<pid>.map` (perf's map format for JIT
code): the entry point of every compiled function of the process, by its mangled name (a function
inlined into its caller counts as the caller). Needs `perf` (linux-perf / linux-tools) and the
permission to record (root, or kernel.perf_event_paranoid <= 1).

AMD EPYC with AVX-512 VNNI (Zen 5), Gemma 3 270M, 1 thread, 2026-12-05: the Q5_0_x2 / Q8_0_x2 pair
products 81 % of the samples, the Q4_K x8 gemv 5 %, Q6_K 3.4 %, the attention's F16 heads 2.1 %,
the norms, GELU, the KV store and the quantizations 0.2-0.6 % each, Numba's reference counting
~1.2 %.
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from numba.core.dispatcher import Dispatcher  # noqa: E402

from workbench.engine import Engine  # noqa: E402
from workbench.engine.engine import Placement, default_model_path  # noqa: E402


def write_perf_map() -> int:
    """/tmp/perf-<pid>.map for every compiled function of the process; returns how many."""
    syms: dict[int, str] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, Dispatcher):
                continue
        except ReferenceError:   # a weak proxy whose object is gone
            continue
        for cres in obj.overloads.values():
            name = cres.fndesc.mangled_name
            for nm in (name, "cfunc." + name):
                try:
                    addr = cres.library.get_pointer_to_function(nm)
                except Exception:  # not in this library (an inlined or wrapper-less function)
                    addr = 0
                if addr:
                    syms[addr] = nm
    from numba.core.runtime import rtsys   # the reference counting every compiled function calls
    for nm in ("NRT_incref", "NRT_decref"):
        try:
            addr = rtsys.library.get_pointer_to_function(nm)
        except Exception:
            addr = 0
        if addr:
            syms[addr] = nm
    addrs = sorted(syms)
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as f:
        for i, a in enumerate(addrs):
            size = addrs[i + 1] - a if i + 1 < len(addrs) and addrs[i + 1] - a < 1 << 20 else 4096
            size = 16 if syms[a].startswith("NRT_") else size   # (a few instructions each)
            f.write(f"{a:x} {size:x} {syms[a]}\n")
    return len(addrs)


def readable(sym: str) -> str:
    """A Numba mangled name as module.function (its argument types dropped)."""
    m = re.match(r"(?:cfunc\.)?_ZN(.*?)B\d+v\d+B", sym)
    if not m:
        return sym
    parts, s = [], m.group(1)
    while s and s[0].isdigit():
        n = int(re.match(r"\d+", s).group())
        s = s[len(str(n)):]
        parts.append(s[:n])
        s = s[n:]
    return ".".join(p.replace("_3clocals_3e", "<locals>") for p in parts) or sym


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-s", "--seconds", type=float, default=6.0, help="seconds recorded")
    ap.add_argument("--top", type=int, default=25, help="functions listed")
    a = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf_decode.py: `perf` is not installed (apt install linux-perf)")
    eng = Engine.load(a.model or default_model_path(), placement=Placement(threads=a.threads))
    s = eng.new_session(4096)
    s.eval(eng.tokenizer.encode("The capital of France is")[:16])
    for i in range(16):
        s.eval([100 + i])
    n_syms = write_perf_map()
    data = f"/tmp/perf-decode-{os.getpid()}.data"
    rec = subprocess.Popen(["perf", "record", "-F", "20000", "-p", str(os.getpid()), "-o", data, "--",
                            "sleep", str(a.seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    t0, n = time.perf_counter(), 0
    while rec.poll() is None:
        s.eval([100 + n % 50])
        n += 1
        if len(s.tokens) > 1000:
            s.reset()
            s.eval([2])
    rate = n / (time.perf_counter() - t0)
    if rec.returncode != 0:
        sys.exit(f"perf_decode.py: perf record failed: {rec.stderr.read().strip().splitlines()[-1:]}")
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym", "--stdio"],
                         capture_output=True, text=True)
    rows = []
    for line in rep.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[\.\]\s+(\S+)", line)
        if m:
            rows.append((float(m.group(1)), readable(m.group(2))))
    print(f"{os.path.basename(a.model or default_model_path())}, {a.threads} thread(s), {n} tokens decoded "
          f"at {rate:.1f} t/s under perf, {n_syms} compiled functions mapped")
    for pct, name in rows[:a.top]:
        print(f"{pct:6.2f} %  {name}")
    os.remove(data)


if __name__ == "__main__":
    main()
