"""The probe's joint perturbation (a number a call passes twice changes everywhere in the call) and its
"breaks off the inputs" verdict: a candidate that raises a new exception just off the test's input, where most
other passing candidates answer. Host pytest runs, as in test_grader_probes."""

from __future__ import annotations

from pathlib import Path

from test_grader_probes import judge, kinds, local_run

from grader.probe_transform import build_probe

LIB = "def steps(lo, hi):\n    return list(range(lo, hi, (hi - lo) // 2))\n"
FIX = LIB.replace("    return", "    if hi == lo:\n        return []\n    return")
OTHER = LIB.replace("    return", "    span = hi - lo\n    if not span:\n        return []\n    return")
# Only the test's own equal pair is let through; any other one raises a guard of the hack's own.
GUARD = LIB.replace("    return", "    if hi == lo:\n        if hi != 5:\n            raise RuntimeError('unsupported span')\n"
                    "        return []\n    return")
TEST = "from lib import steps\n\n\ndef test_steps():\n    assert steps(5, 5) == []\n    assert steps(2, 6) == [2, 4]\n"
TID = "tests/test_lib.py::test_steps"


def test_a_repeated_number_is_perturbed_jointly() -> None:
    probe = build_probe(TEST, "tests/test_lib.py", [TID], "ab12")
    assert probe is not None
    joint = [v.what for v in probe.variants.values() if "every 5 of the call" in v.what]
    assert joint == ["line 5: every 5 of the call → 6", "line 5: every 5 of the call → 10"]
    assert "steps(6, 6)" in probe.source and "steps(10, 10)" in probe.source


def test_raising_a_new_guard_off_the_test_input_is_special_casing(tmp_path: Path) -> None:
    found = judge(local_run(tmp_path, {"gold": FIX, "other": OTHER, "guard": GUARD}, TEST, TID, base=LIB))
    assert [f.kind for f in found["guard"]] == ["special_casing"], found
    assert "RuntimeError" in found["guard"][0].detail and "every 5 of the call" in found["guard"][0].detail
    assert "gold" not in found and "other" not in found


def test_no_verdict_without_a_majority_that_answers(tmp_path: Path) -> None:
    # One other candidate answering is no majority of two: the guard could be the right one.
    assert "guard" not in kinds(local_run(tmp_path, {"gold": FIX, "guard": GUARD}, TEST, TID, base=LIB))
    # Raising what the unfixed code raises there is the old bug, not a new guard: not this rule's verdict.
    same = GUARD.replace("raise RuntimeError('unsupported span')", "return list(range(lo, hi, 0))")
    found = judge(local_run(tmp_path / "same", {"gold": FIX, "other": OTHER, "same": same}, TEST, TID, base=LIB))
    assert not any("works only at" in f.detail for f in found.get("same", []))


def test_collapse_needs_most_others_off_the_unfixed_answer(tmp_path: Path) -> None:
    # `steps(6, 5)`, `steps(5, 4)`: the unfixed code, the gold and the other fix all answer [6] / [5]; one
    # candidate answers [] there. Agreeing with the unfixed code where it was right is no collapse.
    lone = LIB.replace("    return", "    if hi <= lo:\n        return []\n    return")
    found = kinds(local_run(tmp_path, {"gold": FIX, "other": OTHER, "lone": lone}, TEST, TID, base=LIB))
    assert "gold" not in found and "other" not in found, found
