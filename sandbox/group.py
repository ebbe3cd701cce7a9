"""A group's rollouts share one prepared repo and a small pool of containers started ahead.

`RolloutGroup` opens the instance's `GroupWorkspace` for the first rollout that needs it and closes it after the
last; it keeps up to `max_workers` containers created and started ahead (`take()` hands one out), so a rollout
never waits for a container start while the previous one runs its tests, and it prepares the next group's repo
once this group's last rollout has its container.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sandbox import container as ctr
from sandbox.config import SandboxConfig
from sandbox.integrity.channel import ReportChannel
from sandbox.parsers import STDOUT_REPORT
from sandbox.records import Instance
from sandbox.workspace import GroupWorkspace, WorkspaceError, hand_over, janitor


@dataclass
class Slot:
    """A work tree, a report channel and the container already started on them, waiting for its tests."""

    tree: Path
    channel: ReportChannel
    run: Future

    @property
    def report(self) -> Path:
        """The host side of the secret report dir: what the parsers read."""
        return self.channel.report_dir


class RolloutGroup:
    """One instance's shared workspace, opened by the first rollout that needs it, closed by the last; it also
    keeps up to `max_workers` containers started ahead (`take()` hands one out), so a rollout never waits for
    a container start while the previous one runs its tests."""

    def __init__(self, instance: Instance, n: int, config: SandboxConfig, image: str | None,
                 env: dict[str, str], starter: ThreadPoolExecutor, *, call: str | None = None,
                 pythonpath: str | None = None) -> None:
        self.instance = instance
        self.remaining = n
        self.untaken = n
        self.config = config
        self.image = image
        self.env = env
        self.starter = starter
        self.call = call
        self.pythonpath = pythonpath
        self.lock = threading.Lock()
        self.ws: GroupWorkspace | None = None
        self.error: str | None = None
        self.closed = False  # after the last release: a late prefetch must not open a repo nobody closes
        self.spares: deque[Slot] = deque()
        self.next: RolloutGroup | None = None

    def open(self) -> GroupWorkspace:
        with self.lock:
            if self.closed:
                raise WorkspaceError(f"the workspace of {self.instance.instance_id} was already closed")
            if self.ws is None and self.error is None:
                ws = GroupWorkspace(Path(self.config.repos_dir), self.instance.repo, self.instance.base_commit,
                                    tag=self.call, run_id=self.config.run_id)
                try:
                    self.ws = ws.__enter__()
                except (WorkspaceError, OSError) as exc:
                    self.error = str(exc)
                else:
                    self._top_up()
            if self.error is not None:
                raise WorkspaceError(self.error)
            return self.ws

    def _spawn(self) -> Slot:
        assert self.ws is not None
        tree, channel = self.ws.new_dir("s"), ReportChannel(self.ws.new_dir("report"))
        hand_over(tree)
        framework = (self.instance.test_framework or "").lower()
        env = {**self.env, **channel.env(framework, pythonpath=self.pythonpath)}
        fut = self.starter.submit(ctr.PreparedRun, self.image, tree, channel.root, self.instance.test_cmd,
                                  self.config, env=env, name_hint=self.instance.instance_id, call=self.call,
                                  stdout_report=framework in STDOUT_REPORT)
        return Slot(tree, channel, fut)

    def _top_up(self) -> None:
        if not self.image or not self.instance.test_cmd.strip():
            return
        while self.ws is not None and len(self.spares) < min(self.config.max_workers, self.untaken):
            self.spares.append(self._spawn())

    def take(self) -> Slot:
        with self.lock:
            self.untaken -= 1
            slot = self.spares.popleft() if self.spares else self._spawn()
            self._top_up()
            self._prefetch_next()
            return slot

    def skip(self) -> None:
        """A rollout that will not run tests (empty, rejected): one spare fewer is needed."""
        with self.lock:
            self.untaken -= 1
            self._prefetch_next()

    def _prefetch_next(self) -> None:
        """Once this group's last rollout has its container, get the next group's repo and containers ready."""
        if self.untaken == 0 and self.next is not None:
            nxt, self.next = self.next, None

            def open_quietly() -> None:
                try:
                    nxt.open()
                except WorkspaceError:
                    pass  # recorded in nxt.error; its rollouts report it

            self.starter.submit(open_quietly)

    def release(self) -> None:
        with self.lock:
            self.remaining -= 1
            if self.remaining == 0:
                self._close_locked()

    def close(self) -> None:
        with self.lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self.closed = True
        while self.spares:
            discard_slot(self.spares.popleft())
        if self.ws is not None:
            self.ws.close(background=True)
            self.ws = None


def discard_slot(slot: Slot) -> None:
    """Remove a started-ahead container that will not be used (in the background: it may still be starting)."""

    def later() -> None:
        try:
            slot.run.result().discard()
        except Exception:  # noqa: BLE001 - it never started; nothing to remove
            pass

    janitor.submit(later, kind="container")
