"""Helpers shared by the trainer tests: the bundled tasks and the tiny model's cache, built once per session
under pytest's base temp dir (both builders are idempotent, so a second module reuses them)."""

from __future__ import annotations

from pathlib import Path

from task_fixtures import build_bundled_tasks

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "tiny.yaml"


def bundled_tasks(tmp_path_factory) -> Path:
    return build_bundled_tasks(tmp_path_factory.getbasetemp())


def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "trainer-models"
