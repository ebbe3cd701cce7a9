"""SymPy's own runner (`bin/test -C --verbose FILES`), read the way SWE-bench's `parse_log_sympy` reads it:
`test_x ok|F|E` per line, and `___ path.py:test_x ___` failure headers. Test id: the function name (SymPy's
FAIL_TO_PASS lists are bare names).

No structured report exists, so this is log parsing; the worse outcome wins when a name is reported twice.
"""

from __future__ import annotations

import re

from sandbox.parsers.base import ERROR, FAILED, PASSED, ParsedTests, merge

_HEADER = re.compile(r"(_*) (.*)\.py:(.*) (_*)")


def parse_log(log: str) -> ParsedTests:
    statuses: dict[str, str] = {}
    for m in _HEADER.finditer(log):
        merge(statuses, f"{m.group(2)}.py:{m.group(3)}", FAILED)
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        name = line.split()[0]
        if line.endswith(" E"):
            merge(statuses, name, ERROR)
        elif line.endswith(" F"):
            merge(statuses, name, FAILED)
        elif line.endswith(" ok"):
            merge(statuses, name, PASSED)
    return ParsedTests(statuses, source="log")
