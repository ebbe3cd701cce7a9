"""Issue 7, part 3: load. N evaluations with workers = cores (N = 16 in CI, 200 with GAGAR_FULL=1): nothing
leaked, the gagar process's memory flat, results identical to a 1-worker run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardening.harness import docker_reason  # noqa: E402
from hardening.load import run_load  # noqa: E402

N = 200 if os.environ.get("GAGAR_FULL") else 16


@pytest.mark.docker
@pytest.mark.slow
def test_load_leaks_nothing_and_matches_one_worker(tmp_path: Path) -> None:
    reason = docker_reason()
    if reason:
        pytest.skip(reason)
    out = run_load(tmp_path, N)
    assert out["problems"] == [], "\n".join(out["problems"])
    assert out["lost_results"] == 0 and out["leaked_containers"] == 0 and out["leaked_temp_dirs"] == 0
    assert out["differences_vs_1_worker"] == 0
    assert sum(out["statuses"].values()) == N and out["statuses"].get("resolved", 0) > 0
