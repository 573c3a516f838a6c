"""Raw NUMA system calls through ctypes (libc ``syscall``): no libnuma needed.

Every call returns a ``CallResult``; on failure ``reason`` says why in words
(ENOSYS: kernel without NUMA, EPERM: blocked by seccomp/capabilities, ...),
so callers can fall back to plain allocation and show the reason.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import os
import platform
import threading
from dataclasses import dataclass
from typing import Any, Sequence

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_LOCAL = 4

MPOL_MF_STRICT = 1
MPOL_MF_MOVE = 2
MPOL_MF_MOVE_ALL = 4

MPOL_F_NODE = 1
MPOL_F_ADDR = 2

# Kernel's nr_node_ids can be up to MAX_NUMNODES (1024 on distro kernels);
# get_mempolicy refuses masks smaller than nr_node_ids.
MASK_BITS = 1024

_NUMBERS = {
    "x86_64": dict(mbind=237, set_mempolicy=238, get_mempolicy=239, migrate_pages=256,
                   move_pages=279, getcpu=309, sched_setaffinity=203),
    # generic syscall table (asm-generic/unistd.h)
    "aarch64": dict(mbind=235, get_mempolicy=236, set_mempolicy=237, migrate_pages=238,
                    move_pages=239, getcpu=168, sched_setaffinity=122),
}
_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
NR: dict[str, int] = _NUMBERS.get(_MACHINE, {})

_libc: Any
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # not Linux/glibc-like
    _libc = None
    _syscall = None

_ERRNO_WHY = {
    _errno.ENOSYS: "the kernel has no NUMA support (ENOSYS)",
    _errno.EPERM: "not permitted (EPERM: seccomp filter or missing CAP_SYS_NICE)",
    _errno.EACCES: "not permitted (EACCES)",
    _errno.EINVAL: "invalid argument (EINVAL: node not online or bad range)",
    _errno.EIO: "some pages could not be moved (EIO)",
    _errno.ENOMEM: "out of memory on the target node (ENOMEM)",
    _errno.EFAULT: "bad address (EFAULT)",
    _errno.ESRCH: "no such thread (ESRCH)",
}


@dataclass(frozen=True)
class CallResult:
    ok: bool
    value: Any = None
    errno: int = 0
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _fail(name: str, err: int) -> CallResult:
    why = _ERRNO_WHY.get(err, os.strerror(err) if err else "unknown error")
    return CallResult(False, None, err, f"{name}: {why}")


def _unsupported(name: str) -> CallResult | None:
    if _syscall is None:
        return CallResult(False, None, _errno.ENOSYS, f"{name}: no libc syscall() on this platform")
    if name not in NR:
        return CallResult(False, None, _errno.ENOSYS,
                          f"{name}: syscall number unknown for architecture {_MACHINE!r}")
    return None


def _call(name: str, *args: Any) -> CallResult:
    bad = _unsupported(name)
    if bad is not None:
        return bad
    ctypes.set_errno(0)
    rc = _syscall(ctypes.c_long(NR[name]), *args)
    if rc < 0:
        return _fail(name, ctypes.get_errno())
    return CallResult(True, rc)


def nodemask(nodes: Sequence[int], bits: int = MASK_BITS) -> ctypes.Array:
    """Kernel nodemask as an unsigned long array."""
    words = (bits + 63) // 64
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        if not 0 <= n < bits:
            raise ValueError(f"node {n} outside nodemask of {bits} bits")
        mask[n // 64] |= 1 << (n % 64)
    return mask


def _mask_nodes(mask: ctypes.Array) -> list[int]:
    return [w * 64 + b for w in range(len(mask)) for b in range(64) if mask[w] >> b & 1]


def mbind(addr: int, length: int, mode: int, nodes: Sequence[int] = (), flags: int = 0) -> CallResult:
    """Set the memory policy of [addr, addr+length) (addr page aligned); flags may move pages."""
    mask = nodemask(nodes) if nodes else None
    maxnode = MASK_BITS if nodes else 0
    return _call("mbind", ctypes.c_void_p(addr), ctypes.c_ulong(length), ctypes.c_int(mode),
                 mask, ctypes.c_ulong(maxnode), ctypes.c_uint(flags))


def set_mempolicy(mode: int, nodes: Sequence[int] = ()) -> CallResult:
    """Policy of the calling thread for future allocations."""
    mask = nodemask(nodes) if nodes else None
    return _call("set_mempolicy", ctypes.c_int(mode), mask, ctypes.c_ulong(MASK_BITS if nodes else 0))


def get_mempolicy(addr: int | None = None) -> CallResult:
    """(mode, nodes) of the thread, or of the VMA at ``addr``."""
    mode = ctypes.c_int(0)
    mask = nodemask(())
    flags = MPOL_F_ADDR if addr is not None else 0
    r = _call("get_mempolicy", ctypes.byref(mode), mask, ctypes.c_ulong(MASK_BITS),
              ctypes.c_void_p(addr or 0), ctypes.c_ulong(flags))
    return CallResult(True, (mode.value, _mask_nodes(mask))) if r else r


def move_pages(addrs: Sequence[int], nodes: Sequence[int] | None = None, flags: int = 0) -> CallResult:
    """move_pages(2) on this process. ``nodes=None`` only queries: value is the per-page
    status list (node id, or -errno such as -ENOENT for a page never touched)."""
    n = len(addrs)
    pages = (ctypes.c_void_p * n)(*addrs)
    status = (ctypes.c_int * n)()
    nds = (ctypes.c_int * n)(*nodes) if nodes is not None else None
    r = _call("move_pages", ctypes.c_int(0), ctypes.c_ulong(n), pages, nds, status, ctypes.c_int(flags))
    return CallResult(True, list(status)) if r else r


_getcpu_fn = getattr(_libc, "getcpu", None) if _libc is not None else None


def getcpu() -> CallResult:
    """(cpu, node) the calling thread runs on right now."""
    cpu = ctypes.c_uint(0)
    node = ctypes.c_uint(0)
    if _getcpu_fn is not None:  # glibc >= 2.29: vDSO-backed, cheap
        if _getcpu_fn(ctypes.byref(cpu), ctypes.byref(node)) == 0:
            return CallResult(True, (cpu.value, node.value))
        return _fail("getcpu", ctypes.get_errno())
    r = _call("getcpu", ctypes.byref(cpu), ctypes.byref(node), None)
    return CallResult(True, (cpu.value, node.value)) if r else r


def sched_setaffinity(cpus: Sequence[int], tid: int | None = None) -> CallResult:
    """Pin a thread (default: the calling thread) to ``cpus``."""
    size = max(1024, (max(cpus, default=0) // 64 + 1) * 64)
    mask = (ctypes.c_ulong * (size // 64))()
    for c in cpus:
        mask[c // 64] |= 1 << (c % 64)
    if tid is None:
        tid = threading.get_native_id()
    return _call("sched_setaffinity", ctypes.c_int(tid), ctypes.c_ulong(size // 8), mask)


def trim_heap() -> bool:
    """Give the malloc heap's free pages back to the system (glibc's ``malloc_trim(0)``); False
    where there is no such call (another libc). A model load frees its transients (the Numba
    cache's unpickled data, the header's and the vocabulary's temporaries) inside the heap,
    where they stay resident: ~19 MiB after loading the default model, which the KV cache
    allocated next then adds to instead of reusing. The call took 0.7 ms there."""
    fn = getattr(_libc, "malloc_trim", None) if _libc is not None else None
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    fn(0)
    return True
