"""The `tfopt` command: local services, demo data, pipeline runs and Prefect deployments."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console

import tfopt  # noqa: F401  (environment first)
from tfopt.config import ConfigError, load_config, resolve_cpus
from tfopt.services import (
    DATABASES,
    ServiceError,
    ServiceSettings,
    health_url,
    is_healthy,
    redact,
    require_services,
    service_status,
    start_services,
    stop_services,
)

# Wide enough for the summary table when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() else 140)


def _cmd_up(args: argparse.Namespace) -> int:
    settings = ServiceSettings.from_env(db=args.db)
    console.print(f"starting local services on {settings.db} (state in {settings.state_dir}) ...")
    for line in start_services(settings):
        console.print(line)
    _print_addresses(settings)
    os.environ["PREFECT_API_URL"] = settings.prefect_api_url
    _reconcile_leftovers(settings.mlflow_url)
    return 0


def _cmd_down(_: argparse.Namespace) -> int:
    for line in stop_services(ServiceSettings.from_env()):
        console.print(line)
    return 0


def _cmd_status(_: argparse.Namespace) -> int:
    settings = ServiceSettings.from_env()
    status = service_status(settings)
    for name, healthy in status.items():
        console.print(f"{name}: {'up' if healthy else 'down'}")
    _print_addresses(settings)
    return 0 if all(status.values()) else 1


def _print_addresses(settings: ServiceSettings) -> None:
    console.print(f"Prefect UI: {settings.prefect_url}")
    console.print(f"MLflow UI:  {settings.mlflow_url}")
    if settings.db == "postgres":
        from tfopt import postgres

        secret = postgres.password_file(settings.state_dir)
        console.print(f"PostgreSQL: {postgres.LOOPBACK}:{settings.postgres_port}, user "
                      f"{postgres.SUPERUSER}, password in {secret}", highlight=False)


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from tfopt.demo_data import write_demo_images

    count = write_demo_images(args.out, image_size=args.image_size)
    console.print(f"{count} demo images in {args.out}")
    return 0


def _parse_overrides(pairs: list[str]) -> dict[str, object]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _point_at_services() -> None:
    """Point this process at the configured servers before anything imports Prefect.

    Prefect reads ``PREFECT_API_URL`` once, when it is first imported (loading a config
    imports the techniques, which define Prefect tasks); set later, a flow would run on a
    temporary in-process server instead. Servers that require a password get it from the
    environment or from the password file `tfopt up` wrote (`client_credentials`).
    """
    from tfopt.provenance import mlflow_tracking_uri, prefect_api_url
    from tfopt.services import client_credentials

    os.environ["PREFECT_API_URL"] = prefect_api_url()
    os.environ["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri()
    os.environ.update(client_credentials(ServiceSettings.from_env().state_dir))


def _connect_services() -> tuple[str, str]:
    """Check both servers answer; return their addresses (set by `_point_at_services`)."""
    api_url, tracking_uri = os.environ["PREFECT_API_URL"], os.environ["MLFLOW_TRACKING_URI"]
    require_services(api_url, tracking_uri)
    return api_url, tracking_uri


def _reconcile_leftovers(tracking_uri: str, work_dir: Path | None = None) -> None:
    """Close what a killed tfopt process on this machine left behind, and say so.

    MLflow runs and Prefect flow runs left RUNNING are marked KILLED and Crashed; temporary
    folders are removed (the system's, and the work folder's run folders).
    """
    from tfopt.fileio import RUN_TEMP, remove_orphan_temp_dirs
    from tfopt.orchestration import crash_orphan_flow_runs, mark_crashed
    from tfopt.tracking import reconcile_orphans

    reason = "its tfopt process was gone"
    orphans = reconcile_orphans(tracking_uri)
    crashed = mark_crashed([o["flow_run_id"] for o in orphans], reason)
    for orphan in orphans:
        prefect = ", Prefect Crashed" if orphan["flow_run_id"] in crashed else ""
        console.print(f"closed a run left RUNNING by a process that is gone: {orphan['name']} "
                      f"(MLflow KILLED{prefect})", highlight=False)
    for name in crash_orphan_flow_runs(reason):
        console.print(f"closed a Prefect flow run left RUNNING by a process that is gone: {name} "
                      "(Crashed)", highlight=False)
    roots = [None, *([work_dir / RUN_TEMP] if work_dir and (work_dir / RUN_TEMP).is_dir()
                     else [])]
    for folder in (found for root in roots for found in remove_orphan_temp_dirs(root)):
        console.print(f"removed a temporary folder of a process that is gone: {folder}",
                      highlight=False)


class PrefectUnavailableError(ServiceError):
    """The Prefect server stopped answering while a flow ran."""


def _run_flow(flow_call: Callable[[], dict], api_url: str) -> dict:
    """Run a flow; a Prefect server lost mid-run is an error naming it, not a traceback.

    Raises:
        PrefectUnavailableError: The flow failed and the Prefect server no longer answers.
    """
    try:
        return flow_call()
    except (ConfigError, ServiceError):
        raise
    except Exception as error:
        if is_healthy(health_url(api_url), 5.0):
            raise
        raise PrefectUnavailableError(
            f"Prefect at {redact(api_url)} stopped answering during the run "
            f"({type(error).__name__}). Start it again with `tfopt up` and rerun: the shards and "
            "a trained baseline are reused, and the run left RUNNING is closed then."
        ) from error


def _report(summary: dict, summary_json: Path | None) -> None:
    """Write the summary JSON if asked and print the variants table."""
    from tfopt.fileio import atomic_write_json
    from tfopt.report.summary import summary_table

    if summary_json:
        atomic_write_json(summary_json, summary)
    console.print(summary_table(summary))


def _allow_code_from(folder: Path) -> None:
    """Let this process (and the flows it runs) import builders from `folder` too."""
    from tfopt.models.keras_io import CODE_DIRS_ENV

    known = [p for p in os.environ.get(CODE_DIRS_ENV, "").split(os.pathsep) if p]
    os.environ[CODE_DIRS_ENV] = os.pathsep.join([*known, str(folder)])


class RunFailedError(RuntimeError):
    """A run that failed for a reason of its own (not bad input): one line, exit code 1."""


_EARLY_LOG: list[Any] = []
"""The log the libraries' output goes to from the command's start, until the run has its own."""


def _verbose(args: argparse.Namespace) -> bool:
    """Everything on the terminal: ``--verbose``, ``TFOPT_VERBOSE=1``, ``TFOPT_LOG_LEVEL=DEBUG``."""
    return (bool(getattr(args, "verbose", False)) or os.environ.get("TFOPT_VERBOSE") == "1"
            or os.environ.get("TFOPT_LOG_LEVEL", "").upper() == "DEBUG")


def _route_libraries_early(args: argparse.Namespace) -> None:
    """From the start of `tfopt run` / `tfopt benchmark`, keep the libraries off the terminal.

    TensorFlow prints its C++ banners when it is imported (checking the model imports it), so
    the output goes to a log of this process's own in the temporary folder, moved into the
    work folder once the run starts (`_quiet_libraries`); the terminal keeps tfopt's lines.
    """
    if args.command not in ("run", "benchmark") or _verbose(args):
        return
    if sys.stdout is not sys.__stdout__ or sys.stderr is not sys.__stderr__:
        return  # a caller captures this process's output (a test, an embedding program)
    import atexit
    import tempfile

    from tfopt.logs import route_output_to_log

    folder = Path(tempfile.mkdtemp(prefix=f"tfopt-log-{os.getpid()}-"))
    early = route_output_to_log(folder / "start.log")
    console.file = early.terminal_out
    _EARLY_LOG.append(early)

    def clean_up() -> None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(clean_up)


def _quiet_libraries(args: argparse.Namespace, work_dir: Path, name: str) -> Path | None:
    """Continue the libraries' log in the run's log file; Prefect's lines on the terminal.

    Returns:
        The log file (None when verbose, see `_verbose`).
    """
    if not _EARLY_LOG:
        return None
    import shutil
    import time

    from tfopt.logs import move_log, show_run_lines

    path = work_dir / "logs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    early_folder = _EARLY_LOG[0].path.parent
    run_log = move_log(_EARLY_LOG[0], path.resolve())
    shutil.rmtree(early_folder, ignore_errors=True)  # nothing left in the system's temp folder
    _EARLY_LOG[0] = run_log
    show_run_lines(run_log)
    os.environ["TFOPT_RUN_LOG"] = str(run_log.path)
    console.print(f"libraries' output and full tracebacks: {run_log.path} (--verbose shows "
                  "them here)", highlight=False, soft_wrap=True)
    return run_log.path


def _failure_in_one_line(call: Callable[[], dict], run_log: Path | None) -> dict:
    """Run `call`; an unexpected failure is one line naming its step, its traceback logged.

    Raises:
        RunFailedError: The run failed (the step and reason in the message; the traceback in
            the run's log file).
    """
    if run_log is None:
        return call()
    try:
        return call()
    except (ConfigError, ServiceError):
        raise
    except Exception as error:
        import traceback

        traceback.print_exc()  # to the run's log file (standard error goes there)
        raise RunFailedError(_failure_line(error, run_log)) from error


def _failure_line(error: BaseException, traceback_log: Path) -> str:
    """An unexpected failure in one line: its step, type, first line, and where its traceback is."""
    step = _failed_step(error)
    text = str(error).strip()
    first_line = text.splitlines()[0][:300] if text else ""
    return (f"the run failed{f' in {step}' if step else ''}: {type(error).__name__}: "
            f"{first_line} (traceback: {traceback_log})")


def _failed_step(error: BaseException) -> str | None:
    """The tfopt task, technique or flow module the error was raised in, if any."""
    import traceback

    steps = [Path(frame.filename).stem for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename).parent.name in ("tasks", "techniques", "flows")]
    return steps[-1] if steps else None


def _cleaned_if_disk_full(call: Callable[[], dict], work_dir: Path) -> dict:
    """Run `call`; a disk that fills meanwhile is one line, its partial files removed.

    Raises:
        ConfigError: The disk filled (naming the folder and what is free now); the rerun after
            space is freed reuses the finished shards and a trained baseline.
    """
    import shutil
    import time

    from tfopt.fileio import is_disk_full, remove_partial_files

    started = time.time()
    try:
        return call()
    except Exception as error:
        if not is_disk_full(error):
            raise
        removed = remove_partial_files(work_dir, started)
        free_mb = shutil.disk_usage(work_dir).free / 1e6
        raise ConfigError(
            f"work_dir: {work_dir} ran out of space during the run ({free_mb:,.0f} MB free now, "
            f"{len(removed)} unfinished files removed): free space and rerun; finished shards "
            "and a trained baseline are reused") from error


def _cmd_run(args: argparse.Namespace) -> int:
    import json

    from flows.parameters import load_pipeline_config

    config = load_pipeline_config(args.config, _parse_overrides(args.set))
    if args.config is not None:
        _allow_code_from(args.config.resolve().parent)
    if not config.data.source_dir.is_dir() and config.data.source_dir == Path("data/demo"):
        from tfopt.demo_data import write_demo_images

        write_demo_images(config.data.source_dir)
    from tfopt.preflight import check_run

    check_run(config)
    resolve_cpus(config.benchmark.cpus)
    api_url, tracking_uri = _connect_services()
    _reconcile_leftovers(tracking_uri, config.work_dir)
    from tfopt.fileio import use_run_temp_dir

    use_run_temp_dir(config.work_dir)
    run_log = _quiet_libraries(args, config.work_dir, config.name)

    from flows.optimize_model import optimize_model

    summary = _failure_in_one_line(lambda: _cleaned_if_disk_full(
        lambda: _run_flow(lambda: optimize_model(config=config), api_url), config.work_dir),
        run_log)
    _report(summary, args.summary_json)
    ip = summary["input_pipeline"]
    console.print(
        f"input pipeline: naive {ip['naive_examples_per_s']:,.0f} ex/s, tuned "
        f"{ip['tuned_examples_per_s']:,.0f} ex/s, cached {ip['cached_examples_per_s']:,.0f} ex/s"
    )
    console.print(f"champion: {summary['champion'] or 'none'} ({summary['champion_reason']})")
    prefect_ui = api_url.removesuffix("/api")
    console.print(f"Prefect UI: {prefect_ui}/runs/flow-run/{summary['prefect_flow_run_id']}")
    console.print(f"MLflow UI:  {summary['mlflow_run_url']}")
    if args.summary_json:
        console.print(f"summary: {args.summary_json}")
    elif args.print_json:
        print(json.dumps(summary, indent=2))
    return 0


# `tfopt benchmark` flags that are shorthands for config keys (an explicit --set wins).
_BENCHMARK_FLAGS = {"model": "model", "format": "format", "name": "name",
                    "data": "data.source_dir", "image_size": "data.image_size",
                    "work_dir": "work_dir", "inputs": "inputs"}


def _parse_shapes(pairs: list[str]) -> dict[str, list[int]]:
    """``--shape images=1x3x320x320`` flags as ``shapes`` (input name to dimensions)."""
    shapes: dict[str, list[int]] = {}
    for pair in pairs:
        name, sep, dims = pair.partition("=")
        try:
            shapes[name.strip()] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ConfigError(f"--shape expects NAME=1x3x320x320 (integers), got {pair!r}")
    return shapes


def _check_benchmark_inputs(config: Any, signature: tuple[list, list] | None) -> None:
    """Refuse inputs that cannot be made for the model, or a missing data folder, in one line.

    Args:
        config: The benchmark flow's parameters.
        signature: The model's inputs and outputs (None: a registered model, checked by the
            flow once downloaded).

    Raises:
        ConfigError: Naming the input or the folder and what to give.
    """
    from tfopt.measurement.feeds import FeedsError, read_feeds, request_shapes
    from tfopt.measurement.inputs import takes_images

    setting = config.inputs
    classifier = signature is None or takes_images(*signature)
    if setting == "data" or (setting == "auto" and classifier and signature is not None):
        if not config.data.source_dir.is_dir():
            raise ConfigError(
                f"data.source_dir: {config.data.source_dir} is not a folder (a model measured "
                "on inputs generated from its signature: --inputs random)")
        return
    if signature is None:
        return
    try:
        if setting in ("auto", "random"):
            request_shapes(signature[0], config.shapes)
        elif setting.endswith(".npz"):
            read_feeds(Path(setting), signature[0])
    except (FeedsError, OSError) as error:
        raise ConfigError(f"inputs: {error}") from error


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from flows.parameters import BenchmarkOnlyConfig

    if args.run or args.work_pool:
        return _benchmark_on_machines(args)

    overrides: dict[str, object] = {
        key: str(value) if isinstance(value, Path) else value
        for flag, key in _BENCHMARK_FLAGS.items()
        if (value := getattr(args, flag)) is not None
    }
    if args.shape:
        overrides["shapes"] = _parse_shapes(args.shape)
    overrides.update(_parse_overrides(args.set))
    config = load_config(args.config, overrides, BenchmarkOnlyConfig)
    resolve_cpus(config.benchmark.cpus)
    api_url, tracking_uri = _connect_services()
    _reconcile_leftovers(tracking_uri)
    from tfopt.models.references import check_model_reference

    _check_benchmark_inputs(config, check_model_reference(config.model, tracking_uri))

    run_log = _quiet_libraries(args, config.work_dir, config.name)
    from flows.benchmark_model import benchmark_model

    summary = _failure_in_one_line(
        lambda: _run_flow(lambda: benchmark_model(config=config), api_url), run_log)
    _report(summary, args.summary_json)
    console.print(f"MLflow UI:  {summary['mlflow_run_url']}")
    return 0


def _benchmark_on_machines(args: argparse.Namespace) -> int:
    """`tfopt benchmark --run R --work-pool P ...`: measure R's variants where P's workers are."""
    from rich.table import Table

    from deployments import machines as deployed
    from tfopt import machines, tracking

    if not (args.run and args.work_pool):
        raise ConfigError("--run and --work-pool go together: the pipeline run whose variants "
                          "to measure, and the work pool(s) of the machines to measure them on")
    _, tracking_uri = _connect_services()
    variants = machines.variants_to_measure(tracking_uri, args.run, args.variant)
    submitted = deployed.submit(args.run, variants, args.work_pool, args.work_dir, args.source)
    console.print(f"{len(submitted)} benchmark_model flow runs submitted: {len(variants)} "
                  f"variants x {', '.join(args.work_pool)}; waiting for the workers ...")
    states = deployed.wait_for(submitted, args.timeout)
    for item in submitted:
        if states[item.flow_run_id] != "Completed":
            console.print(f"{item.variant} on {item.pool}: {states[item.flow_run_id]} (flow run "
                          f"{item.flow_run_id})", highlight=False)
    names, rows = machines.machine_rows(tracking_uri, args.run)
    report_dir = (args.work_dir or Path(".tfopt/work")).resolve() / "machines" / args.run
    files = machines.write_machine_report(names, rows, report_dir)
    client = tracking.client(tracking_uri)
    for path in files:
        tracking.log_artifact(client, args.run, path, "report/machines")
    table = Table(title="batch-1 p50 (ms) per machine, same files, same inputs")
    table.add_column("variant")
    for name in names:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(row["variant"], *(f"{row[n]['p50_ms']:.3f}" if n in row else "-"
                                        for n in names))
    console.print(table)
    console.print(f"per machine report: {files[0]} (also in the run's report/machines)")
    failed = sum(1 for state in states.values() if state != "Completed")
    return 1 if failed else 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from deployments.serve import PREFECT_YAML, DeploymentConflictError, serve_deployments

    api_url, _ = _connect_services()
    console.print(f"serving the deployments of {PREFECT_YAML}")
    console.print(f"run them from {api_url.removesuffix('/api')}/deployments (Ctrl+C stops)")
    try:
        serve_deployments(limit=args.limit)
    except DeploymentConflictError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        return 2
    return 0


def _cmd_deploy(args: argparse.Namespace) -> int:
    from deployments.serve import deploy_to_work_pool, load_deployment_specs, work_pool_names

    _connect_services()
    for line in deploy_to_work_pool(source=args.source):
        console.print(line, highlight=False)
    for pool in work_pool_names(load_deployment_specs()):
        console.print(f"start a worker for them: tfopt worker --pool {pool}")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from deployments.machines import deploy_to_pool
    from tfopt.machines import machine_settings

    settings = machine_settings(_parse_overrides(args.set))
    _connect_services()
    deployment = deploy_to_pool(args.pool, machine=settings)
    console.print(f"{deployment}: this machine's settings {settings or '(none)'}", highlight=False)
    prefect = Path(sys.executable).with_name("prefect")
    os.execv(prefect, [str(prefect), "worker", "start", "--pool", args.pool, "--type", "process"])


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `tfopt` command."""
    parser = argparse.ArgumentParser(prog="tfopt", description=__doc__)
    parser.add_argument("--verbose", action="store_true",
                        help="on an error, show its traceback too (TFOPT_VERBOSE=1 does the same)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the local Prefect and MLflow servers")
    up.add_argument("--db", choices=DATABASES, default=None,
                    help="their database: SQLite files (the default) or a local PostgreSQL "
                    "server started with them (TFOPT_DB sets the default)")
    up.set_defaults(handler=_cmd_up)
    commands.add_parser("down", help="stop the local servers").set_defaults(handler=_cmd_down)
    commands.add_parser("status", help="are the local servers answering?").set_defaults(
        handler=_cmd_status
    )
    demo = commands.add_parser("demo-data", help="write the built-in demo images")
    demo.add_argument("--out", type=Path, default=Path("data/demo"))
    demo.add_argument("--image-size", type=int, default=32)
    demo.set_defaults(handler=_cmd_demo_data)
    run = commands.add_parser("run", help="run the optimization pipeline")
    run.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    run.add_argument("--summary-json", type=Path, default=None,
                     help="write the run summary (JSON contract) here")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value, e.g. --set train.epochs=2")
    run.add_argument("--print-json", action="store_true", help="print the summary JSON")
    run.set_defaults(handler=_cmd_run)
    bench = commands.add_parser(
        "benchmark", help="benchmark one registered or saved model, or a pipeline run's "
        "variants on the machines of work pools (--run, --work-pool)")
    bench.add_argument("--config", type=Path, default=None,
                       help="YAML of the benchmark_model flow's parameters (BenchmarkOnlyConfig)")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a parameter, e.g. --set benchmark.threads=1")
    bench.add_argument("--model", default=None,
                       help="models:/<name>@<alias>, models:/<name>/<version>, or a path")
    bench.add_argument("--data", type=Path, default=None,
                       help="class-per-folder images; the test split is used (data.source_dir)")
    bench.add_argument("--image-size", type=int, default=None, help="data.image_size")
    bench.add_argument("--inputs", default=None,
                       help="auto (default), data, random (generated from the model's "
                            "signature, no data needed) or a file.npz of named inputs")
    bench.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x320x320",
                       help="one batch-1 request's shape for an input whose dimensions the "
                            "model leaves open (repeatable)")
    bench.add_argument("--format", default=None)
    bench.add_argument("--name", default=None)
    bench.add_argument("--work-dir", type=Path, default=None)
    bench.add_argument("--summary-json", type=Path, default=None)
    bench.add_argument("--run", default=None,
                       help="an optimize_model MLflow run id: measure its ok variants on the "
                            "machines of --work-pool")
    bench.add_argument("--work-pool", action="append", default=[],
                       help="a process work pool whose worker sits on the target machine "
                            "(repeat for several machines)")
    bench.add_argument("--variant", action="append", default=None,
                       help="only this variant of --run (repeatable; default: every ok one)")
    bench.add_argument("--timeout", type=float, default=3600.0,
                       help="seconds to wait for the workers (default 3600)")
    bench.add_argument("--source", default=None,
                       help="git URL the workers clone the code from (default: this checkout)")
    bench.set_defaults(handler=_cmd_benchmark)
    serve = commands.add_parser(
        "serve", help="serve the deployments of deployments/prefect.yaml from this process"
    )
    serve.add_argument("--limit", type=int, default=1,
                       help="flow runs at the same time (default 1: runs queue on 2 cores)")
    serve.set_defaults(handler=_cmd_serve)
    deploy = commands.add_parser(
        "deploy", help="register the deployments of deployments/prefect.yaml to their work pool"
    )
    deploy.add_argument("--source", default=None,
                        help="git URL workers clone the code from (default: this checkout)")
    deploy.set_defaults(handler=_cmd_deploy)
    worker = commands.add_parser("worker", help="start a Prefect worker on a process work pool")
    worker.add_argument("--pool", default="tfopt-process")
    worker.add_argument("--set", action="append", default=[], metavar="benchmark.KEY=VALUE",
                        help="this machine's benchmark settings for the runs it measures, "
                             "e.g. --set benchmark.threads=4 --set benchmark.cpus=[0,1,2,3]")
    worker.set_defaults(handler=_cmd_worker)
    return parser


