"""How busy the machine is with other work while a variant is timed (Linux `/proc/stat`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_PROC_STAT = Path("/proc/stat")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (not idle, iowait)


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (None: not Linux)."""
    try:
        fields = _PROC_STAT.read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / os.sysconf(
        "SC_CLK_TCK")


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
