from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from compress import all_failed, plan
from flows.parameters import PipelineConfig
from techniques import CompressConfig, registry
from techniques.base import NotApplicable, TechniqueSection, kernels
from techniques.cluster import ClusterConfig, cluster_model, clusterable_layers, unique_values
from techniques.distill import DistillConfig, distill_model, inherit_filters
from techniques.prune import PruneConfig, kernel_sparsity, prune_and_finetune, prune_model
from techniques.qat import QatConfig, quantize_aware_train
from tests.steps import build, to_tflite
from tfopt.fileio import gzip_size_bytes, sha256_file
from tfopt.models.keras_io import load_keras_model
from tfopt.models.zoo import build_model
from tfopt.runtimes import ConvertConfig
from tfopt.runtimes.litert import TFLiteRunner, int8_kernel_stats
from tfopt.runtimes.tensorflow import SavedModelRunner


def _pipeline(**compress: object) -> PipelineConfig:
    """The default pipeline configuration with these ``compress`` settings."""
    return PipelineConfig.model_validate({"compress": compress})


def test_every_technique_module_is_registered_with_its_config_section():
    import pkgutil

    import techniques

    modules = {info.name for info in pkgutil.iter_modules(techniques.__path__)}
    modules -= techniques.NOT_TECHNIQUES
    sections = {name for name, _ in CompressConfig().techniques()}
    assert sections == set(registry()) == modules
    for name, technique in registry().items():
        assert issubclass(technique.section, TechniqueSection)
        assert isinstance(getattr(CompressConfig(), name), technique.section)
        assert technique.apply.fn.__module__ == f"techniques.{name}"


def test_the_plan_names_each_variant_once_with_what_it_derives_from(tiny_baseline):
    compress = {"tflite": ["int8"], "distill": {"enabled": False}}
    plans = plan(_pipeline(**compress), tiny_baseline)
    assert [p.source for p in plans] == ["pruned-80", "qat"]
    variants = [spec for p in plans for spec in p.variants]
    assert [(v.name, v.source, v.format, v.precision, v.derived_from) for v in variants] == [
        ("pruned-80-graph", "pruned-80", "graph", "fp32", "baseline-graph"),
        ("pruned-80-tflite-int8", "pruned-80", "tflite", "int8", "baseline-tflite-int8"),
        ("qat-tflite-int8", "qat", "tflite", "int8", "baseline-tflite-int8"),
    ]
    sparse = next(v for p in plan(_pipeline(tflite=["fp32"]), tiny_baseline)
                  for v in p.variants if v.params.get("sparsity_encoding"))
    assert (sparse.name, sparse.precision, sparse.derived_from) == (
        "pruned-80-tflite-sparse", "fp32", "pruned-80-tflite-fp32")
    without_graphs = _pipeline(**compress, graph=False)
    assert [v.name for p in plan(without_graphs, tiny_baseline) for v in p.variants] == [
        "pruned-80-tflite-int8", "qat-tflite-int8"]
    two_of_four = _pipeline(prune={"structured_2_4": True})
    assert "pruned-2of4" in [p.source for p in plan(two_of_four, tiny_baseline)]
    failed = all_failed(plans, "compress_model failed: KilledWorker")
    assert [v.name for v in failed] == [v.name for v in variants]
    assert all(v.status == "failed" and "KilledWorker" in v.error for v in failed)


def test_a_rebuilt_models_automatic_epoch_cap_follows_how_long_the_baseline_trained(tmp_path):
    from techniques.base import REBUILT_EPOCHS
    from tfopt.artifacts import ModelArtifact

    def baseline(**params: int) -> ModelArtifact:
        return ModelArtifact(name="baseline", path=tmp_path, format="keras", image_size=32,
                             num_classes=10, params=params)

    def caps(config: PipelineConfig, model: ModelArtifact) -> dict[str, int]:
        return {p.technique.name: p.cfg.epochs for p in plan(config, model)
                if hasattr(p.cfg, "cool_down_epochs")}

    automatic = PipelineConfig.model_validate({"name": "auto"})
    assert automatic.compress.channel_prune.epochs == "auto"
    assert caps(automatic, baseline(epochs_run=27)) == {
        "channel_prune": 54, "depth_prune": 54, "width_depth": 54}
    assert set(caps(automatic, baseline(epochs_run=3)).values()) == {REBUILT_EPOCHS}
    assert set(caps(automatic, baseline(epochs_run=0)).values()) == {REBUILT_EPOCHS}
    assert set(caps(automatic, baseline()).values()) == {REBUILT_EPOCHS}
    chosen = _pipeline(channel_prune={"enabled": True, "epochs": 5})
    assert caps(chosen, baseline(epochs_run=27)) == {"channel_prune": 5}


