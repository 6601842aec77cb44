"""The CPU's inference features are read from its flags; bf16 is offered only where it is native."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tfopt.cpu_features import bf16_unavailable_reason, inference_features, parse_cpu_flags

CPUINFO = """processor\t: 0
model name\t: Some Xeon
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni amx_tile amx_bf16 amx_int8
processor\t: 1
flags\t\t: fpu
"""


def test_the_first_processors_flags_are_read_and_filtered_in_a_fixed_order():
    flags = parse_cpu_flags(CPUINFO)
    assert "sse2" in flags and "fpu" in flags
    assert inference_features(flags) == ["avx2", "fma", "avx512f", "avx512_vnni", "amx_tile",
                                         "amx_int8", "amx_bf16"]
    assert parse_cpu_flags("model name: x\n") == frozenset()


def test_bf16_needs_avx512_bf16_or_amx_bf16_and_says_why_not():
    assert bf16_unavailable_reason(frozenset({"avx512_bf16"})) is None
    assert bf16_unavailable_reason(parse_cpu_flags(CPUINFO)) is None
    assert "no bfloat16 instructions" in bf16_unavailable_reason(frozenset({"avx2", "fma"}))
    assert "not readable" in bf16_unavailable_reason(frozenset())


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="AMX permission requests are x86-64 Linux system calls")
def test_denying_amx_makes_the_kernel_refuse_it_to_that_process():
    """Each in a child of its own: the filter lasts the process's life."""
    def child(code: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", "from tfopt.cpu_features import amx_permitted, "
                                   f"amx_request_refused, deny_amx\n{code}"],
            capture_output=True, text=True, check=True, timeout=120).stdout.strip()

    assert child("print(amx_request_refused())") == "False"
    denied = child("try:\n    deny_amx()\nexcept OSError as error:\n    print('no filter', error)\n"
                   "else:\n    print(amx_request_refused(), amx_permitted())")
    if denied.startswith("no filter"):
        pytest.skip(f"this kernel or sandbox refuses seccomp filters: {denied}")
    assert denied == "True False"
