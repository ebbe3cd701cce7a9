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
from trainer.config import TrainConfig
from trainer.experiments.scope import Scope, task_scope
from trainer.experiments.verdicts import diff_size

# arm name -> overrides of the base config (the default composition is whatever the config file says)
ARMS: dict[str, list[str]] = {
    "grpo": ["advantage.mode=grpo"],
    "grpo+gagar": ["advantage.mode=grpo+gagar"],  # with the config's grader (the heuristic by default)
    # the learned judge of `make judge`: SmolLM2-135M-Instruct + its LoRA adapter, the scoring judge combined with
    # the heuristic at the confidence calibrated beside the adapter (grader.judge.scoring)
    "grpo+gagar-llm": ["advantage.mode=grpo+gagar", "grader.judge=combined", "grader.model=smollm2-135m-instruct",
                       "grader.adapter=.gagar/models/judge"],
    "gapo+gagar": ["advantage.mode=gapo+gagar"],
    "downweight": ["advantage.mode=grpo+downweight"],
    "control": ["optim.lr=0"],
}
METRICS = ("pass_rate", "minimal_share", "passing_diff_lines", "passing_files", "scope_creep",
           "out_of_scope_lines", "policy_tokens_mean", "adv_std", "adv_pass_max_after", "gagar_groups", "gagar_moved",
           "judge_fallbacks", "hacks_sandbox", "hacks_grader", "format_errors", "groups_kept", "gen_s", "eval_s",
           "check_s", "rank_s", "update_s", "step_s")
HELDOUT = ("pass1_greedy", "pass1_sampled", "passing_diff_lines", "passing_files", "scope_creep",
           "out_of_scope_lines", "tokens_mean", "hacks_sandbox", "hacks_grader", "format_errors")
# Wall-clock seconds, measured on the 2-core machine, used only for the estimate printed first: per answer of an RL
# step (sampling, scoring, update, sandbox, grading), per answer sampled and judged without an update (held-out,
# frontier), and per warm start. tiny: this experiment's own runs (12 answers a step in 9 s). smol: the demo's
# vLLM step (230 s for 8 answers, load 10-25: README), the held-out measurement of the mutation-warm-started policy
# (bench/results/policy-warmstart.json) and its warm start under the 35-minute budget of configs/loop_real.yaml.
TIMING = {"tiny": {"answer_s": 0.75, "sample_s": 0.2, "warm_s": 60.0},
          "smol": {"answer_s": 29.0, "sample_s": 12.0, "warm_s": 2400.0}}


@dataclass
class LoopExperiment:
    config: Path
    arms: list[str]
    seeds: int = 3
    steps: int = 24
    work: Path = Path(".gagar/experiments/loop")
    tasks_dir: Path | None = Path(".gagar/tasks")  # None: the tasks the config names
    extra: list[str] = field(default_factory=list)  # more --set overrides for every run
    heldout_split: str = ""  # a split of the task set to measure every trained policy on ("" = none)
    heldout_tasks: int = 16  # a fixed subset of it, the same for every run (0 = all)
    heldout_k: int = 4  # samples per held-out task for pass@k

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
        if self.heldout_split:
            from trainer.tasks import check_heldout_split

            check_heldout_split(self.config_for(self.arms[0], 0).tasks, self.heldout_split)
        if self.tasks_dir is not None and not (self.tasks_dir / "instances.jsonl").is_file():
            raise ValueError(f"{self.tasks_dir} holds no tasks (instances.jsonl); build the bundled ones with "
                             f"`python examples/build_tasks.py --out {self.tasks_dir}` (or `make tasks`)")

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.work / f"{arm}-seed{seed}"

    def overrides(self, arm: str, seed: int) -> list[str]:
        tasks = [f"tasks.dir={self.tasks_dir}"] if self.tasks_dir is not None else []
        return [f"steps={self.steps}", f"seed={seed}", f"out={self.run_dir(arm, seed)}", *tasks,
                "tensorboard=false", *ARMS[arm], *self.extra]

    def config_for(self, arm: str, seed: int) -> TrainConfig:
        from trainer.config import load_config

        return load_config(self.config, self.overrides(arm, seed))

    def estimate_s(self) -> dict[str, float]:
        """Seconds still to spend, by part (the runs not finished yet; the warm start and the frontier estimate
        once when every seed shares them), and their sum under "total"."""
        from trainer.tasks import load_instances

        cfg = self.config_for(self.arms[0], 0)
        t = TIMING["smol" if "smol" in str(cfg.model.name_or_path) else "tiny"]
        todo = [(a, s) for a in self.arms for s in range(self.seeds) if not _done(self.run_dir(a, s), self.steps)]
        shared = cfg.warmstart.source == "mutations"  # keyed by warmstart.seed, not the run's seed
        warm = (1 if todo and shared else len({s for _, s in todo})) * t["warm_s"] if cfg.warmstart.enabled else 0.0
        r = cfg.rollout
        part = {"steps": len(todo) * self.steps * r.tasks_per_step * r.n * t["answer_s"], "warm_start": warm,
                "frontier": (len(load_instances(cfg)) * cfg.tasks.frontier_k * t["sample_s"]
                             if todo and cfg.tasks.frontier_k else 0.0),
                "heldout": 0.0}
        if self.heldout_split and todo:
            held = self.heldout_tasks or len(load_instances(cfg.model_copy(update={"tasks": cfg.tasks.model_copy(
                update={"split": self.heldout_split, "frontier_k": 0})})))
            part["heldout"] = len(todo) * held * (1 + self.heldout_k) * t["sample_s"]
        return {**part, "total": sum(part.values())}


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
    """(instance_id, normalised patch) -> the bundled rollout's kind (minimal, gold, bloated, ...); empty for a
    task set without labelled rollouts (`expected.jsonl`)."""
    if not (tasks_dir / "expected.jsonl").is_file():
        return {}
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


