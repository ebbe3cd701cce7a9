"""Sandbox reward for verl (`reward_model.reward_manager=batch`): every response's diff is evaluated SWE-bench
style in the Docker sandbox; each instance's passing patches are ranked by the grader, and the results go back
to verl per response as `score` plus `gagar_passed`, `gagar_hacked` and `gagar_weight` — verl stores these
extra fields in `non_tensor_batch`, where the `gagar` estimator of trainer/integrations/verl_plugin.py reads them.

Across nodes: set GAGAR_SANDBOX_ACTORS=N to spread the evaluation over N Ray actors, each on a node with a local
Docker engine and a copy of the tasks dir (request the custom resource `docker` per actor: start such nodes with
`ray start ... --resources '{"docker": 1}'`). Without it, the node running the reward uses its own engine.
Environment: GAGAR_TASKS_DIR (instances.jsonl + repos/), GAGAR_JUDGE (heuristic | llm), GAGAR_SANDBOX_WORKERS.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from sandbox.records import EvalResult, Instance, Prediction


def _tasks_dir() -> Path:
    return Path(os.environ.get("GAGAR_TASKS_DIR", ".gagar/tasks"))


def _instances() -> dict[str, Instance]:
    path = _tasks_dir() / "instances.jsonl"
    return {i.instance_id: i for i in (Instance.from_dict(json.loads(ln)) for ln in path.read_text().splitlines()
                                       if ln.strip())}


def evaluate_local(preds: list[dict]) -> list[dict]:
    """Evaluate on this machine's Docker engine (what each Ray actor runs)."""
    from trainer.config import SandboxSection
    from trainer.sandbox_pool import SandboxPool

    pool = SandboxPool(SandboxSection(max_workers=int(os.environ.get("GAGAR_SANDBOX_WORKERS", "4"))),
                       _tasks_dir() / "repos", run_id="verl-reward")
    with tempfile.TemporaryDirectory(prefix="gagar-verl-") as tmp:
        res = pool.evaluate(_instances(), [Prediction(**p) for p in preds], Path(tmp))
    return [r.to_dict() for r in res]


def _evaluate(preds: list[dict]) -> list[EvalResult]:
    n_actors = int(os.environ.get("GAGAR_SANDBOX_ACTORS", "0"))
    if n_actors <= 0:
        return [EvalResult.from_dict(d) for d in evaluate_local(preds)]
    import ray

    @ray.remote(num_cpus=1, resources={"docker": 1})
    def run(share: list[dict]) -> list[dict]:
        return evaluate_local(share)

    by_inst: dict[str, list[dict]] = defaultdict(list)
    for p in preds:
        by_inst[p["instance_id"]].append(p)
    shares: list[list[dict]] = [[] for _ in range(n_actors)]
    for iid in sorted(by_inst, key=lambda i: -len(by_inst[i])):  # whole groups: one repo copy per group
        min(shares, key=len).extend(by_inst[iid])
    parts = ray.get([run.remote(s) for s in shares if s])
    return [EvalResult.from_dict(d) for part in parts for d in part]


def compute_score(data_sources: list[str], solution_strs: list[str], ground_truths: list[str],
                  extra_infos: list[dict] | None = None, **kwargs: Any) -> list[dict]:
    from grader.grade import grade_groups
    from grader.records import Candidate, Group
    from trainer.agent.format import extract_diff

    insts = _instances()
    preds = [{"instance_id": gt, "model_patch": extract_diff(s), "model_name_or_path": "verl", "rollout_id": str(k)}
             for k, (s, gt) in enumerate(zip(solution_strs, ground_truths, strict=True))]
    results = {r.rollout_id: r for r in _evaluate(preds)}
    weights: dict[str, float] = {}
    groups: dict[str, list[dict]] = defaultdict(list)
    for p in preds:
        if results[p["rollout_id"]].resolved:
            groups[p["instance_id"]].append(p)
    todo = [Group(iid, insts[iid].repo, insts[iid].base_commit, insts[iid].problem_statement,
                  [Candidate(p["rollout_id"], p["model_patch"]) for p in ps]) for iid, ps in groups.items() if len(ps) > 1]
    if todo:
        for g in grade_groups(todo, _tasks_dir() / "repos", judge=os.environ.get("GAGAR_JUDGE", "heuristic")):
            if not g.fallback:
                weights.update(g.weights)
    out = []
    for p in preds:
        r = results[p["rollout_id"]]
        out.append({"score": 1.0 if r.resolved else 0.0, "gagar_passed": bool(r.resolved),
                    "gagar_hacked": bool(r.tampered_tests), "gagar_weight": weights.get(p["rollout_id"], math.nan),
                    "sandbox_status": r.status})
    return out
