"""Steps that run a model natively, each in a child process: a crash ends the child, not the run.

TensorFlow's kernels, its converters, ONNX Runtime's and OpenVINO's run a user's model in native
code; a segfault there (oneDNN's training kernels have crashed on a Keras 2-era model on some
CPUs: docs/limits.md) would take the whole run down with no word. Every such step runs here instead:

- in a child of a fork server that imported TensorFlow once (`multiprocessing`'s forkserver, so
  a step starts in milliseconds, not seconds), or in a fresh interpreter where a fork server
  cannot be used (a daemonic Dask worker) and for a retry;
- its log lines and progress come back to the step's own logger and Prefect progress artifact
  while it runs; its result (a frozen result type) and any exception come back when it ends;
- a child that dies of a signal is one line (`NativeCrashError`: the step, the signal, what ran,
  what to try); when the signal came from inside the process (SIGSEGV, SIGABRT, SIGBUS, SIGILL,
  SIGFPE) the step is rerun once in a fresh process with oneDNN's custom operations off
  (``TF_ENABLE_ONEDNN_OPTS=0``), and the retry is recorded (`RETRY_PARAM`, the run's log of
  contained crashes: `record_path`).

Children die with the process that waits for them (``PR_SET_PDEATHSIG``): nothing is left
running after a killed run.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import logging
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tfopt.native_events import send_events_to

T = TypeVar("T")

ONEDNN_OFF = {"TF_ENABLE_ONEDNN_OPTS": "0"}
"""What a retry changes: oneDNN's custom operations off (TensorFlow's plain Eigen kernels)."""
RETRY_PARAM = "native_retry"
"""The parameter a retried step's result carries (a model's or a variant's ``params``)."""
RECORD_ENV = "TFOPT_NATIVE_RECORD"
"""The file (JSON lines) where a run's contained crashes and retries are written, if set."""
INTERNAL_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                              signal.SIGFPE})
"""Signals a process raises on itself (a crash in its own code): worth a retry."""
_PRELOAD = ["tfopt", "numpy", "tensorflow", "tf_keras"]
"""What the fork server imports once. A worker lives on from step to step, so what only some
runs need (tfmot, the converters) is imported by the first step that needs it, once."""
_POLL_SECONDS = 0.25
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class NativeStep:
    """A step that runs a model natively.

    Attributes:
        name: The step, as the run names it (``sweep_batch_size``, ``prune_model``).
        what: What runs natively, for the one line a crash becomes ("training steps in
            TensorFlow's CPU kernels").
        hint: What to try when it crashes even without oneDNN.
    """

    name: str
    what: str
    hint: str = ""


class NativeCrashError(RuntimeError):
    """A step's process died of a signal (after the retry, when one was made)."""


class NativeStepError(RuntimeError):
    """A step raised an exception whose type could not be raised again here."""


