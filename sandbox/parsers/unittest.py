"""unittest verbose output (`python -m unittest -v`): `test_x (pkg.mod.Class.test_x) ... ok`.

Python >= 3.11 prints `name (module.Class.name)`, older versions `name (module.Class)`; both spellings are
recorded so task ids written either way match. There is no structured report: this is log parsing.
"""

from __future__ import annotations

import re

from sandbox.parsers.base import ERROR, FAILED, PASSED, SKIPPED, XFAIL, ParsedTests, merge

_RESULT = re.compile(
    r"^(?P<name>\w+) \((?P<where>[\w.]+)\)(?P<sub> \(.*\))?(?:\n(?!\w+ \()[^\n]*)? \.\.\. "
    r"(?P<status>ok|FAIL|ERROR|skipped|expected failure|unexpected success)",
    re.M,
)
_DETAIL = re.compile(r"^(?P<status>FAIL|ERROR): (?P<name>\w+) \((?P<where>[\w.]+)\)", re.M)
_MAP = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR, "skipped": SKIPPED, "expected failure": XFAIL,
        "unexpected success": FAILED}


def _ids(name: str, where: str) -> list[str]:
    ids = [f"{name} ({where})"]
    if where.endswith("." + name):
        ids.append(f"{name} ({where[: -len(name) - 1]})")
    else:
        ids.append(f"{name} ({where}.{name})")
    return ids


def parse_log(log: str) -> ParsedTests:
    statuses: dict[str, str] = {}
    for m in _RESULT.finditer(log):
        for test_id in _ids(m.group("name"), m.group("where")):
            merge(statuses, test_id, _MAP[m.group("status")])
    # Failure sections ("FAIL: test_x (m.C.test_x) (i=1)") also cover subtests, whose verbose line may be
    # printed before the failure is known.
    for m in _DETAIL.finditer(log):
        for test_id in _ids(m.group("name"), m.group("where")):
            merge(statuses, test_id, FAILED if m.group("status") == "FAIL" else ERROR)
    return ParsedTests(statuses, source="log")
