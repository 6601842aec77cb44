"""Benchmark one existing model, registered or on disk, without rerunning the pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.common import benchmark_serialized, error_of, sharded_data
from flows.parameters import BenchmarkOnlyConfig
from tasks.choose_benchmark_inputs import choose_benchmark_inputs
from tasks.compute_reference_outputs import compute_reference_outputs
from tasks.decide_amx import decide_amx_setting
from tasks.package_models import package_models
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tasks.resolve_model import resolve_model
from tasks.write_report import write_report
from tfopt import tracking
from tfopt.artifacts import BenchmarkInputs, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.machines import MACHINE_RUN_ROLE, local_protocol, machine_label, machine_protocol
from tfopt.measurement.amx import AmxDecision, with_decided_amx
from tfopt.measurement.inputs import INPUTS_ARTIFACT, check_judged, read_inputs_index
from tfopt.models.references import UnusableModelError
from tfopt.orchestration import claim_flow_run
from tfopt.prefect_artifacts import publish_prefect_artifacts
from tfopt.provenance import environment, mlflow_tracking_uri
from tfopt.report.summary import benchmark_summary


@flow(name="benchmark_model", flow_run_name="benchmark-{config.name}", log_prints=True)
def benchmark_model(config: BenchmarkOnlyConfig = BenchmarkOnlyConfig()) -> dict[str, Any]:  # noqa: B008
    """Measure one model with the pipeline's protocol, on a data folder's test split or any inputs.

    An image classifier is measured on the data's test split (accuracy too); a model of any
    other inputs on inputs generated from its signature or on the user's ``.npz``, without data
    (`choose_benchmark_inputs`). The model's own outputs are the reference, so agreement is 1 by
    construction; latency statistics, throughput, load scenarios, memory, the operator profile
    and sizes are what this flow is for. A classifier measured on data is also logged as an
    MLflow 3 LoggedModel of the run (its metrics linked to it), as the pipeline's variants are.
    The model is opened only in the measuring process (`benchmark.isolate`, on by default) and a
    probe process, never in the flow's own.

    Args:
        config: The model reference, the data, and the benchmark protocol.

    Returns:
        A summary with one variant entry, also written as a report to MLflow.
    """
    claim_flow_run()
    tracking.use_retry_seconds(config.services.retry_seconds)
    work_dir = config.work_dir.resolve()
    tracking_uri = mlflow_tracking_uri()
    run_dir = work_dir / "benchmarks" / f"{config.name}-{flow_run.id}"
    if config.pipeline_run:
        return _benchmark_for_pipeline_run(config, config.pipeline_run, tracking_uri, run_dir)
    protocol = local_protocol(config.benchmark, config.machine)
    spec = resolve_model(config.model, config.format, config.precision, tracking_uri,
                         run_dir / "model")
    tags = {"prefect.flow_run_id": str(flow_run.id), "tfopt.role": "benchmark"}
    with tracking.tracked_run(
        tracking_uri, config.experiment, f"benchmark-{config.name}-{spec.name}",
        params=config.model_dump(mode="json"), tags=tags,
    ) as run:
        inputs, class_names = _inputs_of(config, spec, work_dir, run_dir, tracking_uri)
        protocol, amx = _amx_decided(protocol, spec, inputs)
        measured = benchmark_serialized(spec, inputs, protocol)
        if not measured.is_completed():
            raise UnusableModelError(
                f"model {config.model} cannot be measured: {error_of(measured)}")
        result = measured.result()
        packaged = (package_models([result], inputs, class_names, config.input_scale,
                                   run_dir / "mlflow_model", protocol.threads)
                    if class_names else {})
        tracking.log_variants(run, [result], {}, tags, packaged)
        summary = benchmark_summary(
            config_name=config.name, model=config.model, tracking_uri=tracking_uri,
            experiment_id=run.experiment_id, run_id=run.run_id, flow_run_id=str(flow_run.id),
            environment=environment(protocol.threads, result.tf_intra_op_threads,
                                    protocol.cpus, protocol.amx),
            result=result, budget=inputs.budget(protocol.accuracy_budget_points),
            extras={"mlflow_run_url": run.url, "champion": result.name,
                    "amx_decision": amx.model_dump(mode="json"),
                    "champion_reason": "the only model benchmarked"})
        for path in write_report(summary, [result], run_dir / "report"):
            tracking.log_file(run, path, "report")
        publish_prefect_artifacts(summary)
    get_run_logger().info("%s: %s %s, p50 %.3f ms", result.name, result.metric,
                          "n/a (no labels or targets)" if result.accuracy is None
                          else f"{result.accuracy:.4f}", result.latency_ms.p50)
    return summary


def _amx_decided(protocol: MeasurementProtocol, spec: VariantSpec,
                 inputs: BenchmarkInputs) -> tuple[MeasurementProtocol, AmxDecision]:
    """`protocol` with ``amx`` decided on the model's own file (`tfopt.measurement.amx`)."""
    decision = decide_amx_setting(protocol, spec, inputs)
    return with_decided_amx(protocol, decision), decision


