"""This machine's processes as tfopt sees them: alive or gone, who left what, stopping a group.

What tfopt leaves behind (MLflow runs, Prefect flow runs, temporary folders, held slots) carries
`process_identity`, so a later process can tell whether its owner is gone (`left_by_dead_process`).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_identity() -> dict[str, str]:
    """This process as tfopt records it on what it leaves behind (MLflow and Prefect tags).

    Returns:
        ``{"tfopt.host": <host name>, "tfopt.pid": <process id>}``.
    """
    return {"tfopt.host": socket.gethostname(), "tfopt.pid": str(os.getpid())}


def left_by_dead_process(identity: Mapping[str, object]) -> bool:
    """Whether a `process_identity` names a process of this machine that is gone."""
    pid = str(identity.get("tfopt.pid", ""))
    return (identity.get("tfopt.host") == socket.gethostname() and pid.isdigit()
            and not process_alive(int(pid)))


def terminate_group(pid: int, timeout_s: float, first: signal.Signals) -> None:
    """Stop the process group `pid` leads: `first`, then SIGKILL after `timeout_s` each."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            _reap(pid)
            time.sleep(0.2)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` nobody listens on right now, below the kernel's ephemeral range.

    A port the kernel hands out for `bind(0)` lies in the range it also takes the source ports
    of outgoing connections from: between choosing it and a server binding it, any client on
    the machine may take it ("address already in use"). Ports below that range are only ever
    taken by a bind that names them (where the range starts too low for that: any free port).
    """
    low = _ephemeral_low()
    for _ in range(200 if low > _LOWEST_CHOSEN_PORT + 1000 else 0):
        port = random.randrange(_LOWEST_CHOSEN_PORT, low)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


_LOWEST_CHOSEN_PORT = 20000
"""Well above the ports services are usually configured on."""


def _ephemeral_low() -> int:
    """The lowest port the kernel picks for outgoing connections (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
