"""What this CPU's instruction set offers inference: vector width, int8 dot products, bf16, AMX.

Read from the kernel's CPU flags (Linux ``/proc/cpuinfo``), recorded in every run's environment
header, and used to decide whether a bfloat16 variant can run natively here.

AMX is the one feature a process must ask the kernel for before using it
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``); XNNPACK asks when LiteRT creates an interpreter and then
runs its int8 kernels on AMX tiles. `deny_amx` makes that request fail in this process, so the
same files run on the AVX-512 kernels instead (``benchmark.amx``).
"""

from __future__ import annotations

import ctypes
import platform
import struct
import sys
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


_ARCH_PRCTL = 158
"""``arch_prctl``'s system call number on x86-64."""
_ARCH_GET_XCOMP_PERM, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 0x1022, 0x1023, 18
_AUDIT_ARCH_X86_64 = 0xC000003E
"""A filter's calls of other system-call tables (32-bit ones) number their calls otherwise."""


def _x86_64_linux() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def amx_permitted() -> bool:
    """Whether this process may use AMX tiles (it asked for them and the kernel agreed)."""
    if not _x86_64_linux():
        return False
    mask = ctypes.c_ulong(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return False
    return bool(mask.value & (1 << _XFEATURE_XTILEDATA))


SERVE_WITHOUT_AMX = "call tfopt.cpu_features.deny_amx() before the model loads"
"""How to serve a file measured with AMX refused to its process, as every report words it."""


def deny_amx() -> None:
    """Make this process's later requests for AMX fail (EPERM), so no library here uses it.

    A seccomp filter on ``arch_prctl(ARCH_REQ_XCOMP_PERM, ...)``, every other system call
    allowed; it holds for the process's life and its children's. A permission granted before
    stays: call it before any library loads a model (`amx_permitted` tells).

    Raises:
        OSError: Not x86-64 Linux, or the kernel refused the filter.
    """
    if not _x86_64_linux():
        raise OSError("denying AMX needs x86-64 Linux")

    def statement(code: int, k: int) -> bytes:
        return struct.pack("HBBI", code, 0, 0, k)

    def jump(code: int, k: int, if_true: int, if_false: int) -> bytes:
        return struct.pack("HBBI", code, if_true, if_false, k)

    load_word, jump_equal, give = 0x20, 0x15, 0x06
    program = b"".join([
        statement(load_word, 4), jump(jump_equal, _AUDIT_ARCH_X86_64, 0, 5),  # .arch
        statement(load_word, 0), jump(jump_equal, _ARCH_PRCTL, 0, 3),  # .nr
        statement(load_word, 16), jump(jump_equal, _ARCH_REQ_XCOMP_PERM, 0, 1),  # .args[0]
        statement(give, 0x00050000 | 1),  # SECCOMP_RET_ERRNO | EPERM
        statement(give, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    ])
    buffer = ctypes.create_string_buffer(program)

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    filter_program = _Program(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(22, 2, ctypes.byref(filter_program), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def amx_request_refused() -> bool:
    """Whether asking the kernel for AMX here fails with EPERM (after `deny_amx`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    refused = libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0
    return refused and ctypes.get_errno() == 1