def _inputs_of(config: BenchmarkOnlyConfig, spec: VariantSpec, work_dir: Path, run_dir: Path,
               tracking_uri: str) -> tuple[BenchmarkInputs, list[str] | None]:
    """The benchmark's inputs, and the data's classes when they are a labelled test split.

    With a reference model, its outputs on the same inputs (`compute_reference_outputs`, or
    its logits on the test split) are what a fidelity metric scores against.
    """
    out_dir = run_dir / "inputs"
    reference = (None if config.reference is None else resolve_model(
        config.reference, "auto", "auto", tracking_uri, run_dir / "reference"))
    inputs = choose_benchmark_inputs(spec, config.inputs, config.shapes, config.examples,
                                     config.batch_size, config.data.source_dir, out_dir,
                                     config.eval, reference is not None)
    if inputs is not None:
        if reference is not None:
            inputs = compute_reference_outputs(reference, inputs, out_dir)
        return inputs, None
    check_judged(config.eval, labelled=True, referenced=reference is not None)
    dataset = sharded_data(config.data, work_dir)
    inputs = prepare_benchmark_inputs(reference, dataset, out_dir, config.batch_size,
                                      config.input_scale)
    return inputs.model_copy(update={"judged_by": config.eval}), dataset.class_names


def _benchmark_for_pipeline_run(config: BenchmarkOnlyConfig, pipeline_run: str,
                                tracking_uri: str, run_dir: Path) -> dict[str, Any]:
    """Measure a pipeline's variant here, on its inputs with its protocol, as its child run.

    The protocol is the pipeline's with this machine's settings on top (`machine_protocol`);
    the child run is tagged with the machine (host and work pool) and its environment header.
    """
    local_inputs = tracking.download_run_artifacts(tracking_uri, pipeline_run, INPUTS_ARTIFACT,
                                                   run_dir)
    inputs, pipeline_protocol = read_inputs_index(local_inputs)
    protocol = machine_protocol(pipeline_protocol, config.machine)
    spec = resolve_model(config.model, config.format, config.precision, tracking_uri,
                         run_dir / "model")
    protocol, amx = _amx_decided(protocol, spec, inputs)
    measured = benchmark_serialized(spec, inputs, protocol)
    if not measured.is_completed():
        raise UnusableModelError(f"model {config.model} cannot be measured: {error_of(measured)}")
    result = measured.result()
    machine = machine_label(_work_pool_of_this_flow_run())
    env = environment(protocol.threads, result.tf_intra_op_threads, protocol.cpus,
                      protocol.amx)
    client = tracking.client(tracking_uri)
    parent = tracking.with_retries(lambda: client.get_run(pipeline_run))
    run_id = tracking.log_variant_run(
        client, parent.info.experiment_id, pipeline_run, result,
        tags={"prefect.flow_run_id": str(flow_run.id), "tfopt.role": MACHINE_RUN_ROLE,
              "tfopt.machine": machine, **{f"env.{k}": str(v) for k, v in env.items()}},
        log_model_files=False, run_name=f"{spec.name} @ {machine}")
    get_run_logger().info("%s on %s: p50 %.3f ms (%s threads)", spec.name, machine,
                          result.latency_ms.p50, protocol.threads)
    return benchmark_summary(
        config_name=config.name, model=config.model, tracking_uri=tracking_uri,
        experiment_id=parent.info.experiment_id, run_id=run_id, flow_run_id=str(flow_run.id),
        environment=env, result=result,
        budget=inputs.budget(protocol.accuracy_budget_points),
        extras={"machine": machine, "pipeline_run": pipeline_run,
                "amx_decision": amx.model_dump(mode="json")})


def _work_pool_of_this_flow_run() -> str | None:
    """The work pool this flow run was sent to (None: started here, not by a worker)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run.id).work_pool_name
