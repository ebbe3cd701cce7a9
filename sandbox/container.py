"""Containers under limits: one-shot test runs and a long-lived `Container` for multi-turn agents.

Every container is labelled `gagar.sandbox=1`, `gagar.run=<run id>`, `gagar.call=<id of the evaluation call>`
and `gagar.owner=<host>:<pid>`, registered in a process-wide table while it lives, and removed in a `finally`;
`remove_live(call)` (called when an evaluation stops) and `sandbox.cleanup` (`gagar sandbox gc`) catch whatever a crash
leaves behind. The call label keeps two evaluations in one process (overlap mode, refill) from ever removing
each other's containers.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests
from docker.types import LogConfig, Mount
from docker.utils.socket import frames_iter

from sandbox.config import SandboxConfig
from sandbox.integrity.channel import GUEST_DIR, LIB_MOUNT
from sandbox.watch import STDOUT_REPORT_BYTES, OutputCap, WriteWatch, disk_bytes
from sandbox.workspace import janitor

LABEL = "gagar.sandbox"
RUN_LABEL = "gagar.run"
CALL_LABEL = "gagar.call"
OWNER_LABEL = "gagar.owner"


def owner() -> str:
    """This process, as the owner label names it (`host:pid`; computed each time, so a forked child is itself)."""
    return f"{socket.gethostname()}:{os.getpid()}"
TESTBED = "/testbed"
REPORT = "/gagar/report"

_live: dict[str, str | None] = {}  # container id -> the evaluation call that made it
_live_lock = threading.Lock()
_local = threading.local()


class SandboxInfraError(RuntimeError):
    """The sandbox itself failed (engine unreachable, image missing…) — not the code under test."""


def client(http_timeout: float = 120.0) -> docker.DockerClient:
    """One client per thread: the SDK's session is not documented as thread-safe. `http_timeout` bounds socket
    reads; attach streams of quiet test suites must outlive it, so callers pass a timeout above the run's."""
    cache = getattr(_local, "clients", None)
    if cache is None:
        cache = _local.clients = {}
    key = int(http_timeout)
    if key not in cache:
        try:
            c = docker.from_env(timeout=key)
            c.ping()
        except docker.errors.DockerException as exc:
            raise SandboxInfraError(f"cannot reach the Docker engine ({exc})") from exc
        cache[key] = c
    return cache[key]


def runtime_missing(runtime: str) -> str | None:
    """None when dockerd knows the OCI runtime `runtime`, else why not (a clear error before any container)."""
    try:
        known = client().info().get("Runtimes") or {}
    except (SandboxInfraError, docker.errors.DockerException, requests.RequestException) as exc:
        return f"cannot reach the Docker engine ({exc})"
    if runtime not in known:
        return (f"the Docker engine has no runtime {runtime!r} (it has: {', '.join(sorted(known))}); "
                "register it with scripts/ensure_docker.sh (as root) or leave --runtime out")
    return None


@dataclass
class RunOutcome:
    exit_code: int | None
    output: str
    timed_out: bool = False
    oom_killed: bool = False
    write_limit_hit: bool = False
    output_bytes: int = 0
    truncated: bool = False
    duration_s: float = 0.0
    # With `stdout_report`: the whole output, uncapped up to STDOUT_REPORT_BYTES (None past it: `report_over`).
    report: str | None = None
    report_over: bool = False


@dataclass
class ExecResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    write_limit_hit: bool = False


