"""Inputs for any model: named arrays, batch first, read from a file or made from its signature.

A classifier is measured on the decoded test split; a model of any other inputs (several named
tensors, NCHW, integers) on feeds: the user's ``.npz`` (one array per input name, ``x`` for a
model of one input, and optionally ``y``: the labels or targets its metric scores), or arrays
generated from the model's signature, each dimension it leaves open given by the user
(``--shape NAME=1x3x320x320``, the batch first). Requests are batch 1, as in the SingleStream
protocol: the feeds hold `examples` of them along the first axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tfopt.data.arrays import ONE_INPUT, TRUTH
from tfopt.runtimes.base import TensorInfo

Feeds = dict[str, np.ndarray]




class FeedsError(ValueError):
    """Inputs that do not fit the model's signature (the message names the input)."""


def count_of(feeds: Mapping[str, np.ndarray] | np.ndarray) -> int:
    """Examples in a batch of feeds (or of images)."""
    if isinstance(feeds, np.ndarray):
        return len(feeds)
    return len(next(iter(feeds.values()))) if feeds else 0


def take(feeds: Mapping[str, np.ndarray] | np.ndarray,
         indices: Sequence[int] | slice) -> Feeds | np.ndarray:
    """The examples at `indices` of every input (or of the images)."""
    if isinstance(feeds, np.ndarray):
        return feeds[indices]
    return {name: values[indices] for name, values in feeds.items()}


def signature_text(inputs: Sequence[TensorInfo]) -> str:
    """The inputs as a user reads them: ``images float32 [-1, 3, 320, 320]``."""
    return ", ".join(f"{i.name} {i.dtype} {[-1 if d is None else d for d in i.shape]}"
                     for i in inputs)


def request_shapes(inputs: Sequence[TensorInfo],
                   given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Each input's shape for one batch-1 request: the model's dimensions, open ones `given`.

    Raises:
        FeedsError: A given name the model does not take, a given shape that contradicts the
            model's, a batch other than 1, or an open dimension nobody gave (naming the input
            and how to give it).
    """
    names = {info.name for info in inputs}
    unknown = sorted(set(given) - names)
    if unknown:
        raise FeedsError(f"--shape {unknown[0]}: the model has no input {unknown[0]!r}; its "
                         f"inputs: {signature_text(inputs)}")
    shapes: dict[str, tuple[int, ...]] = {}
    for info in inputs:
        wanted = list(given.get(info.name, []))
        if wanted and len(wanted) != len(info.shape):
            raise FeedsError(
                f"--shape {info.name}={'x'.join(map(str, wanted))}: input {info.name} has "
                f"{len(info.shape)} dimensions {_dims(info)}")
        dims = []
        for axis, fixed in enumerate(info.shape):
            value = wanted[axis] if wanted else (1 if axis == 0 and fixed is None else fixed)
            if value is None:
                raise FeedsError(
                    f"input {info.name} {_dims(info)} leaves dimension {axis} open: give its "
                    f"shape with --shape {info.name}=" + "x".join(
                        "1" if a == 0 else str(d or "N") for a, d in enumerate(info.shape)))
            if fixed is not None and value != fixed:
                raise FeedsError(f"--shape {info.name}: dimension {axis} is {fixed} in the "
                                 f"model {_dims(info)}, not {value}")
            dims.append(int(value))
        if dims and dims[0] != 1:
            raise FeedsError(f"input {info.name} {_dims(info)}: requests are batch 1 (the "
                             f"SingleStream protocol), so its first dimension must be 1")
        shapes[info.name] = tuple(dims)
    return shapes


def _dims(info: TensorInfo) -> str:
    return str([-1 if d is None else d for d in info.shape])


def generated_feeds(inputs: Sequence[TensorInfo], given: Mapping[str, Sequence[int]],
                    examples: int, seed: int = 0) -> Feeds:
    """`examples` batch-1 requests for the signature, concatenated along the first axis.

    Floats are uniform in [0, 1), integers uniform in [0, 8) (valid ids or classes for most
    models that take integers), booleans fair coins: the speed of a dense model does not
    depend on the values, and the same seed gives every runtime the same inputs.

    Raises:
        FeedsError: A shape cannot be known (see `request_shapes`).
    """
    rng = np.random.default_rng(seed)
    feeds: Feeds = {}
    for info in inputs:
        shape = (examples, *request_shapes(inputs, given)[info.name][1:])
        dtype = np.dtype(info.dtype)
        if dtype.kind == "f":
            feeds[info.name] = rng.random(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[info.name] = rng.integers(0, 8, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[info.name] = rng.random(shape) < 0.5
        else:
            raise FeedsError(f"input {info.name} has dtype {info.dtype}: tfopt generates "
                             "numbers and booleans only; give the inputs with --inputs file.npz")
    return feeds


def read_feeds(path: Path, inputs: Sequence[TensorInfo]) -> Feeds:
    """The user's inputs from an ``.npz``: one array per input name, batch first.

    A model of one input takes ``x`` too; ``y`` (`TRUTH`) is no input (`read_truth`) unless the
    model has an input of that name.

    Raises:
        FeedsError: A missing or extra input name, or a shape or dtype the model does not take.
    """
    names = [info.name for info in inputs]
    with np.load(path, allow_pickle=False) as stored:
        feeds = {name: stored[name] for name in stored.files
                 if name != TRUTH or TRUTH in names}
    if len(names) == 1 and list(feeds) == [ONE_INPUT]:
        feeds = {names[0]: feeds[ONE_INPUT]}
    if sorted(feeds) != sorted(names):
        raise FeedsError(f"--inputs {path}: holds {sorted(feeds)}, the model takes "
                         f"{signature_text(inputs)}")
    counts = {len(values) for values in feeds.values()}
    if len(counts) != 1 or 0 in counts:
        raise FeedsError(f"--inputs {path}: every input needs the same number of examples "
                         "(the first axis), at least one")
    for info in inputs:
        values = feeds[info.name]
        request = (1, *values.shape[1:])
        mismatch = [axis for axis, d in enumerate(info.shape) if d is not None and axis
                    and axis < len(request) and request[axis] != d]
        if len(request) != len(info.shape) or mismatch:
            raise FeedsError(f"--inputs {path}: {info.name} has shape {list(values.shape)}, the "
                             f"model takes {_dims(info)}")
        feeds[info.name] = values.astype(np.dtype(info.dtype), copy=False)
    return feeds


def read_truth(path: Path, inputs: Sequence[TensorInfo]) -> np.ndarray | None:
    """The labels or targets an ``.npz`` holds beside the inputs (`TRUTH`), None without them.

    Raises:
        FeedsError: They are not one per example of the inputs.
    """
    if TRUTH in {info.name for info in inputs}:
        return None
    with np.load(path, allow_pickle=False) as stored:
        if TRUTH not in stored.files:
            return None
        truth = stored[TRUTH]
        count = count_of({name: stored[name] for name in stored.files if name != TRUTH})
    if truth.ndim == 0 or len(truth) != count:
        raise FeedsError(f"--inputs {path}: {TRUTH} holds {len(truth) if truth.ndim else 0} "
                         f"labels or targets for {count} examples (one per example, first axis)")
    return truth


def save_feeds(path: Path, feeds: Mapping[str, np.ndarray]) -> Path:
    """Write feeds as an ``.npz`` (atomically), so the inputs measured can be given again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(tmp, **feeds)
    tmp.replace(path)
    return path
