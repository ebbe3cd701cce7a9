"""Sandbox reward for verl (`reward_model.reward_manager=batch`): every response's diff is evaluated SWE-bench
style in the Docker sandbox; each instance's passing patches are ranked by the grader, and the results go back
to verl per response as `score` plus `gagar_passed`, `gagar_hacked` and `gagar_weight` — verl stores these
extra fields in `non_tensor_batch`, where the `gagar` estimator of trainer/integrations/verl_plugin.py reads them.

Across nodes: GAGAR_SANDBOX_EXECUTOR=ray spreads the evaluation over the Ray cluster verl runs on, with the
executor `gagar eval --executor ray` uses: one sandbox actor per node (only nodes started with
`ray start ... --resources '{"docker": 1}'` when any is), each with its node's Docker engine, the images and the
tasks dir at the same path; whole groups per node. The default (local) uses the engine of the node running the
reward. Environment: GAGAR_TASKS_DIR (instances.jsonl + repos/), GAGAR_JUDGE (heuristic | llm),
GAGAR_SANDBOX_WORKERS (per node), GAGAR_SANDBOX_EXECUTOR (local | ray). See docs/scaling.md.
"""

from __future__ import annotations

import json
import math
import os
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


_EXECUTOR = None  # one per process: the Ray actors are started once and kept across reward calls


def _evaluate(preds: list[dict]) -> list[EvalResult]:
    global _EXECUTOR
    from sandbox.config import SandboxConfig
    from sandbox.executor import make_executor

    if _EXECUTOR is None:
        _EXECUTOR = make_executor(os.environ.get("GAGAR_SANDBOX_EXECUTOR", "local"))
    config = SandboxConfig(repos_dir=_tasks_dir().resolve() / "repos", run_id="verl-reward",
                           max_workers=int(os.environ.get("GAGAR_SANDBOX_WORKERS", "4")))
    return _EXECUTOR.evaluate(_instances(), [Prediction(**p) for p in preds], config)


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
