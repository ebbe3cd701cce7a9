"""`gagar experiment bloat|skew|loop` — the controlled experiments behind the product's two training claims.

    gagar experiment bloat [--seeds K] [--steps N] [--out DIR] [--verdicts FILE] [--tasks-dir DIR]
    gagar experiment skew  [--seeds K] [--steps N] [--out DIR]
    gagar experiment loop  [--config FILE] [--seeds K] [--steps N] [--arms A,B] [--out DIR] [--work DIR] [--dry-run]
                           [--heldout-split S] [--heldout-tasks N] [--heldout-k K] [--stem STEM] [--quick]
                           [--set k=v]

Each writes `OUT/<name>.json` and `OUT/<name>.png` (`skew --reward exact|tests` writes `skew-exact.*`,
`skew-tests.*`). `bloat` needs the sandbox verdicts of the bundled rollouts:
the first run evaluates them in Docker (minutes) and caches them in `--verdicts` (default OUT/verdicts.json);
later runs, or anyone given that file, need neither Docker nor the repositories.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from trainer.experiments.loop import fmt
from trainer.experiments.skew import REWARDS
from trainer.experiments.verdicts import (
    VerdictError,
    build_verdicts,
    file_digest,
    load_verdicts,
    write_json_atomic,
)

DEFAULT_OUT = Path(".gagar/experiments")
DEFAULT_TASKS = Path(".gagar/tasks")
DEFAULT_LOOP_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
# --quick: small enough for a test, still the real path (warm start, sandbox, grader, update)
QUICK = {"seeds": 1, "steps": 2, "set": ["rollout.tasks_per_step=1", "rollout.n=4", "rollout.max_refill=0",
                                         "save_every=1"]}
BUILD_TASKS = Path(__file__).resolve().parents[2] / "examples" / "build_tasks.py"


def _clean(obj: Any) -> Any:
    """NaN/inf are not JSON: write them as null (a metric undefined at that step)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="gagar experiment", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="name", required=True, metavar="{bloat,skew,loop}")

    b = sub.add_parser("bloat", help="GRPO vs GAGAR on a softmax policy over the bundled tasks' real patches")
    b.add_argument("--seeds", type=_positive_int, default=8, help="independent runs per method (default 8)")
    b.add_argument("--steps", type=_positive_int, default=300, help="policy updates (default 300)")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    b.add_argument("--verdicts", type=Path, default=None,
                   help="verdict cache to reuse (or to create when missing); default OUT/verdicts.json")
    b.add_argument("--tasks-dir", type=Path, default=DEFAULT_TASKS,
                   help="bundled tasks (built with examples/build_tasks.py when missing)")
    b.add_argument("--redo-verdicts", action="store_true", help="re-run the sandbox even if a cache exists")
    b.add_argument("--sandbox-run-dir", type=Path, default=DEFAULT_OUT / "verdicts-run",
                   help="where the sandbox writes results and logs while building the cache (resumable)")
    b.add_argument("--n", type=_positive_int, default=8, help="rollouts per task per step (default 8)")
    b.add_argument("--lr", type=float, default=1.0, help="step size on the logits (default 1.0)")
    b.add_argument("--cap", type=float, default=None, help="GAGAR λ cap (default: the engine's)")
    b.add_argument("--methods", default="grpo,grpo+gagar,grpo+gagar-scale,gapo+gagar,downweight",
                   help="comma-separated advantage methods to compare")
    b.add_argument("--max-workers", type=_positive_int, default=2,
                   help="sandbox containers at once while building the verdict cache")
    b.add_argument("--timeout", type=float, default=600.0, help="sandbox timeout per rollout (s)")
    b.add_argument("--base-seed", type=int, default=0, help="seed of the first run (run k uses base + k)")

    s = sub.add_parser("skew", help="GRPO vs GAPO advantages on normal, skewed and outlier reward groups")
    s.add_argument("--seeds", type=_positive_int, default=5, help="independent draws (default 5)")
    s.add_argument("--steps", type=_positive_int, default=4, help="PPO epochs of the clip-fraction update (default 4)")
    s.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    s.add_argument("--n", type=_positive_int, default=16, help="rollouts per group (even)")
    s.add_argument("--configs", type=_positive_int, default=1500, help="group distributions per seed")
    s.add_argument("--replicates", type=_positive_int, default=16, help="groups drawn per distribution")
    s.add_argument("--lr", type=float, default=0.1, help="SGD step on each rollout's log-probability")
    s.add_argument("--clip-eps", type=float, default=0.2, help="PPO clip range of the update")
    s.add_argument("--estimators", default="grpo,gapo", help="comma-separated advantage estimators to compare")
    s.add_argument("--reward", choices=REWARDS, default="partial",
                   help="partial: tests passed + diff similarity (noisy); exact: the latent quality itself; "
                        "tests: tests passed / m alone (a grid of 1/m steps)")
    s.add_argument("--base-seed", type=int, default=0, help="seed of the first draw (draw k uses base + k)")

    lp = sub.add_parser("loop", help="the real `gagar train` loop: GRPO vs GAGAR arms vs a learning-rate-0 control")
    lp.add_argument("--config", type=Path, default=DEFAULT_LOOP_CONFIG, help="base train config (default: tiny)")
    lp.add_argument("--arms", default="grpo,grpo+gagar,gapo+gagar,control",
                    help="comma-separated: grpo, grpo+gagar (the config's grader), grpo+gagar-llm (the judge of "
                         "`make judge`), gapo+gagar, downweight, control (lr 0)")
    lp.add_argument("--seeds", type=_positive_int, default=3, help="training runs per arm")
    lp.add_argument("--steps", type=_positive_int, default=24, help="RL steps per run")
    lp.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    lp.add_argument("--work", type=Path, default=DEFAULT_OUT / "loop-runs",
                    help="the runs' own folders (resumable: finished runs are reused)")
    lp.add_argument("--tasks-dir", type=Path, default=None,
                    help=f"a bundled tasks directory (default {DEFAULT_TASKS} for the tiny config; a config that "
                         "names its own tasks, e.g. configs/loop_real.yaml, uses those)")
    lp.add_argument("--heldout-split", default=None,
                    help="measure every trained policy on this split of the task set (default: `heldout` when "
                         "the config trains on a split, else none)")
    lp.add_argument("--heldout-tasks", type=int, default=16, help="a fixed subset of the held-out split (0: all)")
    lp.add_argument("--heldout-k", type=_positive_int, default=4, help="samples per held-out task for pass@k")
    lp.add_argument("--stem", default=None, help="output stem (default loop, loop-quick with --quick)")
    lp.add_argument("--dry-run", action="store_true", help="check the settings, print the estimate and stop")
    lp.add_argument("--quick", action="store_true",
                    help="1 seed × 2 steps of a cut-down config, written to OUT/<name>-quick.*: a smoke test")
    lp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every run (repeatable)")
    return ap


