from __future__ import annotations

from pathlib import Path

import pytest

from tfopt.config import ConfigError, PipelineConfig, load_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["demo", "smoke"])
def test_shipped_configs_validate(name):
    config = load_config(ROOT / "configs" / f"{name}.yaml")
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
        load_config(ROOT / "configs" / "smoke.yaml", override)
    assert field in str(caught.value)


def test_unreadable_or_non_mapping_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")
