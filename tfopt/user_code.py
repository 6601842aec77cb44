"""The user's own Python code a run imports (a model builder, a metric), from allowed folders only.

A deployment's parameters can be edited in the Prefect UI, so which code a worker runs is the
worker's decision: a file must lie in an allowed folder, a module must be found in one or among
the interpreter's installed packages.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

CODE_DIRS_ENV = "TFOPT_CODE_DIRS"
"""Folders (separated by ``os.pathsep``) besides the project's whose Python files a builder or a
metric may come from: a machine's own setting, never a flow parameter."""


class CodeNotAllowedError(PermissionError):
    """User code outside the folders this machine allows code from (the message says which)."""


def allowed_code_roots() -> list[Path]:
    """Where this machine runs user code from.

    The tfopt project, the working folder, and ``TFOPT_CODE_DIRS`` (`tfopt run` adds its
    config file's folder).
    """
    extra = [Path(p) for p in os.environ.get(CODE_DIRS_ENV, "").split(os.pathsep) if p]
    return [Path(__file__).resolve().parents[1], Path.cwd(), *extra]


def check_code_allowed(spec: str, field: str = "model.builder") -> None:
    """Refuse code (`field`'s value) that lies outside `allowed_code_roots` or installed packages.

    Raises:
        CodeNotAllowedError: Naming the code, the allowed folders and the setting.
    """
    target = spec.rpartition(":")[0]
    if target.endswith(".py"):
        where: Path | None = Path(target).resolve()
    else:
        try:
            found = importlib.util.find_spec(target.split(".")[0])
        except (ImportError, ValueError):
            return  # importing it fails with its own message
        if found is None or found.origin in (None, "built-in", "frozen"):
            return
        where = Path(found.origin).resolve()
    roots = [*allowed_code_roots(), *(Path(sysconfig.get_paths()[key])
                                      for key in ("purelib", "platlib", "stdlib"))]
    if not any(where.is_relative_to(root.resolve()) for root in roots):
        shown = ", ".join(str(root) for root in allowed_code_roots())
        raise CodeNotAllowedError(
            f"{field}: {target} is outside the folders this machine runs code from "
            f"({shown}); add its folder to {CODE_DIRS_ENV} where tfopt runs (the worker's "
            "environment for a deployment)")


def import_code(spec: str, field: str = "model.builder") -> ModuleType:
    """Import the module of ``"file.py:function"`` or ``"package.module:function"``.

    A file is imported as the module ``tfopt_builder_<stem>`` and kept in `sys.modules`, so a
    Keras model whose classes it defines can be loaded again (in this or another process).

    Raises:
        CodeNotAllowedError: The code lies outside the folders this machine allows.
    """
    check_code_allowed(spec, field)
    target = spec.rpartition(":")[0]
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target)
    name = f"tfopt_builder_{path.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
