"""The `tfopt` command: parses its arguments and calls the core, the flows and the deployments.

Local services, demo data, pipeline runs, benchmarks and Prefect deployments; what a run needs
around its flow (servers, leftovers, the libraries' output, one-line failures) is
`tfopt.supervision`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError
from rich.console import Console

import tfopt  # noqa: F401  (environment first)
from tfopt import supervision
from tfopt.config import ConfigError, load_config, resolve_cpus
from tfopt.services import (
    DATABASES,
    LOCAL_WORK_POOL,
    ServiceError,
    ServiceSettings,
    redact,
    service_status,
    start_services,
    start_worker,
    stop_services,
    worker_pid,
)

# Wide enough for the summary table when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() else 140)


def _cmd_up(args: argparse.Namespace) -> int:
    settings = ServiceSettings.from_env(db=args.db)
    console.print(f"starting local services on {settings.db} (state in {settings.state_dir}) ...")
    for line in start_services(settings):
        console.print(line)
    if args.worker:
        console.print(start_worker(settings))
    _print_addresses(settings)
    os.environ["PREFECT_API_URL"] = settings.prefect_api_url
    supervision.point_at_services()  # the password a first start just made, for the clean-up
    _say(supervision.reconcile_leftovers(settings.mlflow_url))
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
    pid = worker_pid(settings)
    console.print(f"worker: {'down' if pid is None else f'up (pid {pid})'}")
    _print_addresses(settings)
    return 0 if all(status.values()) else 1


def _print_addresses(settings: ServiceSettings) -> None:
    console.print(f"Prefect UI: {settings.prefect_url}")
    console.print(f"MLflow UI:  {settings.mlflow_url}")
    if settings.db == "postgres":
        from tfopt.services import postgres

        secret = postgres.password_file(settings.state_dir)
        console.print(f"PostgreSQL: {postgres.LOOPBACK}:{settings.postgres_port}, user "
                      f"{postgres.SUPERUSER}, password in {secret}", highlight=False)


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from tfopt.demo_data import BUILT_IN_FOLDERS, write_demo_images, write_hard_digits

    if args.hard:
        out = args.out or BUILT_IN_FOLDERS["digits-hard"]
        count = write_hard_digits(out, image_size=args.image_size or 64)
    else:
        out = args.out or BUILT_IN_FOLDERS["demo"]
        count = write_demo_images(out, image_size=args.image_size or 32)
    console.print(f"{count} {'hard digit' if args.hard else 'demo'} images in {out}")
    return 0


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """``--set KEY=VALUE`` pairs as config overrides, each value read as YAML.

    Raises:
        ConfigError: A pair without ``=``.
    """
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _say(lines: list[str]) -> None:
    for line in lines:
        console.print(line, highlight=False)


def _report(summary: dict, summary_json: Path | None) -> None:
    """Write the summary JSON if asked; print the measured variants and the ones not measured."""
    from tfopt.fileio import atomic_write_json
    from tfopt.report.terminal import measured_table, not_measured_lines

    if summary_json:
        atomic_write_json(summary_json, summary)
    console.print(measured_table(summary))
    lines = not_measured_lines(summary)
    if lines:
        count = sum(1 for entry in summary["variants"] if entry["status"] != "ok")
        console.print(f"not measured ({count} variants):", highlight=False)
        for line in lines:
            console.print(f"  {line}", highlight=False, soft_wrap=True)


def _cmd_run(args: argparse.Namespace) -> int:
    import json

    from flows.parameters import load_pipeline_config

    config = load_pipeline_config(args.config, parse_overrides(args.set))
    if args.config is not None:
        supervision.allow_code_from(args.config.resolve().parent)
    if not config.data.source_dir.is_dir():
        from tfopt.demo_data import write_built_in

        write_built_in(config.data.source_dir)
    from tfopt.preflight import check_run

    check_run(config)
    resolve_cpus(config.benchmark.cpus)
    api_url, tracking_uri = supervision.connect_services()
    _say(supervision.reconcile_leftovers(tracking_uri, config.work_dir))
    from tfopt.fileio import use_run_temp_dir

    use_run_temp_dir(config.work_dir)
    run_log = _run_log(config.work_dir, config.name)

    from flows.optimize_model import optimize_model

    summary = supervision.supervised(lambda: optimize_model(config=config), api_url,
                                     config.work_dir, run_log)
    if ip := summary["input_pipeline"]:
        console.print(
            f"input pipeline: naive {ip['naive_examples_per_s']:,.0f} ex/s, tuned "
            f"{ip['tuned_examples_per_s']:,.0f} ex/s, cached "
            f"{ip['cached_examples_per_s']:,.0f} ex/s")
    _report(summary, args.summary_json)
    if args.summary_json:
        console.print(f"summary JSON: {args.summary_json}", highlight=False)
    elif args.print_json:
        print(json.dumps(summary, indent=2))
    from tfopt.report.terminal import verdict_lines

    for line in verdict_lines(summary, api_url.removesuffix("/api")):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def _run_log(work_dir: Path, name: str) -> Path | None:
    """The run's log file for the libraries' output, said on the terminal (None: verbose)."""
    run_log = supervision.quiet_libraries(work_dir, name)
    if run_log is not None:
        console.print(f"libraries' output and full tracebacks: {run_log} (--verbose shows "
                      "them here)", highlight=False, soft_wrap=True)
    return run_log


# `tfopt benchmark` flags that are shorthands for config keys (an explicit --set wins).
_BENCHMARK_FLAGS = {"model": "model", "format": "format", "name": "name",
                    "data": "data.source_dir", "image_size": "data.image_size",
                    "work_dir": "work_dir", "inputs": "inputs", "reference": "reference"}


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
    overrides.update(parse_overrides(args.set))
    config = load_config(args.config, overrides, BenchmarkOnlyConfig)
    resolve_cpus(config.benchmark.cpus)
    from tfopt.models.references import check_model_reference
    from tfopt.preflight import check_benchmark_inputs

    registered = config.model.startswith(("models:/", "runs:/"))
    if not registered:  # a file is refused before the servers are asked for
        check_benchmark_inputs(config, check_model_reference(config.model, tracking_uri=""))
    api_url, tracking_uri = supervision.connect_services()
    _say(supervision.reconcile_leftovers(tracking_uri))
    if registered:
        check_benchmark_inputs(config, check_model_reference(config.model, tracking_uri))

    run_log = _run_log(config.work_dir, config.name)
    from flows.benchmark_model import benchmark_model

    summary = supervision.supervised(lambda: benchmark_model(config=config), api_url, None,
                                     run_log)
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
    _, tracking_uri = supervision.connect_services()
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

    api_url, _ = supervision.connect_services()
    console.print(f"serving the deployments of {PREFECT_YAML}")
    console.print(f"run them from {api_url.removesuffix('/api')}/deployments (Ctrl+C stops)")
    try:
        serve_deployments(limit=args.limit)
    except DeploymentConflictError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        return 2
    return 0


def _cmd_deploy(args: argparse.Namespace) -> int:
    from deployments.alerts import register_alerts, save_webhook
    from deployments.serve import deploy_to_work_pool, load_deployment_specs, work_pool_names

    api_url, _ = supervision.connect_services()
    for line in deploy_to_work_pool(source=args.source):
        console.print(line, highlight=False)
    if args.alert_webhook:
        save_webhook(args.alert_webhook)
    for line in register_alerts():
        console.print(line, highlight=False)
    local = ServiceSettings.from_env()
    for pool in work_pool_names(load_deployment_specs()):
        if pool == LOCAL_WORK_POOL and worker_pid(local) is not None:
            console.print(f"the worker `tfopt up` started runs them: trigger one from "
                          f"{api_url.removesuffix('/api')}/deployments", highlight=False)
        else:
            console.print(f"start a worker for them: tfopt worker --pool {pool}")
    return 0


def _cmd_alerts(args: argparse.Namespace) -> int:
    from deployments.alerts import send_test_alert

    supervision.connect_services()
    try:
        console.print(send_test_alert(), highlight=False)
    except LookupError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        return 2
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from deployments.machines import deploy_to_pool
    from tfopt.machines import machine_settings

    settings = machine_settings(parse_overrides(args.set))
    supervision.connect_services()
    deployment = deploy_to_pool(args.pool, machine=settings)
    console.print(f"{deployment}: this machine's settings {settings or '(none)'}", highlight=False)
    prefect = Path(sys.executable).with_name("prefect")
    os.execv(prefect, [str(prefect), "worker", "start", "--pool", args.pool, "--type", "process"])


def _cmd_docs(_: argparse.Namespace) -> int:
    from cli.config_docs import write_configuration

    console.print(f"wrote {write_configuration()}", highlight=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `tfopt` command."""
    parser = argparse.ArgumentParser(prog="tfopt", description=__doc__)
    parser.add_argument("--verbose", action="store_true",
                        help="on an error, show its traceback too (TFOPT_VERBOSE=1 does the same)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the local Prefect and MLflow servers and a "
                             "Prefect worker for the deployments")
    up.add_argument("--db", choices=DATABASES, default=None,
                    help="their database: SQLite files (the default) or a local PostgreSQL "
                    "server started with them (TFOPT_DB sets the default)")
    up.add_argument("--no-worker", dest="worker", action="store_false",
                    help="do not start the Prefect worker of the local process work pool")
    up.set_defaults(handler=_cmd_up)
    commands.add_parser("down", help="stop the local servers and the worker").set_defaults(
        handler=_cmd_down)
    commands.add_parser("status", help="are the local servers answering?").set_defaults(
        handler=_cmd_status
    )
    commands.add_parser(
        "docs", help="write docs/configuration.md from the parameters' schema"
    ).set_defaults(handler=_cmd_docs)
    demo = commands.add_parser("demo-data", help="write the built-in demo images")
    demo.add_argument("--hard", action="store_true",
                      help="the digits drawn over clutter (data/digits-hard, configs/bench.yaml)")
    demo.add_argument("--out", type=Path, default=None,
                      help="default: data/demo, or data/digits-hard with --hard")
    demo.add_argument("--image-size", type=int, default=None, help="default: 32, or 64 with --hard")
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
    bench.add_argument("--reference", default=None,
                       help="the model whose outputs are the truth for --set "
                            "eval.metric=fidelity (the float model a file was converted from)")
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
    deploy.add_argument("--alert-webhook", default=os.environ.get("TFOPT_ALERT_WEBHOOK"),
                        metavar="URL",
                        help="save the notification block tfopt-alerts as a webhook to URL "
                             "(failed or crashed deployment runs and confirmed regressions "
                             "are sent to it; default: $TFOPT_ALERT_WEBHOOK, so `make run` "
                             "sets it up too)")
    deploy.set_defaults(handler=_cmd_deploy)
    alerts = commands.add_parser(
        "alerts", help="the alerts tfopt deploy registers: `tfopt alerts test` sends one")
    alerts.add_argument("action", choices=["test"],
                        help="test: send one notification through the tfopt-alerts block")
    alerts.set_defaults(handler=_cmd_alerts)
    worker = commands.add_parser("worker", help="start a Prefect worker on a process work pool")
    worker.add_argument("--pool", default="tfopt-process")
    worker.add_argument("--set", action="append", default=[], metavar="benchmark.KEY=VALUE",
                        help="this machine's benchmark settings for the runs it measures, "
                             "e.g. --set benchmark.threads=4 --set benchmark.cpus=[0,1,2,3]")
    worker.set_defaults(handler=_cmd_worker)
    return parser


