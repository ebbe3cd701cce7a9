"""grade(): SWE-bench's FAIL_TO_PASS / PASS_TO_PASS rules and the edge cases around them."""

from __future__ import annotations

import pytest

from sandbox.grading import grade
from sandbox.parsers import ParsedTests
from sandbox.records import Instance


def instance(f2p: list[str], p2p: list[str]) -> Instance:
    return Instance.from_dict({"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc",
                               "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})


INST = instance(["t::new"], ["t::old1", "t::old2"])


def test_all_pass_resolves() -> None:
    out = grade(INST, ParsedTests({"t::new": "PASSED", "t::old1": "PASSED", "t::old2": "XFAIL"}), exit_code=0)
    assert out.resolved
    assert out.tests_status.FAIL_TO_PASS == {"success": ["t::new"], "failure": []}
    assert out.tests_status.PASS_TO_PASS == {"success": ["t::old1", "t::old2"], "failure": []}


@pytest.mark.parametrize("status", ["FAILED", "ERROR", "SKIPPED"])
def test_non_success_statuses_fail(status: str) -> None:
    out = grade(INST, ParsedTests({"t::new": status, "t::old1": "PASSED", "t::old2": "PASSED"}), exit_code=1)
    assert not out.resolved and out.tests_status.FAIL_TO_PASS["failure"] == ["t::new"]


def test_missing_test_counts_as_failure() -> None:
    out = grade(INST, ParsedTests({"t::new": "PASSED", "t::old1": "PASSED"}), exit_code=0)
    assert not out.resolved and out.tests_status.PASS_TO_PASS["failure"] == ["t::old2"]


def test_suite_that_did_not_run_is_never_resolved() -> None:
    empty = instance([], [])
    assert not grade(empty, ParsedTests({}), exit_code=0).resolved
    assert not grade(empty, ParsedTests({}, source="report", ran=True), exit_code=0).resolved
    # ran, and nothing was required: resolved, as SWE-bench does for empty lists
    assert grade(empty, ParsedTests({"t::x": "PASSED"}), exit_code=0).resolved


def test_no_exit_code_means_unfinished() -> None:
    statuses = {"t::new": "PASSED", "t::old1": "PASSED", "t::old2": "PASSED"}
    assert not grade(INST, ParsedTests(statuses), exit_code=None).resolved


def test_nonzero_exit_with_all_listed_passing_still_resolves() -> None:
    statuses = {"t::new": "PASSED", "t::old1": "PASSED", "t::old2": "PASSED", "t::unlisted": "FAILED"}
    assert grade(INST, ParsedTests(statuses), exit_code=1).resolved


def test_swebench_string_lists_are_accepted() -> None:
    inst = Instance.from_dict({"instance_id": "i", "repo": "o/r", "base_commit": "abc",
                               "FAIL_TO_PASS": '["t::new"]', "PASS_TO_PASS": "[]"})
    assert grade(inst, ParsedTests({"t::new": "PASSED"}), exit_code=0).resolved
