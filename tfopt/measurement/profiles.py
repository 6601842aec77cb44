"""Where a variant's time goes: the common shape of every runtime's operator profile.

Each runtime profiles with its own tool (`Runtime.op_profile`); this module ranks what they
report the same way. Profiling runs after the timed runs, on the same prepared inputs, so it
never disturbs them; profilers slow each call down, so shares, not the profiled milliseconds,
compare with the p50. FLOPs count 2 x the multiply-accumulates of the layers that hold nearly
all of a vision network's arithmetic (convolutions, depthwise convolutions, fully connected
layers and matrix products), per example; bias adds, activations and pooling are left out, the
usual convention (so 1 GFLOP here is 0.5 GMACs). Every runtime counts by that rule, so a
network's variants agree whatever their format.
"""

from __future__ import annotations

from tfopt.artifacts import OpTime

TOP_OPS = 8
PROFILED_CALLS = 50
WARMUP_CALLS = 5


def top_ops(totals: dict[tuple[str, str], float], calls: int, timed: bool) -> list[OpTime]:
    """The `TOP_OPS` largest (node, op type) totals, as per-call ms (timed) and shares."""
    whole = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:TOP_OPS]
    return [OpTime(node=node, kind=kind, ms=(total / calls if timed else None),
                   share=(total / whole if whole else 0.0))
            for (node, kind), total in ranked]
