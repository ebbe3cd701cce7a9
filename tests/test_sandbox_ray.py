"""The Ray executor on a real local Ray (2 CPUs, one session shared by the module: a Ray start costs ~10 s on
2 cores): same statuses as the local executor, resume after the worker process is killed mid-run, nothing
left behind; `gagar eval --executor ray` starting and stopping its own Ray; a clear error without Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sandbox_fixtures import leftover_containers, require_docker

from sandbox.cli import eval_main
from sandbox.config import SandboxConfig
from sandbox.executor import LocalExecutor, RayExecutor, RayUnavailable, make_executor, split_groups
from sandbox.records import Instance, Prediction
from sandbox.report import read_results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    require_docker()
    tmp = tempfile.mkdtemp(prefix="gagar-ray-test-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING", _temp_dir=tmp)
    try:
        yield ray
    finally:
        ray.shutdown()
        subprocess.run(["rm", "-rf", tmp])


def _inputs(tasks: Path, ids: set[str] | None = None, rollouts: set[str] | None = None):
    insts = {d["instance_id"]: Instance.from_dict(d) for d in map(json.loads, (tasks / "instances.jsonl").open())}
    preds = [Prediction(d["instance_id"], d["model_patch"], "bundled", str(d["rollout_id"]))
             for d in map(json.loads, (tasks / "predictions.jsonl").open())
             if (ids is None or d["instance_id"] in ids) and (rollouts is None or str(d["rollout_id"]) in rollouts)]
    expected = {(d["instance_id"], str(d["rollout_id"])): d["status"]
                for d in map(json.loads, (tasks / "expected.jsonl").open())}
    return insts, preds, expected


def _ray_procs(marker: str) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.add(int(d.name))
            except OSError:
                pass
    return out


def test_split_keeps_groups_whole_and_balances_by_capacity() -> None:
    preds = [Prediction(f"i{g}", "x", "m", str(k)) for g, n in enumerate([8, 8, 4, 4, 2]) for k in range(n)]
    shares = split_groups(preds, [2, 1])
    per_share = [{p.instance_id for p in s} for s in shares]
    assert not per_share[0] & per_share[1]  # every group on exactly one worker
    assert [len(s) for s in shares] == [18, 8]  # 2:1 capacity → about 2:1 work in whole groups
    assert sum(map(len, shares)) == len(preds)


def test_ray_missing_gives_a_clear_error(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayUnavailable, match=r"gagar\[ray\]"):
        make_executor("ray")
    (tmp_path / "r").mkdir()
    (tmp_path / "i.jsonl").write_text('{"instance_id": "a", "repo": "o/r", "base_commit": "abc", '
                                      '"FAIL_TO_PASS": ["t::a"], "test_cmd": "pytest"}\n')
    (tmp_path / "p.jsonl").write_text('{"instance_id": "a", "model_patch": ""}\n')
    rc = eval_main(["--instances", str(tmp_path / "i.jsonl"), "--predictions", str(tmp_path / "p.jsonl"),
                    "--repos-dir", str(tmp_path / "r"), "--run-id", "x", "--report-dir", str(tmp_path / "o"),
                    "--executor", "ray", "--no-progress"])
    assert rc == 2 and "pip install 'gagar[ray]'" in capsys.readouterr().err


@pytest.mark.docker
def test_ray_gives_the_local_statuses(ray_session, bundled_tasks: Path, tmp_path: Path) -> None:
    """Three Python groups through both executors: a covering subset in CI, every rollout with GAGAR_FULL=1."""
    insts, preds, expected = _inputs(bundled_tasks, {"acme__iniconf-9", "acme__durations-42", "acme__ledger-58"})
    if not os.environ.get("GAGAR_FULL"):
        keep = {("acme__durations-42", "minimal"), ("acme__durations-42", "wrong-suffix"),
                ("acme__durations-42", "empty"), ("acme__iniconf-9", "tamper"), ("acme__iniconf-9", "gold"),
                ("acme__ledger-58", "escape")}
        preds = [p for p in preds if (p.instance_id, p.rollout_id) in keep]
    cfg = SandboxConfig(repos_dir=bundled_tasks / "repos", max_workers=2, timeout=120, run_id="ray-same")
    with RayExecutor() as ex:
        got = ex.evaluate(insts, preds, cfg, run_dir=tmp_path / "ray")
    local = LocalExecutor().evaluate(insts, preds, SandboxConfig(**{**cfg.__dict__, "run_id": "ray-same-local"}),
                                     run_dir=tmp_path / "local")
    assert [r.key for r in got] == [(p.instance_id, p.rollout_id) for p in preds]
    statuses = {r.key: r.status for r in got}
    assert statuses == {r.key: r.status for r in local} == {r.key: expected[r.key] for r in got}
    assert {r.key: r.tampered_tests for r in got} == {r.key: r.tampered_tests for r in local}
    # The driver alone writes the run's files; logs stay under the node's directory.
    assert set(read_results(tmp_path / "ray" / "results.jsonl")) == {r.key for r in got}
    report = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert report["config"]["executor"] == "ray" and report["submitted_instances"] == len(preds)
    logs = [r.log_path for r in got if r.status == "resolved"]
    assert logs and all(Path(p, "test_output.txt").is_file() for p in logs)
    assert leftover_containers("ray-same") == []
    # Still the same actors: a second call on the executor reuses the running session.
    assert ray_session.is_initialized()


@pytest.mark.docker
@pytest.mark.slow
def test_ray_worker_killed_mid_run_then_resume(ray_session, bundled_tasks: Path, tmp_path: Path) -> None:
    insts, preds, expected = _inputs(bundled_tasks, {"acme__iniconf-9", "acme__durations-42", "acme__ledger-58"})
    preds = [p for p in preds if not p.rollout_id.startswith("hack")]  # the hack corpus has its own tests
    cfg = SandboxConfig(repos_dir=bundled_tasks / "repos", max_workers=2, timeout=120, run_id="ray-kill")
    run_dir = tmp_path / "run"
    ex = RayExecutor()
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("res", ex.evaluate(insts, preds, cfg, run_dir=run_dir)))
    t.start()
    results = run_dir / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not results.exists() or results.read_text().count("\n") < 2):
        time.sleep(0.05)
    [(_, _, meta)] = ex._actors[2]
    os.kill(meta["pid"], signal.SIGKILL)  # the worker process dies with containers and predictions in flight
    t.join(timeout=300)
    assert not t.is_alive()
    first = {r.key: r for r in out["res"]}
    lost = [r for r in first.values() if r.status == "infra_error"]
    assert len(first) == len(preds) and lost, "the kill came after the run finished; nothing was tested"
    assert all("lost mid-run" in (r.error or "") and "re-run" in r.error for r in lost)
    assert all(r.status == expected[k] for k, r in first.items() if r.status != "infra_error")
    assert leftover_containers("ray-kill") == []  # the dead worker's containers were removed on its node
    # The re-run (a fresh actor on the same session) finishes exactly the lost ones, one line per prediction.
    again = ex.evaluate(insts, preds, cfg, run_dir=run_dir)
    ex.close()
    assert {r.key: r.status for r in again} == {k: expected[k] for k in first}
    for k, r in first.items():
        if r.status != "infra_error":
            assert {x.key: x for x in again}[k].duration_s == r.duration_s  # kept, not redone
    lines = [json.loads(ln) for ln in results.read_text().splitlines() if ln.strip()]
    assert len(lines) == len(preds)
    assert leftover_containers("ray-kill") == []


@pytest.mark.docker
@pytest.mark.slow
def test_cli_ray_without_address_starts_and_stops_its_own_ray(bundled_tasks: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    require_docker()
    _, preds, expected = _inputs(bundled_tasks, {"acme__iniconf-9"}, {"minimal", "wrong-last-part", "tamper"})
    pp = tmp_path / "p.jsonl"
    pp.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in preds))
    before, dirs_before = _ray_procs("/tmp/gagar-ray-"), set(Path("/tmp").glob("gagar-ray-*"))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "gagar", "eval", "--instances", str(bundled_tasks / "instances.jsonl"),
           "--predictions", str(pp), "--repos-dir", str(bundled_tasks / "repos"), "--run-id", "ray-cli",
           "--report-dir", str(tmp_path / "o"), "--executor", "ray", "--max-workers", "2", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = read_results(tmp_path / "o" / "ray-cli" / "results.jsonl")
    keys = [(p.instance_id, p.rollout_id) for p in preds]
    assert {k: r.status for k, r in got.items()} == {k: expected[k] for k in keys}
    time.sleep(1)  # Ray's last processes exit just after shutdown() returns
    assert _ray_procs("/tmp/gagar-ray-") - before == set()
    assert set(Path("/tmp").glob("gagar-ray-*")) - dirs_before == set()
    assert leftover_containers("ray-cli") == []


@pytest.mark.docker
def test_trainer_pool_and_verl_reward_on_ray(ray_session, bundled_tasks: Path, tmp_path: Path, monkeypatch) -> None:
    """The trainer's pool and the verl reward take the same executor, here on the running Ray session."""
    import importlib.util

    from trainer.config import SandboxSection
    from trainer.sandbox_pool import SandboxPool

    insts, preds, expected = _inputs(bundled_tasks, {"acme__iniconf-9"}, {"minimal", "bloated", "tamper"})
    pool = SandboxPool(SandboxSection(executor="ray", max_workers=2, timeout=120), bundled_tasks / "repos",
                       run_id="ray-pool")
    got = pool.evaluate(insts, preds, tmp_path / "step0")
    pool.close()
    assert {r.key: r.status for r in got} == {r.key: expected[r.key] for r in got} and len(got) == len(preds)
    assert ray_session.is_initialized()  # a session the pool did not start is left running
    monkeypatch.setenv("GAGAR_TASKS_DIR", str(bundled_tasks))
    monkeypatch.setenv("GAGAR_SANDBOX_EXECUTOR", "ray")
    spec = importlib.util.spec_from_file_location("gagar_verl_reward_ray", ROOT / "recipes" / "verl" / "reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(preds)) as calls:  # verl's reward loop calls it from several threads at once
        out = list(calls.map(lambda p: reward.compute_score("gagar_swe", "```diff\n" + p.model_patch + "```",
                                                            p.instance_id, {}), preds))
    reward._EXECUTOR.close()
    assert [o["sandbox_status"] for o in out] == [expected[(p.instance_id, p.rollout_id)] for p in preds]
    assert leftover_containers("ray-pool") == [] and leftover_containers("verl-reward") == []
