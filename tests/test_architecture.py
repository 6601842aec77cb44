"""The shape the code keeps: flows only wire, tasks do not lean on the training task."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOW_FUNCTION_LINES = 60


def _functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


@pytest.mark.parametrize("path", sorted((ROOT / "flows").glob("*.py")), ids=lambda p: p.name)
def test_flow_functions_are_short(path):
    long = {f.name: f.end_lineno - f.lineno + 1 for f in _functions(path)
            if f.end_lineno - f.lineno + 1 > FLOW_FUNCTION_LINES}
    assert not long, f"{path.name}: functions over {FLOW_FUNCTION_LINES} lines: {long}"


def test_no_step_imports_the_training_task():
    importers = [path.relative_to(ROOT) for folder in ("tasks", "techniques")
                 for path in (ROOT / folder).glob("*.py")
                 if "tasks.train_model" in _imported_modules(path)]
    assert importers == []


def test_flows_log_to_mlflow_only_through_the_typed_functions():
    for path in (ROOT / "flows").glob("*.py"):
        imported = _imported_modules(path)
        assert not {m for m in imported if m.split(".")[0] == "mlflow"}, path.name
        source = path.read_text()
        for raw in ("log_metrics(", "log_params(", "start_run(", "end_run("):
            assert f"tracking.{raw}" not in source, f"{path.name} calls tracking.{raw}"


_FILE_REFERENCE = re.compile(r"\b(?:[A-Z][A-Z_]+\.md|(?:[a-z_]+/)+[a-z_]+\.(?:py|yaml|md))\b")


def test_docstrings_and_messages_name_files_that_exist():
    missing = {}
    for folder in ("tfopt", "tasks", "techniques", "flows", "deployments"):
        for path in (ROOT / folder).glob("*.py"):
            named = set(_FILE_REFERENCE.findall(path.read_text()))
            gone = sorted(name for name in named if not (ROOT / name).exists()
                          and not (ROOT / folder / name).exists())
            if gone:
                missing[str(path.relative_to(ROOT))] = gone
    assert not missing, missing
