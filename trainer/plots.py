"""PNG curves of a run's metrics (matplotlib, headless)."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.metrics import read_metrics

PANELS = [
    ("pass rate", ["pass_rate"]),
    ("mean reward (kept groups)", ["reward_mean"]),
    ("advantages", ["adv_mean", "adv_std", "adv_max", "adv_min"]),
    # GAGAR's redistribution among the passing rollouts it moved: dashed before, solid after.
    ("GAGAR: passing advantages before/after", ["adv_pass_max_before", "adv_pass_max_after",
                                                "adv_pass_min_before", "adv_pass_min_after"]),
    ("clip fraction / KL", ["clip_frac", "kl"]),
    ("policy tokens per rollout", ["policy_tokens_mean"]),
    ("loss / entropy", ["loss", "entropy"]),
    ("groups / hacks / infra errors", ["groups_sampled", "groups_kept", "hacks_sandbox", "hacks_grader",
                                        "infra_errors"]),
    ("seconds per stage", ["gen_s", "score_s", "eval_s", "check_s", "rank_s", "update_s", "sync_s"]),
]


def plot_metrics(metrics_path: Path, out_png: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path) if Path(metrics_path).exists() else []
    if not rows:
        return None
    fig, axes = plt.subplots(3, 3, figsize=(16, 10.5))
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=k,
                        linestyle="--" if k.endswith("_before") else "-")
        ax.set_title(title)
        ax.set_xlabel("step")
        if len(keys) > 1 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(f".{out_png.stem}.tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    os.replace(tmp, out_png)
    return out_png
