"""Bug kinds of `gagar tasks synth`: each kind's exact edit, its diff and its revert through git, determinism."""

from __future__ import annotations

import ast
import difflib
import subprocess
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree

from synth.mutate import KINDS, find_mutations
from synth.order import Checker, iter_candidates, order_candidates
from synth.sources import Source, diffs, prepare, write_commits

SOURCE = '''\
"""A module."""
import math


def clamp(value, low, high):
    """Keep `value` in [low, high]; not the place for `if` edits: this is a docstring."""
    if value < low and low is not None:
        return low
    if value > high:
        value = high
    return value


def window(items, size):
    out = []
    for i in range(len(items) - 1):
        out.append(items[i:i + size])
    return out


def tail(items):
    while items and not items[0]:
        items = items[1:]
    return items[:-1]


def scale(a, b):
    total = math.pow(a, b)
    flag = True
    if not flag:
        total += 1
    return total + a * 3


class Box:
    def __init__(self, label: str = "x"):
        self.label = f"<{label} 1>"

    def name(self, upper):
        if upper:
            return self.label.upper()
        return self.label
'''

# kind → (line before, line after): one edit each kind must offer, exactly (the rest of the file unchanged).
EXPECTED = {
    "compare_flip": ("    if value < low and low is not None:", "    if value <= low and low is not None:"),
    "boolop_flip": ("    if value < low and low is not None:", "    if value < low or low is not None:"),
    "off_by_one_range": ("    for i in range(len(items) - 1):", "    for i in range(len(items)):"),
    "off_by_one_slice": ("        out.append(items[i:i + size])", "        out.append(items[i:i + size + 1])"),
    "negate_condition": ("    if not flag:", "    if flag:"),
    "drop_condition": ("    while items and not items[0]:", "    while not items[0]:"),
    "swap_args": ("    total = math.pow(a, b)", "    total = math.pow(b, a)"),
    "change_constant": ("    return total + a * 3", "    return total + a * 4"),
    "remove_statement": ("        out.append(items[i:i + size])", "        pass"),
    "remove_return": ("            return self.label.upper()", "            pass"),
    "wrong_variable": ("    return total + a * 3", "    return total + b * 3"),
}


def _results(kind: str) -> dict[str, object]:
    muts = find_mutations("pkg/m.py", SOURCE, kinds=[kind])
    check = Checker({"pkg/m.py": SOURCE})
    return {m.apply(SOURCE): m for m in muts if check.result(m) is not None}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_makes_its_exact_edit(kind: str) -> None:
    before, after = EXPECTED[kind]
    results = _results(kind)
    want = SOURCE.replace(before + "\n", after + "\n", 1)
    assert want != SOURCE and want in results, f"{kind}: no candidate turns {before!r} into {after!r}"
    for text, m in results.items():
        assert m.kind == kind
        assert ast.dump(ast.parse(text)) != ast.dump(ast.parse(SOURCE))
        changed = [ln for ln in difflib.ndiff(SOURCE.splitlines(), text.splitlines()) if ln[:1] in "+-"]
        first, last = m.lines
        # The edit stays inside its function, and the docstrings are never touched.
        lo, hi = m.func_lines
        assert all(lo <= e_line <= hi for e_line in _edit_lines(m)), (kind, m.function)
        assert "docstring" not in "".join(changed)
        assert first <= last


