"""`gagar experiment loop` — the integrated loop's own learning effect, through the real `gagar train` path.

Each arm is a real training run (tiny policy, warm start, rollouts, Docker sandbox, grader, advantages, LoRA
update) on the bundled tasks, over several seeds; the control arm is the same run with the learning rate 0, so
whatever moves there is sampling noise after the warm start. Per step we read the loop's own files: its
`metrics.jsonl` (pass rate, tokens, advantage statistics, GAGAR-changed groups, judge fallbacks) and the
sandbox's per-step `results.jsonl` + `patch.diff` of every rollout, which we match against the bundled
rollouts' quality labels (`expected.jsonl`) to get the share of the minimal patch among passing rollouts.

All arms of one seed share its warm start (the trainer caches it by everything that shapes it), so the arms
start from the same weights and differ only in the advantage and the update.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.jsonl import read_jsonl
from sandbox.records import EvalResult
from trainer.experiments.verdicts import diff_size

# arm name -> overrides of the base config (the default composition is whatever the config file says)
ARMS: dict[str, list[str]] = {
    "grpo": ["advantage.mode=grpo"],
    "grpo+gagar": ["advantage.mode=grpo+gagar"],
    "gapo+gagar": ["advantage.mode=gapo+gagar"],
    "control": ["optim.lr=0"],
}
METRICS = ("pass_rate", "minimal_share", "passing_diff_lines", "policy_tokens_mean", "adv_std",
           "adv_pass_max_after", "gagar_groups", "judge_fallbacks")
# Wall-clock seconds per RL step and per warm start of the tiny config on a quiet 2-core machine (measured
# by this experiment's own runs; used only for the estimate printed before starting).
STEP_S, WARMSTART_S = 9.0, 60.0


@dataclass
class LoopExperiment:
    config: Path
    arms: list[str]
    seeds: int = 3
    steps: int = 24
    work: Path = Path(".gagar/experiments/loop")
    tasks_dir: Path = Path(".gagar/tasks")
    extra: list[str] = field(default_factory=list)  # more --set overrides for every run

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
        if not (self.tasks_dir / "expected.jsonl").is_file():
            raise ValueError(f"{self.tasks_dir} holds no bundled tasks (expected.jsonl); build them with "
                             f"`python examples/build_tasks.py --out {self.tasks_dir}` (or `make tasks`)")

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.work / f"{arm}-seed{seed}"

    def estimate_s(self) -> float:
        todo = [(a, s) for a in self.arms for s in range(self.seeds) if not _done(self.run_dir(a, s), self.steps)]
        seeds_to_warm = len({s for _, s in todo})
        return len(todo) * self.steps * STEP_S + seeds_to_warm * WARMSTART_S


def _done(run: Path, steps: int) -> bool:
    summary = run / "summary.json"
    if not summary.is_file():
        return False
    try:
        return int(json.loads(summary.read_text()).get("steps", -1)) == steps
    except (OSError, ValueError):
        return False


def _norm(patch: str) -> str:
    """Compare patches by their changes, not by `index` lines or trailing blanks a sampler may drop."""
    return "\n".join(ln.rstrip() for ln in patch.splitlines() if not ln.startswith("index ")).strip()


def quality_labels(tasks_dir: Path) -> dict[tuple[str, str], str]:
    """(instance_id, normalised patch) -> the bundled rollout's kind (minimal, gold, bloated, ...)."""
    kinds = {(e["instance_id"], str(e["rollout_id"])): e["kind"] for e in read_jsonl(tasks_dir / "expected.jsonl")}
    out: dict[tuple[str, str], str] = {}
    for p in read_jsonl(tasks_dir / "predictions.jsonl"):
        kind = kinds.get((p["instance_id"], str(p.get("rollout_id"))))
        if kind and p.get("model_patch"):
            out.setdefault((p["instance_id"], _norm(p["model_patch"])), kind)
    return out


def _patch_of(row: dict[str, Any]) -> str:
    log = Path(row.get("log_path") or "")
    for cand in (log / "patch.diff", log.parent / "patch.diff"):
        if cand.is_file():
            return cand.read_text(errors="replace")
    return ""


