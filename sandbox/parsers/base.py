"""Shared pieces of the test-result parsers: the result record, status merging, safe XML reading."""

from __future__ import annotations

import os
import stat
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
# When one id is reported more than once (pytest 9 subtests: PASSED + SUBFAILED; a fake line printed by the
# patch next to the real result), the worse outcome wins, so printed text can never upgrade a failure.
_RANK = {SKIPPED: 0, XFAIL: 1, PASSED: 2, ERROR: 3, FAILED: 4}
MAX_REPORT_BYTES = 64 * 2**20


@dataclass
class ParsedTests:
    """Per-test outcomes. `source` is "report" (structured file) or "log"; `ran` is False when no test was
    found at all (the suite did not run, or its output is unusable)."""

    statuses: dict[str, str] = field(default_factory=dict)
    source: str = "log"
    ran: bool = False

    def __post_init__(self) -> None:
        self.ran = self.ran or bool(self.statuses)


def merge(statuses: dict[str, str], test_id: str, status: str) -> None:
    old = statuses.get(test_id)
    if old is None or _RANK[status] > _RANK[old]:
        statuses[test_id] = status


def read_xml(path: Path) -> ET.Element | None:
    """Parse a report file, or None when it is not a regular file, too big, or not XML (a crash may leave it
    half written).

    expat >= 2.4 (Python 3.11 ships 2.5) limits entity expansion, and ElementTree resolves no external
    entities, so a hostile report cannot blow up memory or read files.
    """
    try:
        # The report dir is writable from inside the container: a test could leave a symlink to a host file
        # or a FIFO there, so only a regular file is read.
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REPORT_BYTES:
            return None
        return ET.parse(path).getroot()
    except (ET.ParseError, OSError, ValueError):
        return None


def testcases(root: ET.Element):
    """Yield <testcase> elements of a <testsuites>/<testsuite> document (any nesting)."""
    if root.tag not in ("testsuites", "testsuite"):
        return
    yield from root.iter("testcase")


def junit_case_status(case: ET.Element) -> str:
    """Status of one JUnit <testcase>: failure > error > xfail-skip > skip > pass."""
    tags = {child.tag for child in case}
    if "failure" in tags:
        return FAILED
    if "error" in tags:
        return ERROR
    for child in case:
        if child.tag == "skipped":
            return XFAIL if child.get("type") == "pytest.xfail" else SKIPPED
    return PASSED
