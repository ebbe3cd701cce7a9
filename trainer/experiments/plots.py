"""PNG figures of the experiments' JSON results (matplotlib, headless)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_BLOAT_PANELS = (
    ("pass_rate", "pass rate (policy)"),
    ("minimal_share", "minimal share of passing (dashed: grader tier 1)"),
    ("diff_lines", "diff lines of passing (mean)"),
    ("entropy", "policy entropy (nats)"),
    ("pos_adv", "positive advantage per group"),
    ("mixed_groups", "share of mixed groups (dashed: judged)"),
)


_SAMPLED = {"pos_adv", "mixed_groups"}
_SMOOTH = 10


def _save(fig: Any, path: Path) -> None:
    """Write atomically so an interrupted run never leaves a truncated PNG behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)


def plot_bloat(result: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (key, title) in zip(axes.flat, _BLOAT_PANELS, strict=True):
        for method, data in result["methods"].items():
            band = data["curves"][key]
            mean = np.asarray([np.nan if v is None else v for v in band["mean"]], dtype=float)
            std = np.asarray([np.nan if v is None else v for v in band["std"]], dtype=float)
            x = np.arange(len(mean))
            if key in _SAMPLED:
                # Per-step sample statistics are noisy: draw a moving average, without the band.
                w = max(1, min(_SMOOTH, len(mean)))
                line = ax.plot(x[w - 1:], np.convolve(mean, np.ones(w) / w, mode="valid"), label=method, lw=1.4)[0]
                if key == "mixed_groups" and "graded_groups" in data["curves"]:
                    judged = np.asarray(data["curves"]["graded_groups"]["mean"], dtype=float)
                    ax.plot(x[w - 1:], np.convolve(judged, np.ones(w) / w, mode="valid"), ls="--", lw=1.0,
                            color=line.get_color())
                continue
            line = ax.plot(x, mean, label=method, lw=1.4)[0]
            ax.fill_between(x, mean - std, mean + std, alpha=0.18)
            if key == "minimal_share" and "top_tier_share" in data["curves"]:
                top = np.asarray([np.nan if v is None else v for v in data["curves"]["top_tier_share"]["mean"]])
                ax.plot(x, top, ls="--", lw=1.0, color=line.get_color())
        ax.set_title(title + (f" ({_SMOOTH}-step avg)" if key in _SAMPLED else ""))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="lower right", fontsize=9)
    cfg = result["config"]
    fig.suptitle(f"bloat: softmax policy over {len(result['tasks'])} bundled tasks' real patches — "
                 f"n={cfg['n']}, lr={cfg['lr']}, mean ± sd over {cfg['seeds']} seeds", fontsize=11)
    fig.tight_layout()
    _save(fig, path)


_SKEW_PANELS = (
    ("sign_error_rank", "sign errors vs true ranking (A = 0: half)"),
    ("sign_error_value", "sign errors vs true mean quality (A = 0: half)"),
    ("rank_var", "variance of A at a fixed true rank"),
    ("clip_frac_matched", "PPO clip fraction at equal mean |A|"),
)


def plot_skew(result: dict[str, Any], path: Path) -> None:
    summary = result["summary"]
    estimators = list(summary)
    shapes = [s for s in ("all", "normal", "left_skewed", "right_skewed", "outlier") if s in summary[estimators[0]]]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    width = 0.8 / max(len(estimators), 1)
    x = np.arange(len(shapes))
    for ax, (key, title) in zip(axes.flat, _SKEW_PANELS, strict=True):
        for i, est in enumerate(estimators):
            means = [summary[est][s][key]["mean"] for s in shapes]
            stds = [summary[est][s][key]["std"] for s in shapes]
            ax.bar(x + (i - (len(estimators) - 1) / 2) * width, means, width, yerr=stds, label=est, capsize=2)
        ax.set_xticks(x, [s.replace("_", "\n") for s in shapes])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=9)
    cfg = result["config"]
    kind = {"partial": "partial-credit rewards", "exact": "rewards = latent quality",
            "tests": "rewards = tests passed / m"}.get(cfg.get("reward"), "")
    fig.suptitle(f"skew: {kind}, groups of n={cfg['n']}, "
                 f"{cfg['configs']}×{cfg['replicates']} groups per seed, {cfg['seeds']} seeds", fontsize=11)
    fig.tight_layout()
    _save(fig, path)


_LOOP_PANELS = (
    ("pass_rate", "train pass rate"),
    ("passing_diff_lines", "diff lines of passing (mean)"),
    ("scope_creep", "passing patches out of scope"),
    ("policy_tokens_mean", "policy tokens per rollout"),
    ("minimal_share", "minimal share of passing (labelled tasks)"),
    ("adv_pass_max_after", "max passing advantage after GAGAR"),
    ("gagar_groups", "groups GAGAR could act on"),
    ("judge_fallbacks", "judge fallbacks"),
)
_HELDOUT_BARS = (("pass1_greedy", "held-out pass@1 (greedy)"), ("passk", "held-out pass@k"),
                 ("passing_diff_lines", "held-out passing diff lines"), ("scope_creep", "held-out out of scope"))


def plot_loop(result: dict[str, Any], path: Path) -> Path:
    """One panel per step metric (each arm's mean over seeds, shaded ± one std); with held-out figures, a last
    row of bars (mean ± std over seeds) per arm."""
    held = result.get("heldout")
    rows = 3 if held else 2
    fig, axes = plt.subplots(rows, 4, figsize=(17, 3.75 * rows))
    steps = np.arange(1, result["steps"] + 1)
    for ax, (key, title) in zip(axes.flat, _LOOP_PANELS, strict=False):
        for arm, data in result["results"].items():
            curve = data["curves"].get(key) or []
            mean = np.array([np.nan if c["mean"] is None else c["mean"] for c in curve], dtype=float)
            std = np.array([0.0 if c["std"] is None else c["std"] for c in curve], dtype=float)
            style = "--" if arm == "control" else "-"
            (line,) = ax.plot(steps[: len(mean)], mean, style, marker="o" if len(mean) < 12 else None, label=arm)
            ax.fill_between(steps[: len(mean)], mean - std, mean + std, color=line.get_color(), alpha=0.15)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if held:
        arms = list(result["results"])
        for ax, (key, title) in zip(axes[2], _HELDOUT_BARS, strict=True):
            key = f"pass{held['k']}" if key == "passk" else key
            vals = [(result["results"][a]["heldout"] or {}).get(key) or {} for a in arms]
            mean = [np.nan if v.get("mean") is None else v["mean"] for v in vals]
            std = [0.0 if v.get("std") is None else v["std"] for v in vals]
            ax.bar(range(len(arms)), mean, yerr=std, capsize=3, color=[f"C{i}" for i in range(len(arms))])
            ax.set_xticks(range(len(arms)), arms, rotation=25, fontsize=8, ha="right")
            ax.set_title(title.replace("pass@k", f"pass@{held['k']}"), fontsize=10)
            ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"gagar experiment loop: {result['seeds']} seeds × {result['steps']} steps (mean ± std)"
                 + (f"; held-out: {held['tasks'] or 'all'} tasks of split {held['split']}" if held else ""))
    _save(fig, path)
    return path