def test_a_collaborative_technique_derives_from_the_model_it_continues_from(tiny_baseline):
    config = _pipeline(tflite=["int8"], distill={"enabled": False}, qat={"enabled": False},
                       pqat={"enabled": True}, cqat={"enabled": True})
    by_source = {p.source: p for p in plan(config, tiny_baseline)}
    (pqat,) = by_source["pqat"].variants
    assert (pqat.name, pqat.derived_from, pqat.status) == (
        "pqat-tflite-int8", "pruned-80-tflite-int8", "ok")
    (cqat,) = by_source["cqat"].variants
    assert cqat.status == "skipped" and "enable compress.cluster" in cqat.error
    assert cqat.derived_from == "clustered-16-tflite-int8"


def test_a_technique_whose_starting_model_is_missing_inherits_skipped_or_failed(tiny_baseline):
    from compress.outcomes import without_base
    from tfopt.variants import failed, skipped

    by_source = {p.source: p for p in plan(_pipeline(pqat={"enabled": True}), tiny_baseline)}
    pruned, pqat = by_source["pruned-80"].variants[0], by_source["pqat"]
    (left,) = without_base(pqat, skipped(pruned, "prune does not apply: Rescaling"))
    assert left.status == "skipped" and "which was skipped: prune does not apply" in left.error
    (broken,) = without_base(pqat, failed(pruned, "pruned-80 failed: OOM"))
    assert broken.status == "failed" and "pruned-80 failed: OOM" in broken.error


def test_a_technique_refuses_a_model_kind_it_cannot_take(tiny_baseline):
    tflite_model = tiny_baseline.model_copy(update={"format": "tflite"})
    plans = plan(_pipeline(), tflite_model)
    assert all(p.refusal and "not on a tflite model" in p.refusal for p in plans)
    assert all(v.status == "skipped" for p in plans for v in p.variants)


def test_pruning_reaches_the_target_sparsity_and_leaves_its_input(tiny_baseline, tiny_data,
                                                                  tmp_path):
    before = sha256_file(tiny_baseline.path)
    cfg = PruneConfig(target_sparsity=0.8, epochs=2)
    pruned = prune_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    assert pruned.name == "pruned-80" and pruned.path != tiny_baseline.path
    assert pruned.metrics["sparsity"] >= 0.78
    per_layer = kernel_sparsity(load_keras_model(pruned.path))
    assert per_layer and all(value >= 0.75 for value in per_layer.values()), per_layer
    assert kernel_sparsity(load_keras_model(tiny_baseline.path))["logits"] < 0.05
    assert pruned.params["learning_rate"] == cfg.learning_rate


def _xnnpack_sparse_model(path, classes: int):
    """A model laid out as XNNPACK's sparse inference (and tfmot's latency policy) requires."""
    from tfopt.models.keras_io import save_keras_model

    inputs = keras.Input((16, 16, 3), name="images")
    x = keras.layers.ZeroPadding2D(1)(inputs)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="valid", name="stem")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(32, 1, name="pointwise")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    x = keras.layers.Flatten()(x)
    save_keras_model(keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x)), path)
    return path


def test_the_xnnpack_latency_policy_prunes_only_1x1_convolutions_or_skips_with_tfmots_reason(
        tiny_baseline, tiny_data, tmp_path):
    cfg = PruneConfig(target_sparsity=0.8, epochs=2, policy="xnnpack_latency")
    with pytest.raises(NotApplicable, match=r"PruneForLatencyOnXNNPack refuses .*Conv2D 3x3"):
        prune_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    laid_out = tiny_baseline.model_copy(update={"path": _xnnpack_sparse_model(
        tmp_path / "xnnpack.keras", tiny_data.dataset.num_classes)})
    pruned = prune_model.fn(laid_out, cfg, tiny_data, tmp_path)
    assert pruned.name == "pruned-80-xnnpack" and pruned.params["policy"] == "xnnpack_latency"
    per_layer = kernel_sparsity(load_keras_model(pruned.path))
    assert per_layer["pointwise"] >= 0.78, per_layer
    assert per_layer["stem"] < 0.05 and per_layer["logits"] < 0.05, per_layer


