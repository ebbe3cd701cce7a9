"""Helpers shared by the trainer tests: the bundled tasks and the tiny model's cache, built once per session
under pytest's base temp dir (both builders are idempotent, so a second module reuses them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "tiny.yaml"


def bundled_tasks(tmp_path_factory) -> Path:
    out = tmp_path_factory.getbasetemp() / "trainer-tasks"
    if not (out / "instances.jsonl").is_file():
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--out", str(out)], check=True,
                       capture_output=True)
    return out


def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "trainer-models"
