"""This machine's processes as tfopt sees them: alive or gone, who left what, stopping a group.

What tfopt leaves behind (MLflow runs, Prefect flow runs, temporary folders, held slots) carries
`process_identity`, so a later process can tell whether its owner is gone (`left_by_dead_process`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Mapping


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
    """A TCP port of `host` nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
