"""Sandbox reward for verl 0.9.1 (`reward.custom_reward_function`, called per response by verl's reward loop):
the response's diff is evaluated SWE-bench style in the Docker sandbox and scored 1.0 iff it *passed*
(`EvalResult.passed`: resolved, without tampering with the tests or forging their report — a hack scores 0).
Besides `score` it returns `gagar_passed`, `gagar_hacked`, `gagar_patch` and `gagar_instance`; verl stores these in
`non_tensor_batch`, where `GagarRayPPOTrainer` (trainer/integrations/verl_trainer.py) grades each group's passing
patches — a judge needs the whole group, which a per-response reward never sees — and hands the weights to the
`gagar` estimator.

Across nodes: GAGAR_SANDBOX_EXECUTOR=ray spreads the evaluation over the Ray cluster verl runs on, with the
executor `gagar eval --executor ray` uses: one sandbox actor per node (only nodes started with
`ray start ... --resources '{"docker": 1}'` when any is), each with its node's Docker engine, the images and the
tasks dir at the same path. The default (local) uses the engine of the node running the reward.
Environment: GAGAR_TASKS_DIR (instances.jsonl + repos/), GAGAR_SANDBOX_WORKERS (per node),
GAGAR_SANDBOX_EXECUTOR (local | ray). See docs/scaling.md.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

from sandbox.records import EvalResult, Instance, Prediction


def _tasks_dir() -> Path:
    return Path(os.environ.get("GAGAR_TASKS_DIR", ".gagar/tasks"))


_LOCK = threading.Lock()  # verl's reward loop calls compute_score from several threads at once
_EXECUTOR = None  # one per process: the Ray actors are started once and kept across reward calls
_INSTANCES: dict[str, Instance] | None = None
_IDS = itertools.count()


def _instances() -> dict[str, Instance]:
    global _INSTANCES
    with _LOCK:
        if _INSTANCES is None:
            from sandbox.inputs import load_instances

            notes: list[str] = []
            _INSTANCES = load_instances(_tasks_dir() / "instances.jsonl", notes)
        return _INSTANCES


def _evaluate(preds: list[Prediction]) -> list[EvalResult]:
    global _EXECUTOR
    from sandbox.config import SandboxConfig
    from sandbox.executor import make_executor

    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = make_executor(os.environ.get("GAGAR_SANDBOX_EXECUTOR", "local"))
    config = SandboxConfig(repos_dir=_tasks_dir().resolve() / "repos", run_id="verl-reward",
                           max_workers=int(os.environ.get("GAGAR_SANDBOX_WORKERS", "4")))
    return _EXECUTOR.evaluate(_instances(), preds, config)


def score_result(result: EvalResult, patch: str) -> dict[str, Any]:
    """verl's reward dict for one evaluated response: a hack (tampered tests, forged report) scores 0."""
    return {"score": 1.0 if result.passed else 0.0, "gagar_passed": bool(result.passed),
            "gagar_hacked": bool(result.hacked), "gagar_patch": patch, "gagar_instance": result.instance_id,
            "sandbox_status": result.status}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """verl's per-response reward function: ground_truth is the instance id (see prepare_data.py)."""
    from trainer.agent.format import extract_diff

    iid = str(ground_truth)
    if iid not in _instances():
        raise ValueError(f"instance {iid!r} is not in {_tasks_dir() / 'instances.jsonl'}: set GAGAR_TASKS_DIR to "
                         "the tasks dir prepare_data.py read")
    patch = extract_diff(solution_str)
    pred = Prediction(instance_id=iid, model_patch=patch, model_name_or_path="verl", rollout_id=str(next(_IDS)))
    (result,) = _evaluate([pred])
    return score_result(result, patch)
