"""Every package the shipped code imports comes from a dependency pyproject.toml declares."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib

from tests.test_architecture import LAYERS, ROOT, _imports, _python_files

SHIPPED = LAYERS
"""The packages pyproject.toml installs (its ``packages.find``: the layers); not tests or
benchmarks."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """The distributions pyproject.toml names, its optional ones too, canonical."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"],
                    *(r for extra in project.get("optional-dependencies", {}).values()
                      for r in extra)]
    return {_canonical(re.split(r"[\[<>=!~;\s]", r, maxsplit=1)[0]) for r in requirements}


def _imported() -> dict[str, set[str]]:
    """Each top-level module the shipped code imports (at any depth), with the files that do."""
    found: dict[str, set[str]] = {}
    for package in SHIPPED:
        for path in _python_files(package):
            for _, module, _ in _imports(path):
                found.setdefault(module.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_comes_from_a_declared_dependency():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    undeclared = {
        top: sorted(files)[:3] for top, files in _imported().items()
        if top not in sys.stdlib_module_names and top not in SHIPPED
        and not {_canonical(name) for name in distributions.get(top, [])} & declared}
    assert undeclared == {}, "imported, not declared in pyproject.toml (add it, pinned)"


def test_the_installed_packages_agree_with_each_others_requirements():
    import subprocess

    checked = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
