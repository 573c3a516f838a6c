"""CPU feature detection (Linux /proc/cpuinfo flags) and kernel-path selection."""
from __future__ import annotations

import functools

#: Kernel paths from most to least capable, with the CPU flags each one needs.
PATH_REQUIREMENTS: dict[str, frozenset[str]] = {
    "avx512-vnni": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "portable": frozenset(),
}


def cpuinfo_field(key: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The first processor's `key` field in /proc/cpuinfo ("" when absent or unreadable)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """Flags of the first processor listed in /proc/cpuinfo (empty set if unreadable)."""
    return frozenset(cpuinfo_field("flags").split())


@functools.lru_cache(maxsize=4)
def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The first processor's vendor_id ("GenuineIntel", "AuthenticAMD"; "" if unreadable): some
    tuning constants (software prefetch distances) were measured per vendor."""
    return cpuinfo_field("vendor_id", cpuinfo)


def supported_paths(flags: frozenset[str] | None = None) -> list[str]:
    """Kernel paths this CPU can run, best first."""
    flags = cpu_flags() if flags is None else flags
    return [p for p, req in PATH_REQUIREMENTS.items() if req <= flags]


def best_path(flags: frozenset[str] | None = None) -> str:
    return supported_paths(flags)[0]
