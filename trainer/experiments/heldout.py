"""A trained run's policy on tasks it never trained on: held-out pass@1 (greedy) and pass@k, and the quality of
its passing patches (changed lines and files, lines outside the functions the reference fix changes).

The held-out tasks are a split of the task set (`tasks.split`, e.g. `heldout` of `gagar tasks synth`'s
`splits.json`, whose repositories no training task comes from); a fixed subset of them (`max_tasks`, the same for
every arm and seed) keeps the cost in budget. The run's last checkpoint is loaded as the trainer would resume
it, and a separate sampling engine (vLLM, a server) is handed its trained adapter before it samples; every patch
goes through the same sandbox and the same grader hack check as training, and the samples are drawn with the
run's seed (the transformers sampler's torch seed; a vLLM engine is seeded with it when it starts). The figures are written to `<run>/heldout.json` (atomically) and reused only when
that file was made with the same settings: the same checkpoint (by content), the same tasks (by content) and
the same sampling.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.jsonl import atomic_write_text
from sandbox.records import Instance, Prediction
from trainer.agent import Trajectory
from trainer.config import TrainConfig
from trainer.experiments.scope import task_scope
from trainer.experiments.verdicts import diff_size
from trainer.groups import RolloutGroup
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


def checkpoint_digest(ckpt: Path) -> str:
    """A checkpoint's content (its weights and state), so that a retrained run's checkpoint of the same step
    is not taken for the old one."""
    h = hashlib.sha256()
    for f in sorted(p for p in [*(ckpt / "weights").rglob("*"), ckpt / "state.json"] if p.is_file()):
        h.update(f.relative_to(ckpt).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def heldout_settings(cfg: TrainConfig, ckpt: Path, instances: dict[str, Instance], k: int) -> dict[str, Any]:
    """Everything the held-out figures depend on: the checkpoint (by content), the tasks (their whole records),
    and how they are sampled. A cached `heldout.json` is reused only for the same settings."""
    r = cfg.rollout
    tasks = hashlib.sha256(json.dumps([instances[i].to_dict() for i in sorted(instances)],
                                      sort_keys=True).encode()).hexdigest()[:16]
    return {"split": cfg.tasks.split, "tasks": tasks, "n_tasks": len(instances), "k": k,
            "checkpoint": ckpt.name, "checkpoint_sha": checkpoint_digest(ckpt), "seed": cfg.seed,
            "temperature": r.temperature, "top_p": r.top_p, "max_new_tokens": r.max_new_tokens,
            "edit_format": r.edit_format, "max_context_chars": r.max_context_chars,
            "max_region_lines": r.max_region_lines, "backend": r.backend}


def evaluate_heldout(cfg: TrainConfig, run: Path, *, max_tasks: int, k: int,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Held-out figures of the policy in `run`'s last checkpoint; `cfg` is the run's config with `tasks.split`
    set to the held-out split."""
    from trainer.checkpoint import latest_checkpoint
    from trainer.tasks import load_instances

    every = load_instances(cfg)
    instances = {i: every[i] for i in heldout_ids(list(every), max_tasks)}
    ckpt = latest_checkpoint(run)
    if ckpt is None:  # never build a policy here: a warm start would imitate the held-out tasks' own fixes
        raise ValueError(f"{run} has no checkpoint to measure; train it first")
    settings = heldout_settings(cfg, ckpt, instances, k)
    out_path = run / "heldout.json"
    if out_path.is_file():
        done = json.loads(out_path.read_text())
        if done.get("settings") == settings:
            return done
    t0 = time.monotonic()
    result = {"settings": settings, "tasks": sorted(instances), "checkpoint": ckpt.name,
              **measure(cfg, run, ckpt, instances, k, log, settings=settings),
              "seconds": round(time.monotonic() - t0, 1)}
    atomic_write_text(out_path, json.dumps(result, indent=1) + "\n")
    (run / PARTIAL).unlink(missing_ok=True)
    return result


PARTIAL = "heldout.partial.json"
CHUNK = 16  # tasks measured at a time: a cut measurement resumes at the chunk it was in