def _ensure_tasks(tasks_dir: Path) -> None:
    if (tasks_dir / "instances.jsonl").is_file():
        return
    if not BUILD_TASKS.is_file():
        raise VerdictError(f"no bundled tasks in {tasks_dir}; pass --tasks-dir DIR (built with "
                           "examples/build_tasks.py --out DIR) or --verdicts FILE")
    print(f"building the bundled tasks into {tasks_dir} ...", file=sys.stderr)
    proc = subprocess.run([sys.executable, str(BUILD_TASKS), "--out", str(tasks_dir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise VerdictError(f"examples/build_tasks.py failed:\n{proc.stderr[-2000:]}")


def _stale(cache: dict[str, Any], tasks_dir: Path) -> bool:
    """A default-path cache made from other task files than the ones now in --tasks-dir."""
    preds = tasks_dir / "predictions.jsonl"
    if not preds.is_file():
        return False
    return cache.get("source", {}).get("predictions_sha") != file_digest(preds)


def _verdicts(args: argparse.Namespace) -> dict[str, Any]:
    path = args.verdicts or args.out / "verdicts.json"
    if path.exists() and not args.redo_verdicts:
        cache = load_verdicts(path)
        # An explicit --verdicts file is used as given; the default one follows the task files.
        if args.verdicts is not None or not _stale(cache, args.tasks_dir):
            return cache
        print(f"{path} was built from other task files than {args.tasks_dir}: rebuilding", file=sys.stderr)
    _ensure_tasks(args.tasks_dir)
    print(f"evaluating the bundled rollouts in the sandbox (cached in {path}) ...", file=sys.stderr)
    # The sandbox keeps its results and logs in --sandbox-run-dir, so an interrupted build resumes there.
    # One run folder per version of the task files: a resumed run must never mix verdicts of two versions.
    version = file_digest(args.tasks_dir / "instances.jsonl") + file_digest(args.tasks_dir / "predictions.jsonl")
    cache = build_verdicts(args.tasks_dir, run_dir=args.sandbox_run_dir / version, redo=args.redo_verdicts,
                           max_workers=args.max_workers, timeout=args.timeout, progress=True)
    write_json_atomic(path, cache)
    return cache


def _bloat(args: argparse.Namespace) -> int:
    from trainer.experiments.bloat import BloatConfig, run_bloat
    from trainer.experiments.plots import plot_bloat

    cfg_kwargs: dict[str, Any] = {"steps": args.steps, "n": args.n, "lr": args.lr,
                                  "methods": tuple(m.strip() for m in args.methods.split(",") if m.strip())}
    if args.cap is not None:
        cfg_kwargs["cap"] = args.cap
    from docker.errors import DockerException

    try:
        cfg = BloatConfig(**cfg_kwargs)
        cache = _verdicts(args)
    except (ValueError, VerdictError) as exc:
        print(f"gagar experiment bloat: {exc}", file=sys.stderr)
        return 2
    except DockerException as exc:
        print(f"gagar experiment bloat: the sandbox needs a running Docker engine ({exc}); start it "
              "(`make docker`) or pass --verdicts FILE to reuse cached verdicts", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    result = run_bloat(cache, cfg, args.seeds, base_seed=args.base_seed)
    result["seconds"] = round(time.monotonic() - t0, 1)
    result = _clean(result)
    write_json_atomic(args.out / "bloat.json", result)
    plot_bloat(result, args.out / "bloat.png")
    print(f"bloat: {args.seeds} seeds × {args.steps} steps in {result['seconds']} s "
          f"-> {args.out / 'bloat.json'}, {args.out / 'bloat.png'}")
    for method, data in result["methods"].items():
        f = data["final"]
        print(f"  {method:<11} pass {f['pass_rate']['mean']:.3f}  minimal share "
              f"{fmt(f['minimal_share']['mean'])}  tier-1 share {fmt(f['top_tier_share']['mean'])}  diff lines {fmt(f['diff_lines']['mean'])}  "
              f"entropy {f['entropy']['mean']:.3f}")
    return 0


def _skew(args: argparse.Namespace) -> int:
    from trainer.experiments.plots import plot_skew
    from trainer.experiments.skew import SkewConfig, run_skew

    try:
        cfg = SkewConfig(n=args.n, configs=args.configs, replicates=args.replicates, epochs=args.steps,
                         lr=args.lr, clip_eps=args.clip_eps, reward=args.reward,
                         estimators=tuple(e.strip() for e in args.estimators.split(",") if e.strip()))
        from trainer.advantage import ESTIMATORS

        unknown = [e for e in cfg.estimators if e not in ESTIMATORS]
        if unknown:
            raise ValueError(f"unknown estimator(s) {', '.join(unknown)}; known: {', '.join(sorted(ESTIMATORS))}")
    except ValueError as exc:
        print(f"gagar experiment skew: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    result = run_skew(args.seeds, cfg, base_seed=args.base_seed)
    result["seconds"] = round(time.monotonic() - t0, 1)
    result = _clean(result)
    stem = "skew" if cfg.reward == "partial" else f"skew-{cfg.reward}"
    write_json_atomic(args.out / f"{stem}.json", result)
    plot_skew(result, args.out / f"{stem}.png")
    print(f"skew ({cfg.reward} rewards): {args.seeds} seeds in {result['seconds']} s -> "
          f"{args.out / (stem + '.json')}, {args.out / (stem + '.png')}")
    for est, rows in result["summary"].items():
        for shape, m in rows.items():
            print(f"  {est:<6} {shape:<13} sign err (rank) {m['sign_error_rank']['mean']:.3f}  "
                  f"(value) {m['sign_error_value']['mean']:.3f}  rank var {m['rank_var']['mean']:.3f}  "
                  f"clip {m['clip_frac']['mean']:.3f} (equal |A|: {m['clip_frac_matched']['mean']:.3f})")
    return 0


def _loop(args: argparse.Namespace) -> int:
    from trainer.experiments.loop import LoopExperiment, run_experiment
    from trainer.experiments.plots import plot_loop

    seeds, steps, extra, stem = args.seeds, args.steps, list(args.overrides), args.stem or "loop"
    heldout_tasks, heldout_k = args.heldout_tasks, args.heldout_k
    if args.quick:
        seeds, steps, extra, stem = QUICK["seeds"], QUICK["steps"], QUICK["set"] + extra, f"{stem}-quick"
        heldout_tasks, heldout_k = 1, 2
    try:
        from trainer.config import load_config

        base = load_config(args.config, extra)  # a bad override fails here, not after the first arm
        own_tasks = base.tasks.split or base.tasks.instances
        tasks_dir = args.tasks_dir or (None if own_tasks else DEFAULT_TASKS)
        if tasks_dir is not None:
            _ensure_tasks(tasks_dir)
        if base.warmstart.enabled and base.warmstart.tasks_dir:
            _ensure_tasks(Path(base.warmstart.tasks_dir))
        split = args.heldout_split if args.heldout_split is not None else ("heldout" if base.tasks.split else "")
        from trainer.tasks import check_heldout_split, split_ids

        split_ids(base.tasks)  # a missing splits file or split fails here, with what there is, not mid-run
        if split:
            split_ids(base.tasks.model_copy(update={"split": split}))
            check_heldout_split(base.tasks, split)
        _ensure_repos(base)
        exp = LoopExperiment(config=args.config, arms=[a.strip() for a in args.arms.split(",") if a.strip()],
                             seeds=seeds, steps=steps, work=args.work / stem, tasks_dir=tasks_dir, extra=extra,
                             heldout_split=split, heldout_tasks=heldout_tasks, heldout_k=heldout_k)
        for arm in exp.arms:
            cfg = exp.config_for(arm, 0)
            if cfg.grader.judge != "heuristic" and cfg.grader.adapter and not Path(cfg.grader.adapter).is_dir():
                raise ValueError(f"arm {arm} needs the learned judge's adapter at {cfg.grader.adapter}: train it "
                                 "with `make judge`, or pass --set grader.adapter=DIR")
    except (ValueError, VerdictError) as exc:
        print(f"gagar experiment loop: {exc}", file=sys.stderr)
        return 2
    est = exp.estimate_s()
    print(f"loop: {len(exp.arms)} arms × {seeds} seeds × {steps} steps"
          + (f", held-out {split} ({heldout_tasks or 'all'} tasks, greedy + {heldout_k} samples)" if split else "")
          + f"; estimated {est['total'] / 60:.0f} min on the 2-core machine ("
          + ", ".join(f"{k.replace('_', ' ')} {v / 60:.0f}" for k, v in est.items() if k != "total" and v)
          + f"; runs in {exp.work}, finished runs, the warm start and the frontier reused)", flush=True)
    if args.dry_run:
        return 0
    result = _clean(run_experiment(exp, log=lambda m: print(m, flush=True)))
    write_json_atomic(args.out / f"{stem}.json", result)
    plot_loop(result, args.out / f"{stem}.png")
    print(f"loop: {result['seconds']} s -> {args.out / (stem + '.json')}, {args.out / (stem + '.png')}")
    for arm, data in result["results"].items():
        f, h = data["final"], data["heldout"] or {}
        print(f"  {arm:<15} (last {result['tail_steps']} steps) pass {fmt(f['pass_rate']['mean'])} "
              f"± {fmt(f['pass_rate']['std'])}  passing diff lines {fmt(f['passing_diff_lines']['mean'])}  "
              f"scope creep {fmt(f['scope_creep']['mean'])}"
              + (f"  held-out pass@1 {fmt(h['pass1_greedy']['mean'])} ± {fmt(h['pass1_greedy']['std'])}, "
                 f"pass@{heldout_k} {fmt(h[f'pass{heldout_k}']['mean'])}" if h else ""))
    return 0


def _ensure_repos(cfg: Any) -> None:
    """A synthesized set's task repositories are rebuilt from its sources on first use (`gagar tasks repos`)."""
    inst, repos = cfg.tasks.instances_path(), cfg.tasks.repos_path()
    if repos.is_dir() or not (inst.parent / "tasks_meta.jsonl").is_file():
        return
    from synth.rebuild import rebuild

    print(f"rebuilding the task repositories of {inst.parent} into {repos.parent} (gagar tasks repos) ...",
          file=sys.stderr, flush=True)
    if repos.name != "repos":
        raise ValueError(f"tasks.repos_dir must end in /repos to be rebuilt here (got {repos}); run "
                         f"`gagar tasks repos {inst.parent} --out DIR` and set tasks.repos_dir=DIR/repos")
    repos.parent.mkdir(parents=True, exist_ok=True)
    rebuild(inst.parent, repos.parent.resolve())


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.name == "loop":
        return _loop(args)  # the trainer sizes its own threads
    import torch

    # The tensors are tiny: intra-op threads only add contention (30x slower on a busy 2-core machine).
    torch.set_num_threads(1)
    return _bloat(args) if args.name == "bloat" else _skew(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
