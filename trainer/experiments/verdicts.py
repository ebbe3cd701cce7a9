"""A cache of real sandbox verdicts and real grader rankings for the bundled rollouts.

The bloat experiment samples thousands of rollouts from a policy over each bundled task's real patches. Running
the sandbox for each sample would take hours, yet a patch's verdict does not change between samples, so this
module runs every bundled rollout through `sandbox.run.evaluate_predictions` once and records, per patch hash,
the verdict and the diff size. The grader's ranking depends on which passing patches share a group, so it is
run (the real heuristic ranker, `grader.grade.grade_groups`) on every subset of a task's sandbox-passing patches
that a sampled group can contain, and stored too. A run then needs neither Docker nor the repositories.

What a patch earns is the trainer's verdict, by the trainer's own code: the sandbox's `EvalResult`, then the
model-free hack check on the task's sandbox-passing patches (`trainer.judging.Judge.check`, as the loop runs it
on every group with a pass), then `grader.records.passes` — so a hack the grader finds earns 0 here as in
training (it used to keep reward 1 and a positive advantage).

File format (`format` = FORMAT):
  tasks: [{instance_id, repo, candidates: [{rollout_id, patch_hash, kind, quality_rank}],
           gradings: {"<sorted sandbox-passing rollout ids joined by ','>": {ranking, tiers, weights, fallback,
                                                                              hacks}}}]
  patches: {patch_hash: {status, resolved, tampered_tests, suspicious_report, sandbox_passed (EvalResult.passed),
                         grader_hack (kind or null), passed (grader.records.passes), reward (1.0 iff passed),
                         tests_passed, tests_total, diff_lines, files_changed}}
           (patch_hash: of the instance id and the patch, see `patch_hash`)
  source: where the verdicts came from (sandbox run, grader, task files' hashes).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox.jsonl import JsonlError, atomic_write_text, read_jsonl
from sandbox.report import file_sha256

FORMAT = "gagar-experiment-verdicts/3"  # /3: grader hacks fail, as in the trainer
# 2**k - 1 subsets get graded per task; past this many passing patches that stops being "fast".
MAX_PASSING = 10


class VerdictError(ValueError):
    """Unusable task files or verdict cache (the CLI reports it and exits 2)."""


def patch_hash(instance_id: str, patch: str) -> str:
    """The cache key of a patch: a verdict belongs to the patch *and* the task it was applied to."""
    text = f"{instance_id}\0{patch}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def diff_size(patch: str) -> tuple[int, int]:
    """(changed lines = added + removed, files changed) of a unified diff; (0, 0) when unparsable."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        ps = PatchSet(patch)
    except (UnidiffParseError, ValueError):
        return 0, 0
    return sum(f.added + f.removed for f in ps), len(ps)


def subset_key(rollout_ids: list[str] | set[str]) -> str:
    return ",".join(sorted(rollout_ids))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise VerdictError(f"{path} not found: build the bundled tasks first "
                           f"(`.venv/bin/python examples/build_tasks.py --out {path.parent}`)")
    try:
        return read_jsonl(path)
    except JsonlError as exc:
        raise VerdictError(str(exc)) from exc


