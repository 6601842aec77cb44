"""How busy the machine is with other work while a variant is timed (psutil's CPU times)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_BUSY = ("user", "nice", "system", "irq", "softirq", "steal")
"""Busy CPU time (not idle, not iowait); psutil has the last four on Linux only."""


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (None: not measurable)."""
    import psutil

    try:
        times = psutil.cpu_times()
    except (OSError, RuntimeError):
        return None
    return float(sum(getattr(times, field, 0.0) for field in _BUSY))


def own_cpu_seconds() -> float:
    """CPU seconds this process has used (all its threads)."""
    times = os.times()
    return times.user + times.system


@dataclass
class LoadProbe:
    """Cores kept busy by other processes between `LoadProbe.start()` and `cores()`."""

    busy: float | None
    own: float
    wall: float

    @classmethod
    def start(cls) -> LoadProbe:
        """Begin a measurement window."""
        return cls(machine_busy_seconds(), own_cpu_seconds(), time.monotonic())

    def cores(self) -> float | None:
        """Average number of cores other processes used since `start` (None: not measurable)."""
        busy, wall = machine_busy_seconds(), time.monotonic() - self.wall
        if busy is None or self.busy is None or wall <= 0:
            return None
        others = (busy - self.busy) - (own_cpu_seconds() - self.own)
        return max(0.0, others / wall)


def background_cores(seconds: float = 0.5) -> float | None:
    """Cores other processes use over a short idle window (before a measurement starts)."""
    probe = LoadProbe.start()
    time.sleep(seconds)
    return probe.cores()
