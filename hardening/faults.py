"""Fault injection: a private Docker engine killed mid-run, signals mid-run, an unusable report dir.

The Docker engine on these machines is shared with other people's tests, so the engine-failure test never
touches it: `PrivateDockerd` starts a second `dockerd` with its own data root, exec root, pid file and unix
socket under a temp dir, without a bridge or iptables rules (nothing on the host network changes), loads the
sandbox image into it with `docker save | docker load`, and is the only engine this module ever kills.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from hardening.repo import INSTANCE_ID, Fortress

SLOW_FIX = "import time\ntime.sleep({s})\nreturn a + b"


class EngineError(RuntimeError):
    """The private engine could not be started (no dockerd binary, not root, …): the caller skips."""


class PrivateDockerd:
    """A throwaway `dockerd` (plus the containerd it manages) under one temp dir; `DOCKER_HOST` points at it."""

    def __init__(self, image: str = "gagar-python:latest") -> None:
        # Unix socket paths are limited to 108 bytes: keep the root short.
        self.root = Path(tempfile.mkdtemp(prefix="gh-dockerd-", dir="/tmp"))
        self.sock = self.root / "d.sock"
        self.image = image
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "dockerd.log"
        (self.root / "daemon.json").write_text("{}\n")

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    def _cmd(self) -> list[str]:
        return ["dockerd", "--host", self.host, "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "x"), "--pidfile", str(self.root / "d.pid"),
                "--config-file", str(self.root / "daemon.json"), "--bridge", "none", "--iptables=false",
                "--ip-masq=false", "--ip-forward=false", "--userland-proxy=false",
                "--cgroup-parent", f"gagar-hardening-{self.root.name}"]

    def start(self, timeout: float = 90) -> None:
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            raise EngineError("a private Docker engine needs the dockerd binary and root")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._cmd(), stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"private dockerd exited {self.proc.returncode}: {self.log.read_text()[-1500:]}")
            if self._docker("version", check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise EngineError(f"private dockerd did not answer in {timeout:g}s: {self.log.read_text()[-1500:]}")

    def _docker(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, check=check,
                              timeout=timeout)

    def load_image(self) -> None:
        """Copy the sandbox image from the shared engine (read-only use of it) into this one."""
        save = subprocess.Popen(["docker", "save", self.image], stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "-H", self.host, "load"], stdin=save.stdout, capture_output=True,
                              text=True, timeout=600)
        save.stdout.close()
        save.wait(timeout=600)
        if save.returncode != 0 or load.returncode != 0:
            raise EngineError(f"cannot copy {self.image} into the private engine: {load.stderr[-800:]}")

    def containers(self, run_id: str) -> list[str]:
        out = self._docker("ps", "-a", "--filter", f"label=gagar.run={run_id}", "--format", "{{.Names}}",
                           check=False)
        return [x for x in out.stdout.split() if x]

    def kill(self) -> None:
        """The fault: the whole engine dies at once (SIGKILL to dockerd, its containerd, the shims and the
        containers' processes), as when the engine's host service crashes or is stopped hard."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._kill_all(signal.SIGKILL)
        # The dead containerd's pid file would make the next dockerd wait for it: its pid may be a zombie (the
        # process was reparented away from us) or already reused.
        (self.root / "x" / "containerd" / "containerd.pid").unlink(missing_ok=True)

    def _cgroup_dirs(self) -> list[Path]:
        base = Path("/sys/fs/cgroup")
        return [d for d in base.glob(f"*/gagar-hardening-{self.root.name}") if d.is_dir()] + \
            [d for d in base.glob(f"gagar-hardening-{self.root.name}") if d.is_dir()]

    def _cgroup_pids(self) -> list[int]:
        """Processes of this engine's containers (they sit in its private cgroup parent)."""
        pids: set[int] = set()
        for d in self._cgroup_dirs():
            for f in d.rglob("cgroup.procs"):
                try:
                    pids.update(int(x) for x in f.read_text().split())
                except OSError:
                    pass
        return sorted(pids)

    def _kill_all(self, sig: int) -> None:
        for _ in range(20):
            pids = self._own_pids() + self._cgroup_pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)

    def _own_pids(self) -> list[int]:
        """Processes started for this engine: their command line names this engine's private root."""
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if str(self.root).encode() in (d / "cmdline").read_bytes():
                        pids.append(int(d.name))
                except OSError:
                    pass
        return pids

    def close(self) -> None:
        """Stop the engine (gracefully, then by force), its containerd and shims, unmount, delete the root."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._kill_all(signal.SIGKILL)
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()
                  if ln.split()[1].startswith(str(self.root) + "/")]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        for d in self._cgroup_dirs():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                pass

    def __enter__(self) -> PrivateDockerd:
        try:
            self.start()
            self.load_image()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def slow_predictions(path: Path, fortress: Fortress, n: int, sleep_s: float) -> list[str]:
    """`n` passing predictions whose tests take `sleep_s` seconds each; returns their rollout ids."""
    patch = fortress.calc_patch(SLOW_FIX.format(s=sleep_s))
    ids = [f"slow{i:02d}" for i in range(n)]
    path.write_text("".join(json.dumps({"instance_id": INSTANCE_ID, "model_name_or_path": "faults",
                                        "rollout_id": rid, "model_patch": patch}) + "\n" for rid in ids))
    return ids


def result_lines(path: Path) -> tuple[list[dict], list[str]]:
    """(parsed lines, unparsable lines) of a results.jsonl."""
    good, bad = [], []
    if path.exists():
        for ln in path.read_text().splitlines():
            if not ln.strip():
                continue
            try:
                good.append(json.loads(ln))
            except ValueError:
                bad.append(ln[:200])
    return good, bad


def wait_for_lines(path: Path, n: int, timeout: float, proc: subprocess.Popen | None = None) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = len(result_lines(path)[0])
        if got >= n or (proc is not None and proc.poll() is not None):
            return got
        time.sleep(0.2)
    return len(result_lines(path)[0])
