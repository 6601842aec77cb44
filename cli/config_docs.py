"""docs/configuration.md, generated from the flows' pydantic parameter models.

The schema is the one source of every key: its type, default, bounds and description. `tfopt
docs` writes the file; a test fails when the file and the schema disagree.
"""

from __future__ import annotations

import json
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

CONFIGURATION_MD = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

_HEADER = """# Configuration reference

Generated from the pydantic schema by `tfopt docs` (do not edit by hand: a test compares this
file with the schema). Every key has a default; a YAML file passed to `tfopt run --config` sets
only what differs from it, `--set key=value` overrides one key, and the Prefect UI's run form
shows the same fields. A config with no `compress` section gets the automatic plan (see
[techniques.md](techniques.md)).

Sections: {sections}
"""


def _type_name(annotation: Any) -> str:
    """A reader's name for a type annotation: `int`, `fp32 | int8`, `list of str`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{value}`" for value in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if arg is type(None) else _type_name(arg) for arg in args)
    if origin in (list, tuple, set, frozenset):
        inner = [arg for arg in args if arg is not Ellipsis]
        return f"list of {_type_name(inner[0])}" if inner else "list"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{member.value}`" for member in annotation)
    if annotation is Path or (isinstance(annotation, type) and issubclass(annotation, Path)):
        return "path"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _bounds(field: FieldInfo) -> str:
    """The field's numeric or length bounds, e.g. ``>= 0, <= 100``."""
    parts = []
    for item in field.metadata:
        for kind, sign, attribute in ((Ge, ">=", "ge"), (Gt, ">", "gt"), (Le, "<=", "le"),
                                      (Lt, "<", "lt"), (MinLen, "min length", "min_length"),
                                      (MaxLen, "max length", "max_length")):
            if isinstance(item, kind):
                parts.append(f"{sign} {getattr(item, attribute)}")
    return ", ".join(parts)


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def _json(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, Enum):
        value = value.value
    elif isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value, default=str)}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _section_model(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, list[str]]]:
    """(key, description, table rows) for `model` and every section nested in it."""
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _section_model(field)
        if section is not None:
            nested.append((key, field.description or section.__doc__ or "", section))
            rows.append(f"| `{key}` | section | | {_cell(field.description)} (below) |")
            continue
        kind = _type_name(field.annotation)
        bounds = _bounds(field)
        rows.append(f"| `{key}` | {kind}{f' ({bounds})' if bounds else ''} | "
                    f"{_json(_default(field))} | {_cell(field.description)} |")
    found = [(prefix.rstrip(".") or "(top level)", _cell(model.__doc__), rows)]
    for key, description, section in nested:
        for title, doc, section_rows in _sections(section, f"{key}."):
            found.append((title, _cell(description) if title == key else doc, section_rows))
    return found


def render_configuration(model: type[BaseModel]) -> str:
    """The Markdown reference of `model` (the pipeline's parameters): a table per section."""
    sections = _sections(model)
    links = ", ".join(f"[`{title}`](#{title.replace('.', '').replace(' ', '-')})"
                      for title, _, _ in sections[1:])
    parts = [_HEADER.format(sections=links)]
    for title, description, rows in sections:
        parts.append(f"## {title}\n\n{description}\n\n| key | type | default | description |\n"
                     "|---|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def pipeline_configuration() -> str:
    """docs/configuration.md's text for `flows.parameters.PipelineConfig`."""
    from flows.parameters import PipelineConfig

    return render_configuration(PipelineConfig)


def write_configuration(path: Path = CONFIGURATION_MD) -> Path:
    """Write the reference of the pipeline's parameters to `path` (atomically)."""
    from tfopt.fileio import atomic_write_text

    atomic_write_text(path, pipeline_configuration())
    return path
