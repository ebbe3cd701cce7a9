"""The limits hold: patches whose code allocates past the memory limit, forks without bound, loops forever,
tries the network, prints 100 MB or pokes at privileges — each contained, reported with the right status, and no
container left behind. Real Docker, real images."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sandbox_fixtures import CalcTask, leftover_containers, require_docker, results_by_rollout

from sandbox.cli import eval_main
from sandbox.config import SandboxConfig
from sandbox.container import Container, OutputCap

pytestmark = pytest.mark.docker
FULL = bool(os.environ.get("GAGAR_FULL"))
MEMORY = "2g" if FULL else "256m"
ALLOC_MB = 3072 if FULL else 512

MEM = f"x = bytearray({ALLOC_MB} * 1024 * 1024)\nreturn a + b + len(x) * 0"
FORK = """import os, time
n = 0
while n < 2000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(1)
    n += 1
print("forks before the pids limit:", n)
return a + b if n < 2000 else None"""
LOOP = "import subprocess\nsubprocess.Popen(['sleep', '1000'])\nwhile True:\n    pass"
NET = """import socket
for target in [("1.1.1.1", 53), ("deb.debian.org", 80)]:
    try:
        socket.create_connection(target, timeout=2).close()
        return a + b
    except OSError as exc:
        print("network blocked:", target, exc)
return None"""
PRINT = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\nreturn a + b"
PRIV = """import os
assert os.getuid() == 1000 and os.getgid() == 1000
for attempt in (lambda: open('/usr/evil', 'w'), lambda: os.setuid(0), lambda: os.chown('/testbed', 0, 0),
                lambda: open('/etc/passwd', 'a')):
    try:
        attempt()
        return None
    except OSError:
        pass
open('/tmp/ok', 'w').write('tmp is writable')
open('/testbed/ok', 'w').write('testbed is writable')
return a + b"""


def test_output_cap_keeps_head_and_tail() -> None:
    cap = OutputCap(1000)
    for i in range(100):
        cap.feed(f"{i:04d}".encode() * 50)
    text = cap.text()
    assert text.startswith("0000") and text.rstrip().endswith("0099")
    assert cap.truncated and "bytes dropped" in text and len(text) < 1400
    small = OutputCap(1000)
    small.feed(b"hello")
    assert small.text() == "hello" and not small.truncated


def test_limits_are_contained(tmp_path: Path) -> None:
    require_docker()
    task = CalcTask(tmp_path, test_cmd="python -m pytest -s tests")
    cases = {"mem": MEM, "fork": FORK, "loop": LOOP, "net": NET, "print": PRINT, "priv": PRIV}
    preds = [{"instance_id": "acme__calc-1", "rollout_id": k, "model_patch": task.calc_patch(v)}
             for k, v in cases.items()]
    _, pp = task.write_inputs(preds)
    out = tmp_path / "o"
    rc = eval_main(["--instances", str(task.root / "instances.jsonl"), "--predictions", str(pp),
                    "--repos-dir", str(task.repos_dir), "--run-id", "limits", "--report-dir", str(out),
                    "--memory", MEMORY, "--timeout", "15", "--max-workers", "2", "--no-progress"])
    assert rc == 0
    res = results_by_rollout(out / "limits")
    logs = {k: Path(r["log_path"]) for k, r in res.items()}
    got = {k: r["status"] for k, r in res.items()}
    # The bomb's children keep trying to fork on one CPU: the parent usually finishes first (resolved), but a
    # starved run ending in a timeout is contained as well.
    assert got.pop("fork") in ("resolved", "timeout")
    assert got == {"mem": "unresolved", "loop": "timeout", "net": "unresolved", "print": "resolved",
                   "priv": "resolved"}, {k: (r["status"], r["error"]) for k, r in res.items()}
    assert "out of memory" in res["mem"]["error"]
    if res["fork"]["status"] == "resolved":
        fork_out = (logs["fork"] / "test_output.txt").read_text()
        n = int(fork_out.split("forks before the pids limit:")[1].split()[0])
        assert 0 < n < 256  # the pids limit stopped the bomb (its children fork too, so the parent gets few)
    assert res["fork"]["duration_s"] < 40
    assert res["loop"]["exit_code"] is None and res["loop"]["duration_s"] < 40
    assert "network blocked" in (logs["net"] / "test_output.txt").read_text()
    printed = logs["print"] / "test_output.txt"
    assert printed.stat().st_size < 1.2 * (1 << 20) and "bytes dropped" in printed.read_text()
    assert "output kept" in res["print"]["error"]
    assert leftover_containers("limits") == []


def test_long_lived_container_exec(tmp_path: Path) -> None:
    require_docker()
    work = tmp_path / "w"
    work.mkdir()
    os.chown(work, 1000, 1000) if os.geteuid() == 0 else work.chmod(0o777)
    cfg = SandboxConfig(run_id="agent-test", output_limit_bytes=4096)
    with Container("gagar-python:latest", work, cfg) as box:
        r = box.exec("echo hello > f.txt && cat f.txt && id -u")
        assert r.exit_code == 0 and r.output.split() == ["hello", "1000"] and not r.timed_out
        assert (work / "f.txt").read_text() == "hello\n"
        r = box.exec("sleep 30 & sleep 30", timeout=1.5)
        assert r.timed_out and r.exit_code is None
        r = box.exec("exit 3")
        assert r.exit_code == 3
        r = box.exec("yes | head -c 100000")
        assert "bytes dropped" in r.output and len(r.output) < 6000
        r = box.exec("getent hosts deb.debian.org || echo offline")
        assert "offline" in r.output
        assert len(leftover_containers("agent-test")) == 1
    assert leftover_containers("agent-test") == []
    json.dumps(cfg.host_config_kwargs())  # the limits are plain data (logged in report.json)


def test_agent_container_write_watchdog(tmp_path: Path) -> None:
    """The agent's long-lived container has the evaluation's write cap: a flood into the work tree (a host bind
    mount without quota) is stopped and reported, and the container still works afterwards, so the agent can
    clean up even while the tree is over the cap."""
    require_docker()
    work = tmp_path / "w"
    work.mkdir()
    os.chown(work, 1000, 1000) if os.geteuid() == 0 else work.chmod(0o777)
    cfg = SandboxConfig(run_id="agent-flood", max_write_bytes=32 << 20)
    with Container("gagar-python:latest", work, cfg) as box:
        # ~100 MiB/s without end (100,000 MiB at most): only the watchdog can stop it before the 60 s timeout.
        r = box.exec("i=0; while [ $i -lt 100000 ]; do head -c 1048576 /dev/zero; sleep 0.01; i=$((i+1)); done"
                     " > flood.bin; echo finished", timeout=60)
        assert r.write_limit_hit and not r.timed_out and r.exit_code is None
        assert "grew by more than 32 MiB" in r.output and "finished" not in r.output
        size = (work / "flood.bin").stat().st_size
        assert 32 << 20 < size < 400 << 20
        r = box.exec("rm flood.bin && echo cleaned")
        assert r.exit_code == 0 and "cleaned" in r.output and not r.write_limit_hit
        r = box.exec("head -c 1048576 /dev/zero > small.bin && echo ok")
        assert r.exit_code == 0 and not r.write_limit_hit
    assert leftover_containers("agent-flood") == []
