"""The bundled tasks, built once per test session and shared by every area's tests (read-only: tests write
their outputs elsewhere). `examples/build_tasks.py` is idempotent, so a second caller only reuses the dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_bundled_tasks(base: Path) -> Path:
    out = Path(base) / "bundled-tasks"
    if not (out / "instances.jsonl").is_file():
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--out", str(out)],
                       check=True, capture_output=True, text=True, timeout=600)
    return out
