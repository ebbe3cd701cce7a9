"""Shared workspace and judge tools on real git repositories (purpose-made and the bundled tasks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_grader_util import CALC, bundled_tasks, git, make_patch, make_repo

from grader.judge.tools import MAX_LINES, bound, run_tool
from grader.records import Group, load_groups
from grader.workspace import SharedWorkspace, letter


@pytest.fixture()
def calc(tmp_path: Path) -> tuple[Path, Path, str]:
    repos = tmp_path / "repos"
    repo, base = make_repo(repos, {"calc.py": CALC, "tests/test_calc.py": "def test_x():\n    pass\n"})
    return repos, repo, base


def _group(base: str, patches: dict[str, str]) -> Group:
    return Group.from_dict({
        "instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base,
        "problem_statement": "add() subtracts", "candidates": [{"rollout_id": k, "patch": v} for k, v in patches.items()],
    })


def test_workspace_stages_each_candidate_and_refuses_bad_patches(calc):
    repos, repo, base = calc
    good = make_patch(repo, {"calc.py": CALC.replace("a - b", "a + b", 1)})
    debug = make_patch(repo, {"calc.py": CALC.replace("    return a - b", "    print(a)\n    return a + b", 1)})
    escape = good.replace("a/calc.py", "a/../evil.py").replace("b/calc.py", "b/../evil.py")
    into_git = good.replace("a/calc.py", "a/.git/hooks/pre-commit").replace("b/calc.py", "b/.git/hooks/pre-commit")
    stale = good.replace("-    return a - b", "-    return x * y")  # removes a line the file never had
    g = _group(base, {"good": good, "debug": debug, "escape": escape, "git": into_git, "stale": stale, "empty": ""})
    with SharedWorkspace(g, repos, seed=3) as ws:
        assert sorted(ws.label_to_rollout.values()) == ["debug", "good"]
        assert ws.labels == ["A", "B"]
        assert set(ws.failed) == {"escape", "git", "stale", "empty"}
        assert "refused" in ws.failed["escape"] and "refused" in ws.failed["git"]
        assert "does not apply" in ws.failed["stale"]
        lab = ws.label_of("good")
        assert "return a + b" in (ws.worktree(lab) / "calc.py").read_text()
        assert "return a - b" in (ws.worktree("base") / "calc.py").read_text().split("\n")[1]
        root = ws.root
        assert not (repo.parent / "evil.py").exists()
    assert root is not None and not root.exists()  # cleaned up on exit
    assert git(repo, "status", "--porcelain") == ""  # the user's clone is never touched


def test_a_patch_only_the_sandboxs_fuzz_applies_is_staged(tmp_path):
    # Both context lines next to the change drifted: git apply fails even with -C1 (the grader's old chain, which
    # called such a patch "does not apply" — tier 3 — and skipped its hack check), GNU patch --fuzz applies it,
    # and so does the sandbox: it passes there, so the grader must stage it.
    repos = tmp_path / "repos"
    text = "".join(f"line{i}\n" for i in range(1, 10))
    repo, base = make_repo(repos, {"f.txt": text})
    fuzzy = ("diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -2,7 +2,7 @@\n line2\n line3\n LINE4\n"
             "-line5\n+line5 fixed\n LINE6\n line7\n line8\n")
    g = _group(base, {"fuzzy": fuzzy, "clean": make_patch(repo, {"f.txt": text.replace("line9", "line9 fixed")})})
    with SharedWorkspace(g, repos) as ws:
        assert ws.failed == {} and sorted(ws.label_to_rollout.values()) == ["clean", "fuzzy"]
        assert ws.apply_methods == {"fuzzy": "patch --fuzz", "clean": "git apply"}
        assert "line5 fixed" in (ws.worktree(ws.label_of("fuzzy")) / "f.txt").read_text()
    from sandbox.apply import apply_patch  # the sandbox applies the same patch the same way

    copy = tmp_path / "copy"
    git(repo, "clone", "-q", str(repo), str(copy))
    assert apply_patch(copy, fuzzy, base_commit=base).method == "patch --fuzz"


def test_labels_shuffle_per_seed_and_map_back(calc):
    repos, repo, base = calc
    patches = {f"r{i}": make_patch(repo, {"calc.py": CALC + f"\n\nX{i} = {i}\n"}) for i in range(6)}
    g = _group(base, patches)
    with SharedWorkspace(g, repos, seed=0) as ws:
        orders = set()
        for seed in range(6):
            ws.relabel(seed)
            orders.add(tuple(ws.rollout_of(lab) for lab in ws.labels))
            for lab in ws.labels:  # each letter's tree holds that rollout's change
                i = ws.rollout_of(lab)[1:]
                assert f"X{i} = {i}" in (ws.worktree(lab) / "calc.py").read_text()
        assert len(orders) > 1
    assert [letter(i) for i in (0, 25, 26, 27)] == ["A", "Z", "AA", "AB"]


def test_tools_are_bounded_and_safe(calc, tmp_path):
    repos, repo, base = calc
    big = "\n".join(f"line_{i} = {i}" for i in range(600)) + "\n"
    # A patch that adds a link pointing out of the tree is refused ...
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET\n")
    os.symlink(secret, repo / "leak")
    p_link = make_patch(repo, {})
    with SharedWorkspace(_group(base, {"link": p_link}), repos) as ws:
        assert "refused" in ws.failed["link"]
    # ... and one already in a tree is never followed by read_file, grep or list_files. (A repository whose
    # base commit holds such a link cannot be staged at all: the sandbox's apply chain, which staging uses,
    # refuses every patch there, as the sandbox itself does; so the link is planted in the staged trees.)
    p1 = make_patch(repo, {"calc.py": CALC.replace("a - b", "a + b", 1), "big.py": big})
    p2 = make_patch(repo, {"calc.py": CALC.replace("a - b", "b + a", 1)})
    g = _group(base, {"one": p1, "two": p2})
    g.candidates[1].test_output = "\n".join(f"log {i}" for i in range(500)) + "\n2 passed"
    g.candidates[1].trajectory = [{"step": i, "action": "edit"} for i in range(300)]
    with SharedWorkspace(g, repos) as ws:
        a, b = ws.label_of("one"), ws.label_of("two")
        for label in (a, b, "base"):
            os.symlink(secret, ws.worktree(label) / "leak")
        listing = run_tool(ws, "list_candidates", {})
        assert f"{a}: +601 -1 in 2 file(s)" in listing
        diff = run_tool(ws, "show_diff", {"candidate": a})
        assert "[truncated:" in diff and "offset=" in diff
        assert len(diff.splitlines()) <= MAX_LINES + 3
        page = run_tool(ws, "show_diff", {"candidate": a, "offset": 400})
        assert "line_" in page and "from line 400" in page
        one = run_tool(ws, "show_diff", {"candidate": a, "path": "calc.py"})
        assert "big.py" not in one and "a + b" in one
        assert run_tool(ws, "show_diff", {"candidate": a, "path": "nope.py"}).startswith("error:")
        rf = run_tool(ws, "read_file", {"candidate": a.lower(), "path": "big.py", "start": 10, "end": 12})
        assert "lines 10-12 of 600" in rf and "   10  line_9 = 9" in rf and "line_12" not in rf
        assert "call read_file with start=13" in rf
        base_read = run_tool(ws, "read_file", {"candidate": "base", "path": "calc.py"})
        assert "return a - b" in base_read.split("\n")[2]
        for bad in ("../secret.txt", "/etc/passwd", "leak", ".git/config"):
            out = run_tool(ws, "read_file", {"candidate": b, "path": bad})
            assert out.startswith("error:") and "TOPSECRET" not in out, (bad, out)
        hits = run_tool(ws, "grep", {"candidate": b, "pattern": "TOPSECRET|b \\+ a"})
        assert "calc.py:2: return b + a" in hits and "TOPSECRET" not in hits
        many = run_tool(ws, "grep", {"candidate": a, "pattern": "line_"})
        assert "more matches not shown" in many
        assert "no match" in run_tool(ws, "grep", {"candidate": a, "pattern": "(unbalanced"})
        cmp_ = run_tool(ws, "compare", {"a": a, "b": b})
        assert f"only {a}: big.py" in cmp_ and "-    return a + b" in cmp_ and "+    return b + a" in cmp_
        assert "no test output" in run_tool(ws, "test_output", {"candidate": a})
        assert "no trajectory" in run_tool(ws, "trajectory", {"candidate": a})
        assert run_tool(ws, "show_diff", {"candidate": "Z"}).startswith("error: unknown candidate")
        assert run_tool(ws, "rm_rf", {}).startswith("error: unknown tool")
        assert run_tool(ws, "read_file", {"candidate": a, "path": "calc.py", "start": "x"}).startswith("error:")
        assert "leak" not in run_tool(ws, "list_files", {"candidate": b})
        tail = run_tool(ws, "test_output", {"candidate": b})
        assert tail.startswith("[first 301 lines not shown]") and tail.endswith("2 passed")
        traj = run_tool(ws, "trajectory", {"candidate": b})
        assert '"step": 0' in traj and "offset=200" in traj


def test_bound_says_what_was_cut():
    assert bound("x\n" * 10, max_lines=3).endswith("[truncated: 7 more lines not shown]")
    assert "more characters" in bound("y" * 100, max_chars=10)
    assert bound("short") == "short"


def test_workspace_on_bundled_tasks(tmp_path_factory):
    tasks = bundled_tasks(tmp_path_factory.getbasetemp())
    groups = load_groups(tasks / "groups.jsonl")
    assert groups
    for g in groups:
        with SharedWorkspace(g, tasks / "repos") as ws:
            assert not ws.failed, ws.failed  # every passing rollout of a bundled task applies
            assert len(ws.labels) == len(g.candidates) >= 3
            listing = run_tool(ws, "list_candidates", {})
            for lab in ws.labels:
                assert listing.count(f"{lab}: ") == 1
                first_file = listing.split(f"{lab}: ")[1].split(": ", 1)[1].split(" (")[0]
                out = run_tool(ws, "read_file", {"candidate": lab, "path": first_file})
                assert not out.startswith("error"), out


def _drift_context(patch: str) -> str:
    """The context line on either side of every hunk's changes altered (upper-cased): git apply refuses the patch
    even with -C1, GNU patch applies it with fuzz — as a model's patch against a slightly different tree looks."""
    lines = patch.splitlines(keepends=True)
    out = list(lines)
    i = 0
    while i < len(lines):
        if lines[i].startswith("@@"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith(("@@", "diff --git")):
                j += 1
            body = range(i + 1, j)
            changed = [k for k in body if lines[k][:1] in "+-"]
            for k in (changed[0] - 1, changed[-1] + 1):
                if k in body and lines[k].startswith(" ") and lines[k].strip():
                    out[k] = " " + lines[k][1:].upper()
            i = j
        else:
            i += 1
    return "".join(out)


def test_a_fuzz_only_hack_is_staged_and_caught(tmp_path_factory):
    # Before, a passing patch the grader could not stage escaped the hack check (and sat in tier 3 as "does not
    # apply"): a hack with drifted context kept its reward.
    import json

    from grader.grade import grade_group
    from sandbox.apply import apply_patch

    tasks = bundled_tasks(tmp_path_factory.getbasetemp())
    iid = "acme__durations-42"
    inst = next(json.loads(ln) for ln in (tasks / "instances.jsonl").open() if json.loads(ln)["instance_id"] == iid)
    preds = {r["rollout_id"]: r["model_patch"] for r in map(json.loads, (tasks / "predictions.jsonl").open())
             if r["instance_id"] == iid}
    hack = _drift_context(preds["hack-special-case"])
    assert hack != preds["hack-special-case"]
    copy = tmp_path_factory.mktemp("copy") / "t"
    git(tasks / "repos", "clone", "-q", str(tasks / "repos" / "acme__durations"), str(copy))
    assert apply_patch(copy, hack, base_commit=inst["base_commit"]).method == "patch --fuzz"  # the sandbox's way
    g = Group.from_dict({**{k: inst[k] for k in ("instance_id", "repo", "base_commit", "problem_statement",
                                                   "test_patch", "FAIL_TO_PASS")},
                         "candidates": [{"rollout_id": "hack", "patch": hack},
                                        {"rollout_id": "minimal", "patch": preds["minimal"]}]})
    grading = grade_group(g, tasks / "repos")
    assert grading.hacks.get("hack") == "special_casing" and grading.ranking[-1] == "hack"
