"""Scale-out pieces on the local engine: the trainer's sandbox pool and its executor setting, and the verl
recipe's batch reward function (called directly; verl itself is not installed here). The Ray executor under
both is tested on a real local Ray in test_sandbox_ray.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from trainer_fixtures import ROOT, bundled_tasks

from sandbox.records import Instance
from trainer.config import SandboxSection
from trainer.sandbox_pool import SandboxPool

TASKS = ["acme__iniconf-9", "acme__durations-42"]


def _load(tasks: Path):
    insts = {d["instance_id"]: Instance.from_dict(d) for d in map(json.loads, (tasks / "instances.jsonl").open())}
    preds = [d for d in map(json.loads, (tasks / "predictions.jsonl").open()) if d["instance_id"] in TASKS]
    expected = {(d["instance_id"], str(d["rollout_id"])): d for d in map(json.loads, (tasks / "expected.jsonl").open())}
    return insts, preds, expected


def test_docker_hosts_is_retired_with_a_pointer_to_ray():
    from trainer.config import ConfigError, load_config

    cfg = ROOT / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError, match=r"sandbox\.docker_hosts was retired.*executor: ray"):
        load_config(cfg, ["sandbox.docker_hosts=[tcp://a:2376]"])
    with pytest.raises(ConfigError, match="sandbox.executor must be local or ray"):
        load_config(cfg, ["sandbox.executor=k8s"])


def test_pool_uses_the_local_executor_by_default():
    from sandbox.executor import LocalExecutor

    assert isinstance(SandboxPool(SandboxSection(), Path("/nonexistent")).executor, LocalExecutor)


@pytest.mark.docker
def test_verl_reward_scores_and_grades_a_batch(tmp_path_factory, monkeypatch):
    tasks = bundled_tasks(tmp_path_factory)
    _, preds, expected = _load(tasks)
    batch = [p for p in preds if p["instance_id"] == "acme__iniconf-9" and p["rollout_id"] in
             {"minimal", "bloated", "gold", "tamper"}]
    monkeypatch.setenv("GAGAR_TASKS_DIR", str(tasks))
    import importlib.util

    spec = importlib.util.spec_from_file_location("gagar_verl_reward", ROOT / "recipes" / "verl" / "reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    out = reward.compute_score(["gagar_swe"] * len(batch), ["Fix:\n```diff\n" + p["model_patch"] + "```" for p in batch],
                               [p["instance_id"] for p in batch], [{} for _ in batch])
    for p, o in zip(batch, out, strict=True):
        exp = expected[(p["instance_id"], p["rollout_id"])]
        assert o["score"] == (1.0 if exp["resolved"] else 0.0) and o["gagar_hacked"] == exp["tampered_tests"]
        # Passing patches got a grader weight in (0, 1]; failing ones none (NaN = not graded).
        assert (0 < o["gagar_weight"] <= 1) if exp["resolved"] else math.isnan(o["gagar_weight"])
    weights = {p["rollout_id"]: o["gagar_weight"] for p, o in zip(batch, out, strict=True)}
    assert weights["minimal"] >= weights["bloated"]
