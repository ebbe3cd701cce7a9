"""`gagar sandbox gc` spares the containers of runs that are still going, and a test container that another
process kills or removes mid-run gives `infra_error` (masked in training), never a 0-reward `unresolved`.
Real Docker: an evaluation runs in this process while another process (the CLI, or the engine's API) acts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sandbox_fixtures import CalcTask, require_docker

from sandbox.config import SandboxConfig
from sandbox.records import EvalResult, Instance, Prediction

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]


def _start(task: CalcTask, run_id: str, tmp_path: Path) -> tuple[threading.Thread, list[EvalResult]]:
    """An evaluation of the gold fix, slowed to a few seconds inside the tests, on a thread of this process."""
    from sandbox.run import evaluate_predictions

    slow = task.calc_patch("import time\ntime.sleep(6)\nreturn a + b")
    inst = Instance.from_dict(task.instance)
    cfg = SandboxConfig(repos_dir=task.repos_dir, timeout=120, run_id=run_id)
    out: list[EvalResult] = []
    t = threading.Thread(target=lambda: out.extend(evaluate_predictions(
        [inst], [Prediction(inst.instance_id, slow, "m", "r1")], cfg, run_dir=tmp_path / "run")), daemon=True)
    t.start()
    return t, out


def _running_tests(run_id: str, deadline: float = 120) -> str:
    """The id of the run's container once pytest runs in it (not while it is held before the tests)."""
    import docker

    c = docker.from_env()
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for row in c.api.containers(filters={"label": f"gagar.run={run_id}"}):
            try:
                procs = c.api.top(row["Id"]).get("Processes") or []
            except docker.errors.APIError:
                continue
            if any("pytest" in " ".join(p) for p in procs):
                return row["Id"]
        time.sleep(0.1)
    raise AssertionError(f"no container of run {run_id} started its tests within {deadline} s")


def test_gc_spares_the_containers_of_a_run_still_going(tmp_path: Path) -> None:
    require_docker()
    task = CalcTask(tmp_path)
    run_id = f"gc-live-{os.getpid()}"
    t, out = _start(task, run_id, tmp_path)
    cid = _running_tests(run_id)
    gc = subprocess.run([sys.executable, "-m", "gagar", "sandbox", "gc", "--run-id", run_id], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert "removed 0 container(s)" in gc.stdout and "kept 1 container(s) of runs still going" in gc.stdout, gc.stdout
    t.join(300)
    [res] = out
    assert res.status == "resolved", (res.status, res.error, res.exit_code)
    import docker

    with pytest.raises(docker.errors.NotFound):  # the run removed its own container when it finished
        docker.from_env().api.inspect_container(cid)


@pytest.mark.parametrize("how", ["kill", "remove"])
def test_a_container_killed_or_removed_from_outside_is_an_infra_error(tmp_path: Path, how: str) -> None:
    import docker

    require_docker()
    task = CalcTask(tmp_path)
    run_id = f"gc-kill-{how}-{os.getpid()}"
    t, out = _start(task, run_id, tmp_path)
    cid = _running_tests(run_id)
    c = docker.from_env()
    if how == "kill":
        c.api.kill(cid)  # `docker kill`: exit 137, as a test process killed by the kernel would be
    else:
        c.api.remove_container(cid, force=True)  # `docker rm -f`, or `gagar sandbox gc --force`
    t.join(300)
    [res] = out
    assert res.status == "infra_error", (res.status, res.error, res.exit_code)
    assert "another process" in (res.error or "") or "No such container" in (res.error or ""), res.error
    assert not res.resolved
