"""`--runtime crun`: every limit holds under crun as under runc (memory, pids, network, read-only root, uid,
no capabilities), and a runtime the engine does not know is a clear error before any container starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox_fixtures import CalcTask, leftover_containers, require_docker, results_by_rollout
from test_sandbox_limits import FORK, MEM, NET, PRIV

from sandbox.cli import eval_main
from sandbox.container import runtime_missing

pytestmark = pytest.mark.docker

CAPS = """caps = [ln for ln in open('/proc/self/status') if ln.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))]
print(caps)
mem = open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip() if __import__('os').path.exists(
    '/sys/fs/cgroup/memory/memory.limit_in_bytes') else open('/sys/fs/cgroup/memory.max').read().strip()
print('memory limit', mem)
ok = all(ln.split()[1] == ('1' if ln.startswith('NoNewPrivs') else '0000000000000000') for ln in caps)
return a + b if ok and mem == str(256 << 20) else None"""


def _run(tmp_path: Path, runtime: str, cases: dict[str, str]) -> tuple[int, dict]:
    task = CalcTask(tmp_path, test_cmd="python -m pytest -s tests")
    preds = [{"instance_id": "acme__calc-1", "rollout_id": k, "model_patch": task.calc_patch(v)}
             for k, v in cases.items()]
    _, pp = task.write_inputs(preds)
    rc = eval_main(["--instances", str(task.root / "instances.jsonl"), "--predictions", str(pp),
                    "--repos-dir", str(task.repos_dir), "--run-id", f"rt-{runtime}", "--report-dir",
                    str(tmp_path / "o"), "--memory", "256m", "--timeout", "30", "--max-workers", "2",
                    "--no-progress", "--runtime", runtime])
    return rc, (results_by_rollout(tmp_path / "o" / f"rt-{runtime}") if rc == 0 else {})


def test_limits_hold_under_crun(tmp_path: Path) -> None:
    require_docker()
    if runtime_missing("crun"):
        pytest.skip("crun is not registered with dockerd (scripts/ensure_docker.sh as root does it)")
    rc, res = _run(tmp_path, "crun", {"mem": MEM, "fork": FORK, "net": NET, "priv": PRIV, "caps": CAPS})
    assert rc == 0
    got = {k: r["status"] for k, r in res.items()}
    assert got.pop("fork") in ("resolved", "timeout")
    assert got == {"mem": "unresolved", "net": "unresolved", "priv": "resolved", "caps": "resolved"}, \
        {k: (r["status"], r["error"]) for k, r in res.items()}
    assert "out of memory" in res["mem"]["error"]
    assert "network blocked" in (Path(res["net"]["log_path"]) / "test_output.txt").read_text()
    if res["fork"]["status"] == "resolved":
        out = (Path(res["fork"]["log_path"]) / "test_output.txt").read_text()
        assert 0 < int(out.split("forks before the pids limit:")[1].split()[0]) < 256
    assert leftover_containers("rt-crun") == []


def test_unknown_runtime_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    require_docker()
    rc, _ = _run(tmp_path, "no-such-runtime", {"x": "return a + b"})
    assert rc == 2 and "has no runtime 'no-such-runtime'" in capsys.readouterr().err
    assert leftover_containers("rt-no-such-runtime") == []
