"""A run's temporary folder goes at its exit, after multiprocessing's own, with no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import multiprocessing.util, sys
from pathlib import Path
from tfopt.fileio import use_run_temp_dir

if __name__ == "__main__":
    folder = use_run_temp_dir(Path(sys.argv[1]))
    # What a fork server or a Pool does first: its folder (and exit finalizer) in the run's.
    assert Path(multiprocessing.util.get_temp_dir()).parent == folder
"""


def test_the_run_temp_dir_is_removed_at_exit_without_a_traceback(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "work")], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert list((tmp_path / "work" / "tmp").iterdir()) == []
