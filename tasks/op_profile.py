"""Where a variant's time goes: its top operators, from each runtime's own profiler. Not a task.

- TensorFlow graph, XLA and SavedModel variants: the TensorFlow profiler
  (`tf.profiler.experimental`) traces some calls; its XSpace holds one event per executed
  kernel, named ``node:OpType`` on the executor's threads, and for XLA-compiled code one event
  per HLO instruction or fusion (those carry an ``hlo_op`` statistic).
- ONNX Runtime variants: the session's own profiler (``enable_profiling``), one ``Node`` event
  per kernel run.
- TFLite variants: the installed LiteRT (ai-edge-litert 2.3.0) exposes no operator profiler to
  Python (neither `Interpreter`, its wrapper nor `CompiledModel` has one), so their operators are
  ranked by their share of the FLOPs instead, and the profile says so (`OpProfile.method`).

Profiling runs after the timed runs, on the same prepared inputs, so it never disturbs them;
profilers slow each call down, so shares, not the profiled milliseconds, compare with the p50.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from tfopt.artifacts import OpProfile, OpTime

TOP_OPS = 8
PROFILED_CALLS = 50
_WARMUP_CALLS = 5

TF_METHOD = "TensorFlow profiler: kernel time per call"
ONNX_METHOD = "ONNX Runtime profiler: kernel time per call"
TFLITE_METHOD = "share of FLOPs (LiteRT's Python package has no operator profiler)"

_TF_KERNEL_EVENT = re.compile(r"^(?P<node>[^\s:]+):(?P<kind>[A-Za-z_][\w]*)$")
"""A TensorFlow executor's kernel event: ``model/layer/Op:OpType``."""
_CALL_KINDS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "XlaLaunch", "_XlaRun"})
"""Kernels that run a nested function or XLA cluster: their inner kernels are counted instead."""
_HLO_NUMBER = re.compile(r"\.\d+$")
"""XLA numbers its instructions (``Conv2D.3``); the kind drops the number."""


def top_ops(totals: dict[tuple[str, str], float], calls: int, timed: bool) -> list[OpTime]:
    """The `TOP_OPS` largest (node, op type) totals, as per-call ms (timed) and shares."""
    whole = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:TOP_OPS]
    return [OpTime(node=node, kind=kind, ms=(total / calls if timed else None),
                   share=(total / whole if whole else 0.0))
            for (node, kind), total in ranked]


def tf_op_profile(invoke: Callable[[object], object], prepared: Sequence[object]) -> OpProfile:
    """Trace `PROFILED_CALLS` calls with the TensorFlow profiler; rank the kernels by time."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for index in range(_WARMUP_CALLS):
        invoke(prepared[index % len(prepared)])
    with tempfile.TemporaryDirectory(prefix="tfopt-tf-profile-") as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for index in range(PROFILED_CALLS):
                invoke(prepared[index % len(prepared)])
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        for trace in Path(logdir).rglob("*.xplane.pb"):
            space.ParseFromString(trace.read_bytes())
    totals: Counter[tuple[str, str]] = Counter()
    for plane in space.planes:
        hlo_stat = next((key for key, stat in plane.stat_metadata.items()
                         if stat.name == "hlo_op"), None)
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                match = _TF_KERNEL_EVENT.match(name)
                if match and match["kind"] not in _CALL_KINDS:
                    totals[(match["node"], match["kind"])] += event.duration_ps / 1e9
                elif hlo_stat is not None and any(s.metadata_id == hlo_stat for s in event.stats):
                    totals[(name, "XLA " + _HLO_NUMBER.sub("", name))] += event.duration_ps / 1e9
    return OpProfile(method=TF_METHOD, calls=PROFILED_CALLS,
                     ops=top_ops(totals, PROFILED_CALLS, timed=True))


def onnx_op_profile(path: Path, threads: int, prepared: Sequence[object]) -> OpProfile:
    """Run `PROFILED_CALLS` calls on a profiling session of its own; rank the kernels by time."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="tfopt-ort-profile-") as folder:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "ort")
        session = ort.InferenceSession(str(path), sess_options=options,
                                       providers=["CPUExecutionProvider"])
        for index in range(_WARMUP_CALLS + PROFILED_CALLS):
            session.run(None, prepared[index % len(prepared)])
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted(event["ts"] for event in events if event.get("name") == "model_run")
    profiled_from = runs[_WARMUP_CALLS] if len(runs) > _WARMUP_CALLS else 0
    totals: Counter[tuple[str, str]] = Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time") \
                and event["ts"] >= profiled_from:
            node = name.removesuffix("_kernel_time")
            totals[(node, event["args"].get("op_name", "?"))] += event["dur"] / 1000.0
    return OpProfile(method=ONNX_METHOD, calls=PROFILED_CALLS,
                     ops=top_ops(totals, PROFILED_CALLS, timed=True))


def tflite_op_profile(interpreter: object) -> OpProfile:
    """Rank a LiteRT graph's operators by FLOPs (see the module's note)."""
    from tasks.flops import tflite_op_flops

    totals: Counter[tuple[str, str]] = Counter()
    for node, kind, flops in tflite_op_flops(interpreter):
        totals[(node, kind)] += flops
    return OpProfile(method=TFLITE_METHOD, calls=0, ops=top_ops(totals, 1, timed=False))


def op_profile(runner: object, prepared: Sequence[object], threads: int) -> OpProfile | None:
    """The top operators of the model `runner` holds, by the method its runtime allows."""
    from tasks.runners import GraphRunner, OnnxRunner, SavedModelRunner, TFLiteRunner

    if isinstance(runner, GraphRunner | SavedModelRunner):
        return tf_op_profile(runner.invoke, prepared)
    if isinstance(runner, OnnxRunner):
        return onnx_op_profile(runner.path, threads, prepared)
    if isinstance(runner, TFLiteRunner):
        return tflite_op_profile(runner.interpreter)
    return None
