"""Test-result parsers, one module per framework, behind one registry.

`parse_results(framework, log, report_dir) -> ParsedTests(statuses, source, ran)` with statuses
`{test_id: "PASSED"|"FAILED"|"SKIPPED"|"ERROR"|"XFAIL"}`. Test ids follow the cross-team contract:
pytest node ids, `go test -json` `Test` names, JUnit `classname.method`, unittest `name (module.Class)`,
Django's runner `name (module.Class)`, SymPy's runner bare function names. SWE-bench's parser names map onto
these in `sandbox.parsers.swebench`.

`STDOUT_REPORT` names the frameworks whose report *is* the run's output (`go test -json`, and the runners that
write no report): the sandbox parses their whole output, never the capped copy it keeps for the log.

A patch controls what the tests print, so a structured report wins: when one exists the log is not read at
all (printed "PASSED" lines cannot add passes); the log is the fallback only when no report exists. Pass
`require_report=True` when the runtime configured a report (e.g. PYTEST_ADDOPTS for pytest): a missing
report then means "did not run" instead of trusting the log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sandbox.parsers import django, go, junit, pytest, sympy, unittest
from sandbox.parsers.base import ERROR, FAILED, PASSED, SKIPPED, XFAIL, ParsedTests
from sandbox.parsers.pytest import REPORT_NAME, pytest_addopts

Parser = Callable[[str, "Path | None"], ParsedTests]

PARSERS: dict[str, Parser] = {
    "pytest": pytest.parse,
    "unittest": lambda log, report_dir: unittest.parse_log(log),
    "go": lambda log, report_dir: go.parse_log(log),
    "junit": junit.parse,
    "django": lambda log, report_dir: django.parse_log(log),
    "sympy": lambda log, report_dir: sympy.parse_log(log),
}
STDOUT_REPORT = frozenset({"go", "unittest", "django", "sympy"})


def register_parser(framework: str, parser: Parser) -> None:
    """Add or replace the parser for a framework name (`parser(log, report_dir) -> ParsedTests`)."""
    PARSERS[framework] = parser


def parse_results(
    framework: str, log: str, report_dir: Path | None, *, require_report: bool = False
) -> ParsedTests:
    """Parse one run's results; raises ValueError for an unknown framework."""
    try:
        parser = PARSERS[framework]
    except KeyError:
        raise ValueError(f"unknown test_framework {framework!r}; known: {', '.join(sorted(PARSERS))}") from None
    parsed = parser(log or "", Path(report_dir) if report_dir is not None else None)
    if require_report and parsed.source != "report":
        return ParsedTests({}, source="log", ran=False)
    return parsed


__all__ = [
    "ERROR", "FAILED", "PASSED", "SKIPPED", "XFAIL", "ParsedTests", "PARSERS", "REPORT_NAME",
    "STDOUT_REPORT", "parse_results", "pytest_addopts", "register_parser",
]
