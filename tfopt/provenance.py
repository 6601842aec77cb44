"""Where a run came from: the code's git commit and the tracking addresses in use."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

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
    threads: int, tf_intra_op_threads: int | None = None, cpus: list[int] | None = None
) -> dict[str, str | int]:
    """What the benchmark ran on: CPU, cores, OS, library versions, thread settings.

    Args:
        threads: The configured ``benchmark.threads``.
        tf_intra_op_threads: TensorFlow's intra-op pool size in force where TensorFlow variants
            were measured (None: no TensorFlow variant was).
        cpus: The CPUs the measuring processes were pinned to (``benchmark.cpus``).
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
        "cores": str(os.cpu_count()),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        **{package: installed(package) for package in _REPORTED_PACKAGES},
        **machine_state(),
        "benchmark_threads": str(threads),
        "benchmark_cpus": ",".join(map(str, cpus)) if cpus else "not pinned",
        "tf_intra_op_threads": (tf_intra_op_threads if tf_intra_op_threads is not None
                                else "no TensorFlow variant measured"),
    }


def mlflow_tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else the local server that `tfopt up` starts."""
    return os.environ.get("MLFLOW_TRACKING_URI") or ServiceSettings.from_env().mlflow_url


def prefect_api_url() -> str:
    """`PREFECT_API_URL` if set, else the local server that `tfopt up` starts."""
    return os.environ.get("PREFECT_API_URL") or ServiceSettings.from_env().prefect_api_url
