"""`gagar train --config FILE.yaml [--resume] [--steps N] [--out DIR] [--set section.key=value ...]`."""

from __future__ import annotations

import json
import sys
import warnings

from gagar.args import ArgumentParser
from trainer.config import ConfigError, load_config

COLUMNS = [("step", "step", "{}"), ("pass", "pass_rate", "{:.2f}"), ("reward", "reward_mean", "{:.2f}"),
           ("kept", "groups_kept", "{}"), ("adv μ/σ", None, None), ("clip", "clip_frac", "{:.3f}"),
           ("kl", "kl", "{:.4f}"), ("tokens", "policy_tokens_mean", "{:.0f}"),
           ("hacks", "hacks_sandbox", "{}"), ("+grader", "hacks_grader", "{}"), ("infra", "infra_errors", "{}"),
           ("gagar", "gagar_groups", "{}"), ("moved", "gagar_moved", "{}"),
           ("|Δlogp|", "sampler_logprob_diff", "{:.1e}"),
           ("gen s", "gen_s", "{:.1f}"), ("score s", "score_s", "{:.1f}"), ("eval s", "eval_s", "{:.1f}"),
           ("check s", "check_s", "{:.1f}"), ("rank s", "rank_s", "{:.1f}"), ("update s", "update_s", "{:.1f}"),
           ("step s", "step_s", "{:.0f}")]


def _cell(row: dict, key: str | None, fmt: str | None) -> str:
    if key is None:
        if row.get("adv_mean") is None:
            return "-"
        return f"{row['adv_mean']:+.2f}/{row['adv_std']:.2f}"
    v = row.get(key)
    return "-" if v is None else fmt.format(v)


class LiveView:
    """A rich table that grows one row per step (plain lines when stdout is not a terminal)."""

    def __init__(self, total: int) -> None:
        from rich.console import Console

        self.console = Console()
        self.total = total
        self.rows: list[dict] = []
        self.live = None
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._table(), console=self.console, refresh_per_second=4)
            self.live.start()

    def _table(self):
        from rich.table import Table

        t = Table(title=f"gagar train — {len(self.rows)}/{self.total} steps", expand=False)
        for name, _, _ in COLUMNS:
            t.add_column(name, justify="right")
        for r in self.rows[-30:]:
            t.add_row(*(_cell(r, k, f) for _, k, f in COLUMNS))
        return t

    def log(self, msg: str) -> None:
        self.console.print(msg)

    def step(self, row: dict) -> None:
        self.rows.append(row)
        if self.live is not None:
            self.live.update(self._table())
        else:
            self.console.print("  ".join(f"{n}={_cell(row, k, f)}" for n, k, f in COLUMNS), soft_wrap=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def print_summary(summary: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    last = summary.get("last") or {}
    t = Table(title="run summary", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    for k in ("out", "steps", "checkpoint", "metrics", "plot"):
        t.add_row(k, str(summary.get(k)))
    for k in ("pass_rate", "reward_mean", "groups_kept", "adv_mean", "adv_std", "clip_frac", "loss",
              "hacks_sandbox", "hacks_grader", "infra_errors", "gagar_groups", "judge_fallbacks", "step_s"):
        if k in last:
            v = last[k]
            t.add_row(f"last {k}", f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(t)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="gagar train", description="RL post-training of a code agent "
                            "(sandboxed rewards, GAPO/GAGAR advantages). See docs/trainer.md.")
    parser.add_argument("--config", required=True, help="YAML config (see configs/tiny.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the out dir")
    parser.add_argument("--steps", type=int, help="total number of steps (overrides `steps`)")
    parser.add_argument("--out", help="run directory (overrides `out`)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable), e.g. --set rollout.n=8")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"steps={args.steps}")
    if args.out:
        overrides.append(f"out={json.dumps(args.out)}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"gagar train: {exc}", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    from trainer.loop import train

    hf_logging.disable_progress_bar()  # weight-loading bars would tear the live table
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

    view = LiveView(cfg.steps)
    try:
        summary = train(cfg, resume=args.resume, log=view.log, on_step=view.step)
    except (FileNotFoundError, ValueError) as exc:
        view.close()
        print(f"gagar train: {exc}", file=sys.stderr)
        return 2
    finally:
        view.close()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, view.console)
    return 0