def _traceback_if_verbose(args: argparse.Namespace) -> None:
    """Print the exception being handled with its traceback when the user asked to see it."""
    if _verbose(args):
        console.print_exception()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tfopt` console script."""
    args = build_parser().parse_args(argv)
    _point_at_services()
    _route_libraries_early(args)
    try:
        return args.handler(args)
    except PrefectUnavailableError as error:
        console.print(f"[bold red]error:[/] {redact(str(error))}", highlight=False, soft_wrap=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Prefect's exit handlers would spend minutes sending logs and events to the lost server.
        os._exit(2)
    except (ConfigError, ServiceError) as error:
        _traceback_if_verbose(args)
        console.print(f"[bold red]error:[/] {redact(str(error))}", highlight=False, soft_wrap=True)
        return 2
    except RunFailedError as error:
        console.print(f"[bold red]error:[/] {redact(str(error))}", highlight=False, soft_wrap=True)
        return 1
    except ValidationError as error:
        from tfopt.config import describe_validation_error

        console.print(f"[bold red]error:[/] invalid {error.title}:\n"
                      f"{describe_validation_error(error)}", highlight=False)
        return 2
    except Exception as error:
        if not _EARLY_LOG:
            raise
        import shutil
        import traceback

        traceback.print_exc()  # into the log, kept beside the work folder's logs
        kept = ServiceSettings.from_env().state_dir / "logs" / f"tfopt-error-{os.getpid()}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_EARLY_LOG[0].path, kept)
        console.print(f"[bold red]error:[/] {redact(_failure_line(error, kept))} (--verbose "
                      "shows it here)", highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
