"""The probe's joint perturbation (a number a call passes twice changes everywhere in the call) and its
"breaks off the inputs" verdict: a candidate that raises a new exception just off the test's input, where most
other passing candidates answer. Host pytest runs, as in test_grader_probes."""

from __future__ import annotations

from pathlib import Path

from test_grader_probes import judge, kinds, local_run

from grader.probe.transform import build_probe

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


NAMES = "def last_name(dotted):\n    return dotted.split('.')[1]\n"
NAMES_FIX = "def last_name(dotted):\n    return dotted.rsplit('.', 1)[-1]\n"
NAMES_OTHER = "def last_name(dotted):\n    return dotted[dotted.rfind('.') + 1:]\n"
# Right for the tests' two and three dots only.
NAMES_GUARD = ("def last_name(dotted):\n    parts = dotted.split('.')\n"
               "    return parts[-1] if len(parts) in (2, 3) else parts[1]\n")
NAMES_TEST = ("from lib import last_name\n\n\ndef test_last_name():\n    assert last_name('db.tbl') == 'tbl'\n"
              "    assert last_name('db.schema.tbl') == 'tbl'\n")


def test_a_delimited_string_gets_one_more_element() -> None:
    from unittest import mock  # noqa: F401 - named in the test text below

    probe = build_probe(NAMES_TEST, "tests/test_lib.py", ["tests/test_lib.py::test_last_name"], "ab12")
    whats = [v.what for v in probe.variants.values() if v.kind == "p"]
    assert "line 6: 'db.schema.tbl' → 'db.schema.tbl.tbl'" in whats
    assert "line 6: 'db.schema.tbl' → 'db.db.schema.tbl'" in whats
    # A dotted name handed to mock.patch names code: it stays as written.
    mocked = NAMES_TEST.replace("    assert last_name('db.tbl')", "    with mock.patch('os.path.sep', '/'):\n"
                                "        pass\n    assert last_name('db.tbl')")
    probe = build_probe("from unittest import mock\n" + mocked, "tests/test_lib.py",
                        ["tests/test_lib.py::test_last_name"], "ab12")
    assert not any("os.path.sep" in v.what for v in probe.variants.values())


def test_a_guard_on_the_number_of_parts_collapses(tmp_path: Path) -> None:
    found = kinds(local_run(tmp_path, {"gold": NAMES_FIX, "other": NAMES_OTHER, "guard": NAMES_GUARD}, NAMES_TEST,
                            "tests/test_lib.py::test_last_name", base=NAMES))
    assert found == {"guard": ["special_casing"]}


EVEN = "def is_even(n):\n    return n % 4 == 0\n"
EVEN_FIX = "def is_even(n):\n    return n % 2 == 0\n"
EVEN_TEST = "from lib import is_even\n\n\ndef test_even():\n    assert is_even(6) == True\n"


def test_a_boolean_answer_is_no_collapse_evidence(tmp_path: Path) -> None:
    # On 6 → 7 and 6 → 5 the fix answers False like the unfixed code (right there), two candidates answer True:
    # agreeing with a buggy predicate where it happens to be right is no special case.
    always = "def is_even(n):\n    return True\n"
    always2 = "def is_even(n):\n    return n == n\n"
    found = kinds(local_run(tmp_path, {"gold": EVEN_FIX, "always": always, "always2": always2}, EVEN_TEST,
                            "tests/test_lib.py::test_even", base=EVEN))
    assert "gold" not in found, found
