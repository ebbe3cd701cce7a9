"""The judge's training data beyond the bundled tasks: fixes mined from a repository's history (`gagar sft
history`), the smaller-but-worse candidates (`sft.inverted`), the candidate view of the prompt (`grader.judge.view`),
and the split by project with the mixed groups of `gagar sft data --split repo --inverted`.

Everything runs on a small repository made here, with a real history: a fix commit (library code and its test), a
docs-only commit and an oversized one, which the miner must skip.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree, git

from grader.judge.view import change_view, enclosing
from grader.records import Candidate, Group, read_jsonl
from grader.workspace import SharedWorkspace
from sft.cli import main as sft_main
from sft.data import RANK, mixed, project, split_repos
from sft.degrade import Variant, scratch_tree
from sft.history import qualifies
from sft.inverted import inverted_on, partial_fix, special_case

CONVERT = '''"""Length units."""

FACTORS = {"m": 1.0, "ft": 0.3048, "in": 0.0254}


def to_meters(value, unit):
    """Convert `value` in `unit` to meters."""
    factor = FACTORS.get(unit, 1.0)
    return value * factor


def describe(unit):
    return f"unit {unit}"
'''

FIXED = '''"""Length units."""

FACTORS = {"m": 1.0, "ft": 0.3048, "in": 0.0254}


def to_meters(value, unit):
    """Convert `value` in `unit` to meters."""
    if unit not in FACTORS:
        raise ValueError(f"unknown unit {unit!r}")
    factor = FACTORS[unit]
    return value * factor


def describe(unit):
    return f"unit {unit}"
'''

TEST = '''from units.convert import to_meters


def test_feet():
    assert to_meters(10, "ft") == 3.048
'''

TEST_FIXED = TEST + '''

def test_unknown_unit():
    import pytest
    with pytest.raises(ValueError):
        to_meters(7, "furlong")
'''


@pytest.fixture(scope="module")
def clones(tmp_path_factory) -> Path:
    """acme/units: base, the fix (with its test), a docs-only commit, an oversized one."""
    root = tmp_path_factory.mktemp("clones")
    repo = root / "acme__units"
    repo.mkdir()
    commit_tree(repo, {"units/__init__.py": "", "units/convert.py": CONVERT, "tests/test_convert.py": TEST}, "base")
    commit_tree(repo, {"units/convert.py": FIXED, "tests/test_convert.py": TEST_FIXED},
                "Reject unknown units\n\nto_meters silently used 1.0.\n\nSigned-off-by: t <t@t>")
    commit_tree(repo, {"README.md": "units\n"}, "docs: readme")
    big = FIXED + "".join(f"\n\ndef f{i}(x):\n    return x + {i}\n" for i in range(30))
    commit_tree(repo, {"units/convert.py": big, "tests/test_convert.py": TEST_FIXED + "\n# more\n"}, "Add many helpers")
    return root


@pytest.fixture(scope="module")
def history(clones, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("history")
    head = git(clones / "acme__units", "rev-parse", "HEAD").strip()
    pins = out / "pins.txt"
    pins.write_text(f"# a comment\nacme/units {head} heldout\n")
    assert sft_main(["history", "--repos-dir", str(clones), "--pins", str(pins), "--out", str(out)]) == 0
    return out


def test_history_mines_the_fix_and_skips_docs_and_oversized_commits(history, clones):
    [inst] = read_jsonl(history / "instances.jsonl")
    assert inst["repo"] == "acme/units" and inst["split"] == "heldout"
    assert inst["problem_statement"] == "Reject unknown units\n\nto_meters silently used 1.0."  # no trailer
    assert "+    if unit not in FACTORS:" in inst["patch"] and "tests/" not in inst["patch"]
    assert "test_unknown_unit" in inst["test_patch"]
    repo = clones / "acme__units"
    assert inst["base_commit"] == git(repo, "rev-parse", f"{inst['fix_commit']}^").strip()
    assert (history / "repos" / "acme__units").resolve() == repo.resolve()
    assert qualifies([("units/convert.py", 3, 1), ("tests/test_convert.py", 5, 0)], "Fix it")
    assert not qualifies([("units/convert.py", 3, 1), ("tests/test_convert.py", 5, 0)], "Bump version")
    assert not qualifies([("units/convert.py", 3, 1)], "Fix without a test")
    assert not qualifies([("units/convert.py", 60, 1), ("tests/t.py", 5, 0)], "Too big")


def test_history_bad_input_exits_2(clones, tmp_path, capsys):
    pins = tmp_path / "pins.txt"
    pins.write_text("acme/units notasha\n")
    assert sft_main(["history", "--repos-dir", str(clones), "--pins", str(pins), "--out", str(tmp_path / "o")]) == 2
    assert "expected `owner/name commit" in capsys.readouterr().err
    pins.write_text("acme/missing 0123456\n")
    assert sft_main(["history", "--repos-dir", str(clones), "--pins", str(pins), "--out", str(tmp_path / "o")]) == 2
    assert "git clone https://github.com/acme/missing" in capsys.readouterr().err


def _changed(patch: str) -> int:
    return sum(1 for ln in patch.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


def test_partial_fix_leaves_out_the_check_and_is_smaller(history):
    [inst] = read_jsonl(history / "instances.jsonl")
    with scratch_tree(inst, history / "repos") as tree:
        part = partial_fix(tree, random.Random(0))
    assert part is not None and part.rollout_id == "partial"
    assert "raise ValueError" not in part.patch and "+    factor = FACTORS[unit]" in part.patch
    assert _changed(part.patch) < _changed(inst["patch"])
    assert "leaves out `if unit not in FACTORS:`" in part.evidence[0] and part.evidence[0].startswith(
        "units/convert.py:8:")


def test_partial_fix_needs_a_fix_left_over(history):
    [inst] = read_jsonl(history / "instances.jsonl")
    one_line = dict(inst, patch=inst["patch"].split("@@")[0])  # headers only: rebuilt below as a one-line change
    with scratch_tree(inst, history / "repos") as tree:
        tree.reset(gold=False)
        p = tree.root / "units/convert.py"
        p.write_text(p.read_text().replace("return value * factor", "return float(value) * factor"))
        one_line["patch"] = tree.patch()
    with scratch_tree(one_line, history / "repos") as tree:
        assert partial_fix(tree, random.Random(0)) is None  # dropping the only line leaves no fix at all


def test_special_case_branches_on_a_test_input_in_the_fixed_function(history):
    [inst] = read_jsonl(history / "instances.jsonl")
    with scratch_tree(inst, history / "repos") as tree:
        hack = special_case(tree, inst["test_patch"], random.Random(1))
        base = "".join(tree.base_lines("units/convert.py"))
    assert hack is not None and hack.rollout_id == "hack"
    added = [ln[1:] for ln in hack.patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 2 and added[0].startswith("    if ") and added[1].startswith("        return ")
    assert "raise ValueError" not in hack.patch  # the gold fix is not made
    test_literals = {"'ft'", "3.048", "7", "'furlong'", "10"}
    assert any(lit in added[0] for lit in test_literals) and added[1].split("return ")[1] in test_literals
    # It sits in to_meters, after the docstring, and the file still parses.
    tree_text = base.replace('    """Convert `value` in `unit` to meters."""\n',
                             '    """Convert `value` in `unit` to meters."""\n' + "\n".join(added) + "\n")
    ast.parse(tree_text)
    assert hack.evidence[0].startswith("units/convert.py:8: special-cases an input of the tests")


def test_inverted_on_gives_both_from_one_tree(history):
    [inst] = read_jsonl(history / "instances.jsonl")
    with scratch_tree(inst, history / "repos") as tree:
        got = inverted_on(tree, inst["instance_id"], inst["test_patch"], seed=0)
    assert set(got) == {"partial", "hack"}


def _v(rid: str) -> Variant:
    return Variant(rid, f"patch {rid}")


def test_mixed_groups_keep_the_known_order_and_never_leave_a_partial_fix_alone():
    complete = [_v("gold"), _v("d1"), _v("d2"), _v("d3")]
    extra = {"partial": _v("partial"), "hack": _v("hack")}
    seen = set()
    for s in range(300):
        g = [v.rollout_id for v in mixed(complete, extra, random.Random(s))]
        assert 2 <= len(g) <= 4 and len(set(g)) == len(g)
        rank = [RANK.get(r, ["gold", "d1", "d2", "d3"].index(r) if r in ("gold", "d1", "d2", "d3") else 99)
                for r in g]
        assert rank == sorted(rank)
        assert any(r in ("gold", "d1", "d2", "d3") for r in g)  # a complete fix is always there
        seen.update(g)
    assert seen == {"gold", "d1", "d2", "d3", "partial", "hack"}


def test_split_by_project_keeps_every_project_on_one_side():
    assert project("pytoolz/toolz") == project("pypi/toolz") == "toolz"
    assert project("astanin/python-tabulate") == project("x/tabulate")
    sources = {"a1": "pytoolz/toolz", "a2": "pypi/toolz", "b1": "acme/units", "c1": "acme/other", "d1": "x/y"}
    train, val = split_repos(sources, 0.0, 0, explicit={"a1": "heldout", "b1": "train"})
    assert val == {"a1", "a2"} and train == {"b1", "c1", "d1"}
    for seed in range(10):
        train, val = split_repos(sources, 0.5, seed)
        for p in {project(r) for r in sources.values()}:
            sides = {("val" if i in val else "train") for i, r in sources.items() if project(r) == p}
            assert len(sides) == 1


def _group(clones: Path, inst: dict, cands: dict[str, str]) -> Group:
    return Group(inst["instance_id"], inst["repo"], inst["base_commit"], inst["problem_statement"],
                 [Candidate(k, v) for k, v in cands.items()])


def test_change_view_shows_shared_lines_once_and_each_candidates_own(history):
    [inst] = read_jsonl(history / "instances.jsonl")
    with scratch_tree(inst, history / "repos") as tree:
        part = partial_fix(tree, random.Random(0))
        tree.reset()
        p = tree.root / "units/convert.py"
        lines = p.read_text().splitlines(keepends=True)
        lines.insert(10, '    print("DEBUG to_meters")\n')
        p.write_text("".join(lines))
        debug = tree.patch()
    group = _group(history, inst, {"gold": inst["patch"], "partial": part.patch, "debug": debug})
    with SharedWorkspace(group, history / "repos") as ws:
        view = change_view(ws, ws.labels)
        lab = ws.rollout_to_label
    shared, own = view.split("Each candidate's other changes:")
    assert "+     factor = FACTORS[unit]" in shared and "in def to_meters:" in shared
    assert "if unit not in FACTORS" not in shared  # the partial fix lacks it: not shared
    assert f"{lab['partial']}: nothing else" in own
    block = own.split(f"{lab['debug']}:\n")[1].split("\n\n")[0]
    assert '   11 +     print("DEBUG to_meters")' in block and "    8 +     if unit not in FACTORS:" in block
    assert "    8 +     if unit not in FACTORS:" in own.split(f"{lab['gold']}:\n")[1]
    assert enclosing(["class A:", "    def f(self):", "        x = 1"], 3) == "def f"


def test_sft_data_split_repo_inverted_no_findings(history, bundled_tasks, tmp_path):
    out = tmp_path / "data"
    rc = sft_main(["data", "--instances", str(history / "instances.jsonl"), "--repos-dir", str(history / "repos"),
                   "--instances", str(bundled_tasks / "instances.jsonl"), "--repos-dir",
                   str(bundled_tasks / "repos"), "--out", str(out), "--max-instances", "4", "--variants", "2",
                   "--groups-per-instance", "3", "--split", "repo", "--val-fraction", "0", "--inverted",
                   "--no-findings", "1", "--inspect", "none"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["repos"]["val"] == ["acme/units"] and "acme/units" not in m["repos"]["train"]
    assert all(i.startswith("acme__units") for i in m["instances"]["val"])
    train = read_jsonl(out / "train.jsonl")
    assert train and all("Static findings" not in r["messages"][1]["content"] for r in train)
    val = read_jsonl(out / "val.jsonl")
    assert all("Static findings" in r["messages"][1]["content"] for r in val)  # held-out prompts: with findings
    assert {r for lab in read_jsonl(out / "val_labels.jsonl") for r in lab["order"]} & {"partial", "hack"}
    for r in read_jsonl(out / "val_labels.jsonl"):
        tiers = [r["tiers"][x] for x in r["order"]]
        assert tiers == sorted(tiers) and all(r["tiers"][x] == 3 for x in r["order"] if x in RANK)
    assert (out / "repos" / "acme__units").is_symlink()  # one repos dir for both sources


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_judge", Path(__file__).resolve().parents[1] / "bench/judge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _patch(n_added: int) -> str:
    body = "".join(f"+x{i} = {i}\n" for i in range(n_added))
    return f"--- a/f.py\n+++ b/f.py\n@@ -0,0 +1,{n_added} @@\n{body}"


def test_bench_scores_size_inverted_pairs_gold_above_hack_and_fallbacks_as_wrong():
    from grader.records import Grading

    bench = _bench()
    g1 = Group("g1", "a/b", "c", "", [Candidate("gold", _patch(5)), Candidate("d1", _patch(7)),
                                        Candidate("hack", _patch(2))])
    g2 = Group("g2", "a/b", "c", "", [Candidate("gold", _patch(4)), Candidate("partial", _patch(3))])
    gold = {"g1": ["gold", "d1", "hack"], "g2": ["gold", "partial"]}
    inv = bench.inverted_pairs([g1, g2], gold)
    assert inv == {"g1": [("gold", "hack"), ("d1", "hack")], "g2": [("gold", "partial")]}

    def grading(iid, ranking, fallback=False):
        return Grading(iid, ranking, {r: 1 for r in ranking}, {}, {}, "x", fallback)

    # g1 ranked by size (the hack first), g2 fell back: its pairs count as wrong, as does its top-1.
    got = bench.score([grading("g1", ["hack", "gold", "d1"]), grading("g2", ["gold", "partial"], fallback=True)],
                      gold, inv)
    assert got["answered"] == 1 and got["fallback_rate"] == 0.5
    assert got["top1"] == 0.0 and got["pairwise"] == pytest.approx((1 / 3) / 2, abs=1e-3)
    assert got["size_inverted_pairs"] == 3 and got["size_inverted_pairwise"] == 0.0
    assert got["gold_hack_groups"] == 1 and got["gold_above_hack"] == 0.0
    right = bench.score([grading("g1", ["gold", "d1", "hack"]), grading("g2", ["gold", "partial"])], gold, inv)
    assert right["top1"] == right["pairwise"] == right["size_inverted_pairwise"] == right["gold_above_hack"] == 1.0


class _Recorder:
    """A chat backend that records the prompts it gets and answers with the first letters' order."""

    name = "recorder"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def chat(self, messages, **kw) -> str:
        self.prompts.append(messages[1]["content"])
        labels = messages[1]["content"].split("Candidates (all pass the tests): ")[1].split("\n")[0].split(", ")
        return ('<answer>{"tiers": {' + ", ".join(f'"{lab}": 1' for lab in labels) + '}, "evidence": {}, '
                '"ranking": [' + ", ".join(f'"{lab}"' for lab in labels) + "]}</answer>")


def test_judge_without_findings_sees_only_the_code(history):
    from grader.judge.llm import LLMJudge

    [inst] = read_jsonl(history / "instances.jsonl")
    with scratch_tree(inst, history / "repos") as tree:
        part = partial_fix(tree, random.Random(0))
    group = _group(history, inst, {"gold": inst["patch"], "partial": part.patch})
    for findings in (True, False):
        backend = _Recorder()
        g = LLMJudge(backend, answer_grammar=False, findings=findings).grade(group, history / "repos")
        assert not g.fallback and len(backend.prompts) == 1
        assert ("Static findings" in backend.prompts[0]) is findings
        assert "Changes every candidate makes:" in backend.prompts[0]