def measure(cfg: TrainConfig, run: Path, ckpt: Path, instances: dict[str, Instance], k: int,
            log: Callable[[str], None], *, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Greedy and k sampled answers per task from the checkpoint's policy, judged as training judges them: the
    sandbox's verdict, then the grader's hack check (a flagged hack does not pass). Sampling is seeded by the
    run's seed. Tasks are measured `CHUNK` at a time and each chunk's judged answers saved (`heldout.partial.json`,
    for these `settings`), so a cut measurement goes on where it stopped."""
    from inference.backends import close_backend
    from trainer.checkpoint import load_state
    from trainer.groups import build_groups
    from trainer.judging import Judge
    from trainer.policy import build_policy
    from trainer.rollout import make_backend
    from trainer.sandbox_pool import SandboxPool

    repos = cfg.tasks.repos_path()
    ids = sorted(instances)
    chunks = [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]
    partial_path = run / PARTIAL
    partial = json.loads(partial_path.read_text()) if partial_path.is_file() else {}
    if partial.get("settings") != settings or settings is None:
        partial = {"settings": settings, "done": [], "rows": {"greedy": [], "sampled": []}}
    todo = [c for c in chunks if c[0] not in partial["done"]]
    if todo:
        pool = SandboxPool(cfg.sandbox, repos, run_id=f"heldout-{run.name}")  # checks the sandbox before the model
        policy = build_policy(cfg, instances, ckpt=ckpt, state=load_state(ckpt), log=log)
        backend = make_backend(cfg, policy.model, policy.tokenizer, str(run), base_path=policy.base_path)
        if cfg.rollout.backend != "transformers":
            # A separate engine samples from the base until it is handed the trained adapter: without this every
            # arm would measure the same untrained policy.
            backend.sync_weights(policy.model, int(load_state(ckpt).get("step", 0)))
        policy.model.eval()
        judge = Judge(cfg.grader, repos, sandbox=pool.config, work_dir=run, models_root=cfg.model.cache_dir)
    try:
        for chunk in todo:
            sub = {i: instances[i] for i in chunk}
            for name, trajs in draw(cfg, backend, policy.tokenizer, sub, k, sandbox=pool.config()).items():
                preds = [Prediction(instance_id=t.instance_id, model_patch=t.patch,
                                    model_name_or_path="gagar-heldout", rollout_id=t.rollout_id)
                         for g in trajs for t in g]
                results = pool.evaluate_masked(sub, preds, run / "heldout" / name / chunk[0], log)
                groups = build_groups(sub, trajs, results)
                judge.check_hacks(groups)
                partial["rows"][name] += judged(groups)
            partial["done"].append(chunk[0])
            atomic_write_text(partial_path, json.dumps(partial) + "\n")
            log(f"held-out: {sum(len(c) for c in chunks if c[0] in partial['done'])} of {len(ids)} tasks measured")
    finally:
        if todo:
            close_backend(backend)
            judge.close()
    scopes = {i: task_scope(instances[i], repos / instances[i].repo_dirname) for i in ids}
    rows = partial["rows"]
    return {**summarize(rows["greedy"], rows["sampled"], scopes, k),
            "tokens_mean": _mean([r["tokens"] for r in rows["sampled"]])}


def judged(groups: list[RolloutGroup]) -> list[dict[str, Any]]:
    """Each answer's verdict as training reads it (`RolloutGroup.passed`: resolved, not tampered, no hack the
    grader found; `valid`: the sandbox could run it), with what the summary needs of it."""
    return [{"task": g.instance.instance_id, "patch": t.patch, "passed": p, "valid": v, "hacked": r.hacked,
             "grader_hack": r.rollout_id in g.grader_hacks, "format_error": t.format_error, "tokens": t.policy_tokens,
             "status": r.status}
            for g in groups for t, r, p, v in zip(g.trajs, g.results, g.passed, g.valid, strict=True)]


def draw(cfg: TrainConfig, backend: Any, tokenizer: Any, instances: dict[str, Instance], k: int, *,
         sandbox: Any) -> dict[str, list[list[Trajectory]]]:
    """The held-out answers: one greedy and `k` sampled at the rollout temperature per task, in sorted task
    order. Each draw starts from the run's seed (the transformers sampler draws from torch's RNG; a vLLM engine
    is seeded when it starts), so the same policy gives the same answers."""
    import torch

    from trainer.generation import generate

    r = cfg.rollout
    draws = {"greedy": r.model_copy(update={"n": 1, "temperature": 0.0}), "sampled": r.model_copy(update={"n": k})}
    out = {}
    for name, rc in draws.items():
        torch.manual_seed(cfg.seed)
        out[name] = generate(rc, backend, tokenizer, instances, sorted(instances), f"heldout-{name}",
                             repos_dir=cfg.tasks.repos_path(), sandbox=sandbox)
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(greedy: list[dict[str, Any]], sampled: list[dict[str, Any]], scopes: dict[str, Any],
              k: int) -> dict[str, Any]:
    """pass@1 (greedy), pass@k over the sampled answers, and the passing patches' size and scope, from `judged`
    rows. An infra_error says nothing about the policy and is left out (counted apart). pass@k is over the tasks
    with at least k judged samples (`pass{k}_tasks` says how many): a task with fewer has no pass@k."""
    g, s = [r for r in greedy if r["valid"]], [r for r in sampled if r["valid"]]
    per_task: dict[str, list[bool]] = {}
    for r in s:
        per_task.setdefault(r["task"], []).append(r["passed"])
    full = [v for v in per_task.values() if len(v) >= k]
    passing = [(r["task"], r["patch"]) for r in g + s if r["passed"]]
    sizes = [diff_size(p) for _, p in passing]
    outside = [scopes[iid].outside(p) for iid, p in passing]
    every = greedy + sampled
    return {
        "pass1_greedy": _mean([float(r["passed"]) for r in g]),
        f"pass{k}": _mean([pass_at_k(len(v), sum(v), k) for v in full]),
        f"pass{k}_tasks": len(full),
        "pass1_sampled": _mean([float(r["passed"]) for r in s]),
        "passing_patches": len(passing),
        "passing_diff_lines": _mean([a for a, _ in sizes]),
        "passing_files": _mean([b for _, b in sizes]),
        "out_of_scope_lines": _mean(outside),
        "scope_creep": _mean([float(o > 0) for o in outside]),
        "hacks_sandbox": sum(r["hacked"] for r in every),
        "hacks_grader": sum(r["grader_hack"] for r in every),
        "format_errors": sum(r["format_error"] is not None for r in every),
        "infra_errors": sum(not r["valid"] for r in every),
        "outcomes": outcomes(every),
    }


def outcomes(rows: list[dict[str, Any]]) -> dict[str, int]:
    """What the answers got wrong, one count per answer: `format: <reason>` (the answer did not parse in its edit
    format; the reason without its specifics), `no change` (it returned the code as shown), else the sandbox's
    status (`unresolved`: a well-formed patch, the wrong fix), and `passed`."""
    counts: Counter[str] = Counter()
    for r in rows:
        if r["passed"]:
            counts["passed"] += 1
        elif r["format_error"] is not None:
            counts["format: " + re.sub(r"\s*\(.*|\s*`[^`]*`", "", r["format_error"]).strip()] += 1
        elif not r["patch"].strip():
            counts["no change"] += 1
        else:
            counts[r.get("status") or "not passed"] += 1
    return dict(counts.most_common())
