"""The shape the code keeps: layers that are layers, tasks that are tasks, flows that only wire."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOW_FUNCTION_LINES = 60
LAYERS = ("tfopt", "techniques", "compress", "tasks", "flows", "deployments", "cli")
"""Bottom to top: a package imports only from its own layer and the ones below it."""
PACKAGES = (*LAYERS, "tests", "benchmarks")


def _python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _functions(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """Every absolute import of a file, at any depth: (line, module, names imported from it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
    return found


def _imported_modules(path: Path) -> set[str]:
    return {module for _, module, _ in _imports(path)}


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@pytest.mark.parametrize("layer", LAYERS)
def test_no_package_imports_a_layer_above_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1:])
    crossing = [f"{path.relative_to(ROOT)}:{line}: {module}"
                for path in _python_files(layer)
                for line, module, _ in _imports(path) if module.split(".")[0] in above]
    assert crossing == [], f"{layer}/ imports from a layer above it"


def test_the_command_line_starts_flows_not_steps():
    imported = {m.split(".")[0] for path in _python_files("cli") for m in _imported_modules(path)}
    assert {"flows", "deployments"} <= imported
    assert not imported & {"tasks", "techniques"}, "the CLI starts flows, not steps"


def test_the_command_line_only_parses_and_calls():
    long = {f.name: f.end_lineno - f.lineno + 1 for path in _python_files("cli")
            for f in _functions(path) if f.end_lineno - f.lineno + 1 > FLOW_FUNCTION_LINES
            and f.name != "build_parser"}
    assert not long, f"command functions over {FLOW_FUNCTION_LINES} lines: {long}"


def _defines_a_prefect_task(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Name) and target.id == "task":
                    return True
    return False


@pytest.mark.parametrize("path", [p for p in _python_files("tasks") if p.name != "__init__.py"],
                         ids=lambda p: p.name)
def test_every_task_module_defines_a_prefect_task_and_stays_thin(path):
    assert _defines_a_prefect_task(path), f"tasks/{path.name} defines no Prefect task"
    helpers = [f.name for f in _functions(path) if not any(
        isinstance(d, ast.Call | ast.Name) and getattr(getattr(d, "func", d), "id", "") == "task"
        for d in f.decorator_list)]
    assert helpers == [], f"tasks/{path.name} holds logic beside its task: {helpers}"


@pytest.mark.parametrize("path", _python_files("flows"), ids=lambda p: p.name)
def test_flow_functions_are_short_and_hold_no_tensorflow(path):
    long = {f.name: f.end_lineno - f.lineno + 1 for f in _functions(path)
            if f.end_lineno - f.lineno + 1 > FLOW_FUNCTION_LINES}
    assert not long, f"{path.name}: functions over {FLOW_FUNCTION_LINES} lines: {long}"
    heavy = {m for m in _imported_modules(path)
             if m.split(".")[0] in ("tensorflow", "tf_keras", "numpy", "onnxruntime")}
    assert not heavy, f"flows/{path.name} imports {heavy}: flows only wire"


def test_the_measurements_flow_asks_the_schedule_and_prices_nothing():
    """flows/measurements.py measures and asks `MeasurementLedger`: no price, cost or share."""
    imported = _imports(ROOT / "flows" / "measurements.py")
    schedule = {name for _, module, names in imported if module.startswith("tfopt.schedule")
                for name in names}
    assert schedule <= {"MeasurementLedger", "Budget", "Cuts", "CUT_BY_BUDGET"}, schedule
    seconds = [name for _, _, names in imported for name in names if name.endswith("_s")]
    assert seconds == [], "a price imported into the wiring"


def test_no_step_imports_the_training_task():
    importers = [path.relative_to(ROOT) for folder in ("tasks", "techniques")
                 for path in _python_files(folder)
                 if "tasks.train_model" in _imported_modules(path)]
    assert importers == []


def test_flows_log_to_mlflow_only_through_the_typed_functions():
    for path in _python_files("flows"):
        imported = _imported_modules(path)
        assert not {m for m in imported if m.split(".")[0] == "mlflow"}, path.name
        source = path.read_text()
        for raw in ("log_metrics(", "log_params(", "start_run(", "end_run("):
            assert f"tracking.{raw}" not in source, f"{path.name} calls tracking.{raw}"


def test_every_import_of_the_projects_own_code_names_a_module_that_exists():
    # An editable install falls back to another checkout's files for a module missing here,
    # so a moved module's old name can go on importing there: check the names themselves.
    missing = [f"{path.relative_to(ROOT)}:{line}: {module}"
               for folder in PACKAGES for path in _python_files(folder)
               for line, module, names in _imports(path)
               if module.split(".")[0] in PACKAGES and _module_file(module) is None]
    assert missing == []


_FILE_REFERENCE = re.compile(r"\b(?:[A-Z][A-Z_]+\.md|(?:[a-z_]+/)+[a-z_]+\.(?:py|yaml|md))\b")


def test_docstrings_and_messages_name_files_that_exist():
    missing = {}
    for folder in LAYERS:
        for path in _python_files(folder):
            named = set(_FILE_REFERENCE.findall(path.read_text()))
            gone = sorted(name for name in named if not (ROOT / name).exists()
                          and not (ROOT / folder / name).exists())
            if gone:
                missing[str(path.relative_to(ROOT))] = gone
    assert not missing, missing


_RUN_LOG = re.compile(r"\bsession \d+|\b(?:demo|run|ci) \d+\b|\bci\d+\b|\bstop \d+\b",
                      re.IGNORECASE)
"""How a run log names what it saw (session 22, demo 55, run 36, ci31): docs/measurements.md's."""


def test_the_code_says_what_and_why_not_which_session_or_run_found_it():
    told = {str(path.relative_to(ROOT)): found for folder in LAYERS
            for path in _python_files(folder) if (found := _RUN_LOG.findall(path.read_text()))}
    assert not told, f"anecdotes belong in docs/measurements.md: {told}"


def _core_module_of(module: str, names: list[str]) -> list[str]:
    """The core modules an import names: ``from tfopt.a import b`` is tfopt/a/b.py if it exists."""
    found = [f"{module}.{name}" for name in names if _module_file(f"{module}.{name}")]
    return found or ([module] if _module_file(module) else [])


def _core_imports() -> dict[str, set[str]]:
    """Each module of tfopt/ and the tfopt modules it imports (at any depth of the file)."""
    graph: dict[str, set[str]] = {}
    for path in _python_files("tfopt"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = {target for _, imported, names in _imports(path)
                         if imported.split(".")[0] == "tfopt" and imported != "tfopt"
                         for target in _core_module_of(imported, names) if target != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle_in_the_core():
    assert _circles(_core_imports()) == []


def test_the_bottom_floor_imports_nothing_above_it():
    graph = _core_imports()
    # The config names its metrics: it checks them with the metrics module, which imports only
    # the user-code loader (for a user's function), which imports nothing.
    assert graph["tfopt.config"] <= {"tfopt.eval.metrics"}
    assert graph["tfopt.eval.metrics"] <= {"tfopt.user_code"}
    assert graph["tfopt.user_code"] == set()
    assert graph["tfopt.artifacts"] <= {"tfopt.config"}
