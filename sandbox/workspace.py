"""Repo copies: the repo at `base_commit` is prepared once per instance, each rollout gets a private copy.

No future: the base is a fresh repository holding only `base_commit` (`sandbox.integrity.gitsafe.export_commit`, a
depth-1 fetch): no later commits, branches, tags, remotes, reflogs or packed objects reach a rollout's copy, so
neither tests nor an agent can read the task's own fix out of `.git`. The base itself is never mounted into a
container: its `.git` is the pristine git dir that host-side diffs of a policy's tree are computed against.

Why not hard links: a patch (or a test) that writes a file in place would write through the shared inode into
the base and every sibling copy. A rollout copy is a real copy of the working tree plus `.git` (small repos:
`cp -a` of a few hundred files takes milliseconds), or, for repos whose `.git` is big, a copy of everything but
`.git/objects`, which the copy borrows from the base through `objects/info/alternates` (a host path the
container cannot see).
Copies stay root-owned while the host applies patches (git refuses repos owned by another user), then
`hand_over` gives them to the container user.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sandbox.integrity import gitsafe

SHARED_CLONE_ABOVE = 64 << 20  # .git bytes above which a rollout copy shares objects instead of copying them
SANDBOX_UID = SANDBOX_GID = 1000


WS_PREFIX = "gagar-ws-"
OWNER_FILE = "owner.pid"
TAG_FILE = "call"
RUN_FILE = "run"


def stale_workspaces(tmp_root: Path | None = None, *, run_id: str | None = None) -> list[Path]:
    """Workspaces whose owning process is gone (a `kill -9` skips every cleanup); `gagar sandbox gc` removes
    them, and a resumed run removes its own run's (`run_id`). A workspace without a readable owner is left
    alone."""
    out = []
    for d in Path(tmp_root or tempfile.gettempdir()).glob(WS_PREFIX + "*"):
        try:
            pid = int((d / OWNER_FILE).read_text().strip())
            if run_id is not None and (d / RUN_FILE).read_text() != run_id:
                continue
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            out.append(d)
        except PermissionError:
            pass  # alive, someone else's
    return out


def sweep_workspaces(tag: str, tmp_root: Path | None = None) -> list[str]:
    """Remove every workspace of this process tagged `tag` (one evaluation call) that is still there: the last
    step of an interrupted run's cleanup, whatever thread or race left one behind. Returns their names."""
    gone = []
    for d in Path(tmp_root or tempfile.gettempdir()).glob(WS_PREFIX + "*"):
        try:
            mine = (d / OWNER_FILE).read_text().strip() == str(os.getpid()) and (d / TAG_FILE).read_text() == tag
        except OSError:
            continue
        if mine:
            remove_tree(d)
            gone.append(d.name)
    return gone


class WorkspaceError(RuntimeError):
    """The repo could not be prepared (missing clone, unknown commit); the message names what to fix."""


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def hand_over(tree: Path) -> None:
    """Make `tree` writable by the container user: chown to uid 1000 when root (never following links — a
    patch may add a symlink to anywhere); otherwise open the permissions, which is all a non-root host can do."""
    is_root = os.geteuid() == 0
    for root, dirs, files in os.walk(tree):
        for name in [*dirs, *files, None]:
            p = os.path.join(root, name) if name else root
            try:
                if is_root:
                    os.lchown(p, SANDBOX_UID, SANDBOX_GID)
                else:
                    st = os.lstat(p)
                    if not stat.S_ISLNK(st.st_mode):
                        os.chmod(p, st.st_mode | stat.S_IRWXO if stat.S_ISDIR(st.st_mode) else st.st_mode | 0o666)
            except OSError:
                pass


def remove_tree(path: Path) -> None:
    """Remove `path` and everything under it. The janitor removes a rollout's tree and, on another thread, the
    group workspace around it, so entries vanish under `rmtree`: that is success, not an error. Whatever
    `rmtree` meets, GNU rm finishes the job (it was skipped when the handler itself raised, and CI found the
    workspace left behind)."""

    def onerror(func, p, exc_info):
        if isinstance(exc_info[1], FileNotFoundError):
            return  # another remover got there first
        if func not in (os.unlink, os.rmdir):
            return  # os.open, os.scandir, os.lstat (rmtree passes them flags and dir_fd): rm -rf below sees to it
        try:  # a read-only dir left by the tests: open it and retry once
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass

    try:
        shutil.rmtree(path, onerror=onerror)
    except RecursionError:  # a test nested directories deeper than Python's stack
        pass
    finally:
        if os.path.lexists(path):  # GNU rm removes trees of any depth
            subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True)


