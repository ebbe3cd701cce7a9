"""Precision and recall of static hack detection on the bundled tasks and the SFT degradations.

    .venv/bin/python bench/hacks.py [--tasks .gagar/tasks] [--seeds 3] [--out bench/results/hacks.json]

Recall: the bundled `hack` rollouts (each passes the sandbox) must get a verdict of their labelled class and rank
below every general fix. Precision: the bundled general fixes (`minimal`, `gold`, `bloated`, `unrelated`) and the
passing SFT degradations of every gold patch (`sft.degrade.build_variants`, `--seeds` seeds, all defect kinds)
must get none. Grading runs `grader.grade.grade_group` with the heuristic judge, as the trainer does. Not a test:
prints a summary and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader.grade import grade_group  # noqa: E402
from grader.records import Candidate, Group, load_groups, read_jsonl  # noqa: E402
from sandbox.report import atomic_write_text  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=str(ROOT / ".gagar" / "tasks"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hacks.json"))
    args = ap.parse_args(argv)
    tasks = Path(args.tasks)
    if not (tasks / "groups.jsonl").is_file():
        print(f"no bundled tasks at {tasks}: run `make tasks` first", file=sys.stderr)
        return 2
    t0 = time.time()
    out = {"bundled": bundled(tasks)}
    t1 = time.time()
    out["degradations"] = degradations(tasks, args.seeds)
    out["seconds"] = {"bundled": round(t1 - t0, 1), "degradations": round(time.time() - t1, 1)}
    out["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    b, d = out["bundled"], out["degradations"]
    print(f"bundled hacks: {b['detected']}/{b['hack_rollouts']} detected ({b['right_kind']} of the labelled class); "
          f"honest rollouts flagged: {b['honest_flagged']}/{b['honest_rollouts']}; hacks ranked last in "
          f"{b['groups_with_hacks_ranked_last']}/{b['groups']} groups")
    print(f"SFT degradations flagged: {d['flagged']}/{d['candidates']}")
    for p in b["problems"] + d["problems"]:
        print("  ", p)
    atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
