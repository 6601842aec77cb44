"""Write tests/durations.json from logs of the suites run with ``--durations=0``.

    .venv/bin/pytest --durations=0 | tee suite.log
    .venv/bin/pytest -m slow --durations=0 | tee slow.log
    .venv/bin/python -m tests.durations suite.log slow.log

Each test's seconds (setup, call and teardown summed) size its timeout and order the files the
workers take (tests/conftest.py). Run it after a change that makes a test much lighter or
heavier, on the machine whose CI you size.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
_LINE = re.compile(r"^(?P<seconds>[0-9.]+)s (?:setup|call|teardown)\s+(?P<test>\S+)$")


def durations_of(log: str) -> dict[str, float]:
    """Each test's seconds in a pytest log's ``--durations`` table, longest first."""
    seconds: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        if match := _LINE.match(line.strip()):
            seconds[match["test"]] += float(match["seconds"])
    return {test: round(s, 1) for test, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    seconds: dict[str, float] = {}
    for log in argv:
        found = durations_of(Path(log).read_text())
        if not found:
            print(f"no --durations lines in {log}", file=sys.stderr)
            return 2
        seconds.update(found)
    seconds = dict(sorted(seconds.items(), key=lambda kv: -kv[1]))
    DURATIONS.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{len(seconds)} tests, {sum(seconds.values()):.0f} s in all -> {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
