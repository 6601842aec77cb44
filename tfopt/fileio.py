"""Atomic file writes and content hashing shared by every step."""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tfopt.processes import process_alive

_PROCESS_TEMP_DIR = re.compile(r"tfopt-[a-z]+-(\d+)-.+")


def process_temp_dir(purpose: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder named after this process, so a leftover can be traced to a dead one.

    Args:
        purpose: A lowercase word saying what the folder is for (e.g. ``bench``).
    """
    return tempfile.TemporaryDirectory(prefix=f"tfopt-{purpose}-{os.getpid()}-")


def remove_orphan_temp_dirs(root: Path | None = None) -> list[Path]:
    """Remove the `process_temp_dir` folders whose process is gone (killed before cleaning up).

    Args:
        root: Where to look (default: the system's temporary folder).

    Returns:
        The folders removed.
    """
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob("tfopt-*-*-*"):
        match = _PROCESS_TEMP_DIR.fullmatch(path.name)
        if match and path.is_dir() and not process_alive(int(match[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


RUN_TEMP = "tmp"
"""The work folder's sub-folder that holds each run's temporary folder."""


def use_run_temp_dir(work_dir: Path) -> Path:
    """Make this process and its children keep their temporary files in the work folder.

    The folder ``<work_dir>/tmp/tfopt-run-<pid>-*`` becomes ``TMPDIR`` (Python's `tempfile`
    and the processes this one starts: TensorFlow autograph's generated files, converters'
    scratch files, benchmark workers) and is removed at a normal exit; after a kill the next
    run removes it (`remove_orphan_temp_dirs` on ``<work_dir>/tmp``), so nothing accumulates
    in the system's temporary folder.

    Returns:
        The folder.
    """
    from multiprocessing.util import Finalize

    root = work_dir / RUN_TEMP
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"tfopt-run-{os.getpid()}-", dir=root)).resolve()
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    # After multiprocessing's own exit finalizers (its `pymp-*` folder may live in this one,
    # removed at priority -100): removed before them, that removal would print a traceback.
    Finalize(None, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True},
             exitpriority=-200)
    return folder


@contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block.

    The operating system releases it when the holder dies, so a killed run never leaves it
    taken. `on_wait` is called once when another process holds it, before waiting.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write bytes so that readers see either the old file or the complete new one.

    Args:
        path: Final location of the file.
        data: Content to write.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_save_array(path: Path, values: Any) -> None:
    """Save a NumPy array as ``.npy`` so that readers never see a half-written file."""
    import numpy as np

    tmp = path.with_name(f".{path.stem}.tmp.npy")
    np.save(tmp, values)
    tmp.replace(path)


def atomic_write_text(path: Path, text: str) -> None:
    """Write UTF-8 text atomically (see `atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically, indented and with sorted keys for stable diffs."""
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or one it came from, is a full disk (``ENOSPC``, TensorFlow's too)."""
    import errno

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def remove_partial_files(root: Path, since: float) -> list[Path]:
    """Remove the unfinished files and folders tfopt's atomic writes left under `root`.

    Every atomic write builds ``.<name>...tmp...`` beside its target and renames it when done,
    so such an entry is never a finished result; only those changed since `since` (this run's,
    not another run's that is still writing) are removed.

    Returns:
        The entries removed.
    """
    removed = []
    for path in sorted(root.rglob(".*"), key=lambda p: len(p.parts)):
        if ".tmp" not in path.name or not path.exists():
            continue
        try:
            if path.lstat().st_mtime < since:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def staging_dir_for(final: Path) -> Path:
    """A clean temporary sibling of folder `final` to build it in (leftovers removed)."""
    staging = final.parent / f".{final.name}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    final.parent.mkdir(parents=True, exist_ok=True)
    return staging


def replace_dir(staging: Path, final: Path) -> None:
    """Move a finished folder into place; the old one, if any, is removed only then."""
    if final.exists():
        shutil.rmtree(final)
    staging.replace(final)


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Return the hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def path_size_bytes(path: Path) -> int:
    """Return the size of a file, or the total size of the files under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _CountingSink(io.RawIOBase):
    """A write-only stream that counts bytes instead of keeping them."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.written += len(data)
        return len(data)


def gzip_size_bytes(path: Path) -> int:
    """Return the gzip-compressed size of a file or folder (a folder is tarred first).

    Compressed size is what a download or an app bundle pays, and it is where weight sparsity
    shows: a pruned model's file is as large as the dense one until it is compressed.
    """
    sink = _CountingSink()
    with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=9, mtime=0) as zipped:
        if path.is_file():
            zipped.write(path.read_bytes())
        else:
            with tarfile.open(fileobj=zipped, mode="w") as tar:
                for file in sorted(p for p in path.rglob("*") if p.is_file()):
                    info = tar.gettarinfo(str(file), arcname=str(file.relative_to(path)))
                    info.mtime = 0
                    with file.open("rb") as handle:
                        tar.addfile(info, handle)
    return sink.written