def _name(run_id: str, hint: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", f"{run_id}-{hint}")[:80].strip("-.") or "run"
    return f"gagar-{safe}-{uuid.uuid4().hex[:6]}"


def new_call_id() -> str:
    """A fresh id for one evaluation call: the label its containers carry and `remove_live` selects by."""
    return uuid.uuid4().hex[:16]


def _register(cid: str, call: str | None) -> None:
    with _live_lock:
        _live[cid] = call


def _remove(c: docker.DockerClient, cid: str) -> None:
    try:
        c.api.remove_container(cid, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise
    finally:
        with _live_lock:
            _live.pop(cid, None)


def remove_live(call: str | None = None) -> int:
    """Force-remove the containers of one evaluation call (or, without `call`, every container this process
    still has: at exit)."""
    with _live_lock:
        ids = [cid for cid, c in _live.items() if call is None or c == call]
    if not ids:
        return 0
    c = docker.from_env(timeout=30)
    for cid in ids:
        try:
            _remove(c, cid)
        except docker.errors.DockerException:
            pass
    return len(ids)


# A caller that is interrupted outside the driver (no signal handlers in a worker thread, an exception
# escaping) still gets its containers removed at a normal interpreter exit.
atexit.register(remove_live)


def _killed_from_outside(c: docker.DockerClient, cid: str, state: dict, since: float) -> str | None:
    """Why a finished test container's end was not the tests' doing (None when it was): it is being removed,
    or something other than this run sent it a signal (`docker kill`/`stop`/`rm -f`, `gagar sandbox gc
    --force`). Its exit status (137 for SIGKILL) then says nothing about the patch. The run's own kills (its
    timeout, the write watchdog) are known to the caller and not asked about."""
    if state.get("Dead") or state.get("Status") in ("removing", "dead"):
        return "the test container was removed by another process while the tests ran (docker rm, gagar sandbox gc)"
    try:
        events = list(c.api.events(since=since, until=time.time(), decode=True,
                                   filters={"container": cid, "event": ["kill", "stop", "destroy"]}))
    except (docker.errors.DockerException, requests.RequestException):
        return None  # an engine without the events API: the exit status stands
    if events:
        ev = events[0]
        sig = (ev.get("Actor") or {}).get("Attributes", {}).get("signal")
        return (f"the test container was sent `{ev.get('Action') or ev.get('status')}`"
                f"{f' (signal {sig})' if sig else ''} by another process while the tests ran")
    return None


def _create(c: docker.DockerClient, image: str, config: SandboxConfig, *, command: list[str], name: str,
            mounts: dict[str, dict], env: dict[str, str], stdin_open: bool = False, call: str | None = None) -> str:
    # No log driver: output is read live over the attach stream and capped there, and a test printing
    # gigabytes must not fill the engine's disk with a json log nobody reads.
    # Mounts, not Binds: a bind source that is gone (a tree already removed by an interrupted run's cleanup)
    # fails the create, where Binds would have dockerd recreate it on the host, as root, for nobody to remove.
    binds = [Mount(spec["bind"], src, type="bind", read_only=spec.get("mode") == "ro") for src, spec in mounts.items()]
    hc = c.api.create_host_config(mounts=binds, init=True, log_config=LogConfig(type="none"), **_host_kwargs(config))
    try:
        res = c.api.create_container(
            image, command=command, name=name, working_dir=TESTBED, environment=env, host_config=hc,
            labels={LABEL: "1", RUN_LABEL: config.run_id, CALL_LABEL: call or "", OWNER_LABEL: owner()},
            user=config.user, stdin_open=stdin_open, tty=False,
        )
    except docker.errors.ImageNotFound as exc:
        raise SandboxInfraError(
            f"image {image!r} not found; build it with `gagar image build --all` or pass --image"
        ) from exc
    cid = res["Id"]
    _register(cid, call)
    return cid


def _host_kwargs(config: SandboxConfig) -> dict:
    kw = config.host_config_kwargs()
    kw.pop("user")  # a container (not host) setting
    kw["mem_limit"] = kw.pop("mem_limit")
    return kw


# The container starts with the tests held behind a `read` on stdin: it can be created and started (the slow
# part, 0.3-0.7 s) while the host still prepares the tree, and the tests begin the moment `go()` writes a line.
_HOLD = 'read -r _ || exit 125; exec bash -lc "$0"'


class PreparedRun:
    """A fresh container for one test run, started ahead of time and waiting for `go()`. Nothing but the
    `read` runs before then, and every run gets its own container, so starting early shares nothing between
    rollouts. `discard()` (or `go()`) removes it."""

    def __init__(self, image: str, testbed: Path, report_dir: Path, command: str, config: SandboxConfig, *,
                 env: dict[str, str] | None = None, name_hint: str = "run", call: str | None = None,
                 stdout_report: bool = False) -> None:
        self.config = config
        self.stdout_report = stdout_report  # the output is the verdict's report: keep it whole (RunOutcome.report)
        self._c = client(http_timeout=config.timeout + 120)
        self._mounted = (Path(testbed), Path(report_dir))
        self._since = time.time() - 1  # signals sent to the container from here on are seen by go()
        # The guard plugin comes from the host, read-only: the tests can neither change nor replace it.
        mounts = {str(testbed): {"bind": TESTBED, "mode": "rw"}, str(report_dir): {"bind": REPORT, "mode": "rw"},
                  str(GUEST_DIR): {"bind": LIB_MOUNT, "mode": "ro"}}
        full_env = {"HOME": "/tmp", "GAGAR_REPORT_DIR": REPORT, **(env or {})}
        self.cid: str | None = _create(self._c, image, config, command=["bash", "-c", _HOLD, command],
                                       name=_name(config.run_id, name_hint), mounts=mounts, env=full_env,
                                       stdin_open=True, call=call)
        try:
            # One attach for both directions, made before the start so no output is missed: the `go` line goes
            # in, the tests' output comes back, and go() pays no API round trip before the tests begin.
            self._stdin = self._c.api.attach_socket(self.cid, params={"stdin": 1, "stdout": 1, "stderr": 1,
                                                                      "stream": 1})
            self._c.api.start(self.cid)
        except docker.errors.DockerException as exc:
            self.discard()
            raise SandboxInfraError(f"docker could not start a container from {image!r}: {exc}") from exc

    def _close_stdin(self) -> None:
        sock = getattr(self, "_stdin", None)
        if sock is not None:
            raw = getattr(sock, "_sock", sock)
            try:
                raw.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
            self._stdin = None

    def discard(self, *, background: bool = False) -> None:
        self._close_stdin()
        if self.cid is not None:
            cid, self.cid = self.cid, None
            if background:
                janitor.submit(_remove_bg, cid, kind="container")
            else:
                _remove(self._c, cid)

    def go(self, *, background_remove: bool = False) -> RunOutcome:
        """Release the tests, wait for them (killing the container at the timeout), collect, remove."""
        if self.cid is None:
            raise RuntimeError("this run was discarded")
        c, cid = self._c, self.cid
        cap = OutputCap(self.config.output_limit_bytes, STDOUT_REPORT_BYTES if self.stdout_report else 0)
        try:
            # Drained on a thread so the wait can time out.
            sock = self._stdin

            def drain() -> None:
                try:
                    for _, chunk in frames_iter(sock, tty=False):
                        cap.feed(chunk)
                except (OSError, ValueError, docker.errors.DockerException):
                    pass  # the container was killed under us; what was read is kept

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            t0 = time.monotonic()
            raw = getattr(self._stdin, "_sock", self._stdin)
            try:
                raw.sendall(b"go\n")
                raw.shutdown(socket.SHUT_WR)  # the tests see EOF on stdin (StdinOnce), as with `docker run` without -i
            except OSError as exc:
                # Most often the engine itself went away: say so, a user acts on that, not on a broken pipe.
                try:
                    c.ping()
                    why = "the test container did not take the start signal"
                except (docker.errors.DockerException, requests.RequestException):
                    why = "the Docker engine stopped answering; the test container did not take the start signal"
                raise SandboxInfraError(f"{why} ({exc})") from exc
            watch = WriteWatch(self._mounted, self.config.max_write_bytes, lambda: _stop_container(cid))
            watch.start()
            timed_out = False
            exit_code: int | None = None
            try:
                exit_code = c.api.wait(cid, timeout=self.config.timeout)["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                timed_out = True
                try:
                    c.api.kill(cid)
                except docker.errors.APIError:
                    pass  # it exited just now
            finally:
                watch.stop()
            duration = time.monotonic() - t0
            reader.join(timeout=30)
            self._close_stdin()
            state = c.api.inspect_container(cid)["State"]
            if exit_code is None and not timed_out and not state.get("Running"):
                exit_code = state.get("ExitCode")
            if not timed_out and not watch.tripped:
                outside = _killed_from_outside(c, cid, state, self._since)
                if outside:
                    raise SandboxInfraError(f"{outside}; the run's verdict is lost, not the patch's: re-run the "
                                            "same command to retry this prediction")
            return RunOutcome(
                exit_code=None if timed_out else exit_code,
                output=cap.text(),
                timed_out=timed_out,
                oom_killed=bool(state.get("OOMKilled")),
                write_limit_hit=watch.tripped,
                output_bytes=cap.total,
                truncated=cap.truncated,
                duration_s=duration,
                report=cap.report(),
                report_over=cap.report_over,
            )
        except docker.errors.DockerException as exc:
            raise SandboxInfraError(f"docker failed while running the tests: {exc}") from exc
        finally:
            # `docker rm` of an exited container takes ~0.1 s the caller need not wait for; it stays in the
            # live set until removed, so the signal handlers and janitor.drain() still cover it.
            self.discard(background=background_remove)


def run_tests(
    image: str,
    testbed: Path,
    report_dir: Path,
    command: str,
    config: SandboxConfig,
    *,
    env: dict[str, str] | None = None,
    name_hint: str = "run",
    background_remove: bool = False,
    call: str | None = None,
    stdout_report: bool = False,
) -> RunOutcome:
    """Run `command` once in a fresh container with `testbed` at /testbed and `report_dir` at /gagar/report.
    The container is removed before this returns, whatever happens (with `background_remove`, soon after:
    `sandbox.workspace.janitor.drain()` waits for it)."""
    return PreparedRun(image, testbed, report_dir, command, config, env=env, name_hint=name_hint, call=call,
                       stdout_report=stdout_report).go(background_remove=background_remove)


def _stop_container(cid: str, *, restart: bool = False) -> None:
    """The write watchdog's action: kill a test run's container, or restart the agent's (which kills every
    process in it and keeps it). Runs on the watchdog's thread, with that thread's own client."""
    try:
        if restart:
            client().api.restart(cid, timeout=0)
        else:
            client().api.kill(cid)
    except (docker.errors.DockerException, requests.RequestException, SandboxInfraError):
        pass  # it exited just now, or the engine is gone: the waiter finds out


def _remove_bg(cid: str) -> None:
    _remove(client(), cid)


class Container:
    """A long-lived limited container for multi-turn agents: `with Container(image, path, cfg) as box:
    box.exec("pytest -q", timeout=60)`. The work tree is mounted at /testbed; the container is removed on exit.

    Writes into the work tree (a host bind mount without quota) are capped like an evaluation's: once the tree
    has grown by more than `config.max_write_bytes` since the container started, the running command is stopped
    (the container is restarted, which kills every process in it) and its result says so (`write_limit_hit`)."""

    def __init__(self, image: str, workdir_host_path: Path | str, config: SandboxConfig | None = None,
                 *, env: dict[str, str] | None = None) -> None:
        self.image = image
        self.workdir = Path(workdir_host_path).resolve()
        self.config = config or SandboxConfig()
        self.env = {"HOME": "/tmp", **(env or {})}
        self.id: str | None = None
        self._c: docker.DockerClient | None = None
        self._base = 0

    def __enter__(self) -> Container:
        self._c = client(http_timeout=max(120.0, self.config.timeout + 60))
        if self.config.max_write_bytes > 0:
            self._base = disk_bytes((self.workdir,))
        mounts = {str(self.workdir): {"bind": TESTBED, "mode": "rw"}}
        self.id = _create(self._c, self.image, self.config, command=["sleep", "infinity"],
                          name=_name(self.config.run_id, "agent"), mounts=mounts, env=self.env)
        try:
            self._c.api.start(self.id)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.id and self._c:
            _remove(self._c, self.id)
            self.id = None

    def revive(self) -> bool:
        """After a failed exec: start the container again if it stopped (its processes killed its init, or the
        OOM killer did), with the same tree and limits. False: it was running, so the failure lies elsewhere.
        Raises (SandboxInfraError) when the engine or the container cannot be reached: an infrastructure fault."""
        if not self.id or not self._c:
            raise SandboxInfraError("the agent's container was closed")
        try:
            if self._c.api.inspect_container(self.id)["State"].get("Running"):
                return False
            self._c.api.start(self.id)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxInfraError(f"the agent's container cannot be restarted: {exc}") from exc
        return True

    def exec(self, cmd: str, timeout: float = 60.0) -> ExecResult:
        """Run `cmd` with bash in /testbed. GNU `timeout` kills the command's whole process group in the
        container; a host-side deadline backs it up for processes that escaped the group."""
        if not self.id or not self._c:
            raise RuntimeError("Container is not running; use it as a context manager")
        api = self._c.api
        wrapped = ["timeout", "-s", "KILL", f"{timeout:g}", "bash", "-lc", cmd]
        ex = api.exec_create(self.id, wrapped, stdout=True, stderr=True, workdir=TESTBED, user=self.config.user)
        cap = OutputCap(self.config.output_limit_bytes)
        t0 = time.monotonic()
        stream = api.exec_start(ex["Id"], stream=True)

        def drain() -> None:
            try:
                for chunk in stream:
                    cap.feed(chunk)
            except (requests.RequestException, OSError):
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        cid = self.id
        watch = WriteWatch((self.workdir,), self.config.max_write_bytes, lambda: _stop_container(cid, restart=True),
                           base=self._base)
        watch.start()
        try:
            reader.join(timeout + 10)
        finally:
            watch.stop()
        if watch.tripped:
            watch.join(60)  # the restart it issued has to finish before the next command can run
        escaped = reader.is_alive() and not watch.tripped
        if escaped:
            # Something outlived the group kill and keeps the stream open: only a restart frees it.
            api.restart(self.id, timeout=0)
        reader.join(10)
        info = api.exec_inspect(ex["Id"])
        elapsed = time.monotonic() - t0
        code = info.get("ExitCode")
        if watch.tripped:
            note = (f"\n[gagar: stopped: the work tree grew by more than {self.config.max_write_bytes / 2**20:g} MiB "
                    "since the container started; every process was killed — delete what you wrote]\n")
            return ExecResult(exit_code=None, output=cap.text() + note, write_limit_hit=True)
        timed_out = escaped or (code == 137 and elapsed >= timeout - 0.05)
        return ExecResult(exit_code=None if timed_out else code, output=cap.text(), timed_out=timed_out)
