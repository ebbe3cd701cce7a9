"""Session-wide fixtures shared across areas."""

from __future__ import annotations

from pathlib import Path

import pytest
from task_fixtures import build_bundled_tasks


@pytest.fixture(scope="session")
def bundled_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled tasks (repos + JSONL files), built once per session; treat as read-only."""
    return build_bundled_tasks(tmp_path_factory.getbasetemp())
