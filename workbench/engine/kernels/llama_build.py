"""Which of llama.cpp's CPU builds numawb's float orders follow: the one llama.cpp compiles on this host.

llama.cpp built for the host (GGML_NATIVE) sums some float reductions in SIMD lanes whose width is
the host's: with AVX-512 the F16/F32 dot products run 16 lanes (ggml_vec_dot_f16 4 x 16, tinyBLAS<16>),
the softmax adds its exps 16 at a time and ggml_v_expf ends with a scalef; with AVX2 only, 8 lanes,
8 at a time, and ggml_v_expf's __m256 form (fma(j, 2^n, 2^n)), which rounds differently in the last
bit. The integer products (Q8_0, Q5_0, the K-quants, the repacked Q4_K) and the activation
quantizers give the same bits on both builds. So the orders that differ follow ``WIDE``: True where the
host has AVX-512F (what llama.cpp's native build then uses), False otherwise. ``NUMAWB_LLAMA_SIMD``
=512 or =256 chooses one whatever the host (to reproduce the other build's numbers).

Read once at import: compiled functions take it as a constant (and the disk cache keys on it).
"""
from __future__ import annotations

import os


def _host_has_avx512f() -> bool:
    try:
        from llvmlite import binding as ll
        return bool(ll.get_host_cpu_features().get("avx512f", False))
    except Exception:  # noqa: BLE001 - no LLVM feature query: read the kernel's CPU flags
        try:
            with open("/proc/cpuinfo") as f:
                return " avx512f" in f.read()
        except OSError:
            return False


def _wide() -> bool:
    want = os.environ.get("NUMAWB_LLAMA_SIMD", "").strip()
    if want in ("512", "256"):
        return want == "512"
    return _host_has_avx512f()


#: True: llama.cpp's AVX-512 build's orders; False: its AVX2 build's
WIDE: bool = _wide()
#: the softmax's exps summed per chunk of this many (ggml_vec_soft_max_f32)
SOFTMAX_LANES: int = 16 if WIDE else 8
