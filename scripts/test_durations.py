"""Write tests/file_durations.json from a JUnit XML report: each test file's seconds.

The suite's conftest starts the longest files first, so that with pytest-xdist's
--dist loadfile no long file is left for last while the other process sits idle (at 2
processes the longest file is ~7 % of the whole). The figures only order the files:
stale ones cost balance, never a test. Refresh them after adding or slowing a file:

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    .venv/bin/python scripts/test_durations.py /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "file_durations.json"


def file_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test file ("tests/engine/test_x.py"), from each testcase's classname."""
    totals: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        if name := _test_file(case.get("classname", "")):
            totals[name] += float(case.get("time", 0))
    return {name: round(s, 1) for name, s in sorted(totals.items(), key=lambda kv: -kv[1])}


def _test_file(classname: str) -> str | None:
    """'tests.engine.test_x' or 'tests.engine.test_x.TestCase' -> 'tests/engine/test_x.py'."""
    parts = classname.split(".")
    root = OUT.parent.parent
    for end in range(len(parts), 0, -1):
        name = "/".join(parts[:end]) + ".py"
        if (root / name).is_file():
            return name
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(json.dumps(file_seconds(Path(argv[0])), indent=0) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
