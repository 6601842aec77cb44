"""Where a run came from: the code's git commit and the tracking addresses in use."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from tfopt.cpu_features import inference_features
from tfopt.services import ServiceSettings

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def git_commit(repo: Path = PROJECT_ROOT) -> str:
    """Return the checked-out commit of tfopt's repository, or ``unknown`` outside one."""
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo, capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return completed.stdout.strip() or "unknown"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo), or the platform's processor string."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_state() -> dict[str, str]:
    """Load and CPU frequency information, where the OS exposes it (Linux /proc and /sys)."""
    state = {}
    if hasattr(os, "getloadavg"):
        one, five, _ = os.getloadavg()
        state["load_average_1m_5m"] = f"{one:.2f} {five:.2f}"
    try:
        mhz = [float(line.split(":", 1)[1]) for line in
               Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("cpu MHz")]
        if mhz:
            state["cpu_mhz"] = f"{min(mhz):.0f}-{max(mhz):.0f}"
    except (OSError, ValueError):
        pass
    cpufreq = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    for name in ("scaling_governor", "scaling_max_freq"):
        with contextlib.suppress(OSError):
            state[f"cpu_{name}"] = (cpufreq / name).read_text().strip()
    if hasattr(os, "sched_getaffinity"):
        state["cpus_available"] = str(len(os.sched_getaffinity(0)))
    return state


_REPORTED_PACKAGES = ("tensorflow-cpu", "tf-keras", "tensorflow-model-optimization",
                      "ai-edge-litert", "onnxruntime", "tf2onnx", "mlflow", "prefect")


def environment(
    threads: int, tf_intra_op_threads: int | None = None, cpus: list[int] | None = None,
    amx: str = "allowed",
) -> dict[str, str | int]:
    """What the benchmark ran on: CPU, cores, OS, library versions, thread settings.

    Args:
        threads: The configured ``benchmark.threads``.
        tf_intra_op_threads: TensorFlow's intra-op pool size in force where TensorFlow variants
            were measured (None: no TensorFlow variant was).
        cpus: The CPUs the measuring processes were pinned to (``benchmark.cpus``).
        amx: Whether the measuring processes could use AMX (``benchmark.amx``).
    """
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return {
        "cpu": cpu_model(),
        "cpu_features": " ".join(inference_features()) or "unknown",
        "cores": str(os.cpu_count()),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        **{package: installed(package) for package in _REPORTED_PACKAGES},
        **machine_state(),
        "benchmark_threads": str(threads),
        "benchmark_cpus": ",".join(map(str, cpus)) if cpus else "not pinned",
        "benchmark_amx": amx,
        "tf_intra_op_threads": (tf_intra_op_threads if tf_intra_op_threads is not None
                                else "no TensorFlow variant measured"),
        **machine_limits(),
    }


def machine_limits() -> dict[str, float]:
    """This machine's measured float32 matrix-multiply peak and memory copy rate.

    The roof that achieved GFLOP/s are read against, measured in the same run as the variants
    (numpy's BLAS on all cores; a 128 MB copy).
    """
    return {"machine_peak_gflops": round(machine_peak_gflops(), 2),
            "machine_memory_gb_per_s": round(machine_memory_gb_per_s(128), 2)}


def mlflow_tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else the local server that `tfopt up` starts."""
    return os.environ.get("MLFLOW_TRACKING_URI") or ServiceSettings.from_env().mlflow_url


def prefect_api_url() -> str:
    """`PREFECT_API_URL` if set, else the local server that `tfopt up` starts."""
    return os.environ.get("PREFECT_API_URL") or ServiceSettings.from_env().prefect_api_url


def machine_peak_gflops(size: int = 1024, repeats: int = 5) -> float:
    """The best float32 matrix-multiply rate of this process's BLAS on all its threads."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    np.dot(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.dot(a, b)
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best / 1e9


def machine_memory_gb_per_s(megabytes: int = 256, repeats: int = 3) -> float:
    """The best rate of copying a buffer far larger than the caches (read + write bytes)."""
    import numpy as np

    source = np.ones(megabytes * 2**20 // 8, np.float64)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return 2.0 * source.nbytes / best / 1e9