class Quality:
    """The quality of a step's passing rollouts, read from the sandbox's own per-step results and patch logs: the
    share of the bundled minimal patch (labelled task sets), size, and scope against the reference fix."""

    def __init__(self, cfg: TrainConfig) -> None:
        from trainer.tasks import load_instances

        self.labels = quality_labels(cfg.tasks.instances_path().parent)  # the labels beside the tasks trained on
        self.instances = load_instances(cfg)
        self.repos = cfg.tasks.repos_path()
        self._scopes: dict[str, Scope] = {}

    def scope(self, iid: str) -> Scope:
        if iid not in self._scopes:
            inst = self.instances[iid]
            self._scopes[iid] = task_scope(inst, self.repos / inst.repo_dirname)
        return self._scopes[iid]

    def step(self, run: Path, step: int) -> dict[str, float | None]:
        kinds: list[str] = []
        sizes: list[tuple[int, int]] = []
        outside: list[int] = []
        for res in sorted((run / "sandbox" / f"step_{step:06d}").rglob("results.jsonl")):
            for row in read_jsonl(res, skip_bad=True):
                r = EvalResult.from_dict(row)
                if not r.passed or r.instance_id not in self.instances:
                    continue
                patch = _patch_of(row)
                kinds.append(self.labels.get((r.instance_id, _norm(patch)), "other"))
                sizes.append(diff_size(patch))
                outside.append(self.scope(r.instance_id).outside(patch))
        if not kinds:
            return {"minimal_share": None, "passing_diff_lines": None, "passing_files": None,
                    "scope_creep": None, "out_of_scope_lines": None}
        n = len(kinds)
        return {"minimal_share": kinds.count("minimal") / n if self.labels else None,
                "passing_diff_lines": sum(a for a, _ in sizes) / n, "passing_files": sum(b for _, b in sizes) / n,
                "scope_creep": sum(o > 0 for o in outside) / n, "out_of_scope_lines": sum(outside) / n}


