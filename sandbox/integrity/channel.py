"""Where a test run's results go: a report dir the tests cannot list, with a secret name, and a live pipe.

Per rollout the host prepares a report root (mounted at /gagar/report) that belongs to the host and has mode
0711: the tests can reach a name in it but never list it. Inside it:
- `<nonce>/` — the only place the tests may write; the framework's report goes there (`$GAGAR_REPORT_DIR`,
  pytest's `--junitxml`). A forger cannot predict the name; it has to read it from the run's configuration.
- `<nonce2>.pipe` — a FIFO read live by the host (`$GAGAR_RESULT_PIPE`). The guard plugin
  (`sandbox/integrity/guest/gagar_pytest_guard.py`, mounted read-only at /gagar/lib) writes each test's outcome there
  as it happens. What is written cannot be taken back, so a report rewritten after the tests disagrees with it.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.parsers.pytest import REPORT_NAME, pytest_addopts
from sandbox.workspace import hand_over

REPORT_MOUNT = "/gagar/report"
LIB_MOUNT = "/gagar/lib"
GUEST_DIR = Path(__file__).resolve().parent / "guest"
GUARD_PLUGIN = "gagar_pytest_guard"
READER_JOIN_S = 60.0  # a woken reader stops after one last drain; only a stalled host takes longer
PIPE_CAP = 16 << 20  # bytes of records kept; an honest run of 40,000 tests writes ~8 MiB


@dataclass
class ChannelData:
    """What came through the pipe: parsed records of the configured session, and signs of interference."""

    records: list[dict] = field(default_factory=list)
    junk_lines: int = 0
    overflow: bool = False
    other_sessions: int = 0
    lost: str | None = None  # the host failed to read the pipe to its end (an infrastructure fault)

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("e") == kind]


class ReportChannel:
    """One rollout's report root, secret report dir and result pipe (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.nonce = secrets.token_hex(16)
        self.report_dir = self.root / self.nonce
        self.pipe = self.root / f"{secrets.token_hex(16)}.pipe"
        self.report_dir.mkdir()
        hand_over(self.report_dir)
        os.mkfifo(self.pipe, 0o600)
        os.chmod(self.pipe, 0o622)  # the tests may write, never read what others wrote
        os.chmod(self.root, 0o711)  # reachable by name, not listable
        self._error: str | None = None
        self._buf = bytearray()
        self._overflow = False
        self._wake_w = -1
        self._thread: threading.Thread | None = None

    @property
    def junit_path(self) -> str:
        return f"{REPORT_MOUNT}/{self.nonce}/{REPORT_NAME}"

    def env(self, framework: str, *, pythonpath: str | None = None) -> dict[str, str]:
        """The container environment; `pythonpath` is the image's own PYTHONPATH, kept after the guard's dir."""
        env = {"GAGAR_REPORT_DIR": f"{REPORT_MOUNT}/{self.nonce}",
               "GAGAR_RESULT_PIPE": f"{REPORT_MOUNT}/{self.pipe.name}"}
        if framework in ("pytest", "unittest"):
            # SWE-bench-style commands may run unittest through pytest; plain `python -m unittest` ignores it.
            env["PYTEST_ADDOPTS"] = pytest_addopts(f"{REPORT_MOUNT}/{self.nonce}", plugin=GUARD_PLUGIN)
            env["PYTHONPATH"] = LIB_MOUNT + (f":{pythonpath}" if pythonpath else "")
        return env

    def open(self) -> None:
        """Start reading the pipe (before the tests are released)."""
        rfd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)
        # A write end of our own keeps the pipe open between writers, so the reader never sees an early EOF.
        wfd = os.open(self.pipe, os.O_WRONLY | os.O_NONBLOCK)
        # close() wakes the reader through a pipe of its own: a stop flag polled on a select timeout cost every
        # rollout up to two timeouts (0.2-0.4 s) on its critical path.
        wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._read, args=(rfd, wfd, wake_r), daemon=True,
                                        name="gagar-result-pipe")
        self._thread.start()

    def _drain(self, rfd: int) -> None:
        while True:
            try:
                chunk = os.read(rfd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            room = PIPE_CAP - len(self._buf)
            if len(chunk) > room:
                self._overflow = True  # keep draining, so a flooding writer never blocks the tests
            self._buf += chunk[:max(room, 0)]

    def _read(self, rfd: int, wfd: int, wake_r: int) -> None:
        # The reader thread owns its descriptors and closes them itself: were they closed under it while it
        # still runs (a join that timed out on a stalled host), their numbers could be reused by another
        # rollout's pipe, and this thread would read that rollout's records away.
        try:
            while True:
                ready, _, _ = select.select([rfd, wake_r], [], [])
                self._drain(rfd)  # woken or not: what is in the pipe now is kept
                if wake_r in ready:
                    return  # the run is over (its container is gone): nothing more can arrive
        except OSError as exc:
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            for fd in (wfd, rfd, wake_r):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close(self, *, parse_for: str | None = None) -> ChannelData:
        """Stop reading (after the container is gone) and return the records; `parse_for` is the JUnit
        path whose session counts (defaults to this channel's). A reader that failed or never finished
        gives `lost`: what came through is then incomplete, through no fault of the tests."""
        lost = None
        if self._thread is not None:
            try:
                os.write(self._wake_w, b"x")
            finally:
                os.close(self._wake_w)
            self._thread.join(READER_JOIN_S)
            if self._thread.is_alive():
                lost = f"the host's pipe reader did not finish within {READER_JOIN_S:g}s"
            self._thread = None
        lost = lost or self._error
        data = parse_records(bytes(self._buf), parse_for or self.junit_path, overflow=self._overflow)
        data.lost = lost
        return data


def parse_records(data: bytes, junit_path: str, *, overflow: bool = False) -> ChannelData:
    out = ChannelData(overflow=overflow)
    lines = data.split(b"\n")
    if overflow and lines:
        lines = lines[:-1]  # the cut-off line is not junk
    for raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            out.junk_lines += 1
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("e"), str):
            out.junk_lines += 1
        elif rec.get("x") != junit_path:
            out.other_sessions += 1  # a nested pytest run with its own settings
        else:
            out.records.append(rec)
    return out