def run_native(step: NativeStep, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``function(*args, **kwargs)`` in a child process and return what it returns.

    `function` is a module-level function; its arguments and result are pickled (paths,
    frozen result types, configs). An exception it raises is raised here again, of the same
    type where that type can be made from its message. A result with ``params`` (a model, a
    variant) made by a retry carries `RETRY_PARAM`.

    Raises:
        NativeCrashError: The child died of a signal, and the retry did too (or was not
            tried: the signal came from outside, or oneDNN was off already).
    """
    return _contained(step, pickle.dumps((function, args, kwargs)), fresh=not _can_fork())


def _contained(step: NativeStep, request: bytes, fresh: bool) -> Any:
    """Run a pickled request in a child; retry a crash from inside it once with oneDNN off."""
    outcome = _run_child(step, request, fresh=fresh)
    if outcome.signal is None:
        return outcome.value()
    first = _crash_line(step, outcome.signal)
    if not _worth_retrying(outcome.signal):
        _record(step, outcome.signal, retried=False, recovered=False)
        raise NativeCrashError(f"{first}; {_hint(step, outcome.signal)}")
    _logger().warning("%s; running it again in a fresh process with oneDNN's custom operations "
                      "off (TF_ENABLE_ONEDNN_OPTS=0)", first)
    retry = _run_child(step, request, fresh=True, env=ONEDNN_OFF)
    _record(step, outcome.signal, retried=True, recovered=retry.signal is None)
    if retry.signal is not None:
        raise NativeCrashError(f"{first}, and again with oneDNN off ({signal_name(retry.signal)}); "
                               f"{_hint(step, retry.signal)}")
    note = f"TF_ENABLE_ONEDNN_OPTS=0 after {signal_name(outcome.signal)}"
    _logger().warning("%s: the retry with oneDNN off worked (speed and rounding may differ)",
                      step.name)
    return _noted(retry.value(), note)


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11, and so on (the number itself when it has no name)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


RECORD_NAME = "native-crashes.jsonl"


def contain_native_steps(run_dir: Path) -> Path:
    """Record this run's contained crashes under `run_dir`; start the fork server now.

    Returns:
        The record file (`read_record` reads it; it may never be written).
    """
    path = run_dir / RECORD_NAME
    os.environ[RECORD_ENV] = str(path)
    warm_up()
    return path


def record_path() -> Path | None:
    """The file this run's contained crashes go to (set by the flow: `RECORD_ENV`)."""
    value = os.environ.get(RECORD_ENV)
    return Path(value) if value else None


def read_record(path: Path) -> list[dict[str, Any]]:
    """The contained crashes written to `path` (none when it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _crash_line(step: NativeStep, number: int) -> str:
    return f"{step.name} crashed: its process died of {signal_name(number)} in {step.what}"


def _hint(step: NativeStep, number: int) -> str:
    if number == signal.SIGKILL:
        return ("it was killed from outside, most often by the kernel for lack of memory: try "
                "smaller batches or fewer things at once")
    return step.hint or "the model cannot be run natively here; try another TensorFlow build"


def _worth_retrying(number: int) -> bool:
    return (number in INTERNAL_SIGNALS
            and os.environ.get("TF_ENABLE_ONEDNN_OPTS") != ONEDNN_OFF["TF_ENABLE_ONEDNN_OPTS"])


def _noted(value: T, note: str) -> T:
    """`value` with the retry in its ``params`` (a model or a variant); else as it is."""
    params = getattr(value, "params", None)
    if isinstance(params, dict) and hasattr(value, "model_copy"):
        return value.model_copy(update={"params": {**params, RETRY_PARAM: note}})
    return value


def _record(step: NativeStep, number: int, *, retried: bool, recovered: bool) -> None:
    """Append the crash to the run's record (`RECORD_ENV`), where the report reads it."""
    path = record_path()
    if path is None:
        return
    line = json.dumps({"step": step.name, "signal": signal_name(number), "what": step.what,
                       "retried": retried, "recovered": recovered,
                       "retry": " ".join(f"{k}={v}" for k, v in ONEDNN_OFF.items())
                       if retried else ""}) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    from tfopt.logs import step_logger

    return step_logger()


@dataclass(frozen=True)
class _Outcome:
    """How a child ended: the signal that killed it, or its pickled answer."""

    signal: int | None
    answer: bytes = b""

    def value(self) -> Any:
        status, payload = pickle.loads(self.answer)
        if status == "ok":
            return payload
        raise _exception(*payload)


def _exception(module: str, name: str, message: str, trace: str) -> BaseException:
    """The child's exception, of its own type where it can be made from its message."""
    try:
        kind = getattr(importlib.import_module(module), name)
        if isinstance(kind, type) and issubclass(kind, Exception):
            error = kind(message)
            error.__notes__ = [f"raised in a child process:\n{trace}"]
            return error
    except Exception:  # any failure to rebuild it falls back to one type
        pass
    return NativeStepError(f"{name}: {message}")


def _can_fork() -> bool:
    """A fork server's child can be started here (not from a daemonic process, on Linux)."""
    return (sys.platform.startswith("linux")
            and not multiprocessing.current_process().daemon)


_SERVER: list[Any] = []


def _context() -> Any:
    """The fork server's context, TensorFlow imported in it once."""
    if not _SERVER:
        _short_socket_folder()
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        _SERVER.append(context)
    return _SERVER[0]


_SOCKET_PATH_ROOM = 60
"""Unix socket paths hold 107 bytes; the fork server's adds about 40 to its folder's."""


def _short_socket_folder() -> None:
    """Keep multiprocessing's folder (the fork server's socket) where its path fits.

    A run's temporary files live in its work folder (`tfopt.fileio.use_run_temp_dir`), whose
    path can be too long for a Unix socket ("AF_UNIX path too long"); multiprocessing keeps
    the first folder it makes, so it is made once in the system's temporary folder.
    """
    if len(tempfile.gettempdir()) <= _SOCKET_PATH_ROOM:
        return
    saved = tempfile.tempdir
    tempfile.tempdir = next((root for root in ("/tmp", "/dev/shm", "/var/tmp")
                             if os.access(root, os.W_OK)), saved)
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def warm_up() -> None:
    """Start the fork server now, so its TensorFlow import overlaps other work."""
    if _can_fork():
        from multiprocessing import forkserver

        _context()
        forkserver.ensure_running()


def _run_child(step: NativeStep, request: bytes, *, fresh: bool,
               env: dict[str, str] | None = None) -> _Outcome:
    """Run one request in a child; relay its log lines and progress until it ends."""
    with tempfile.TemporaryDirectory(prefix=f"tfopt-native-{os.getpid()}-") as folder:
        paths = tuple(str(Path(folder) / name)
                      for name in ("request.pkl", "answer.pkl", "events.jsonl"))
        Path(paths[0]).write_bytes(request)
        relay = _Relay(Path(paths[2]))
        if fresh:
            code = _run_fresh(paths, env, relay)
        else:
            worker = _idle_worker()
            code = worker.run(paths, relay)
            if code is None and not worker.retiring:
                _IDLE.append(worker)
        relay.flush()
        if code is not None and code < 0:
            return _Outcome(signal=-code)
        answer = Path(paths[1])
        if not answer.is_file():
            raise NativeStepError(f"{step.name}: its process exited with code {code} and no "
                                  "answer (see the run's log file)")
        return _Outcome(signal=None, answer=answer.read_bytes())


def _run_fresh(paths: tuple[str, ...], env: dict[str, str] | None, relay: _Relay) -> int:
    """One request in a fresh interpreter (its own environment); its exit code."""
    process = subprocess.Popen([sys.executable, "-m", "tfopt.native", *paths],
                               env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    while (code := process.poll()) is None:
        relay.flush()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_POLL_SECONDS)  # returns as soon as it exits
    return code


class _Worker:
    """A child of the fork server that runs requests one after another until one kills it.

    Reusing it keeps TensorFlow's runtime, started once, for the next step (a fresh child spent
    about 0.6 s starting it again for every conversion); a step that crashes takes only this
    worker down, and the next step gets a new one.
    """

    def __init__(self) -> None:
        self._conn, child_end = _context().Pipe()
        self._process = _context().Process(target=worker_main, args=(child_end,),
                                           name="tfopt-native", daemon=True)
        self._process.start()
        child_end.close()
        self.retiring = False

    def run(self, paths: tuple[str, ...], relay: _Relay) -> int | None:
        """Run one request; None when it answered (the worker lives on), else its exit code.

        The request runs in this process's environment of the moment (the run's temporary
        folder, its log, its code folders), not the fork server's: the server may have started
        before the run set them (the command line's checks), or for an earlier run.
        """
        self._conn.send((paths, dict(os.environ)))
        while True:
            relay.flush()
            if self._conn.poll(_POLL_SECONDS):
                with contextlib.suppress(EOFError, OSError):
                    self.retiring = self._conn.recv() == "retiring"
                    return None
            if self._process.exitcode is not None or not self._process.is_alive():
                self._process.join()
                return self._process.exitcode

    def close(self) -> None:
        """Let the worker end (its loop stops when the pipe closes)."""
        self._conn.close()


_IDLE: list[_Worker] = []
_IDLE_LOCK = threading.Lock()


def _idle_worker() -> _Worker:
    """A waiting worker, or a new one (steps running at once each get their own)."""
    with _IDLE_LOCK:
        while _IDLE:
            worker = _IDLE.pop()
            if worker._process.is_alive():
                return worker
    return _Worker()


WORKER_MAX_RSS_MB = 4096.0
"""A worker that grew past this (TensorFlow keeps what it allocated) ends after its step; the
next step gets a fresh one."""


def worker_main(conn: Any) -> None:
    """A worker's life: run each request it is sent, answer, wait for the next."""
    _die_with_parent()
    gc.freeze()  # what the fork server imported: never garbage, and its pages stay shared
    while True:
        try:
            paths, environment = conn.recv()
        except (EOFError, OSError):
            return
        _take_environment(environment)
        child_main(*paths)
        _forget_models()
        gc.collect()
        gc.freeze()  # what this step imported (tfmot, the converters) for the steps after it
        if _resident_mb() > WORKER_MAX_RSS_MB:
            conn.send("retiring")
            return
        conn.send("done")


def _take_environment(environment: dict[str, str]) -> None:
    """Make `environment` this process's, ``TMPDIR`` included (read again by `tempfile`).

    Only the variables that differ are set or removed: the same run's steps change nothing,
    and TensorFlow's threads may read the environment meanwhile.
    """
    for name in [name for name in os.environ if name not in environment]:
        del os.environ[name]
    os.environ.update({name: value for name, value in environment.items()
                       if os.environ.get(name) != value})
    tempfile.tempdir = None


def _resident_mb() -> float:
    """This process's resident memory (VmRSS), in MB."""
    import psutil

    with contextlib.suppress(OSError, psutil.Error):
        return psutil.Process().memory_info().rss / 2**20
    return 0.0


def release_workers() -> None:
    """End the idle workers (their memory is the machine's again, e.g. before measuring)."""
    with _IDLE_LOCK:
        idle, _IDLE[:] = list(_IDLE), []
    for worker in idle:
        worker.close()


def _forget_models() -> None:
    """Free the last step's Keras graphs before the next step runs in the same worker."""
    with contextlib.suppress(Exception):
        import tf_keras

        tf_keras.backend.clear_session()


class _Relay:
    """Replays a child's log lines to the step's logger and its progress to Prefect as they come."""

    def __init__(self, events: Path) -> None:
        self._events, self._offset = events, 0
        self._progress: dict[str, Any] = {}

    def flush(self) -> None:
        """Replay the events written since the last call."""
        if not self._events.is_file():
            return
        with self._events.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError):
                self._replay(json.loads(line))

    def _replay(self, event: dict[str, Any]) -> None:
        if event["kind"] == "log":
            _logger().log(event["level"], "%s", event["message"])
        elif event["kind"] == "progress":
            from tfopt.orchestration import StepProgress

            key = event["key"]
            if key not in self._progress:
                self._progress[key] = StepProgress(key, event["description"])
            self._progress[key].update(event["done"], event["total"])


def _die_with_parent() -> None:
    """Ask the kernel to kill this process when the one that started it is gone (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_main(request_path: str, answer_path: str, events_path: str) -> None:
    """A child's whole life: run the request, write the answer (the value or the exception)."""
    _die_with_parent()
    send_events_to(Path(events_path))
    try:
        function, args, kwargs = pickle.loads(Path(request_path).read_bytes())
        answer = ("ok", function(*args, **kwargs))
    except Exception as error:  # every failure goes back to the parent
        answer = ("error", (type(error).__module__, type(error).__qualname__, str(error),
                            traceback.format_exc()))
    partial = Path(f"{answer_path}.partial")
    partial.write_bytes(pickle.dumps(answer))
    os.replace(partial, answer_path)


if __name__ == "__main__":
    import tfopt  # noqa: F401  (environment before TensorFlow)

    child_main(*sys.argv[1:4])
