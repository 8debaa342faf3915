"""Per-file test times from a JUnit XML report, as the Markdown table of docs/contributing/test-times.md.

    .venv/bin/python -m pytest -q tests --junitxml=times.xml
    .venv/bin/python tests/durations_table.py times.xml [--top 25]

Seconds are each test's own (setup, call and teardown), summed per file: on a parallel run they add
up to more than the wall time, which pytest prints on its last line.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(report: str) -> dict[str, tuple[int, float]]:
    """``file -> (tests, seconds)`` of a JUnit XML report."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_app[.TestClass]
        name = next((part for part in parts if part.startswith("test_")), parts[-1]) + ".py"
        totals[name][0] += 1
        totals[name][1] += float(case.get("time", 0.0))
    return {name: (int(count), seconds) for name, (count, seconds) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    files = per_file(args.report)
    total = sum(seconds for _, seconds in files.values())
    print("| file | tests | seconds | share |")
    print("| --- | ---: | ---: | ---: |")
    for name, (count, seconds) in sorted(files.items(), key=lambda item: -item[1][1])[: args.top]:
        print(f"| `{name}` | {count} | {seconds:.0f} | {100 * seconds / total:.1f}% |")
    rest = sorted(files.items(), key=lambda item: -item[1][1])[args.top :]
    if rest:
        print(
            f"| {len(rest)} other files | {sum(c for _, (c, _) in rest)} | "
            f"{sum(s for _, (_, s) in rest):.0f} | {100 * sum(s for _, (_, s) in rest) / total:.1f}% |"
        )
    print(f"| **all** | {sum(c for c, _ in files.values())} | {total:.0f} | 100% |")


if __name__ == "__main__":
    main()
