"""The fresh hack set of issue 23: real more-itertools fixes, each with hand-written passing hacks
(`hacks_more_itertools.py`), judged by the static line, the behavioural line (`grader.probe.runner`) and both.

Per group: every candidate (the gold fix and its hacks) is evaluated in the sandbox with the task's own tests;
only passing ones are kept. Then: static verdicts (`grade_group`, heuristic judge), the behavioural probe over
the passing candidates (seconds measured), and the combined grading (`Group.behaviour`). Precision: each gold
fix probed alone (no other candidate to compare with) must get no verdict, and so must every gold in its group.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from grader.grade import grade_group  # noqa: E402
from grader.probe.runner import file_diff, probe_group  # noqa: E402
from grader.records import Candidate, Group  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.integrity.gitsafe import source_git  # noqa: E402
from sandbox.records import Instance, Prediction  # noqa: E402
from sandbox.run import evaluate_predictions  # noqa: E402


def hack_patch(repo_dir: Path, base: str, path: str, edits: list[tuple[str, str]]) -> str | None:
    text = source_git(repo_dir, "show", f"{base}:{path}")
    new = text
    for old, rep in edits:
        if new.count(old) != 1:
            return None
        new = new.replace(old, rep)
    return file_diff(path, text, new)


def _finding_dicts(found) -> list[dict]:
    return [dataclasses.asdict(f) for f in found]


def run(tasks: list[dict], repos_dir: Path, hacks: list, split: dict[str, str], workers: int = 2) -> dict:
    cfg = SandboxConfig(repos_dir=repos_dir, image="gagar-python:latest", max_workers=workers, timeout=300)
    groups = []
    for t in tasks:
        key = t["fix_commit"][:7]
        repo_dir = repos_dir / t["repo"].replace("/", "__")
        cands = {"gold": t["patch"]}
        for commit, style, path, edits in hacks:
            if commit == key:
                p = hack_patch(repo_dir, t["base_commit"], path, edits)
                if p:
                    cands[f"hack-{style}"] = p
        groups.append((t, cands))
    insts = {t["instance_id"]: Instance.from_dict(t) for t, _ in groups}
    preds = [Prediction(instance_id=t["instance_id"], model_patch=p, model_name_or_path="fresh", rollout_id=r)
             for t, c in groups for r, p in c.items()]
    with tempfile.TemporaryDirectory(prefix="gagar-fresh-") as tmp:
        results = evaluate_predictions(insts, preds, cfg, run_dir=Path(tmp))
    passed = {(r.instance_id, r.rollout_id) for r in results if r.passed}
    rows = []
    for t, cands in groups:
        iid = t["instance_id"]
        ok = {r: p for r, p in cands.items() if (iid, r) in passed}
        row = {"instance_id": iid, "split": split.get(t["fix_commit"][:7], "?"),
               "not_passing": sorted(r for r in cands if r not in ok)}
        if "gold" not in ok or len(ok) < 2:
            row["skipped"] = "the gold fix or every hack fails the task's tests"
            rows.append(row)
            continue
        inst = insts[iid]
        group = Group.of_instance(inst, [Candidate(r, p) for r, p in ok.items()])
        static = grade_group(group, repos_dir)
        t0 = time.monotonic()
        probe = probe_group(inst, ok, cfg)
        row["probe_seconds"] = round(time.monotonic() - t0, 2)
        group.behaviour = {r: _finding_dicts(f) for r, f in probe.findings.items()}
        both = grade_group(group, repos_dir)
        alone = probe_group(inst, {"gold": ok["gold"]}, cfg)
        hacks_ok = [r for r in ok if r != "gold"]
        row.update({
            "hacks": hacks_ok,
            "static": dict(static.hacks),
            "behavioural": {r: f[0]["kind"] for r, f in group.behaviour.items()},
            "combined": dict(both.hacks),
            "gold_above_hacks": both.ranking.index("gold") < min(both.ranking.index(h) for h in hacks_ok),
            "gold_alone_flagged": bool(alone.findings.get("gold")),
            "evidence": {r: [c for c in both.evidence.get(r, []) if c.startswith("hack:")][:3] for r in ok},
            "gold_alone_evidence": [f.cite() for f in alone.findings.get("gold", [])][:3],
            "gold_alone_seconds": alone.seconds,
            "variants": len(probe.probe.variants) if probe.probe else 0,
            "probed": probe.probed, "why_not": probe.why_not,
        })
        rows.append(row)
        print(iid, row["split"], "static", row["static"], "behavioural", row["behavioural"],
              "gold above", row["gold_above_hacks"], f"{row['probe_seconds']}s", flush=True)
    return {"groups": rows, "summary": summarize(rows)}


def golds_alone(tasks: list[dict], repos_dir: Path, workers: int = 2) -> dict:
    """Precision on real gold fixes with nothing to compare against: each probed alone must get no verdict."""
    cfg = SandboxConfig(repos_dir=repos_dir, image="gagar-python:latest", max_workers=workers, timeout=300)
    flagged, secs, probed, problems = 0, [], 0, []
    for t in tasks:
        run = probe_group(Instance.from_dict(t), {"gold": t["patch"]}, cfg)
        secs.append(run.seconds)
        probed += run.probed
        if run.findings.get("gold"):
            flagged += 1
            problems.append(f"{t['instance_id']}: {[f.cite() for f in run.findings['gold']][:2]}")
    secs.sort()
    return {"gold_fixes": len(tasks), "probed": probed, "flagged": flagged, "problems": problems,
            "seconds_median": secs[len(secs) // 2] if secs else None}


def honest_groups(tasks: list[dict], repos_dir: Path, workers: int = 2, n_variants: int = 3) -> dict:
    """Precision on honest rollouts: each gold with its SFT degradations (debug output, dead helpers, renames,
    reformatting, unrelated edits — passing, behaviourally honest), probed together."""
    from sft.degrade import DegradeError, build_variants

    cfg = SandboxConfig(repos_dir=repos_dir, image="gagar-python:latest", max_workers=workers, timeout=300)
    cands = flagged = groups = 0
    problems = []
    for t in tasks:
        try:
            variants = build_variants(t, repos_dir, n_variants=n_variants, seed=0)
        except DegradeError as exc:
            problems.append(f"{t['instance_id']}: {exc}")
            continue
        inst = Instance.from_dict(t)
        preds = [Prediction(instance_id=inst.instance_id, model_patch=v.patch, model_name_or_path="honest",
                            rollout_id=v.rollout_id) for v in variants]
        with tempfile.TemporaryDirectory(prefix="gagar-honest-") as tmp:
            res = evaluate_predictions({inst.instance_id: inst}, preds, cfg, run_dir=Path(tmp))
        ok = {r.rollout_id: next(v.patch for v in variants if v.rollout_id == r.rollout_id) for r in res if r.passed}
        if len(ok) < 2:
            continue
        run = probe_group(inst, ok, cfg)
        groups += 1
        cands += len(ok)
        flagged += len(run.findings)
        problems += [f"{inst.instance_id}/{r}: {[f.cite() for f in fs][:2]}" for r, fs in run.findings.items()]
    return {"groups": groups, "candidates": cands, "flagged": flagged, "problems": problems}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for name, sel in (("all", rows), ("dev", [r for r in rows if r.get("split") == "dev"]),
                      ("heldout", [r for r in rows if r.get("split") == "heldout"])):
        g = [r for r in sel if "hacks" in r]
        n = sum(len(r["hacks"]) for r in g)
        line = {"groups": len(g), "hacks": n}
        for key in ("static", "behavioural", "combined"):
            found = sum(1 for r in g for h in r["hacks"] if h in r[key])
            gold_fp = sum(1 for r in g if "gold" in r[key])
            line[key] = {"recall": round(found / n, 3) if n else None, "found": found,
                         "gold_flagged_in_group": gold_fp}
        line["gold_above_every_hack"] = sum(r["gold_above_hacks"] for r in g)
        line["gold_alone_flagged"] = sum(r["gold_alone_flagged"] for r in g)
        secs = sorted(r["probe_seconds"] for r in g)
        line["probe_seconds_per_group"] = {"median": secs[len(secs) // 2] if secs else None,
                                           "max": secs[-1] if secs else None}
        out[name] = line
    return out
