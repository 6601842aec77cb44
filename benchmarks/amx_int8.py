"""TFLite files timed with AMX allowed and denied to XNNPACK, side by side, on an AMX CPU.

Usage: .venv/bin/python benchmarks/amx_int8.py FILE.tflite [FILE.tflite ...] [--reference NAME]
       [--rounds 6] [--calls 1500] [--threads 1] [--images IMAGES.npy]

On Linux a process may use AMX only after asking the kernel for it
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); XNNPACK asks when it starts on a CPU
with AMX and then runs its int8 kernels on AMX tiles. A process started with that request denied
(`tfopt.cpu_features.deny_amx`, what ``benchmark.amx: denied`` does to every measuring process)
runs the same files on XNNPACK's AVX-512 kernels instead. Each round starts one process of each
kind, in alternating order; each process times every file in turn (LiteRT's Interpreter,
`set_tensor` then `invoke`, as `benchmarks/tflite_pair.py`) and prints its medians. The table
gives each file's median over rounds with AMX allowed and denied, what denying it changes, and
each file's speed-up over `--reference` in each setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tfopt.cpu_features import amx_permitted, deny_amx


def _child(args: argparse.Namespace) -> None:
    """Time every file in this process (AMX denied first if asked); print JSON medians."""
    if args.child == "denied":
        deny_amx()
    sys.path.insert(0, str(Path(__file__).parent))
    from tflite_pair import _median_ms, _prepared

    images = _images(args.images)
    prepared = {path.name: _prepared(path, images, args.threads) for path in args.files}
    medians: dict[str, list[float]] = {name: [] for name in prepared}
    names = list(prepared)
    for index in range(3):
        for name in names if index % 2 == 0 else names[::-1]:
            medians[name].append(_median_ms(prepared[name], args.calls))
    print(json.dumps({"amx": amx_permitted(),
                      "p50": {name: float(np.median(ms)) for name, ms in medians.items()}}))


def _images(path: Path | None) -> np.ndarray:
    if path is not None:
        return np.load(path)[:200]
    return np.random.default_rng(0).random((64, 64, 64, 3), dtype=np.float32)


def _run_child(args: argparse.Namespace, setting: str) -> dict:
    command = [sys.executable, __file__, *map(str, args.files), "--child", setting,
               "--threads", str(args.threads), "--calls", str(args.calls)]
    if args.images is not None:
        command += ["--images", str(args.images)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--reference", help="file name the speed-ups are over (default: first)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--images", type=Path, help="a run's benchmark-inputs/test-images.npy")
    parser.add_argument("--child", choices=["allowed", "denied"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    p50s: dict[str, dict[str, list[float]]] = {"allowed": {}, "denied": {}}
    for round_ in range(args.rounds):
        for setting in ("allowed", "denied") if round_ % 2 == 0 else ("denied", "allowed"):
            measured = _run_child(args, setting)
            if measured["amx"] != (setting == "allowed"):
                sys.exit(f"AMX {setting} asked, the process reports permitted={measured['amx']}: "
                         "this CPU has no AMX, or the filter did not hold")
            for name, ms in measured["p50"].items():
                p50s[setting].setdefault(name, []).append(ms)
    reference = args.reference or args.files[0].name
    print(f"{args.rounds} rounds, {args.threads} thread(s); medians over rounds [min, max]")
    print(f"{'file':52s} {'AMX allowed':>22s} {'AMX denied':>22s} {'AMX off gain':>15s} "
          f"{'speed-up over ' + reference + ' (allowed, denied)'}")
    for name in p50s["allowed"]:
        allowed, denied = np.array(p50s["allowed"][name]), np.array(p50s["denied"][name])
        gains = [np.median(np.array(p50s[s][reference]) / np.array(p50s[s][name]))
                 for s in ("allowed", "denied")]
        print(f"{name:52s} {np.median(allowed):8.4f} [{allowed.min():.4f}, {allowed.max():.4f}]"
              f" {np.median(denied):8.4f} [{denied.min():.4f}, {denied.max():.4f}]"
              f" {np.median(allowed / denied):14.2f}x   {gains[0]:.2f}x, {gains[1]:.2f}x")


if __name__ == "__main__":
    main()
