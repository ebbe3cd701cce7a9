"""Run metrics: one JSON line per step in `OUT/metrics.jsonl` (and TensorBoard scalars when it is installed)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from sandbox.jsonl import append_jsonl, read_jsonl, write_jsonl_atomic
from trainer.groups import RolloutGroup


class MetricsWriter:
    def __init__(self, out: Path, *, start_step: int = 0, tensorboard: bool = True) -> None:
        self.path = Path(out) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # On resume, steps after the checkpoint were never committed: drop them so the curve has no duplicates.
        if self.path.exists():
            keep = [ln for ln in read_metrics(self.path) if ln.get("step", 0) <= start_step]
            write_jsonl_atomic(self.path, keep)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(out) / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        append_jsonl(self.path, clean)
        if self.tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self.tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path, skip_bad=True, notes=[])  # a line cut by a crash is dropped


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def step_row(step: int, groups: list[RolloutGroup], kept: list[RolloutGroup], stats: dict[str, Any]) -> dict:
    """One metrics line: what was sampled (`groups`, every draw of the step), what was trained on (`kept`),
    and the stage statistics and timings in `stats` (advantages, GAGAR before/after, update, seconds)."""
    results = [r for g in groups for r in g.results]
    valid = [r for r in results if r.status != "infra_error"]
    n_valid = sum(v for g in groups for v in g.valid)  # neither infra_error nor dropped
    statuses = Counter(r.status for r in results)
    row: dict[str, Any] = {
        "step": step,
        "groups_sampled": len(groups),
        "groups_kept": len(kept),
        "rollouts": len(results),
        # Over the rollouts the sandbox could run: an infra_error says nothing about the policy.
        "pass_rate": sum(p for g in groups for p, v in zip(g.passed, g.valid, strict=True) if v) / max(1, n_valid),
        "resolved_rate": sum(r.resolved for r in valid) / max(1, len(valid)),
        "infra_errors": len(results) - len(valid),
        "dropped": sum(t.dropped for g in groups for t in g.trajs),
        # single-turn answers that are no patch in the edit format asked for (empty patch, reward 0)
        "format_errors": sum(t.format_error is not None for g in groups for t in g.trajs),
        "hacks_sandbox": sum(r.hacked for r in results),
        "hacks_grader": sum(len(g.grader_hacks) for g in groups),
        "tampered": sum(r.tampered_tests for r in results),
        "reward_mean": _mean([float(p) for g in kept for p, v in zip(g.passed, g.valid, strict=True) if v]),
        "policy_tokens_mean": _mean([t.policy_tokens for g in kept for t in g.trajs]),
        "rollout_tokens": sum(t.policy_tokens for g in groups for t in g.trajs),  # every sampled token
        "patch_lines_mean": _mean([len(t.patch.splitlines()) for g in kept for t in g.trajs]),
        **{f"status_{k}": v for k, v in sorted(statuses.items())},
    }
    row.update(stats)
    if row.get("gen_s"):  # sampling throughput (scoring the behaviour log-probs is score_s)
        row["rollout_tokens_per_s"] = round(row["rollout_tokens"] / row["gen_s"], 2)
    return row
