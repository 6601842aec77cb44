"""What this CPU's instruction set offers inference: vector width, int8 dot products, bf16, AMX.

Read from the kernel's CPU flags (Linux ``/proc/cpuinfo``), recorded in every run's environment
header, and used to decide whether a bfloat16 variant can run natively here.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

# Flags that change which inference kernels are fast, in the kernel's spelling.
INFERENCE_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in a ``/proc/cpuinfo`` text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@cache
def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (empty where the OS does not expose ``/proc/cpuinfo``)."""
    try:
        return parse_cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def inference_features(flags: frozenset[str] | None = None) -> list[str]:
    """The inference-relevant features among `flags` (default: this CPU's), in a fixed order."""
    present = cpu_flags() if flags is None else flags
    return [flag for flag in INFERENCE_FLAGS if flag in present]


def bf16_unavailable_reason(flags: frozenset[str] | None = None) -> str | None:
    """Why bfloat16 cannot run natively here, or None when the CPU has bf16 instructions."""
    present = cpu_flags() if flags is None else flags
    if not present:
        return "the CPU's flags are not readable here (no /proc/cpuinfo): bf16 support unknown"
    if any(flag in present for flag in BF16_FLAGS):
        return None
    return ("this CPU has no bfloat16 instructions (AVX512-BF16 or AMX-BF16): bf16 would be "
            "emulated in float32, slower, not faster")
