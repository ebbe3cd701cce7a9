"""JUnit XML reports in the report dir: the JUnit 5 console launcher's `TEST-junit-jupiter.xml` (and
`-vintage`) and surefire-style `TEST-<class>.xml`. Test id: `<classname>.<method>` with a trailing `()`
stripped (`calc.CalculatorTest.addsNumbers`).

No log fallback: the launcher's tree output carries no package names, so without a report nothing ran.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox.parsers.base import ParsedTests, junit_case_status, merge, read_xml, testcases

LAUNCHER_REPORTS = ("TEST-junit-jupiter.xml", "TEST-junit-vintage.xml")
MAX_FILES = 2000


def test_id(case) -> str | None:
    name = (case.get("name") or "").strip()
    classname = (case.get("classname") or "").strip()
    if not name:
        return None
    if name.endswith("()"):
        name = name[:-2]
    return f"{classname}.{name}" if classname else name


def report_cases(report_dir: Path) -> list[tuple[str, str]] | None:
    """(test id, status) of every <testcase> in the reports, in order; None when no report is readable."""
    report_dir = Path(report_dir)
    if not report_dir.is_dir():
        return None
    # Prefer the launcher's own files; surefire-style per-class files only when the launcher wrote none.
    files = [report_dir / n for n in LAUNCHER_REPORTS if (report_dir / n).is_file()]
    if not files:
        files = sorted(
            Path(root, name)
            for root, _, names in os.walk(report_dir)  # does not follow symlinked directories
            for name in names
            if name.startswith("TEST-") and name.endswith(".xml")
        )[:MAX_FILES]
    cases: list[tuple[str, str]] = []
    found = False
    for path in files:
        root = read_xml(path)
        if root is None:
            continue
        found = True
        cases.extend((tid, junit_case_status(case)) for case in testcases(root) if (tid := test_id(case)))
    return cases if found else None


def parse_report(report_dir: Path) -> ParsedTests | None:
    cases = report_cases(report_dir)
    if cases is None:
        return None
    statuses: dict[str, str] = {}
    for tid, status in cases:
        merge(statuses, tid, status)
    return ParsedTests(statuses, source="report", ran=bool(statuses))


def parse(log: str, report_dir: Path | None) -> ParsedTests:
    if report_dir is not None:
        parsed = parse_report(report_dir)
        if parsed is not None:
            return parsed
    return ParsedTests({}, source="log", ran=False)
