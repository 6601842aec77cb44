"""Every variant as an MLflow Model: loads with pyfunc, answers like its runner, benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from flows.parameters import PipelineConfig
from tasks.build_variant import build_variant
from tfopt.artifacts import VariantSpec
from tfopt.data.pipeline import load_split_arrays
from tfopt.models.references import detect_format
from tfopt.models.sources import labels_of
from tfopt.packaging import model_file_of, save_variant_model
from tfopt.runtimes import known_formats, load_runner, plan_forms, runtime_of, settings_of
from tfopt.runtimes.base import BuildSources, PlanRequest, ServingContract
from tfopt.serving import LABELS_FILE, read_labels


@pytest.fixture(scope="module")
def images(tiny_dataset) -> np.ndarray:
    return load_split_arrays(tiny_dataset.splits["test"].files, tiny_dataset.image_size)[0][:8]


@pytest.fixture(scope="module")
def contract(tiny_dataset, images) -> ServingContract:
    return ServingContract(tiny_dataset.class_names, "unit", images[:2])


@pytest.fixture(scope="module")
def variant_files(tiny_baseline, tiny_savedmodel, tiny_dataset, tmp_path_factory
                  ) -> dict[str, VariantSpec]:
    """One variant of every format a runtime measures, planned and built as a run does."""
    config = PipelineConfig.model_validate({"convert": {
        "calibration_examples": 16, "tflite": ["int8"], "xla": ["jit_compile"],
        "onnx_quantize": [], "bfloat16": False, "selective_int8": False}})
    sources = BuildSources(model=tiny_baseline, savedmodel=tiny_savedmodel,
                           dataset=tiny_dataset, out_dir=tmp_path_factory.mktemp("variants"),
                           calibration_examples=16)
    built: dict[str, VariantSpec] = {}
    for spec in plan_forms(PlanRequest(source="baseline", kind="keras"), config):
        if spec.status == "ok":
            built[spec.name] = build_variant.fn(
                spec, sources.model_copy(update={"built": built}),
                settings_of(runtime_of(spec.format), config))
    return {spec.format: spec for spec in reversed(built.values()) if spec.status == "ok"}


@pytest.mark.parametrize("model_format", sorted(known_formats()))
def test_a_packaged_variant_predicts_what_its_runner_predicts(
    model_format, variant_files, contract, images, tmp_path
):
    import mlflow.pyfunc

    spec = variant_files[model_format]
    assert labels_of(spec.path) == list(contract.class_names), "the step wrote labels.txt"
    folder = save_variant_model(spec.path, model_format, spec.precision, contract,
                                tmp_path / "model")
    predicted = mlflow.pyfunc.load_model(str(folder)).predict(images)
    if isinstance(predicted, dict):  # the ONNX flavor answers every output by name
        predicted = predicted["logits"]
    expected = load_runner(spec).predict(images)
    assert np.asarray(predicted).shape == expected.shape
    np.testing.assert_allclose(predicted, expected, atol=1e-4)

    assert read_labels(folder / LABELS_FILE) == list(contract.class_names)
    found_format, found_file = detect_format(folder)
    assert found_format in (model_format, "graph") and found_file.exists()
    again = spec.model_copy(update={"path": found_file})
    np.testing.assert_allclose(load_runner(again).predict(images), expected, atol=1e-4)


def test_a_keras_variant_loads_without_the_legacy_keras_switch(variant_files, contract,
                                                               images, tmp_path):
    folder = save_variant_model(variant_files["graph"].path, "graph", "fp32", contract,
                                tmp_path / "model")
    np.save(tmp_path / "images.npy", images)
    script = (
        "import sys, numpy as np, mlflow.pyfunc\n"
        f"model = mlflow.pyfunc.load_model({str(folder)!r})\n"
        f"print(model.predict(np.load({str(tmp_path / 'images.npy')!r})).shape)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"({len(images)}, {len(contract.class_names)})"


def test_only_tfopt_model_folders_name_a_model_file(tmp_path):
    assert model_file_of(tmp_path) is None
    with pytest.raises(ValueError, match="no model found"):
        detect_format(Path(tmp_path))


def test_variants_of_one_file_share_its_packaging_with_their_own_precision(
    variant_files, contract, images, tmp_path
):
    import logging

    import mlflow.pyfunc
    from mlflow.models import Model

    from tfopt.artifacts import VariantResult
    from tfopt.packaging import METADATA_KEY, package_variants

    path = variant_files["graph"].path
    variants = [VariantResult(name=name, source="baseline", format="graph", precision=precision,
                              status="ok", path=str(path))
                for name, precision in (("plain", "fp32"), ("rewritten", "bfloat16"))]
    folders = package_variants(variants, contract, tmp_path, logging.getLogger("test"))
    plain, rewritten = Model.load(str(folders["plain"])), Model.load(str(folders["rewritten"]))
    assert plain.metadata[METADATA_KEY]["precision"] == "fp32"
    assert rewritten.metadata[METADATA_KEY]["precision"] == "bfloat16"
    assert plain.model_uuid != rewritten.model_uuid
    np.testing.assert_allclose(mlflow.pyfunc.load_model(str(folders["rewritten"])).predict(images),
                               load_runner(variant_files["graph"]).predict(images), atol=1e-4)


def test_the_runoff_times_each_file_at_its_fastest_thread_count_marks_load_and_serves_with_it(
    variant_files, contract, images, tmp_path
):
    import logging

    from mlflow.models import Model

    from tfopt.artifacts import BenchmarkInputs, VariantResult
    from tfopt.config import MeasurementProtocol
    from tfopt.measurement.worker import measure_runoff
    from tfopt.packaging import package_variants

    np.save(tmp_path / "images.npy", images)
    inputs = BenchmarkInputs(images=tmp_path / "images.npy", labels=None, reference_logits=None,
                             examples=len(images))
    specs = [variant_files["tflite"], variant_files["onnx"]]
    protocol = MeasurementProtocol(threads=2, warmup_runs=5, warmup_seconds=0.0, min_runs=5,
                                   min_seconds=0.2)
    runoff = measure_runoff(specs, inputs, protocol, rounds=6, thread_counts=[1, 2])
    for spec in specs:
        tried = runoff.thread_pick_p50_ms[spec.name]
        assert sorted(tried) == [1, 2] and all(p50 > 0 for p50 in tried.values())
        assert runoff.threads[spec.name] in (1, 2)
        assert len(runoff.round_p50_ms[spec.name]) == 6, "its picked count's rounds"
        assert runoff.p50(spec.name) == pytest.approx(tried[runoff.threads[spec.name]]), (
            "its figures are its picked count's, from the same rounds")
    fixed = measure_runoff(specs, inputs, protocol, rounds=6)
    assert fixed.threads == {} and fixed.thread_pick_p50_ms == {}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = measure_runoff(specs, inputs, protocol, rounds=6)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert loaded.under_load and loaded.background_cores > protocol.max_background_cores, (
        "two busy processes beside it")

    tflite = specs[0]
    variants = [VariantResult(name=name, source="baseline", format="tflite", precision="int8",
                              status="ok", path=str(tflite.path)) for name in ("picked", "other")]
    folders = package_variants(variants, replace(contract, threads=2), tmp_path / "models",
                               logging.getLogger("test"), {"picked": 1})
    served = {name: Model.load(str(folder)).flavors["python_function"]["config"]["threads"]
              for name, folder in folders.items()}
    assert served == {"picked": 1, "other": 2}, "the pick, else the count it was measured at"