def step_quality(run: Path, step: int, labels: dict[tuple[str, str], str]) -> dict[str, float | None]:
    """Quality of the step's passing rollouts, from the sandbox's own per-step results and patch logs."""
    kinds: list[str] = []
    lines: list[int] = []
    for res in sorted((run / "sandbox" / f"step_{step:06d}").rglob("results.jsonl")):
        for row in read_jsonl(res, skip_bad=True):
            r = EvalResult.from_dict(row)
            if not r.passed:
                continue
            patch = _patch_of(row)
            kinds.append(labels.get((r.instance_id, _norm(patch)), "other"))
            lines.append(diff_size(patch)[0])
    if not kinds:
        return {"minimal_share": None, "passing_diff_lines": None}
    return {"minimal_share": kinds.count("minimal") / len(kinds), "passing_diff_lines": sum(lines) / len(lines)}


def run_arm(exp: LoopExperiment, arm: str, seed: int, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Train one arm for one seed (resuming a cut run), then return its per-step rows."""
    from trainer.checkpoint import latest_checkpoint
    from trainer.config import load_config
    from trainer.loop import train

    run = exp.run_dir(arm, seed)
    if not _done(run, exp.steps):
        overrides = [f"steps={exp.steps}", f"seed={seed}", f"out={run}", f"tasks.dir={exp.tasks_dir}",
                     "tensorboard=false", *ARMS[arm], *exp.extra]
        cfg = load_config(exp.config, overrides)
        train(cfg, resume=latest_checkpoint(run) is not None, log=lambda m: None)
    return collect(run, exp.tasks_dir, exp.steps)


def collect(run: Path, tasks_dir: Path, steps: int) -> list[dict[str, Any]]:
    labels = quality_labels(tasks_dir)
    rows = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl", skip_bad=True)}
    out = []
    for step in range(1, steps + 1):
        m = rows.get(step, {})
        out.append({"step": step, **{k: m.get(k) for k in METRICS}, **step_quality(run, step, labels)})
    return out


def _stats(values: list[float | None]) -> dict[str, float | None]:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(v)}


def aggregate(per_seed: dict[str, list[list[dict[str, Any]]]], steps: int, tail: int) -> dict[str, Any]:
    """Per arm: mean ± std over seeds at every step, and over the last `tail` steps of each seed."""
    out: dict[str, Any] = {}
    for arm, seeds in per_seed.items():
        curves = {m: [_stats([s[i].get(m) for s in seeds]) for i in range(steps)] for m in METRICS}

        def tail_mean(s: list[dict[str, Any]], m: str) -> float | None:
            v = [r.get(m) for r in s[-tail:] if r.get(m) is not None]
            return sum(v) / len(v) if v else None

        final = {m: _stats([tail_mean(s, m) for s in seeds]) for m in METRICS}
        out[arm] = {"curves": curves, "final": final}
    return out


def run_experiment(exp: LoopExperiment, log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.monotonic()
    per_seed: dict[str, list[list[dict[str, Any]]]] = {a: [] for a in exp.arms}
    total = len(exp.arms) * exp.seeds
    k = 0
    for seed in range(exp.seeds):  # seed-major: a cut experiment still has every arm for the first seeds
        for arm in exp.arms:
            k += 1
            t = time.monotonic()
            per_seed[arm].append(run_arm(exp, arm, seed, log))
            last = per_seed[arm][-1][-1]
            log(f"[{k}/{total}] {arm} seed {seed}: {time.monotonic() - t:.0f} s, last-step pass rate "
                f"{fmt(last.get('pass_rate'))}, minimal share {fmt(last.get('minimal_share'))}")
    tail = max(1, exp.steps // 4)
    return {
        "config": str(exp.config), "arms": {a: ARMS[a] for a in exp.arms}, "extra": exp.extra,
        "seeds": exp.seeds, "steps": exp.steps, "tail_steps": tail, "seconds": round(time.monotonic() - t0, 1),
        "metrics": list(METRICS), "results": aggregate(per_seed, exp.steps, tail),
        "per_seed": per_seed,
    }


def fmt(v: Any) -> str:
    """A figure for the experiment logs: three decimals, or n/a where no run produced one."""
    return "n/a" if v is None else f"{v:.3f}"