def _traceback_if_verbose(args: argparse.Namespace) -> None:
    """Print the exception being handled with its traceback when the user asked to see it."""
    if supervision.wants_verbose(args.verbose):
        console.print_exception()


def _error(text: str) -> None:
    console.print(f"[bold red]error:[/] {redact(text)}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tfopt` console script."""
    args = build_parser().parse_args(argv)
    supervision.point_at_services()
    if (args.command in ("run", "benchmark", "deploy")
            and not supervision.wants_verbose(args.verbose)):
        terminal = supervision.route_libraries_early()
        if terminal is not None:
            console.file = terminal
    try:
        return args.handler(args)
    except supervision.PrefectUnavailableError as error:
        _error(str(error))
        sys.stdout.flush()
        sys.stderr.flush()
        # Prefect's exit handlers would spend minutes sending logs and events to the lost server.
        os._exit(2)
    except (ConfigError, ServiceError) as error:
        _traceback_if_verbose(args)
        _error(str(error))
        return 2
    except supervision.RunFailedError as error:
        _error(str(error))
        return 1
    except ValidationError as error:
        from tfopt.config import describe_validation_error

        console.print(f"[bold red]error:[/] invalid {error.title}:\n"
                      f"{describe_validation_error(error)}", highlight=False)
        return 2
    except Exception as error:
        line = supervision.unexpected_failure_line(error)
        if line is None:
            raise
        _error(f"{line} (--verbose shows it here)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