def run_arm(exp: LoopExperiment, arm: str, seed: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train one arm for one seed (resuming a cut run), measure it on the held-out tasks, and return its per-step
    rows and held-out figures."""
    from trainer.checkpoint import latest_checkpoint
    from trainer.loop import train

    run = exp.run_dir(arm, seed)
    cfg = exp.config_for(arm, seed)
    if not _done(run, exp.steps):
        train(cfg, resume=latest_checkpoint(run) is not None, log=lambda m: None)
    heldout = None
    if exp.heldout_split:
        from trainer.experiments.heldout import evaluate_heldout

        held = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"split": exp.heldout_split})})
        heldout = evaluate_heldout(held, run, max_tasks=exp.heldout_tasks, k=exp.heldout_k, log=lambda m: None)
    frontier = json.loads((run / "frontier.json").read_text()) if (run / "frontier.json").is_file() else None
    return {"steps": collect(run, cfg, exp.steps), "heldout": heldout,
            "frontier": {k: v for k, v in frontier.items() if k != "rates"} if frontier else None}


def collect(run: Path, cfg: TrainConfig, steps: int) -> list[dict[str, Any]]:
    quality = Quality(cfg)
    rows = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl", skip_bad=True)}
    out = []
    for step in range(1, steps + 1):
        m = rows.get(step, {})
        out.append({"step": step, **{k: m.get(k) for k in METRICS}, **quality.step(run, step)})
    return out


def _stats(values: list[float | None]) -> dict[str, float | None]:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(v)}


def aggregate(per_seed: dict[str, list[dict[str, Any]]], steps: int, tail: int, k: int) -> dict[str, Any]:
    """Per arm: mean ± std over seeds at every step, over the last `tail` steps of each seed, and of the
    held-out figures."""
    out: dict[str, Any] = {}
    for arm, seeds in per_seed.items():
        rows = [s["steps"] for s in seeds]
        curves = {m: [_stats([s[i].get(m) for s in rows]) for i in range(steps)] for m in METRICS}

        def tail_mean(s: list[dict[str, Any]], m: str) -> float | None:
            v = [r.get(m) for r in s[-tail:] if r.get(m) is not None]
            return sum(v) / len(v) if v else None

        final = {m: _stats([tail_mean(s, m) for s in rows]) for m in METRICS}
        held = [s["heldout"] for s in seeds if s.get("heldout")]
        heldout = {m: _stats([h.get(m) for h in held]) for m in (*HELDOUT, f"pass{k}", f"pass{k}_tasks")} \
            if held else None
        out[arm] = {"curves": curves, "final": final, "heldout": heldout}
    return out


CONTRASTS = ("pass_rate", "passing_diff_lines", "passing_files", "scope_creep", "out_of_scope_lines",
             "policy_tokens_mean")
HELD_CONTRASTS = ("pass1_greedy", "pass1_sampled", "passing_diff_lines", "scope_creep")


def contrast(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Arm a minus arm b on one figure (`_stats` of each over seeds): the difference, its standard error over
    the seeds (Welch), and whether it is beyond the seed spread (|difference| > 2 standard errors)."""
    if not a or not b or a.get("mean") is None or b.get("mean") is None or not a["n"] or not b["n"]:
        return None
    diff = a["mean"] - b["mean"]
    se = math.sqrt((a["std"] or 0.0) ** 2 / a["n"] + (b["std"] or 0.0) ** 2 / b["n"])
    return {"diff": diff, "se": se, "beyond_spread": bool(abs(diff) > 2 * se) if se > 0 else diff != 0.0,
            "seeds": [a["n"], b["n"]]}


def contrasts(results: dict[str, Any], k: int) -> dict[str, Any]:
    """Every arm against `grpo` and against `control`, on the last steps' training figures and the held-out
    ones: what differs beyond the seed spread and what does not."""
    out: dict[str, Any] = {}
    held = (*HELD_CONTRASTS, f"pass{k}")
    for base in ("grpo", "control"):
        if base not in results:
            continue
        for arm, data in results.items():
            if arm == base:
                continue
            row = {f"train.{m}": contrast(data["final"].get(m), results[base]["final"].get(m)) for m in CONTRASTS}
            if data.get("heldout") and results[base].get("heldout"):
                row.update({f"heldout.{m}": contrast(data["heldout"].get(m), results[base]["heldout"].get(m))
                            for m in held})
            out[f"{arm} - {base}"] = {m: c for m, c in row.items() if c is not None}
    return out


def run_experiment(exp: LoopExperiment, log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.monotonic()
    per_seed: dict[str, list[dict[str, Any]]] = {a: [] for a in exp.arms}
    total = len(exp.arms) * exp.seeds
    k = 0
    for seed in range(exp.seeds):  # seed-major: a cut experiment still has every arm for the first seeds
        for arm in exp.arms:
            k += 1
            t = time.monotonic()
            per_seed[arm].append(run_arm(exp, arm, seed, log))
            last, held = per_seed[arm][-1]["steps"][-1], per_seed[arm][-1]["heldout"] or {}
            log(f"[{k}/{total}] {arm} seed {seed}: {time.monotonic() - t:.0f} s, last-step pass rate "
                f"{fmt(last.get('pass_rate'))}, passing diff lines {fmt(last.get('passing_diff_lines'))}"
                + (f", held-out pass@1 {fmt(held.get('pass1_greedy'))}" if held else ""))
    tail = max(1, exp.steps // 4)
    return {
        "config": str(exp.config), "arms": {a: ARMS[a] for a in exp.arms}, "extra": exp.extra,
        "seeds": exp.seeds, "steps": exp.steps, "tail_steps": tail, "seconds": round(time.monotonic() - t0, 1),
        "heldout": {"split": exp.heldout_split, "tasks": exp.heldout_tasks, "k": exp.heldout_k}
        if exp.heldout_split else None,
        "metrics": list(METRICS), "results": (results := aggregate(per_seed, exp.steps, tail, exp.heldout_k)),
        "contrasts": contrasts(results, exp.heldout_k),
        # the training tasks every run trained on (tasks.frontier_k; the same estimate for every arm and seed)
        "frontier": next((s["frontier"] for runs in per_seed.values() for s in runs if s.get("frontier")), None),
        "per_seed": per_seed,
    }


def fmt(v: Any) -> str:
    """A figure for the experiment logs: three decimals, or n/a where no run produced one."""
    return "n/a" if v is None else f"{v:.3f}"
