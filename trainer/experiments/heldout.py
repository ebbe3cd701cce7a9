"""A trained run's policy on tasks it never trained on: held-out pass@1 (greedy) and pass@k, and the quality of
its passing patches (changed lines and files, lines outside the functions the reference fix changes).

The held-out tasks are a split of the task set (`tasks.split`, e.g. `heldout` of `gagar tasks synth`'s
`splits.json`, whose repositories no training task comes from); a fixed subset of them (`max_tasks`, the same for
every arm and seed) keeps the cost in budget. The run's last checkpoint is loaded as the trainer would resume
it, and a separate sampling engine (vLLM, a server) is handed its trained adapter before it samples; every patch
goes through the same sandbox as training. The figures are written to `<run>/heldout.json`
(atomically) and reused when that file exists for the same settings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.jsonl import atomic_write_text
from sandbox.records import EvalResult, Prediction
from trainer.config import TrainConfig
from trainer.experiments.scope import task_scope
from trainer.experiments.verdicts import diff_size
from trainer.tasks import fixed_subset


def heldout_ids(ids: list[str], max_tasks: int) -> list[str]:
    """A fixed subset of the held-out tasks (all when `max_tasks` is 0 or more than there are)."""
    return fixed_subset(sorted(ids), max_tasks)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. (2021) from n samples of which c pass."""
    if n - c < k:
        return 1.0
    prob = 1.0
    for i in range(n - c + 1, n + 1):
        prob *= 1.0 - k / i
    return 1.0 - prob


def evaluate_heldout(cfg: TrainConfig, run: Path, *, max_tasks: int, k: int,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Held-out figures of the policy in `run`'s last checkpoint; `cfg` is the run's config with `tasks.split`
    set to the held-out split."""
    settings = {"split": cfg.tasks.split, "max_tasks": max_tasks, "k": k, "temperature": cfg.rollout.temperature,
                "max_new_tokens": cfg.rollout.max_new_tokens}
    out_path = run / "heldout.json"
    if out_path.is_file():
        done = json.loads(out_path.read_text())
        if done.get("settings") == settings:
            return done

    from inference.backends import close_backend
    from trainer.checkpoint import latest_checkpoint, load_state
    from trainer.generation import generate
    from trainer.policy import build_policy
    from trainer.rollout import make_backend
    from trainer.sandbox_pool import SandboxPool
    from trainer.tasks import load_instances

    t0 = time.monotonic()
    every = load_instances(cfg)
    instances = {i: every[i] for i in heldout_ids(list(every), max_tasks)}
    repos = cfg.tasks.repos_path()
    ckpt = latest_checkpoint(run)
    if ckpt is None:  # never build a policy here: a warm start would imitate the held-out tasks' own fixes
        raise ValueError(f"{run} has no checkpoint to measure; train it first")
    state = load_state(ckpt)
    pool = SandboxPool(cfg.sandbox, repos, run_id=f"heldout-{run.name}")
    policy = build_policy(cfg, instances, ckpt=ckpt, state=state, log=log)
    backend = make_backend(cfg, policy.model, policy.tokenizer, str(run), base_path=policy.base_path)
    rows: dict[str, list[tuple[str, str, EvalResult]]] = {}
    tokens: list[int] = []
    ids = sorted(instances)
    try:
        if cfg.rollout.backend != "transformers":
            # A separate engine samples from the base until it is handed the trained adapter: without this every
            # arm would measure the same untrained policy.
            backend.sync_weights(policy.model, int(state.get("step", 0)))
        policy.model.eval()
        r = cfg.rollout
        draws = {"greedy": r.model_copy(update={"n": 1, "temperature": 0.0}),
                 "sampled": r.model_copy(update={"n": k})}
        for name, rc in draws.items():
            trajs = [t for g in generate(rc, backend, policy.tokenizer, instances, ids, f"heldout-{name}",
                                         repos_dir=repos, sandbox=pool.config()) for t in g]
            preds = [Prediction(instance_id=t.instance_id, model_patch=t.patch, model_name_or_path="gagar-heldout",
                                rollout_id=t.rollout_id) for t in trajs]
            results = {x.rollout_id: x for x in pool.evaluate_masked(instances, preds, run / "heldout" / name, log)}
            rows[name] = [(t.instance_id, t.patch, results[t.rollout_id]) for t in trajs if t.rollout_id in results]
            tokens += [t.policy_tokens for t in trajs] if name == "sampled" else []
    finally:
        close_backend(backend)
    scopes = {i: task_scope(instances[i], repos / instances[i].repo_dirname) for i in ids}
    result = {"settings": settings, "tasks": ids, "checkpoint": ckpt.name,
              **summarize(rows["greedy"], rows["sampled"], scopes, k),
              "tokens_mean": _mean(tokens),
              "seconds": round(time.monotonic() - t0, 1)}
    atomic_write_text(out_path, json.dumps(result, indent=1) + "\n")
    return result


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(greedy: list[tuple[str, str, EvalResult]], sampled: list[tuple[str, str, EvalResult]],
              scopes: dict[str, Any], k: int) -> dict[str, Any]:
    """pass@1 (greedy), pass@k over the k samples, and the passing patches' size and scope; an infra_error
    says nothing about the policy and is left out (counted apart)."""
    def ok(rows: list[tuple[str, str, EvalResult]]) -> list[tuple[str, str, EvalResult]]:
        return [x for x in rows if x[2].status != "infra_error"]

    g, s = ok(greedy), ok(sampled)
    per_task: dict[str, list[bool]] = {}
    for iid, _p, res in s:
        per_task.setdefault(iid, []).append(res.passed)
    passing = [(iid, p) for iid, p, res in g + s if res.passed]
    lines = [diff_size(p)[0] for _, p in passing]
    files = [diff_size(p)[1] for _, p in passing]
    outside = [scopes[iid].outside(p) for iid, p in passing]
    return {
        "pass1_greedy": _mean([float(res.passed) for _, _, res in g]),
        f"pass{k}": _mean([pass_at_k(len(v), sum(v), min(k, len(v))) for v in per_task.values()]),
        "pass1_sampled": _mean([float(res.passed) for _, _, res in s]),
        "passing_patches": len(passing),
        "passing_diff_lines": _mean(lines),
        "passing_files": _mean(files),
        "out_of_scope_lines": _mean(outside),
        "scope_creep": _mean([float(o > 0) for o in outside]),
        "hacks_sandbox": sum(res.hacked for _, _, res in g + s),
        "infra_errors": len(greedy) + len(sampled) - len(g) - len(s),
    }