def test_fine_tuning_reads_with_the_runs_input_settings(tiny_baseline, tiny_data, tmp_path):
    no_crops = tiny_data.model_copy(update={"input": tiny_data.input.model_copy(
        update={"random_crop_min_area": 1.0})})
    pruned = prune_model.fn(tiny_baseline, PruneConfig(epochs=1), no_crops, tmp_path)
    assert pruned.params["input.random_crop_min_area"] == 1.0
    assert pruned.params["input.cache"] == "decoded", "without crops decoded images are cached"
    cropped = prune_model.fn(tiny_baseline, PruneConfig(epochs=1), tiny_data, tmp_path)
    assert cropped.params["input.random_crop_min_area"] == 0.85
    assert cropped.params["input.cache"] == "encoded"


def test_sparse_encoding_shrinks_the_pruned_fp32_file_and_keeps_its_outputs(
        tiny_baseline, tiny_data, tiny_dataset, test_images, tmp_path):
    from tasks.export_savedmodel import export_savedmodel
    from tests.steps import build
    from tfopt.runtimes import plan_variant

    pruned = prune_model.fn(tiny_baseline, PruneConfig(epochs=2), tiny_data, tmp_path)
    savedmodel = export_savedmodel.fn(pruned, tmp_path)
    cfg = ConvertConfig(calibration_examples=10)
    dense = build(plan_variant("pruned-80", "tflite"), savedmodel, tiny_dataset, cfg, tmp_path)
    sparse = build(plan_variant("pruned-80", "tflite", form="tflite-sparse",
                                params={"sparsity_encoding": True}),
                   savedmodel, tiny_dataset, cfg, tmp_path)
    assert sparse.path.stat().st_size < 0.6 * dense.path.stat().st_size
    runner = TFLiteRunner(sparse.path)
    ops = {op["op_name"] for op in runner.interpreter._get_ops_details()}
    assert "DENSIFY" in ops, ops
    np.testing.assert_allclose(runner.predict(test_images),
                               TFLiteRunner(dense.path).predict(test_images), atol=1e-4)


def test_stripped_model_equals_the_pruned_model(tiny_baseline, tiny_data, test_images):
    import tensorflow_model_optimization as tfmot

    base = load_keras_model(tiny_baseline.path)
    base_weights = [w.copy() for w in base.get_weights()]
    pruned, _ = prune_and_finetune(base, PruneConfig(epochs=1), tiny_data)
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    np.testing.assert_allclose(stripped(test_images, training=False).numpy(),
                               pruned(test_images, training=False).numpy(), atol=1e-6)
    for before, after in zip(base_weights, base.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)


def test_clustering_leaves_at_most_its_clusters_per_layer_and_its_input_alone(
        tiny_baseline, tiny_data, tmp_path):
    before = sha256_file(tiny_baseline.path)
    base = load_keras_model(tiny_baseline.path)
    worth, too_small = clusterable_layers(base, 8)
    assert worth and not too_small
    cfg = ClusterConfig(enabled=True, clusters=8, epochs=1)
    clustered = cluster_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    assert clustered.name == "clustered-8" and clustered.params["unclustered_layers"] == "none"
    distinct = unique_values(load_keras_model(clustered.path))
    assert set(distinct) == set(worth) and all(n <= 8 for n in distinct.values()), distinct
    assert min(unique_values(base).values()) > 8, "the baseline's kernels were not clustered"
    assert clustered.metrics["unique_weights.logits"] == distinct["logits"]
    assert clustered.metrics["keras_gzip_bytes"] < gzip_size_bytes(tiny_baseline.path)
    assert 0.0 <= clustered.metrics["test_accuracy"] <= 1.0


def _int8_stats(model, data, out_dir):
    """What `compress_model` reads back from the model's int8 TFLite file."""
    return int8_kernel_stats(to_tflite(model, "int8", data.dataset, ConvertConfig(), out_dir).path)


