"""The real policy after its warm start: held-out pass@1 (greedy) and pass@k, and the share of training tasks on
the frontier (0 < p < 1), on the synthesized tasks of `configs/loop_real.yaml`.

    .venv/bin/python bench/policy.py [--config configs/loop_real.yaml] [--k 8] [--heldout-tasks 0]
                                     [--frontier-tasks 0] [--base] [--set KEY=VALUE ...]
                                     [--out bench/results/policy-warmstart.json]

1. The warm start the config names (cached: `warmstart.source: mutations` trains it on the first run).
2. A step-0 run: the policy RL would start from (the warm-started model under RL's fresh, zero LoRA adapter) saved
   as a checkpoint, then measured on the held-out split exactly as the loop experiment measures a trained run
   (`trainer.experiments.heldout`: greedy + k samples per task, the sandbox, the grader's hack check, seeded).
3. The frontier estimate (`tasks.frontier_k` answers per training task; cached and shared with the experiment).
`--base` also measures the pretrained model without a warm start (the "before" figure) on the same tasks.
Not a test: prints the figures and writes JSON (atomically); every stage is cached, so a cut run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def step0_run(cfg, run: Path, log) -> None:
    """`run` with a step-0 checkpoint: the starting policy (warm start + RL's fresh adapter), as the trainer
    would save it, so that the held-out code measures it as it measures any trained run."""
    from trainer.checkpoint import latest_checkpoint, save_checkpoint
    from trainer.policy import build_policy
    from trainer.tasks import load_instances

    if latest_checkpoint(run) is not None:
        return
    policy = build_policy(cfg, load_instances(cfg), log=log)
    save_checkpoint(run, 0, policy.model, policy.optimizer, {"base_model": policy.base_path})


def measure(cfg, run: Path, k: int, heldout_tasks: int, log) -> dict:
    from trainer.experiments.heldout import evaluate_heldout

    step0_run(cfg, run, log)
    held = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"split": "heldout", "frontier_k": 0})})
    return evaluate_heldout(held, run, max_tasks=heldout_tasks, k=k, log=log)


def frontier(cfg, run: Path, log, max_tasks: int = 0) -> dict:
    from trainer.checkpoint import latest_checkpoint, load_state
    from trainer.frontier import ensure_frontier
    from trainer.judging import Judge
    from trainer.policy import build_policy
    from trainer.rollout import make_backend
    from trainer.sandbox_pool import SandboxPool
    from trainer.tasks import fixed_subset, load_instances

    instances = load_instances(cfg)
    # a fixed subset estimates the share at a fraction of the cost (its own cache: the task set is in the key)
    instances = {i: instances[i] for i in fixed_subset(sorted(instances), max_tasks)}
    ckpt = latest_checkpoint(run)
    pool = SandboxPool(cfg.sandbox, cfg.tasks.repos_path(), run_id=f"frontier-{run.name}")
    policy = build_policy(cfg, instances, ckpt=ckpt, state=load_state(ckpt), log=log)
    backend = make_backend(cfg, policy.model, policy.tokenizer, str(run), base_path=policy.base_path)
    judge = Judge(cfg.grader, cfg.tasks.repos_path(), sandbox=pool.config, models_root=cfg.model.cache_dir)
    ensure_frontier(cfg, policy.base_path, backend, policy.tokenizer, instances, pool, judge, run, log)
    record = json.loads((run / "frontier.json").read_text())
    return {k: v for k, v in record.items() if k not in ("rates", "kept")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "loop_real.yaml")
    ap.add_argument("--k", type=int, default=8, help="samples per held-out task for pass@k (default 8)")
    ap.add_argument("--heldout-tasks", type=int, default=0, help="a fixed subset of the held-out split (0: all)")
    ap.add_argument("--base", action="store_true", help="also measure the pretrained model without a warm start")
    ap.add_argument("--no-frontier", action="store_true", help="skip the frontier estimate")
    ap.add_argument("--frontier-tasks", type=int, default=0,
                    help="estimate the frontier share on a fixed subset of the training tasks (0: all)")
    ap.add_argument("--work", type=Path, default=ROOT / ".gagar" / "bench-policy")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "policy-warmstart.json")
    args = ap.parse_args(argv)
    from trainer.config import load_config
    from trainer.experiments.verdicts import write_json_atomic
    from trainer.tasks import check_heldout_split

    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    cfg = load_config(args.config, args.overrides)
    check_heldout_split(cfg.tasks, "heldout")
    t0, load0 = time.monotonic(), os.getloadavg()
    out: dict = {"config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
                 "overrides": args.overrides, "k": args.k, "edit_format": cfg.rollout.edit_format,
                 "backend": cfg.rollout.backend, "frontier_tasks": args.frontier_tasks}
    run = args.work / f"warm-{cfg.rollout.edit_format}"
    held = measure(cfg, run, args.k, args.heldout_tasks, log)
    out["warmstart"] = json.loads((Path(held_base(run)) / "gagar_warmstart.json").read_text()) \
        if (Path(held_base(run)) / "gagar_warmstart.json").is_file() else None
    out["heldout"] = {key: v for key, v in held.items() if key != "settings"}
    if not args.no_frontier:
        out["frontier"] = frontier(cfg, run, log, args.frontier_tasks)
    if args.base:
        base_cfg = cfg.model_copy(update={"warmstart": cfg.warmstart.model_copy(update={"enabled": False})})
        base = measure(base_cfg, args.work / f"base-{cfg.rollout.edit_format}", args.k, args.heldout_tasks, log)
        out["base_heldout"] = {key: v for key, v in base.items() if key != "settings"}
    out["seconds"] = round(time.monotonic() - t0, 1)
    out["load_average"] = {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]}
    write_json_atomic(args.out, out)
    h = out["heldout"]
    print(f"held-out ({h['tasks'].__len__()} tasks, {cfg.rollout.edit_format}): greedy pass@1 {h['pass1_greedy']:.3f}, "
          f"pass@{args.k} {h[f'pass{args.k}']} over {h[f'pass{args.k}_tasks']} tasks, sampled pass@1 "
          f"{h['pass1_sampled']:.3f}, format errors {h['format_errors']}")
    if "frontier" in out:
        f = out["frontier"]
        print(f"frontier: {f['frontier']} of {f['tasks']} train tasks have 0 < p < 1 ({f['frontier_share']:.3f}); "
              f"{f['always']} always, {f['never']} never")
    print(f"-> {args.out} ({out['seconds']:.0f} s)")
    return 0


def held_base(run: Path) -> str:
    """The base model directory under the step-0 checkpoint (the warm start's, when there is one)."""
    from trainer.checkpoint import latest_checkpoint, load_state

    return load_state(latest_checkpoint(run))["base_model"]


if __name__ == "__main__":
    sys.exit(main())
