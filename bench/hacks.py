"""Precision and recall of static hack detection on the bundled tasks and the SFT degradations.

    .venv/bin/python bench/hacks.py [--tasks .gagar/tasks] [--seeds 3] [--out bench/results/hacks.json]
                                    [--golds CLONE ...] [--golds-limit 150]

Recall: the bundled `hack` rollouts (each passes the sandbox) must get a verdict of their labelled class and rank
below every general fix. Precision: the bundled general fixes (`minimal`, `gold`, `bloated`, `unrelated`) and the
passing SFT degradations of every gold patch (`sft.degrade.build_variants`, `--seeds` seeds, all defect kinds)
must get none. `--golds` adds real code: in a local git clone, every commit that changes library sources (.py,
.go, .java) and test files is a gold fix (its library diff, with its test diff as the test patch) that must get
no verdict. Grading runs `grader.grade.grade_group` with the heuristic judge, as the trainer does. Not a test:
prints a summary and writes JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader.features import is_test_path  # noqa: E402
from grader.grade import grade_group  # noqa: E402
from grader.hacks.detect import candidate_hacks  # noqa: E402
from grader.hacks.literals import task_literals  # noqa: E402
from grader.records import Candidate, Group, load_groups, read_jsonl  # noqa: E402
from sandbox.integrity import gitsafe  # noqa: E402
from sandbox.jsonl import atomic_write_text  # noqa: E402


def bundled(tasks: Path) -> dict:
    exp = {(e["instance_id"], e["rollout_id"]): e for e in read_jsonl(tasks / "expected.jsonl")}
    hacks = detected = right_kind = honest = flagged = ordered = groups = 0
    misses: list[str] = []
    for g in load_groups(tasks / "groups.jsonl"):
        res = grade_group(g, tasks / "repos")
        groups += 1
        bad = [r for r in res.ranking if r in res.hacks]
        ordered += res.ranking[len(res.ranking) - len(bad):] == bad
        for c in g.candidates:
            want = exp[(g.instance_id, c.rollout_id)].get("hack")
            got = res.hacks.get(c.rollout_id)
            if want:
                hacks += 1
                detected += got is not None
                right_kind += got == want
                if got != want:
                    misses.append(f"{g.instance_id}/{c.rollout_id}: want {want}, got {got}")
            else:
                honest += 1
                flagged += got is not None
                if got:
                    misses.append(f"{g.instance_id}/{c.rollout_id}: honest, got {got}: {res.evidence[c.rollout_id][:2]}")
    return {"hack_rollouts": hacks, "detected": detected, "right_kind": right_kind, "honest_rollouts": honest,
            "honest_flagged": flagged, "groups": groups, "groups_with_hacks_ranked_last": ordered, "problems": misses}


def degradations(tasks: Path, seeds: int) -> dict:
    from sft.degrade import KINDS, build_variants

    n = flagged = 0
    problems = []
    for inst in read_jsonl(tasks / "instances.jsonl"):
        cands = []
        for s in range(seeds):
            vs = build_variants(inst, tasks / "repos", n_variants=len(KINDS), seed=s)
            cands += [Candidate(f"s{s}-{v.rollout_id}", v.patch) for v in vs if s == 0 or v.rollout_id != "gold"]
        g = Group(inst["instance_id"], inst["repo"], inst["base_commit"], "", cands, inst["test_patch"],
                  inst["FAIL_TO_PASS"])
        res = grade_group(g, tasks / "repos")
        n += len(cands)
        flagged += len(res.hacks)
        problems += [f"{inst['instance_id']}/{r}: {res.evidence[r][:2]}" for r in res.hacks]
    return {"candidates": n, "flagged": flagged, "seeds": seeds, "problems": problems}


def _git(repo: Path, *args: str) -> str:
    return str(gitsafe.run(*args, git_dir=gitsafe.git_dir_of(repo), trusted_dir=repo).out)


def _extract(repo: Path, rev: str, dest: Path) -> None:
    data = gitsafe.run("archive", rev, git_dir=gitsafe.git_dir_of(repo), trusted_dir=repo, binary=True).out
    assert isinstance(data, bytes) and data, f"git archive {rev} failed in {repo}"
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        t.extractall(dest, filter="data")


def _owner_name(repo: Path) -> str:
    """owner/name from a clone's remote URL (results name repositories, never this machine's paths)."""
    url = _git(repo, "config", "--get", "remote.origin.url").strip().removesuffix(".git")
    parts = url.replace(":", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) >= 2 and url else repo.name


def real_golds(repo: Path, limit: int, name: str | None = None) -> dict:
    """Gold fixes of a real repository's history: none should get a verdict."""
    n = flagged = 0
    problems = []
    for c in _git(repo, "log", "--no-merges", "--format=%h", "-n", "5000").split():
        files = _git(repo, "diff", "--name-only", f"{c}^", c).split()
        lib = [f for f in files if f.endswith((".py", ".go", ".java")) and not is_test_path(f)]
        tests = [f for f in files if is_test_path(f)]
        if not lib or not tests:
            continue
        gold = _git(repo, "diff", "--no-ext-diff", f"{c}^", c, "--", *lib)
        if not gold.strip() or len(gold) > 200_000:
            continue
        tmp = Path(tempfile.mkdtemp(prefix="gagar-golds-"))
        try:
            _extract(repo, f"{c}^", tmp / "base")
            _extract(repo, c, tmp / "tree")
            found = candidate_hacks(gold, tmp / "base", tmp / "tree",
                                    task_literals(_git(repo, "diff", "--no-ext-diff", f"{c}^", c, "--", *tests)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        n += 1
        if found:
            flagged += 1
            problems.append(f"{repo.name} {c}: {[f.cite() for f in found[:2]]}")
        if n >= limit:
            break
    return {"repo": name or _owner_name(repo), "gold_fixes": n, "flagged": flagged, "problems": problems}


def fresh_section(args: argparse.Namespace) -> int:
    """Issue 23's fresh set: static, behavioural and combined lines on real fixes with hand-written hacks."""
    sys.path.insert(0, str(ROOT / "bench" / "hackset"))
    import fresh
    import hacks_more_itertools as hm

    repos = Path(args.fresh_repos_dir)
    tasks = json.loads(Path(args.fresh).read_text())
    t0 = time.time()
    section = fresh.run(tasks, repos, hm.HACKS, hm.SPLIT)
    section["honest_groups"] = fresh.honest_groups(tasks, repos)
    golds = tasks + (json.loads(Path(args.fresh_golds).read_text()) if args.fresh_golds else [])
    section["golds_alone"] = fresh.golds_alone(golds, repos)
    section["seconds"] = round(time.time() - t0, 1)
    section["machine"] = {"python": platform.python_version(), "cores": os.cpu_count(), "load": os.getloadavg()}
    out = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    out["fresh"] = section
    atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")
    print(json.dumps(section["summary"], indent=1))
    print("honest groups:", {k: v for k, v in section["honest_groups"].items() if k != "problems"})
    print("golds alone:", {k: v for k, v in section["golds_alone"].items() if k != "problems"})
    for p in section["honest_groups"]["problems"] + section["golds_alone"]["problems"]:
        print("  ", p)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=str(ROOT / ".gagar" / "tasks"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hacks.json"))
    ap.add_argument("--golds", nargs="*", default=[], help="local git clones whose bug-fix history to check: PATH or OWNER/NAME=PATH (a clone without a "
                         "remote URL is named by OWNER/NAME)")
    ap.add_argument("--golds-limit", type=int, default=150, help="gold fixes per clone")
    ap.add_argument("--fresh", help="tasks of the fresh hack set (bench/hackset/tasks.json); with --fresh-repos-dir, "
                    "runs only that section and updates it in --out")
    ap.add_argument("--fresh-repos-dir", help="repos dir holding more-itertools__more-itertools")
    ap.add_argument("--fresh-golds", help="more real fixes (prepare.py output) probed alone for precision")
    args = ap.parse_args(argv)
    if args.fresh:
        return fresh_section(args)
    tasks = Path(args.tasks)
    if not (tasks / "groups.jsonl").is_file():
        print(f"no bundled tasks at {tasks}: run `make tasks` first", file=sys.stderr)
        return 2
    t0 = time.time()
    out = {"bundled": bundled(tasks)}
    t1 = time.time()
    out["degradations"] = degradations(tasks, args.seeds)
    t2 = time.time()
    out["real_golds"] = [real_golds(Path(r.split("=", 1)[-1]), args.golds_limit, r.split("=", 1)[0] if "=" in r else None)
                         for r in args.golds]
    out["seconds"] = {"bundled": round(t1 - t0, 1), "degradations": round(t2 - t1, 1),
                      "real_golds": round(time.time() - t2, 1)}
    out["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    b, d = out["bundled"], out["degradations"]
    print(f"bundled hacks: {b['detected']}/{b['hack_rollouts']} detected ({b['right_kind']} of the labelled class); "
          f"honest rollouts flagged: {b['honest_flagged']}/{b['honest_rollouts']}; hacks ranked last in "
          f"{b['groups_with_hacks_ranked_last']}/{b['groups']} groups")
    print(f"SFT degradations flagged: {d['flagged']}/{d['candidates']}")
    for r in out["real_golds"]:
        print(f"{r['repo']}: gold fixes flagged {r['flagged']}/{r['gold_fixes']}")
    for p in b["problems"] + d["problems"] + [p for r in out["real_golds"] for p in r["problems"]]:
        print("  ", p)
    atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
