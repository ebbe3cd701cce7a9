"""Turn SWE-bench style instances into verl's RL parquet: one row per instance, the single-turn diff prompt
(the same messages `gagar train` uses), the instance id as ground truth for the sandbox reward.

    python recipes/verl/prepare_data.py --tasks-dir .gagar/tasks --out data/gagar --val-fraction 0.2
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox.jsonl import read_jsonl  # noqa: E402
from sandbox.records import Instance  # noqa: E402
from trainer.agent.prompts import single_turn_messages  # noqa: E402


def rows(tasks_dir: Path, max_context_chars: int) -> list[dict]:
    out = []
    for i, row in enumerate(read_jsonl(tasks_dir / "instances.jsonl")):
        inst = Instance.from_dict(row)
        out.append({
            "data_source": "gagar_swe",
            "prompt": single_turn_messages(inst, tasks_dir / "repos", max_context_chars),
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": inst.instance_id},
            "extra_info": {"index": i, "instance_id": inst.instance_id},
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--tasks-dir", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--val-fraction", type=float, default=0.2)
    ap.add_argument("--max-context-chars", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import pandas as pd

    data = rows(args.tasks_dir, args.max_context_chars)
    random.Random(args.seed).shuffle(data)
    n_val = max(1, int(len(data) * args.val_fraction)) if len(data) > 1 else 0
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(data[n_val:]).to_parquet(args.out / "train.parquet")
    pd.DataFrame(data[:n_val] or data).to_parquet(args.out / "val.parquet")
    print(f"{len(data) - n_val} train / {n_val} val rows in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
