"""`go test -json` output: one JSON event per line; `Action` pass/fail/skip with a `Test` field (subtests as
`TestX/sub`). Non-JSON lines (build errors on stderr, truncation) are skipped.

Caveat: with Go < 1.20 test2json derives events from the test binary's text, so a test that prints
`--- PASS: TestY` can fake an event; the worst outcome per test wins, so a real failure is never overridden.
"""

from __future__ import annotations

import json

from sandbox.parsers.base import FAILED, PASSED, SKIPPED, ParsedTests, merge

_MAP = {"pass": PASSED, "fail": FAILED, "skip": SKIPPED}


def events(log: str):
    """Yield the `go test -json` events (dicts) found in `log`, in order."""
    for line in log.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            event = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def parse_log(log: str) -> ParsedTests:
    statuses: dict[str, str] = {}
    for event in events(log):
        action, test = event.get("Action"), event.get("Test")
        if isinstance(test, str) and test and action in _MAP:
            merge(statuses, test, _MAP[action])
    return ParsedTests(statuses, source="log")