def _edit_lines(m) -> list[int]:
    starts = [0]
    for line in SOURCE.split("\n")[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    return [max(i for i, s in enumerate(starts, 1) if s <= e.start) for e in m.edits]


def test_unguard_dedents_the_body_and_removal_takes_whole_lines() -> None:
    results = _results("drop_condition")
    unguarded = SOURCE.replace("    if value > high:\n        value = high\n", "    value = high\n")
    assert unguarded in results
    removed = _results("remove_statement")
    assert SOURCE.replace("    flag = True\n", "") in removed  # the whole line, not an empty one left behind


def test_fstrings_annotations_and_defaults_are_left_alone() -> None:
    for kind in KINDS:
        for text in _results(kind):
            # Inside an f-string: no constant or variable edits (the whole statement may go).
            assert 'f"<{label} 1>"' in text or "self.label = " not in text, kind
            assert "label: str" in text, kind


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthrepo") / "acme__mod"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text(SOURCE)
    (root / "tests").mkdir()
    (root / "tests" / "test_m.py").write_text("from pkg.m import clamp\n\ndef test_c():\n    assert clamp(1, 2, 3) == 2\n")
    commit_tree(root)
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_through_git_applies_and_reverts_exactly(kind: str, repo: Path, tmp_path: Path) -> None:
    """The commit holds the broken file; the task's patch (git's diff broken → base) is exactly the inverse edit
    and turns the broken tree back into the original, byte for byte."""
    p = prepare(Source(path=str(repo)), tmp_path / "out", {})
    assert p.repo == "acme/mod" and list(p.sources) == ["pkg/m.py"] and p.test_files == ["tests/test_m.py"]
    before, after = EXPECTED[kind]
    broken = SOURCE.replace(before + "\n", after + "\n", 1)
    m = next(m for m in find_mutations("pkg/m.py", SOURCE, kinds=[kind]) if m.apply(SOURCE) == broken)
    commits = write_commits(p, {"t": ("pkg/m.py", m.apply(SOURCE))}, "refs/tasks/")
    again = write_commits(p, {"t": ("pkg/m.py", m.apply(SOURCE))}, "refs/tasks/")
    assert commits == again  # fixed identity and date: the same bug is the same commit
    forward, revert = diffs(p, commits)["t"], diffs(p, commits, reverse=True)["t"]
    minus = [ln[1:] for ln in forward.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:] for ln in forward.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert (minus, plus) == ([before], [after]) or (kind == "remove_statement" and minus == [before])
    assert [ln[1:] for ln in revert.splitlines() if ln.startswith("+") and not ln.startswith("+++")] == minus
    work = tmp_path / "work"
    work.mkdir()
    tar = subprocess.run(["git", "-C", str(p.clone), "archive", commits["t"]], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=tar, check=True)
    assert (work / "pkg" / "m.py").read_text() == broken
    subprocess.run(["git", "apply"], cwd=work, input=revert.encode(), check=True)
    assert (work / "pkg" / "m.py").read_text() == SOURCE


def test_order_is_deterministic_per_seed_and_capped_per_function() -> None:
    sources = {"pkg/m.py": SOURCE}
    muts = find_mutations("pkg/m.py", SOURCE)
    a = order_candidates(muts, 7, Checker(sources), per_function=2)
    b = order_candidates(list(reversed(muts)), 7, Checker(sources), per_function=2)
    c = order_candidates(muts, 8, Checker(sources), per_function=2)
    assert [m.key for m in a] == [m.key for m in b]  # input order does not matter
    assert [m.key for m in a] != [m.key for m in c]
    per_fn: dict[str, int] = {}
    for m in a:
        per_fn[m.function] = per_fn.get(m.function, 0) + 1
    assert max(per_fn.values()) <= 2
    assert len({m.apply(SOURCE) for m in a}) == len(a)  # no two candidates make the same code
    # Round robin over kinds: the first candidates cover several kinds.
    assert len({m.kind for m in a[:6]}) >= 5
    lazy = iter_candidates(muts, 7, Checker(sources), per_function=2)
    assert [next(lazy).key for _ in range(3)] == [m.key for m in a[:3]]


PROPERTY = '''\
import sys


class Box:
    @property
    def size(self):
        return self._size if self._size > 0 else 0

    @size.setter
    def size(self, value):
        if value < 0:
            raise ValueError(value)
        self._size = value

    @size.deleter
    def size(self):
        self._size = 0


if sys.version_info >= (3, 8):
    def pick(a, b):
        return a if a > b else b
else:
    def pick(a, b):
        return b if a > b else a
'''


def test_a_property_s_accessors_and_a_redefined_function_are_functions_of_their_own(tmp_path: Path) -> None:
    """Python names a property's getter and setter alike (`Box.size`); grouped by that name, a setter's bug was
    screened with the getter's lines' tests and listed with their PASS_TO_PASS."""
    from synth.validate import Baseline, group_for

    muts = find_mutations("pkg/box.py", PROPERTY)
    lines = {m.function: m.func_lines for m in muts}
    assert lines == {"Box.size": (5, 7), "Box.size.setter": (9, 13), "Box.size.deleter": (15, 17),
                     "pick": (21, 22), "pick@L24": (24, 25)}
    # Each gets its own group: the tests that run its own lines, under an id of its own.
    repo = tmp_path / "acme__box"
    commit_tree(repo, {"pkg/box.py": PROPERTY, "tests/test_box.py": "def test_x():\n    pass\n"})
    prepared = prepare(Source(path=str(repo)), tmp_path / "out", {})
    cov = {n: {"tests/test_box.py::test_get"} for n in range(5, 8)}
    cov.update({n: {"tests/test_box.py::test_set"} for n in range(9, 14)})
    base = Baseline(passing={"tests/test_box.py::test_get", "tests/test_box.py::test_set"},
                    coverage={"pkg/box.py": cov})
    get, put = (group_for(prepared, base, {}, "pkg/box.py", f, lines[f]) for f in ("Box.size", "Box.size.setter"))
    assert get.gid != put.gid
    assert get.tests == ["tests/test_box.py::test_get"] and put.tests == ["tests/test_box.py::test_set"]


@pytest.mark.parametrize("path", ["synth/mutate.py", "synth/factory.py", "sandbox/apply.py"])
def test_real_files_every_accepted_candidate_parses_and_changes_the_code(path: str) -> None:
    source = (Path(__file__).resolve().parents[1] / path).read_text()
    muts = find_mutations(path, source)
    check = Checker({path: source})
    taken = order_candidates(muts, 0, check, limit=60)
    assert len(taken) >= 40 and {m.kind for m in taken} >= {"compare_flip", "remove_statement", "wrong_variable"}
    tree = ast.dump(ast.parse(source))
    for m in taken:
        new = m.apply(source)
        assert ast.dump(ast.parse(new)) != tree
        assert len(new.splitlines()) >= len(source.splitlines()) - 3