def write_json_atomic(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def file_digest(path: Path) -> str:
    return file_sha256(path)[:16]  # a short cache version, not an integrity check


def _verdict(result: Any, patch: str, check: Any) -> dict[str, Any]:
    """One patch's record; `check` is the hack check's `Grading` of the task's sandbox-passing patches."""
    from grader.records import passes

    ts = result.tests_status
    ok = len(ts.FAIL_TO_PASS["success"]) + len(ts.PASS_TO_PASS["success"])
    total = ok + len(ts.FAIL_TO_PASS["failure"]) + len(ts.PASS_TO_PASS["failure"])
    lines, files = diff_size(patch)
    passed = passes(result, check)  # the trainer's definition: sandbox passed and no grader hack
    return {
        "status": result.status,
        "resolved": bool(result.resolved),
        "tampered_tests": bool(result.tampered_tests),
        "suspicious_report": bool(result.suspicious_report),
        "sandbox_passed": bool(result.passed),
        "grader_hack": (check.hacks.get(result.rollout_id) if check is not None else None),
        "passed": bool(passed),
        "reward": 1.0 if passed else 0.0,
        "tests_passed": ok,
        "tests_total": total,
        "diff_lines": lines,
        "files_changed": files,
    }


def grade_subsets(instance: Any, passing: list[dict[str, Any]], repos_dir: Path) -> dict[str, Any]:
    """Run the real heuristic grader on every non-empty subset of a task's passing candidates (grader groups
    built with `Group.of_instance`, so each carries the task's test patch the hack detector reads)."""
    from grader.grade import grade_groups
    from grader.records import Candidate, Group

    if len(passing) > MAX_PASSING:
        raise VerdictError(f"{instance.instance_id}: {len(passing)} passing patches; at most {MAX_PASSING} "
                           "are supported (every subset is graded)")
    commas = [c["rollout_id"] for c in passing if "," in c["rollout_id"]]
    if commas:
        raise VerdictError(f"{instance.instance_id}: rollout id(s) {commas} contain ',', which the cache uses "
                           "to join a subset's ids; rename them")
    groups = [Group.of_instance(instance, [Candidate(c["rollout_id"], c["patch"]) for c in combo])
              for k in range(1, len(passing) + 1) for combo in itertools.combinations(passing, k)]
    gradings = grade_groups(groups, repos_dir, judge="heuristic")
    out = {}
    for group, g in zip(groups, gradings, strict=True):
        out[subset_key([c.rollout_id for c in group.candidates])] = {
            "ranking": list(g.ranking),
            "tiers": {str(k): int(v) for k, v in g.tiers.items()},
            "weights": {str(k): float(v) for k, v in g.weights.items()},
            "fallback": bool(g.fallback),
            "hacks": dict(g.hacks),
        }
    return out


def build_verdicts(tasks_dir: Path, *, run_dir: Path | None = None, max_workers: int = 1,
                   timeout: float = 600.0, progress: bool = False, redo: bool = False,
                   instance_ids: list[str] | None = None) -> dict[str, Any]:
    """Evaluate every bundled rollout in the sandbox and grade its passing subsets; returns the cache dict.

    `run_dir` keeps the sandbox's results and logs (and lets an interrupted build resume); `redo` re-runs
    finished predictions there. `instance_ids` restricts the run to those tasks (tests use one to stay fast).
    """
    from sandbox.config import SandboxConfig
    from sandbox.records import Instance, Prediction
    from sandbox.run import evaluate_predictions

    tasks_dir = Path(tasks_dir)
    repos_dir = tasks_dir / "repos"
    inst_rows = _read_jsonl(tasks_dir / "instances.jsonl")
    pred_rows = _read_jsonl(tasks_dir / "predictions.jsonl")
    expected = {(r["instance_id"], str(r["rollout_id"])): r for r in _read_jsonl(tasks_dir / "expected.jsonl")}
    if instance_ids is not None:
        unknown = sorted(set(instance_ids) - {r["instance_id"] for r in inst_rows})
        if unknown:
            raise VerdictError(f"unknown instance id(s) {', '.join(unknown)} in {tasks_dir / 'instances.jsonl'}")
        inst_rows = [r for r in inst_rows if r["instance_id"] in instance_ids]
        pred_rows = [r for r in pred_rows if r["instance_id"] in instance_ids]
    instances = {r["instance_id"]: Instance.from_dict(r) for r in inst_rows}
    preds = [Prediction(instance_id=r["instance_id"], model_patch=r.get("model_patch") or "",
                        model_name_or_path=r.get("model_name_or_path", "bundled"),
                        rollout_id=str(r.get("rollout_id", i))) for i, r in enumerate(pred_rows)]
    config = SandboxConfig(repos_dir=repos_dir, max_workers=max_workers, timeout=timeout,
                           run_id="experiment-verdicts")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gagar-verdicts-") as tmp:
        results = evaluate_predictions(instances, preds, config, run_dir=run_dir or Path(tmp) / "run",
                                       redo=redo, progress=progress)
    sandbox_s = time.monotonic() - t0
    by_key = {(r.instance_id, str(r.rollout_id)): r for r in results}
    broken = [r for r in results if r.status == "infra_error"]
    if broken:
        first = broken[0]
        raise VerdictError(f"the sandbox could not run {len(broken)} rollout(s) (infra_error), e.g. "
                           f"{first.instance_id} rollout {first.rollout_id}: {first.error}. Check that Docker "
                           "answers and the images exist (`make images`); nothing was cached")

    t1 = time.monotonic()
    from grader.records import Group
    from trainer.config import GraderSection
    from trainer.judging import Judge

    for p in preds:
        if (p.instance_id, p.rollout_id) not in by_key:
            raise VerdictError(f"the sandbox returned no result for {p.instance_id} rollout {p.rollout_id}")
    task_ids = list(dict.fromkeys(p.instance_id for p in preds))
    patch_of = {(p.instance_id, p.rollout_id): p.model_patch for p in preds}
    # the hack check, as the trainer runs it: every task's sandbox-passing patches, one grader group each
    groups = {iid: Group.from_results(instances[iid], [r for r in results if r.instance_id == iid],
                                      {rid: patch for (i, rid), patch in patch_of.items() if i == iid})
              for iid in task_ids}
    todo = [iid for iid in task_ids if groups[iid].candidates]
    checks = dict(zip(todo, Judge(GraderSection(), repos_dir).check([groups[i] for i in todo]), strict=True))

    patches: dict[str, Any] = {}
    tasks: dict[str, dict[str, Any]] = {}
    for p in preds:
        res = by_key[(p.instance_id, p.rollout_id)]
        h = patch_hash(p.instance_id, p.model_patch)
        patches[h] = _verdict(res, p.model_patch, checks.get(p.instance_id))
        exp = expected.get((p.instance_id, p.rollout_id), {})
        inst = instances[p.instance_id]
        task = tasks.setdefault(p.instance_id, {
            "instance_id": p.instance_id, "repo": inst.repo, "base_commit": inst.base_commit,
            "problem_statement": inst.problem_statement, "candidates": [], "gradings": {}})
        task["candidates"].append({
            "rollout_id": p.rollout_id, "patch_hash": h, "patch": p.model_patch,
            "kind": exp.get("kind"), "quality_rank": exp.get("quality_rank"),
            "expected_status": exp.get("status")})

    for task in tasks.values():
        # the judge's weights come from gradings of the sandbox-passing patches a group holds (hacks included,
        # ranked last), as the loop's heuristic ranking is its hack check's grading
        passing = [c for c in task["candidates"] if patches[c["patch_hash"]]["sandbox_passed"]]
        if passing:
            task["gradings"] = grade_subsets(instances[task["instance_id"]], passing, repos_dir)
    grader_s = time.monotonic() - t1
    agree = sum(1 for t in tasks.values() for c in t["candidates"]
                if c["expected_status"] in (None, patches[c["patch_hash"]]["status"]))
    hacks_found = sorted(f"{t['instance_id']}:{c['rollout_id']}" for t in tasks.values() for c in t["candidates"]
                         if patches[c["patch_hash"]]["grader_hack"])
    return {
        "format": FORMAT,
        "source": {
            "tasks_dir": str(tasks_dir),
            "instances_sha": file_digest(tasks_dir / "instances.jsonl"),
            "predictions_sha": file_digest(tasks_dir / "predictions.jsonl"),
            "sandbox": "sandbox.run.evaluate_predictions",
            "grader": "grader.grade.grade_groups(judge='heuristic')",
            "sandbox_seconds": round(sandbox_s, 1),
            "grader_seconds": round(grader_s, 1),
            "rollouts": len(preds),
            "status_as_expected": agree,
            "grader_hacks": hacks_found,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "tasks": list(tasks.values()),
        "patches": patches,
    }


def load_verdicts(path: Path) -> dict[str, Any]:
    """Read and check a cache file; every error names what to do."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise VerdictError(f"verdict cache {path} not found (omit --verdicts to build one)") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise VerdictError(f"verdict cache {path} is unreadable ({exc}); delete it to rebuild") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise VerdictError(f"{path} is not a verdict cache of format {FORMAT}; delete it to rebuild")
    tasks, patches = data.get("tasks"), data.get("patches")
    if not isinstance(tasks, list) or not tasks or not isinstance(patches, dict):
        raise VerdictError(f"{path}: no tasks or patches in the cache")
    for t in tasks:
        for c in t.get("candidates", []):
            if c.get("patch_hash") not in patches:
                raise VerdictError(f"{path}: {t.get('instance_id')} rollout {c.get('rollout_id')} has no verdict")
    return data
