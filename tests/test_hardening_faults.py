"""Issue 7, part 2: faults. A private Docker engine killed mid-run (never the shared one), SIGINT / SIGTERM
mid-run, and a report dir that is a file, read-only or full. Each scenario returns its problems."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardening.faults import EngineError  # noqa: E402
from hardening.harness import docker_reason  # noqa: E402
from hardening.scenarios import engine_crash, interrupt, report_dir_errors  # noqa: E402

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _docker() -> None:
    reason = docker_reason()
    if reason:
        pytest.skip(reason)


def test_engine_killed_mid_run_then_resume(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("a private Docker engine needs root and the dockerd binary")
    try:
        out = engine_crash(tmp_path, n=6, sleep_s=3.0)
    except EngineError as exc:
        pytest.skip(f"cannot start a private Docker engine here: {exc}")
    assert out["problems"] == [], "\n".join(out["problems"])
    assert out["infra_errors"] >= 1 and out["lost"] == 0
    assert out["first_run_end_s"] < 60


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_run_leaves_nothing_and_resumes(tmp_path: Path, sig: int) -> None:
    out = interrupt(tmp_path, sig, n=4, sleep_s=3.0)
    assert out["problems"] == [], "\n".join(out["problems"])
    assert out["in_flight_at_signal"] >= 1 and out["lost"] == 0


def test_unusable_report_dir_gives_a_clear_error(tmp_path: Path) -> None:
    out = report_dir_errors(tmp_path)
    assert out["problems"] == [], "\n".join(out["problems"])
    assert out["cases"] >= 1