def test_cluster_preserving_qat_keeps_the_clusters_in_the_int8_file(tiny_baseline, tiny_data,
                                                                    tmp_path):
    from techniques.cqat import CqatConfig, cluster_preserving_qat

    clustered = cluster_model.fn(tiny_baseline, ClusterConfig(enabled=True, clusters=8, epochs=1),
                                 tiny_data, tmp_path)
    cqat = cluster_preserving_qat.fn(clustered, CqatConfig(enabled=True, epochs=1), tiny_data,
                                     tmp_path)
    assert cqat.name == "cqat" and cqat.params["starts_from"] == "clustered-8"
    assert cqat.params["scheme"] == "Default8BitClusterPreserveQuantizeScheme"
    read_back = _int8_stats(cqat, tiny_data, tmp_path)
    per_channel = {k: v for k, v in read_back.items()
                   if k.startswith("int8_values_per_channel.")}
    assert len(per_channel) >= 4 and all(v <= 8 for v in per_channel.values()), per_channel


def test_pcqat_keeps_the_pruned_zeros_and_the_clusters_in_the_int8_file(tiny_baseline,
                                                                        tiny_data, tmp_path):
    from techniques.cqat import CqatConfig, cluster_preserving_qat

    compress = _pipeline(cluster={"enabled": True, "clusters": 8, "preserve_sparsity": True},
                         cqat={"enabled": True}, tflite=["int8"]).compress
    by_source = {p.source: p for p in plan(_pipeline(**compress.model_dump()), tiny_baseline)}
    assert by_source["pruned-clustered-8"].starts_from == "prune"
    assert by_source["pruned-clustered-8"].variants[0].derived_from == "pruned-80-tflite-int8"
    assert by_source["cqat"].variants[0].derived_from == "pruned-clustered-8-tflite-int8"
    pruned = prune_model.fn(tiny_baseline, PruneConfig(epochs=2), tiny_data, tmp_path)
    clustered = cluster_model.fn(pruned, compress.cluster.model_copy(update={"epochs": 1}),
                                 tiny_data, tmp_path)
    assert clustered.name == "pruned-clustered-8" and clustered.metrics["sparsity"] >= 0.75
    assert all(n <= 9 for n in unique_values(load_keras_model(clustered.path)).values())
    pcqat = cluster_preserving_qat.fn(clustered, CqatConfig(enabled=True, epochs=1), tiny_data,
                                      tmp_path)
    assert pcqat.params["scheme"].endswith("(preserve_sparsity=True)")
    metrics = _int8_stats(pcqat, tiny_data, tmp_path)
    sparsity = [v for k, v in metrics.items() if k.startswith("int8_sparsity.")]
    values = [v for k, v in metrics.items() if k.startswith("int8_values_per_channel.")]
    assert sparsity and min(sparsity) >= 0.7, metrics
    assert values and max(values) <= 9, metrics


def test_a_cluster_count_above_a_layers_weights_leaves_it_or_refuses_naming_them(
        tiny_baseline):
    base = load_keras_model(tiny_baseline.path)
    sizes = sorted(values.size for _, values in kernels(base))
    worth, too_small = clusterable_layers(base, sizes[0])
    assert too_small and len(worth) + len(too_small) == len(sizes)
    with pytest.raises(NotApplicable, match=f"no layer .* more than {sizes[-1]} weights"):
        clusterable_layers(base, sizes[-1])


def test_structured_2_4_sparsity_is_what_it_logs(tiny_baseline, tiny_data, tmp_path):
    cfg = PruneConfig(structured_2_4=True, epochs=1)
    pruned = prune_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    assert pruned.name == "pruned-2of4"
    assert pruned.params["target_sparsity"] == 0.5 and pruned.params["pattern"] == "2:4"
    model = load_keras_model(pruned.path)
    kernel = model.get_layer("logits").kernel.numpy()
    groups = kernel.T.reshape(-1, 4)
    assert np.all(np.sum(groups == 0.0, axis=1) >= 2)