class Janitor:
    """Deletes trees and containers off the critical path: on a busy disk removing even a small tree takes a
    few hundred ms, which a rollout should not wait for. `drain()` (the driver calls it before returning, and
    at exit) waits until everything handed over is gone."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gagar-janitor")
        self._pending: dict[Future, str] = {}
        self._lock = threading.Lock()

    def submit(self, fn, *args, kind: str = "tree") -> None:
        fut = self._pool.submit(fn, *args)
        with self._lock:
            self._pending[fut] = kind
        fut.add_done_callback(self._done)

    def _done(self, fut: Future) -> None:
        with self._lock:
            self._pending.pop(fut, None)

    def drain(self, kind: str | None = None, timeout: float | None = 120) -> None:
        """Wait for the pending removals (of one `kind` only, when given)."""
        with self._lock:
            pending = [f for f, k in self._pending.items() if kind is None or k == kind]
        for fut in pending:
            try:
                fut.result(timeout=timeout)
            except Exception:  # noqa: BLE001 - best effort; gc and temp cleaners catch the rest
                pass


janitor = Janitor()
atexit.register(janitor.drain)


class GroupWorkspace:
    """The repo at `base_commit` for one instance group, under a private temp dir removed on exit."""

    def __init__(self, repos_dir: Path, repo: str, base_commit: str, *, tmp_root: Path | None = None,
                 tag: str | None = None, run_id: str | None = None) -> None:
        self.tag = tag  # the evaluation call it belongs to: `sweep_workspaces(tag)` finds it after an interrupt
        self.run_id = run_id  # the run it belongs to: a resumed run removes what a dead earlier one left
        self.source = Path(repos_dir) / repo.replace("/", "__")
        self.base_commit = base_commit
        self.tmp_root = tmp_root
        self.root: Path | None = None
        self.base: Path | None = None
        self.shared_objects = False
        self._n = 0
        self._lock = threading.Lock()

    def __enter__(self) -> GroupWorkspace:
        if not (self.source / ".git").exists() and not (self.source / "HEAD").exists():
            raise WorkspaceError(f"no git clone of the repo at {self.source} (expected <repos-dir>/<owner>__<name>)")
        self.root = Path(tempfile.mkdtemp(prefix=WS_PREFIX, dir=self.tmp_root))
        (self.root / OWNER_FILE).write_text(str(os.getpid()))
        if self.tag:
            (self.root / TAG_FILE).write_text(self.tag)
        if self.run_id:
            (self.root / RUN_FILE).write_text(self.run_id)
        try:
            self.base = self.root / "base"
            try:
                gitsafe.export_commit(self.source, self.base_commit, self.base)
            except gitsafe.GitError as exc:
                raise WorkspaceError(f"cannot prepare {self.source} at {self.base_commit}: {exc}") from exc
            self.shared_objects = _du(self.base / ".git") > SHARED_CLONE_ABOVE
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, *, background: bool = False) -> None:
        if self.root is not None:
            if background:
                janitor.submit(remove_tree, self.root)
            else:
                remove_tree(self.root)
            self.root = None

    def new_dir(self, prefix: str) -> Path:
        """An empty directory under the workspace (a mount point prepared before its contents)."""
        if self.root is None:
            raise RuntimeError("GroupWorkspace is not open")
        with self._lock:
            self._n += 1
            d = self.root / f"{prefix}{self._n}"
        d.mkdir()
        return d

    def copy(self, dst: Path | None = None) -> Path:
        """A private, root-owned copy of the base tree (with its own .git) for one rollout, into `dst` (an
        empty directory, e.g. one already mounted into a waiting container) or a new directory."""
        if self.base is None or self.root is None:
            raise RuntimeError("GroupWorkspace is not open")
        dst = dst if dst is not None else self.new_dir("r")
        if self.shared_objects:
            _cp([p for p in self.base.iterdir() if p.name != ".git"], dst)
            (dst / ".git").mkdir()
            _cp([p for p in (self.base / ".git").iterdir() if p.name != "objects"], dst / ".git")
            (dst / ".git" / "objects" / "info").mkdir(parents=True)
            (dst / ".git" / "objects" / "info" / "alternates").write_text(f"{self.base / '.git' / 'objects'}\n")
        else:
            _cp([f"{self.base}/."], dst)
        return dst

    @property
    def git_dir(self) -> Path:
        """The pristine git dir (base_commit only), outside every mounted tree: what host-side diffs of a
        policy's tree are computed against (`sandbox.integrity.treediff`)."""
        if self.base is None:
            raise RuntimeError("GroupWorkspace is not open")
        return self.base / ".git"


def _cp(srcs: list[Path] | list[str], dst: Path) -> None:
    if srcs:
        subprocess.run(["cp", "-a", "--reflink=auto", *map(str, srcs), str(dst)], check=True, capture_output=True)
