"""The agent's tools over one task's work tree: the tree is bind-mounted into a sandbox `Container` at /testbed.

Reading and editing go through the host side of the mount (the images need not ship an editor or Python: the Go
and Java images have neither), with every path checked to stay inside the tree and out of `.git`; searching and
running commands happen inside the container, under its limits and a per-call timeout.

The answer (`diff()`) is computed without running git in the tree: the agent had a shell in it, so its `.git`,
`.gitattributes` and everything else there are untrusted (hooks, filters, fsmonitor, pager, includes would run
on the host). `sandbox.integrity.treediff` reads the files as bytes and diffs them against the pristine git dir of the
group's workspace, which is never mounted into a container.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import docker.errors
import requests

from sandbox.container import SandboxInfraError
from sandbox.integrity.treediff import TreeDiffError, tree_diff


class ToolError(Exception):
    """A tool call the agent got wrong; its message goes back to the agent."""


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head):]}"


class AgentTools:
    def __init__(self, root: Path, container: Any, *, test_cmd: str, timeout: float = 30.0,
                 output_chars: int = 2000, pristine_git_dir: Path | None = None,
                 base_commit: str | None = None) -> None:
        self.root = Path(root).resolve()
        self.pristine_git_dir = pristine_git_dir  # outside the mounted tree; the agent never had write access
        self.base_commit = base_commit
        self.diff_error: str | None = None
        # Set when the sandbox itself failed (engine gone, container lost): the episode ends and the trainer
        # masks the rollout instead of scoring a policy that lost its shell through no act of its own.
        self.infra_error: str | None = None
        self.container = container
        self.test_cmd = test_cmd
        self.timeout = timeout
        self.output_chars = output_chars
        self.submitted = False
        st = self.root.stat()
        self._owner = (st.st_uid, st.st_gid)

    def _path(self, rel: Any) -> Path:
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("`path` must be a non-empty string relative to the repository root")
        rel = rel.strip()
        if rel.startswith("/testbed"):
            rel = rel[len("/testbed"):].lstrip("/") or "."
        p = (self.root / rel).resolve()
        if p != self.root and self.root not in p.parents:
            raise ToolError(f"{rel}: outside the repository")
        if ".git" in p.relative_to(self.root).parts:
            raise ToolError(f"{rel}: the .git directory is off limits")
        return p

    def _open(self, p: Path, flags: int, mode: int = 0o644, dir_fd: int | None = None) -> int:
        """Open without following a final symlink, then check where the descriptor really points: a process
        left running in the container could swap a path component for a symlink after `_path` checked it, and
        the host side may be root."""
        fd = os.open(p if dir_fd is None else p.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if real != self.root and self.root not in real.parents or ".git" in real.relative_to(self.root).parts:
            os.close(fd)
            raise ToolError(f"{p.relative_to(self.root)}: resolves outside the repository")
        return fd

    def _read(self, p: Path) -> str:
        with os.fdopen(self._open(p, os.O_RDONLY), "r", encoding="utf-8") as fh:
            return fh.read()

    def call(self, name: str, args: dict) -> str:
        fn = {"view": self.view, "search": self.search, "edit": self.edit, "run": self.run,
              "submit": self.submit}.get(name)
        if fn is None:
            return f"error: unknown tool {name!r}; tools: view, search, edit, run, submit"
        try:
            return fn(**args)
        except (TypeError, ValueError) as exc:  # UnicodeDecodeError included: a binary file is a bad target
            return f"error: bad arguments for {name}: {exc}"
        except ToolError as exc:
            return f"error: {exc}"
        except OSError as exc:
            return f"error: {name}: {exc.strerror or exc}"

    def view(self, path: str, start: int = 1, end: int | None = None) -> str:
        p = self._path(path)
        if p.is_dir():
            names = sorted(c.name + ("/" if c.is_dir() else "") for c in p.iterdir() if c.name != ".git")
            return _cap("\n".join(names), self.output_chars)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        try:
            lines = self._read(p).splitlines()
        except UnicodeDecodeError:
            raise ToolError(f"{path}: not a text file") from None
        start = max(1, int(start))
        end = len(lines) if end is None else min(len(lines), int(end))
        body = "\n".join(f"{i:5d} {lines[i - 1]}" for i in range(start, end + 1))
        return _cap(body or f"({path} has {len(lines)} lines)", self.output_chars)

    def search(self, pattern: str, path: str = ".") -> str:
        p = self._path(path)
        rel = os.path.relpath(p, self.root)
        cmd = f"grep -rnIE --exclude-dir=.git -e {shlex.quote(str(pattern))} -- {shlex.quote(rel)} | head -n 200"
        res = self.container.exec(cmd, timeout=self.timeout)
        return _cap(res.output.strip() or "no matches", self.output_chars)

    def edit(self, path: str, old: str, new: str) -> str:
        p = self._path(path)
        if not old:
            if p.exists():
                raise ToolError(f"{path} exists; give `old` text to replace")
            p.parent.mkdir(parents=True, exist_ok=True)
            dfd = self._open(p.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fd = self._open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=dfd)
            finally:
                os.close(dfd)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(new)
            self._chown(p)
            return f"created {path}"
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        text = self._read(p)
        count = text.count(old)
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; it must occur exactly once (add context)")
        # Write in place so the file keeps its owner and mode (the container user must still be able to use it).
        with os.fdopen(self._open(p, os.O_RDWR), "r+", encoding="utf-8") as fh:
            fh.write(text.replace(old, new, 1))
            fh.truncate()
        return f"edited {path}"

    def _chown(self, p: Path) -> None:
        if os.geteuid() == 0:
            for q in [p, *[a for a in p.parents if self.root in a.parents]]:
                os.chown(q, *self._owner, follow_symlinks=False)

    def run(self, command: str | None = None) -> str:
        cmd = command or self.test_cmd
        try:
            res = self.container.exec(cmd, timeout=self.timeout)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            return self._after_failed_exec(exc)
        status = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        return f"[{status}]\n" + _cap(res.output, self.output_chars)

    def _after_failed_exec(self, exc: Exception) -> str:
        # A container that stopped under its own processes (they killed its init) is the policy's doing: it is
        # started again, tree intact, and told so. Anything else is the sandbox failing, not the policy.
        try:
            if self.container.revive():
                return ("[the container had stopped: every process in it was killed; it was started again with "
                        "your files as they were]")
        except SandboxInfraError as lost:
            self.infra_error = str(lost)
        else:
            self.infra_error = f"running a command in the agent's container failed: {type(exc).__name__}: {exc}"
        return "error: the sandbox failed; this episode ends here"

    def submit(self) -> str:
        self.submitted = True
        return "submitted"

    def diff(self) -> str:
        """The answer: `git diff --binary` of the work tree against the task's base commit (new files included,
        `.gitignore`d files and build caches left out), computed without git touching the tree. A tree past
        the diff's limits (too many or too big files) gives "" and sets `diff_error`."""
        if self.pristine_git_dir is None or self.base_commit is None:
            raise RuntimeError("AgentTools.diff needs pristine_git_dir and base_commit")
        try:
            return tree_diff(self.root, self.pristine_git_dir, self.base_commit)
        except TreeDiffError as exc:
            self.diff_error = str(exc)
            return ""
