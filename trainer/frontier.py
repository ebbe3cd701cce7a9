"""Frontier tasks (DAPO-style pre-filter, `tasks.frontier_k`): before RL, each training task's pass rate p is
estimated from k answers of the starting policy (the warm-started model: RL's fresh adapter changes nothing yet),
judged as training judges them (the sandbox, then the grader's hack check). Only tasks with 0 < p < 1 are
trained on: a task the policy always or never solves gives an all-pass or all-fail group, which GRPO-family
advantages discard anyway. Held-out tasks are never filtered.

The estimate depends on the starting weights, the tasks and how they are sampled — not on the run's seed or
arm — so it is cached in `model.cache_dir/frontier-<key>.json` and shared by every run that starts from the same
weights; each run records the copy it used in `OUT/frontier.json`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.jsonl import atomic_write_text
from sandbox.records import Instance, Prediction
from trainer.config import TrainConfig

SEED = 0  # the estimate's sampling seed: the same estimate for every run seed


def frontier_key(cfg: TrainConfig, base_path: str, instances: dict[str, Instance]) -> str:
    from trainer.mutation_sft import base_identity

    r = cfg.rollout
    tasks = hashlib.sha256(json.dumps([instances[i].to_dict() for i in sorted(instances)],
                                      sort_keys=True).encode()).hexdigest()
    shape = {"base": base_identity(base_path), "tasks": tasks, "k": cfg.tasks.frontier_k,
             "temperature": r.temperature, "top_p": r.top_p, "max_new_tokens": r.max_new_tokens,
             "edit_format": r.edit_format, "ctx": r.max_context_chars, "region": r.max_region_lines, "seed": SEED}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


CHUNK = 32  # tasks estimated at a time: a cut estimate resumes at the chunk it was in


def estimate(cfg: TrainConfig, backend: Any, tokenizer: Any, instances: dict[str, Instance], pool: Any,
             judge: Any, run_dir: Path, log: Callable[[str], None], *,
             partial: Path | None = None) -> dict[str, dict[str, int]]:
    """instance_id -> {"n": judged answers, "passed": how many passed}, from `tasks.frontier_k` answers each,
    `CHUNK` tasks at a time; each chunk's rates are saved to `partial` (when given) as it finishes."""
    import torch

    from trainer.generation import generate
    from trainer.groups import build_groups

    rates: dict[str, dict[str, int]] = json.loads(partial.read_text()) if partial and partial.is_file() else {}
    ids = sorted(instances)
    for n, start in enumerate(range(0, len(ids), CHUNK)):
        chunk = [i for i in ids[start : start + CHUNK] if i not in rates]
        if not chunk:
            continue
        sub = {i: instances[i] for i in chunk}
        torch.manual_seed(SEED + n)
        trajs = generate(cfg.rollout.model_copy(update={"n": cfg.tasks.frontier_k}), backend, tokenizer, sub, chunk,
                         f"frontier{n}", repos_dir=cfg.tasks.repos_path(), sandbox=pool.config())
        preds = [Prediction(instance_id=t.instance_id, model_patch=t.patch, model_name_or_path="gagar-frontier",
                            rollout_id=t.rollout_id) for g in trajs for t in g]
        groups = build_groups(sub, trajs, pool.evaluate_masked(sub, preds, run_dir / f"chunk{n}", log))
        judge.check_hacks(groups)
        for g in groups:
            rates[g.instance.instance_id] = {"n": sum(g.valid),
                                             "passed": sum(p for p, v in zip(g.passed, g.valid, strict=True) if v)}
        if partial is not None:
            atomic_write_text(partial, json.dumps(rates) + "\n")
        log(f"frontier: {len(rates)} of {len(ids)} tasks estimated, {len(frontier_ids(rates))} on the frontier")
    return rates


def frontier_ids(rates: dict[str, dict[str, int]]) -> list[str]:
    """The tasks with 0 < p < 1 (a task with no judged answer is left out: nothing is known of it)."""
    return sorted(i for i, r in rates.items() if 0 < r["passed"] < r["n"])


def summary(rates: dict[str, dict[str, int]]) -> dict[str, Any]:
    n = len(rates)
    kept = frontier_ids(rates)
    return {"tasks": n, "frontier": len(kept), "frontier_share": len(kept) / n if n else None,
            "always": sum(r["n"] > 0 and r["passed"] == r["n"] for r in rates.values()),
            "never": sum(r["passed"] == 0 for r in rates.values()),
            "mean_p": sum(r["passed"] / r["n"] for r in rates.values() if r["n"]) / max(1, sum(bool(r["n"])
                                                                                              for r in rates.values()))}


def ensure_frontier(cfg: TrainConfig, base_path: str, backend: Any, tokenizer: Any,
                    instances: dict[str, Instance], pool: Any, judge: Any, out: Path,
                    log: Callable[[str], None] = print) -> list[str]:
    """The training tasks to keep (estimating, or reusing the cached estimate), recorded in `out/frontier.json`.
    Raises ValueError when no task is on the frontier (RL would have nothing to learn from)."""
    key = frontier_key(cfg, base_path, instances)
    cache = Path(cfg.model.cache_dir) / f"frontier-{key}.json"
    if cache.is_file():
        record = json.loads(cache.read_text())
        log(f"frontier: reusing {cache}")
    else:
        log(f"frontier: {cfg.tasks.frontier_k} answers for each of {len(instances)} training tasks ...")
        partial = cache.with_name(f"frontier-{key}.partial.json")
        rates = estimate(cfg, backend, tokenizer, instances, pool, judge, cache.with_name(f"frontier-{key}.run"), log,
                         partial=partial)
        record = {"key": key, "k": cfg.tasks.frontier_k, "base": base_path, **summary(rates), "rates": rates}
        atomic_write_text(cache, json.dumps(record, indent=1) + "\n")
        partial.unlink(missing_ok=True)
    kept = frontier_ids(record["rates"])
    atomic_write_text(Path(out) / "frontier.json", json.dumps({**record, "kept": kept}, indent=1) + "\n")
    log(f"frontier: {len(kept)} of {record['tasks']} training tasks have 0 < p < 1 "
        f"({record['always']} always pass, {record['never']} never)")
    if not kept:
        raise ValueError(f"no training task has 0 < p < 1 under the starting policy ({record['always']} always "
                         f"pass, {record['never']} never): RL has nothing to learn from; see {cache}")
    return kept
