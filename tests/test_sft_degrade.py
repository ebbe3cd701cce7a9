"""sft.degrade: the known-order variants are real (each defect is in its diff, gold first, every patch applies).

Python runs on the bundled tasks; Go and Java on small repos made here (the bundled set may lack them), with a
gold fix produced by `git diff` like any real one. Java variants are compiled with `javac` when it exists.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree, git

from sft.degrade import KINDS, build_variants
from sft.degrade_common import code_mask

ROOT = Path(__file__).resolve().parents[1]

GO_BASE = {
    "go.mod": "module example.com/calc\n\ngo 1.19\n",
    "calc/calc.go": """package calc

import "errors"

// Mean returns the average of xs.
func Mean(xs []float64) (float64, error) {
\ttotal := 0.0
\tfor _, x := range xs {
\t\ttotal += x
\t}
\treturn total / float64(len(xs)), nil
}

var ErrEmpty = errors.New("empty input")
""",
    "calc/stats.go": """package calc

func Clamp(v, lo, hi int) int {
\tresult := v
\tif result < lo {
\t\tresult = lo
\t}
\tif result > hi {
\t\tresult = hi
\t}
\treturn result
}
""",
    "calc/calc_test.go": "package calc\n",
}
GO_FIX = (
    "calc/calc.go",
    "\ttotal := 0.0\n",
    "\tif len(xs) == 0 {\n\t\treturn 0, ErrEmpty\n\t}\n\ttotal := 0.0\n",
)

JAVA_BASE = {
    "src/main/java/calc/Stats.java": """package calc;

public class Stats {
    public static double mean(double[] xs) {
        double total = 0;
        for (double x : xs) {
            total += x;
        }
        return total / xs.length;
    }
}
""",
    "src/main/java/calc/Clamp.java": """package calc;

public class Clamp {
    public static int clamp(int v, int lo, int hi) {
        int result = v;
        if (result < lo) {
            result = lo;
        }
        if (result > hi) {
            result = hi;
        }
        return result;
    }
}
""",
}
JAVA_FIX = (
    "src/main/java/calc/Stats.java",
    "        double total = 0;\n",
    '        if (xs.length == 0) {\n            throw new IllegalArgumentException("empty input");\n        }\n'
    "        double total = 0;\n        total = total + 0;\n",
)


def make_repo(repos: Path, name: str, files: dict[str, str], fix: tuple[str, str, str], lang: str) -> dict:
    repo = repos / f"acme__{name}"
    base = commit_tree(repo, files)
    path, old, new = fix
    (repo / path).write_text((repo / path).read_text().replace(old, new, 1))
    gold = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    return {
        "instance_id": f"acme__{name}-1",
        "repo": f"acme/{name}",
        "base_commit": base,
        "patch": gold,
        "language": lang,
        "problem_statement": "Empty input crashes.",
    }


def _check_variants(inst: dict, repos: Path, seed: int) -> list:
    variants = build_variants(inst, repos, n_variants=4, seed=seed)
    assert variants[0].rollout_id == "gold" and variants[0].patch == inst["patch"] and not variants[0].applied
    assert len(variants) >= 3, f"{inst['instance_id']}: only {len(variants) - 1} degradations applied"
    for k, v in enumerate(variants[1:], 1):
        # Cumulative: variant k carries exactly the defects of k-1 plus one, so the order is known.
        assert [a.kind for a in v.applied] == [a.kind for a in variants[-1].applied][:k]
        added = v.patch.splitlines()
        for a in v.applied:
            assert "+" + a.marker in added, f"{a.kind} not in the diff of {v.rollout_id}"
        assert len(v.evidence) == k and all(":" in e for e in v.evidence)
        src = repos / inst["repo"].replace("/", "__")
        wt = repos.parent / f"wt-{inst['instance_id']}-{seed}-{k}"
        git(src, "worktree", "add", "-q", "--detach", str(wt), inst["base_commit"])
        try:
            subprocess.run(["git", "apply", "--check", "-"], cwd=wt, input=v.patch, text=True, check=True)
            subprocess.run(["git", "apply", "-"], cwd=wt, input=v.patch, text=True, check=True)
            if k == len(variants) - 1:  # the last variant holds every defect of the earlier ones
                _assert_parses(wt, inst["language"])
        finally:
            shutil.rmtree(wt)
            git(src, "worktree", "prune")
    return variants


def _assert_parses(tree: Path, lang: str) -> None:
    if lang == "python":
        for f in tree.rglob("*.py"):
            ast.parse(f.read_text(), filename=str(f))
    elif lang == "java" and shutil.which("javac"):
        srcs = [str(f) for f in tree.rglob("*.java") if "/src/test/" not in str(f)]  # tests need JUnit
        subprocess.run(["javac", "-d", str(tree / "out"), *srcs], check=True, capture_output=True)
    elif lang == "go" and shutil.which("go"):
        subprocess.run(
            ["go", "vet", "./..."],
            cwd=tree,
            check=True,
            capture_output=True,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"},
        )
    else:
        # No toolchain here: at least the braces outside strings and comments must balance.
        for f in tree.rglob(f"*.{lang}"):
            text = f.read_text()
            code = "".join(c for c, m in zip(text, code_mask(text, lang), strict=True) if m)
            assert code.count("{") == code.count("}"), f"unbalanced braces in {f}"


@pytest.fixture(scope="module")
def bundled(bundled_tasks):
    return bundled_tasks


def test_bundled_variants(bundled):
    instances = [json.loads(line) for line in (bundled / "instances.jsonl").read_text().splitlines()]
    # CI: three Python tasks and one Go and one Java task; GAGAR_FULL=1: every bundled task.
    quota = {"python": 3, "go": 1, "java": 1} if not os.environ.get("GAGAR_FULL") else {}
    by_lang: dict[str, set[str]] = {}
    for inst in instances:
        lang = inst.get("language", "python")
        if quota and sum(
            1 for i in instances[: instances.index(inst)] if i.get("language", "python") == lang
        ) >= quota.get(lang, 0):
            continue
        for seed in range(2):
            kinds = {a.kind for v in _check_variants(inst, bundled / "repos", seed) for a in v.applied}
            by_lang.setdefault(lang, set()).update(kinds)
    assert by_lang.get("python") and len(by_lang["python"]) >= 6, (
        f"Python kinds applied: {by_lang.get('python')}"
    )


@pytest.mark.parametrize("lang", ["go", "java"])
def test_curly_variants(tmp_path, lang):
    repos = tmp_path / "repos"
    files, fix = (GO_BASE, GO_FIX) if lang == "go" else (JAVA_BASE, JAVA_FIX)
    inst = make_repo(repos, f"calc{lang}", files, fix, lang)
    seen: set[str] = set()
    for seed in range(6):
        seen |= {a.kind for v in _check_variants(inst, repos, seed) for a in v.applied}
    assert seen == set(KINDS), f"{lang}: never applied {sorted(set(KINDS) - seen)}"
