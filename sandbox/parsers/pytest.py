"""pytest results: the JUnit XML report (xunit1, so `file` gives node ids), else `-rA` / `-v` log lines.

The report is written by pytest itself into a directory outside the work tree; only the file name this module
configures (`REPORT_NAME`) is read, so extra XML files a patch drops there are ignored.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from sandbox.parsers.base import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    XFAIL,
    ParsedTests,
    junit_case_status,
    merge,
    read_xml,
    testcases,
)

REPORT_NAME = "pytest-junit.xml"

_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED|SUBFAILED|SUBPASSED)(?:\([^)]*\))? (\S+::\S.*?)(?: - .*)?$")
_VERBOSE = re.compile(
    r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED|SUBFAIL\w*|SUBPASS\w*)(?:\([^)]*\))?(?:\s.*)?$"
)
_MAP = {
    "PASSED": PASSED, "XPASS": PASSED, "FAILED": FAILED, "ERROR": ERROR, "XFAIL": XFAIL, "SKIPPED": SKIPPED,
    "SUBFAILED": FAILED, "SUBFAIL": FAILED, "SUBPASSED": PASSED, "SUBPASS": PASSED,
}


def pytest_addopts(report_dir_in_container: str, *, plugin: str | None = None) -> str:
    """The PYTEST_ADDOPTS value the runtime sets: JUnit XML (xunit1) into the report dir, no cache writes, and
    optionally a plugin to load first (the sandbox's guard, `sandbox/integrity/channel.py`)."""
    path = f"{report_dir_in_container.rstrip('/')}/{REPORT_NAME}"
    first = f"-p {shlex.quote(plugin)} " if plugin else ""
    return f"{first}--junitxml={shlex.quote(path)} -o junit_family=xunit1 -p no:cacheprovider"


def _node_id(case) -> str | None:
    name = case.get("name") or ""
    classname = case.get("classname") or ""
    file = case.get("file")
    if not name:
        return None
    if file:
        module = re.sub(r"\.py$", "", file).replace("/", ".")
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return "::".join([file, *classname[len(module) + 1 :].split("."), name])
    # No usable `file` (xunit2 or a collection error): classes are the capitalised trailing components.
    parts = classname.split(".") if classname else []
    cls: list[str] = []
    while parts and parts[-1][:1].isupper():
        cls.insert(0, parts.pop())
    if not parts:
        return "::".join([*cls, name]) if cls else name
    return "::".join(["/".join(parts) + ".py", *cls, name])


def report_cases(report_dir: Path) -> list[tuple[str, str]] | None:
    """(test id, status) of every <testcase> in the report, in order (a test may appear twice); None when
    there is no readable report."""
    root = read_xml(Path(report_dir) / REPORT_NAME)
    if root is None:
        return None
    return [(tid, junit_case_status(case)) for case in testcases(root) if (tid := _node_id(case))]


def parse_report(report_dir: Path) -> ParsedTests | None:
    cases = report_cases(report_dir)
    if cases is None:
        return None
    statuses: dict[str, str] = {}
    for test_id, status in cases:
        merge(statuses, test_id, status)
    return ParsedTests(statuses, source="report", ran=bool(statuses))


def parse_log(log: str) -> ParsedTests:
    statuses: dict[str, str] = {}
    for raw in log.splitlines():
        line = raw.strip()
        m = _SUMMARY.match(line)
        if m:
            merge(statuses, m.group(2).strip(), _MAP[m.group(1)])
            continue
        m = _VERBOSE.match(line)
        if m:
            merge(statuses, m.group(1).strip(), _MAP.get(m.group(2), FAILED))
    return ParsedTests(statuses, source="log")


def parse(log: str, report_dir: Path | None) -> ParsedTests:
    if report_dir is not None:
        parsed = parse_report(Path(report_dir))
        if parsed is not None:
            return parsed
    return parse_log(log)