def test_qat_converts_to_int8_that_agrees_with_the_float_qat_model(
    tiny_baseline, tiny_data, tiny_dataset, test_images, tmp_path
):
    before = sha256_file(tiny_baseline.path)
    qat = quantize_aware_train.fn(tiny_baseline, QatConfig(epochs=1), tiny_data, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    int8 = to_tflite(qat, "int8", tiny_dataset, ConvertConfig(calibration_examples=20),
                     tmp_path / "variants")
    assert int8.name == "qat-tflite-int8"
    float_top1 = np.argmax(SavedModelRunner(qat.path).predict(test_images), 1)
    int8_top1 = np.argmax(TFLiteRunner(int8.path).predict(test_images), 1)
    assert np.mean(float_top1 == int8_top1) >= 0.85


def test_the_distilled_student_leaves_its_controls_their_time_before_the_deadline(tiny_data):
    # configs/bench.yaml: the student stopped at the compression deadline, then its two controls
    # trained its 3 epochs each and the phase ended 2 minutes late.
    import time

    from techniques.distill import Students, student_share

    assert student_share(tiny_data, None).deadline is None  # type: ignore[arg-type]
    deadline = time.time() + 90.0
    timed = tiny_data.model_copy(update={"deadline": deadline})
    both = Students(student=None, inherited=[], architecture="thinner", scratch=lambda: None,
                    same_start=lambda: None)  # type: ignore[arg-type]
    assert student_share(timed, both).deadline == pytest.approx(time.time() + 30.0, abs=1.0)
    one = Students(student=None, inherited=[], architecture="small", scratch=lambda: None,
                   same_start=None)  # type: ignore[arg-type]
    assert student_share(timed, one).deadline == pytest.approx(time.time() + 45.0, abs=1.0)


def test_distillation_loss_decreases_and_the_control_is_reported(tiny_baseline, tiny_data,
                                                                 tmp_path):
    before = sha256_file(tiny_baseline.path)
    cfg = DistillConfig(epochs=4, student_width=4, learning_rate=3e-3)
    student = distill_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    curve = student.history["distillation_loss"]
    assert len(curve) == 4 and curve[-1] < curve[0]
    assert {"test_accuracy", "scratch_test_accuracy", "distillation_gain_points"} <= set(
        student.metrics
    )
    assert student.params["student_parameters"] < student.params["teacher_parameters"]
    assert student.params["learning_rate"] == 3e-3
    assert student.params["learning_rate_schedule"] == "cosine"
    assert student.params["inherited_layers"] == "block0_conv,block1_conv,block2_conv"


def test_the_student_starts_from_the_teachers_most_important_filters(tiny_baseline,
                                                                    test_images):
    teacher = load_keras_model(tiny_baseline.path)
    size, classes = teacher.input_shape[1], teacher.output_shape[-1]
    student = build_model("small_student", size, classes, width=4)
    assert inherit_filters(student, teacher) == ["block0_conv", "block1_conv", "block2_conv"]
    gamma = teacher.get_layer("block0_bn").get_weights()[0]
    kernel = teacher.get_layer("block0_conv").get_weights()[0]
    kept = np.sort(np.argsort(-np.abs(gamma) * np.abs(kernel).sum(axis=(0, 1, 2)))[:4])

    def first_block(model: keras.Model) -> np.ndarray:
        return keras.Model(model.input, model.get_layer("block0_relu").output)(
            test_images[:8], training=False).numpy()

    np.testing.assert_allclose(first_block(student), first_block(teacher)[..., kept],
                               rtol=1e-5, atol=1e-5)
    taught = teacher.get_layer("block1_conv").get_weights()[0][:, :, kept, :]
    for column in np.moveaxis(student.get_layer("block1_conv").get_weights()[0], -1, 0):
        assert any(np.array_equal(column, candidate)
                   for candidate in np.moveaxis(taught, -1, 0)), "a filter the teacher has"


def test_a_teacher_that_shares_no_convolution_leaves_the_student_random(tiny_baseline):
    teacher = load_keras_model(tiny_baseline.path)
    size, classes = teacher.input_shape[1], teacher.output_shape[-1]
    for other in (build_model("small_cnn", size, classes, width=2),
                  keras.Sequential([keras.Input((size, size, 3)),
                                    keras.layers.Conv2D(16, 3, use_bias=False, name="stem"),
                                    keras.layers.GlobalAveragePooling2D(),
                                    keras.layers.Dense(classes)])):
        student = build_model("small_student", size, classes, width=4)
        before = [weight.copy() for weight in student.get_weights()]
        assert inherit_filters(student, other) == []
        assert all(np.array_equal(a, b) for a, b in zip(before, student.get_weights(),
                                                         strict=True))


def test_both_students_learning_rate_decays_to_zero_over_their_epochs(tiny_data):
    from techniques.distill import students_learning_rate

    cfg = DistillConfig(epochs=3, learning_rate=2e-3)
    steps = 3 * -(-tiny_data.dataset.splits["train"].examples // tiny_data.batch_size)
    rate = students_learning_rate(cfg, tiny_data)
    assert float(rate(0)) == pytest.approx(2e-3)
    assert float(rate(steps / 2)) == pytest.approx(1e-3, rel=1e-3)
    assert float(rate(steps)) == pytest.approx(0.0, abs=1e-9)
    constant = cfg.model_copy(update={"learning_rate_schedule": "constant"})
    assert students_learning_rate(constant, tiny_data) == 2e-3


NEW_TECHNIQUE = '''
"""A technique that changes nothing: docs/techniques.md's walk-through, as a test writes it."""

import shutil
from pathlib import Path

from prefect import task
from pydantic import Field

from techniques.base import KERAS_ONLY, Technique, TechniqueSection
from tfopt.artifacts import ModelArtifact, TrainingData


class NoopConfig(TechniqueSection):
    """Settings of the no-op technique."""

    label: str = Field("same", description="Names the model it makes.")


@task(name="copy_model")
def copy_model(model: ModelArtifact, cfg: NoopConfig, data: TrainingData,
               out_dir: Path) -> ModelArtifact:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{cfg.label}.keras"
    shutil.copy(model.path, path)
    return model.model_copy(update={"name": cfg.label, "path": path})


TECHNIQUE = Technique(name="noop", section=NoopConfig, accepts=KERAS_ONLY,
                      source_name=lambda cfg: cfg.label, apply=copy_model,
                      precisions=("int8",))
'''


def test_a_new_technique_is_one_module_and_one_config_section(tiny_baseline, tiny_data,
                                                              tmp_path, monkeypatch):
    import techniques

    (tmp_path / "noop.py").write_text(NEW_TECHNIQUE)
    monkeypatch.setattr(techniques, "__path__", [*techniques.__path__, str(tmp_path)])
    registry.cache_clear()
    try:
        technique = registry()["noop"]
        compress = techniques.compress_config_class().model_validate(
            {"noop": {"label": "copied"}, "tflite": ["fp32"]})
        assert compress.noop.label == "copied", "compress.noop is a config section now"
        planned = {p.source: p for p in plan(PipelineConfig.model_construct(compress=compress),
                                              tiny_baseline)}
        assert [v.name for v in planned["copied"].variants] == ["copied-tflite-int8"], \
            "its own precisions on every form asked of compressed models (no fp32 graph)"
        made = technique.apply.fn(tiny_baseline, planned["copied"].cfg, tiny_data, tmp_path)
        assert made.name == "copied" and made.path.exists()
    finally:
        registry.cache_clear()


def _rescaling_model(path):
    """A model whose Rescaling layer tfmot's 8-bit scheme has no rule for."""
    from tfopt.models.keras_io import save_keras_model

    inputs = keras.Input((16, 16, 3), name="images")
    x = keras.layers.Rescaling(2.0, offset=-1.0)(inputs)
    x = keras.layers.Conv2D(8, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    save_keras_model(keras.Model(inputs, keras.layers.Dense(3, name="logits")(x)), path)
    return path


def test_a_technique_that_cannot_wrap_the_model_skips_with_tfmots_reason(
    live_services, tiny_baseline, tiny_data, tmp_path
):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.compress_model import compress_model
    from flows.parameters import PipelineConfig

    baseline = tiny_baseline.model_copy(
        update={"path": _rescaling_model(tmp_path / "rescaling.keras")})
    config = PipelineConfig.model_validate({
        "name": "not-applicable",
        "compress": {"prune": {"epochs": 1}, "distill": {"enabled": False},
                     "qat": {"epochs": 1, "unsupported_layers": "skip"},
                     "pqat": {"enabled": True, "epochs": 1, "unsupported_layers": "skip"},
                     "tflite": ["fp32"]},
    })
    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        compressed = compress_model(config, baseline, tiny_data, tmp_path)
    variants = compressed.variants
    by_name = {v.name: v for v in variants}
    assert by_name["qat-tflite-int8"].status == "skipped"
    assert "qat does not apply" in by_name["qat-tflite-int8"].error
    assert "Rescaling" in by_name["qat-tflite-int8"].error
    assert by_name["pruned-80-graph"].status == "ok", "pruning leaves the Rescaling layer be"
    pqat = by_name["pqat-tflite-int8"]
    assert pqat.status == "skipped" and "pqat does not apply" in pqat.error, pqat
    (pruned,) = compressed.models
    assert pruned.metrics["sparsity"] > 0.5


def test_a_subclassed_model_is_not_applicable_to_pruning_or_qat():
    from techniques.base import NotApplicable
    from techniques.prune import wrap_prunable_layers
    from techniques.qat import make_quantization_aware

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="subclassed")
            self.dense = keras.layers.Dense(3)

        def call(self, inputs):
            return self.dense(keras.layers.Flatten()(inputs))

    model = Subclassed()
    model(np.zeros((1, 4, 4, 3), np.float32))
    with pytest.raises(NotApplicable, match="subclassed model"):
        wrap_prunable_layers(model, {})
    with pytest.raises(NotApplicable, match="subclassed model"):
        make_quantization_aware(model, unsupported_layers="float")


def test_the_technique_thins_the_baseline_and_fine_tunes_it(tiny_baseline, tiny_data, tmp_path):
    from tasks.export_savedmodel import export_savedmodel
    from techniques.channel_prune import ChannelPruneConfig, channel_prune_model

    cfg = ChannelPruneConfig(enabled=True, fraction=0.5, min_channels=2, epochs=2)
    made = channel_prune_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    assert made.name == "channels-50" and made.path.exists()
    assert made.metrics["flops_ratio"] < 0.5
    assert made.metrics["params_after"] < made.metrics["params_before"]
    assert 0.0 <= made.metrics["test_accuracy"] <= 1.0
    assert made.params["technique"] == "channel pruning" and "kept_filters" in made.params

    config = PipelineConfig.model_validate({
        "compress": {"tflite": ["int8"]}, "convert": {"onnx_compressed": ["int8"]},
        "runtimes": {"openvino": {"compressed": ["int8"]}}})
    forms = {spec.name: spec for spec in registry()["channel_prune"].variants(cfg, config,
                                                                              "baseline")}
    assert {"channels-50-graph", "channels-50-tflite-int8", "channels-50-onnx",
            "channels-50-onnx-int8", "channels-50-openvino-int8"} <= set(forms), sorted(forms)
    assert forms["channels-50-onnx"].derived_from == "baseline-onnx", "judged against it"
    savedmodel = export_savedmodel.fn(made, tmp_path)
    onnx = build(forms["channels-50-onnx"], savedmodel, tiny_data.dataset, config.convert,
                 tmp_path / "v")
    int8 = build(forms["channels-50-onnx-int8"], savedmodel, tiny_data.dataset, config.convert,
                 tmp_path / "v", built={onnx.name: onnx})
    assert onnx.status == int8.status == "ok", (onnx.error, int8.error)
    assert onnx.params["check_max_abs_diff"] <= config.convert.onnx_atol
    import onnx as onnx_lib

    ops = {node.op_type for node in onnx_lib.load(str(int8.path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops, ops


def test_a_rebuilt_model_learns_from_the_model_before_it_when_asked(tiny_baseline, tiny_data,
                                                                     tmp_path):
    from techniques.channel_prune import ChannelPruneConfig, channel_prune_model
    from techniques.depth_prune import DepthPruneConfig
    from tfopt.models.keras_io import load_keras_model

    assert DepthPruneConfig().teacher_alpha == ChannelPruneConfig().teacher_alpha
    taught = {}
    for alpha in (1.0, 0.5):
        cfg = ChannelPruneConfig(enabled=True, fraction=0.5, min_channels=2, epochs=2,
                                 teacher_alpha=alpha)
        taught[alpha] = channel_prune_model.fn(tiny_baseline, cfg, tiny_data, tmp_path / str(alpha))
    assert "distillation_loss" not in taught[1.0].history, "labels alone"
    made = taught[0.5]
    assert made.params["teacher_alpha"] == 0.5
    assert len(made.history["distillation_loss"]) == made.params["epochs_run"] >= 1
    assert len(made.history["val_accuracy"]) == made.params["epochs_run"], "judged on labels"
    saved = load_keras_model(made.path)
    assert saved.count_params() == made.metrics["params_after"], "the student, not its teacher"
    assert 0.0 <= made.metrics["test_accuracy"] <= 1.0


def test_a_thinner_teacher_is_the_student_with_two_controls(tiny_baseline, tiny_data, tmp_path):
    cfg = DistillConfig(student="thinner", thinner=0.5, epochs=2)
    student = distill_model.fn(tiny_baseline, cfg, tiny_data, tmp_path)
    assert student.name == "distilled-thinner-50"
    assert student.params["student_parameters"] < student.params["teacher_parameters"]
    assert student.params["inherited_layers"] != "none", "it starts from the teacher's filters"
    assert {"scratch_test_accuracy", "same_start_test_accuracy",
            "teacher_outputs_gain_points", "distillation_gain_points"} <= set(student.metrics)


def test_a_model_the_budget_stopped_far_from_back_is_not_worth_building(tiny_baseline, tiny_data):
    from compress import cut_short

    to_keep = tiny_data.model_copy(update={"recover_to": 0.95})
    budget_stop = "budget"

    def fine_tuned(stopped_by: str, curve: list[float], kept: int | str = "last"):
        return tiny_baseline.model_copy(update={
            "name": "distilled-thinner-50", "history": {"val_accuracy": curve},
            "params": {"stopped_by": stopped_by, "epochs_run": len(curve), "kept_epoch": kept}})

    why = cut_short(fine_tuned(budget_stop, [0.52, 0.73]), to_keep, 0.01)
    assert why is not None and "stopped by the time budget after 2 epochs" in why
    assert "0.7300" in why and "0.9500" in why
    assert cut_short(fine_tuned(budget_stop, [0.73, 0.945]), to_keep, 0.01) is None, "near"
    assert cut_short(fine_tuned("cap", [0.52, 0.73]), to_keep,
                     0.01) is None, "its own recipe stopped it: judged like any other"
    assert cut_short(fine_tuned(budget_stop, [0.73]), tiny_data, 0.01) is None, "no target"
    ramp_cut = cut_short(fine_tuned(budget_stop, [0.99, 0.97, 0.56]), to_keep, 0.01)
    assert ramp_cut is not None and "0.5600" in ramp_cut, (
        "a pruning ramp cut short keeps its last epoch, not its curve's best")
    assert cut_short(fine_tuned(budget_stop, [0.6, 0.97, 0.56], kept=2), to_keep, 0.01) is None



def test_a_fine_tuning_that_collapses_is_tried_again_gentler_then_fails_with_both_reasons(
        tiny_baseline, tmp_path):
    from compress import CollapsedError, apply_here
    from tasks.write_tfrecords import write_tfrecords
    from techniques.qat import QatConfig
    from tests.steps import training_data
    from tfopt.config import DataConfig
    from tfopt.demo_data import digit_to_jpeg

    # Every image the same gray square: any model answers one class for all of them, so its
    # validation accuracy is that class's share (about chance) whatever its rate, on any CPU.
    blank = digit_to_jpeg(np.full((8, 8), 8.0), 16)
    for label in range(3):
        (tmp_path / "blank" / str(label)).mkdir(parents=True)
        for index in range(40):
            (tmp_path / "blank" / str(label) / f"{index:03d}.jpg").write_bytes(blank)
    dataset = write_tfrecords.fn(DataConfig(source_dir=tmp_path / "blank", image_size=16,
                                            val_fraction=0.3, test_fraction=0.2,
                                            shard_size_mb=0.004), tmp_path / "work")
    to_keep = training_data(dataset).model_copy(update={"recover_to": 0.95})
    with pytest.raises(CollapsedError) as failure:
        apply_here("qat", tiny_baseline, QatConfig(enabled=True, epochs=1,
                                                   learning_rate=1e-3), to_keep, tmp_path)
    message = str(failure.value)
    assert "at learning rate 0.001" in message and "at 0.0001" in message, "tried twice"
    assert message.count("chance is 0.3333") == 2


def test_a_cosine_distilled_student_runs_its_whole_schedule_once_back(tiny_baseline, tiny_data):
    """Back within the budget at once, a cosine-rate student still trains to its cap.

    A rate too small to change anything: the held-out accuracy never gains, so the settle rule
    ends a constant-rate student 3 epochs after it is back; the cosine one runs its schedule.
    """
    from techniques.distill import distill, teacher_and_students

    back_at_once = tiny_data.model_copy(update={"recover_to": 0.0})
    ran = {}
    for schedule in ("cosine", "constant"):
        cfg = DistillConfig(epochs=6, student_width=4, learning_rate=1e-9,
                            learning_rate_schedule=schedule)
        teacher, _, students = teacher_and_students(tiny_baseline, cfg, back_at_once)
        fitted = distill(teacher, students.student, cfg, back_at_once)
        assert fitted.stop["recovered"], fitted.stop
        ran[schedule] = fitted.stop["epochs_run"]
    assert ran == {"cosine": 6, "constant": 4}, ran
