from __future__ import annotations

from pathlib import Path

import pytest

from flows.parameters import PipelineConfig, load_pipeline_config
from tfopt.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["demo", "smoke"])
def test_shipped_configs_validate(name):
    config = load_pipeline_config(ROOT / "configs" / f"{name}.yaml")
    assert config.name == name


def test_every_field_has_a_description_and_a_default():
    def walk(model_cls, prefix=""):
        for field_name, field in model_cls.model_fields.items():
            assert field.description, f"{prefix}{field_name} has no description"
            assert not field.is_required(), f"{prefix}{field_name} has no default"
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                walk(annotation, f"{prefix}{field_name}.")

    walk(PipelineConfig)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"train.epochs": -1}, "train.epochs"),
        ({"model.architecture": "resnet9000"}, "model.architecture"),
        ({"data.image_size": 4}, "data.image_size"),
        ({"benchmark.accuracy_budget_points": -2}, "benchmark.accuracy_budget_points"),
        ({"train.unknown_knob": 1}, "train.unknown_knob"),
        ({"data.test_fraction": 0.5, "data.val_fraction": 0.4}, "data"),
    ],
)
def test_bad_values_are_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(ROOT / "configs" / "smoke.yaml", override)
    assert field in str(caught.value)


def test_unreadable_or_non_mapping_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_pipeline_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_pipeline_config(tmp_path / "list.yaml")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"compress.prune_epochs": 2}, "compress.prune.epochs"),
        ({"compress.finetune_learning_rate": 1e-3}, "compress.qat.learning_rate"),
        ({"compress.distill_alpha": 0.3}, "compress.distill.alpha"),
        ({"compress.qat": False}, "compress.qat.enabled"),
    ],
)
def test_old_compress_keys_are_refused_naming_the_new_ones(old, new):
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(ROOT / "configs" / "smoke.yaml", old)
    assert new in str(caught.value), caught.value


def test_techniques_run_after_the_technique_they_continue_from():
    from techniques import registry

    order = [name for name, _ in PipelineConfig().compress.techniques()]
    assert order == list(registry())
    for name, technique in registry().items():
        settings = technique.section()
        for flipped in (settings, *(settings.model_copy(update={field: True})
                                    for field, info in type(settings).model_fields.items()
                                    if info.annotation in (bool, "bool"))):
            base = technique.base_of(flipped)
            assert base is None or order.index(base) < order.index(name), (name, base)


def test_each_technique_has_its_own_budget():
    compress = load_pipeline_config(ROOT / "configs" / "demo.yaml").compress
    assert compress.distill.learning_rate == 2e-3 and compress.prune.learning_rate == 5e-4
    assert compress.prune.epochs == 10 and compress.qat.epochs == 2


def test_parameters_without_a_file_validate_into_any_flow_schema():
    from flows.parameters import BenchmarkOnlyConfig

    config = load_config(None, {"model": "m.tflite", "benchmark.threads": 1},
                         BenchmarkOnlyConfig)
    assert config.model == "m.tflite" and config.benchmark.threads == 1
    with pytest.raises(ConfigError, match=r"benchmark\.threads"):
        load_config(None, {"benchmark.threads": 0}, BenchmarkOnlyConfig)


@pytest.mark.parametrize(
    ("model", "label"),
    [
        ({"architecture": "efficientnet_b0"}, "efficientnet_b0"),
        ({"source": "file", "path": "models/mini_xception.hdf5"}, "mini_xception"),
        ({"source": "file", "path": "exported/classifier"}, "classifier"),
        ({"source": "builder", "builder": "resnetish.py:build_resnet"}, "resnetish-build_resnet"),
        ({"source": "builder", "builder": "my_pkg.models:build"}, "models-build"),
    ],
)
def test_run_names_name_the_model_that_ran(model, label):
    config = PipelineConfig.model_validate({"name": "mine", "model": model})
    assert config.model.label == label


def test_the_configuration_reference_matches_the_schema():
    from cli.config_docs import CONFIGURATION_MD, pipeline_configuration

    assert CONFIGURATION_MD.read_text(encoding="utf-8") == pipeline_configuration(), (
        "docs/configuration.md is out of date: run `tfopt docs`")


def test_the_automatic_plan_fills_what_a_config_leaves_unset_key_by_key():
    # configs/bench.yaml has a convert section and no compress one: merged section by
    # section, the plan's ONNX forms of the compressed models were lost.
    bench = load_pipeline_config(Path("configs/bench.yaml"))
    assert bench.compress.channel_prune.fraction == "auto" and bench.compress.qat.enabled
    assert bench.convert.onnx_compressed == ["fp32", "int8"]
    assert bench.convert.tflite == ["fp32", "dynamic", "float16", "int8"], "the config's own"
    assert bench.runtimes.openvino.compressed == ["int8"]
    mine = PipelineConfig.model_validate({"name": "mine", "convert": {"onnx_compressed": []}})
    assert mine.convert.onnx_compressed == [], "a key the config sets is the config's"
    hand_set = PipelineConfig.model_validate({"name": "hand", "compress": {
        "qat": {"enabled": True}}, "convert": {"tflite": ["int8"]}})
    assert hand_set.convert.onnx_compressed == [] and not hand_set.compress.channel_prune.enabled


def test_amx_auto_or_denied_turns_the_float_stem_off_unless_set_and_denied_needs_isolation():
    for amx in ("denied", "auto"):
        chosen = {"benchmark": {"amx": amx}}
        assert PipelineConfig.model_validate(chosen).convert.selective_float_stem is False, amx
        assert PipelineConfig.model_validate(
            {**chosen, "convert": {"selective_float_stem": True}}).convert.selective_float_stem
    default = PipelineConfig.model_validate({})
    assert default.benchmark.amx == "auto" and default.convert.selective_float_stem is False
    assert PipelineConfig.model_validate(
        {"benchmark": {"amx": "allowed"}}).convert.selective_float_stem is True
    assert PipelineConfig.model_validate(
        {"benchmark": {"amx": "auto", "isolate": False}}).benchmark.amx == "auto"
    with pytest.raises(ValueError, match=r"benchmark.amx: denied needs benchmark.isolate=true"):
        PipelineConfig.model_validate({"benchmark": {"amx": "denied", "isolate": False}})
