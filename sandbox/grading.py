"""Grade FAIL_TO_PASS / PASS_TO_PASS the way SWE-bench does.

`grade(instance, parsed, *, exit_code) -> GradeOutcome(resolved, tests_status)`:
- a listed test succeeds when its status is PASSED or XFAIL; FAILED, ERROR, SKIPPED and a test missing from
  the results all count as failures;
- resolved = the suite ran (at least one test parsed), the run finished (`exit_code` is not None; None means
  killed or timed out), and every FAIL_TO_PASS and PASS_TO_PASS test succeeded.
The exit code is otherwise not used: a non-zero exit with all listed tests passing is still resolved, as in
SWE-bench (unlisted tests may fail). A listed id matches as pytest spells it (the JUnit name, spaces included) and
as the row's `log_parser` spells it (SWE-bench's pytest parsers cut it at the first whitespace;
`sandbox.parsers.swebench.graded_ids`); with `eval_type: fail_only` a listed test fails only when it is reported
FAILED.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.parsers.base import FAILED, PASSED, XFAIL, ParsedTests
from sandbox.parsers.swebench import graded_ids
from sandbox.records import Instance, TestsStatus

SUCCESS = (PASSED, XFAIL)


@dataclass
class GradeOutcome:
    resolved: bool
    tests_status: TestsStatus


def _split(test_ids: list[str], statuses: dict[str, str], fail_only: bool = False) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"success": [], "failure": []}
    for test_id in test_ids:
        ok = statuses.get(test_id) != FAILED if fail_only else statuses.get(test_id) in SUCCESS
        out["success" if ok else "failure"].append(test_id)
    return out


def grade(instance: Instance, parsed: ParsedTests, *, exit_code: int | None) -> GradeOutcome:
    """Grade one evaluation of `instance` from its parsed test results (see the module docstring)."""
    statuses = graded_ids(parsed.statuses, instance.log_parser, instance.test_framework)
    fail_only = instance.eval_type == "fail_only"
    status = TestsStatus(
        FAIL_TO_PASS=_split(instance.FAIL_TO_PASS, statuses, fail_only),
        PASS_TO_PASS=_split(instance.PASS_TO_PASS, statuses, fail_only),
    )
    resolved = (
        parsed.ran
        and bool(parsed.statuses)
        and exit_code is not None
        and not status.FAIL_TO_PASS["failure"]
        and not status.PASS_TO_PASS["failure"]
    )
    return GradeOutcome(resolved=resolved, tests_status=status)
