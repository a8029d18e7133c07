"""Per-module totals of a pytest `--durations=0` report, longest first: what LONGEST_FIRST in
tests/conftest.py should follow (under `--dist loadfile` a module is one worker's unit of work,
so its total, setup included, is a floor on the suite's wall time).

Usage: python scripts/module_durations.py LOG [N]  (N rows, default all)
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S+?\.py)::")


def module_totals(text: str) -> dict[str, float]:
    """Seconds per test module, summed over the setup, call and teardown lines of the report."""
    totals: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        found = LINE.match(line)
        if found:
            totals[found.group(2)] += float(found.group(1))
    return dict(totals)


def main(argv: list[str]) -> None:
    totals = module_totals(Path(argv[1]).read_text(errors="replace"))
    rows = sorted(totals.items(), key=lambda item: -item[1])
    for module, seconds in rows[: int(argv[2]) if len(argv) > 2 else None]:
        print(f"{seconds:8.1f} s  {module}")
    print(f"{sum(totals.values()):8.1f} s  total over {len(totals)} modules")


if __name__ == "__main__":
    main(sys.argv)
