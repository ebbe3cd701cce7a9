"""Run metrics: one JSON line per step in `OUT/metrics.jsonl` (and TensorBoard scalars when it is installed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sandbox.report import atomic_write_text


class MetricsWriter:
    def __init__(self, out: Path, *, start_step: int = 0, tensorboard: bool = True) -> None:
        self.path = Path(out) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # On resume, steps after the checkpoint were never committed: drop them so the curve has no duplicates.
        if self.path.exists():
            keep = [ln for ln in read_metrics(self.path) if ln.get("step", 0) <= start_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(out) / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(clean) + "\n")
            fh.flush()
        if self.tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self.tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash
    return rows
