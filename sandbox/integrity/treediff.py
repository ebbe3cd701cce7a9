"""The diff of a work tree a policy wrote, computed without running git in that tree.

`tree_diff(tree, git_dir, base_commit) -> str` is `git diff --binary` of everything in `tree` against
`base_commit` (new, changed, deleted files, modes, symlinks), with `.gitignore` honoured for untracked files as
`git add -A` would. Only two things are trusted: `git_dir`, a pristine repository the policy never had write
access to (kept outside the mounted tree, see `sandbox.integrity.gitsafe`), and the file contents as plain bytes.

How: Python walks the tree through directory file descriptors with `O_NOFOLLOW` (a process still running in the
container may swap a directory for a symlink mid-walk; a swapped-in link is read as a link, never followed),
skips every entry named `.git`, FIFOs, sockets and devices, hashes each file as a git blob, and writes the
changed blobs and the new tree objects as loose objects into a private temp object dir. Then
`git diff <base_commit> <new tree>` runs against the pristine git dir with that object dir as an extra
source: git compares objects only, it never looks at the policy's tree, its `.git`, its `.gitattributes` or
its config. So nothing the policy planted (hooks, filters, fsmonitor, pager, includes, nested repositories)
can run on the host. Gitlinks (submodules) of the base commit are kept as they are.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from sandbox.integrity import gitsafe

# Build caches the tests leave behind are not part of an answer (tracked ones keep their base state).
DEFAULT_EXCLUDES = ("__pycache__/", "*.pyc", ".pytest_cache/")


class TreeDiffError(RuntimeError):
    """The tree cannot be diffed within the limits (too many files, a file too big, too deep)."""


@dataclass(frozen=True)
class Limits:
    max_entries: int = 200_000
    max_file_bytes: int = 64 << 20
    max_total_bytes: int = 1 << 30
    max_depth: int = 128


@dataclass
class _Entry:
    mode: str  # "100644" | "100755" | "120000" | "160000" | "40000"
    sha: str


def _blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _write_object(objdir: Path, kind: bytes, data: bytes) -> str:
    raw = kind + b" %d\0" % len(data) + data
    sha = hashlib.sha1(raw).hexdigest()
    path = objdir / sha[:2] / sha[2:]
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(zlib.compress(raw, 1))
        os.replace(tmp, path)
    return sha


def base_entries(git_dir: Path, commit: str) -> tuple[dict[str, _Entry], set[str]]:
    """Blobs and gitlinks of `commit` by path, and the set of every object id it holds (trees included)."""
    out = gitsafe.git("ls-tree", "-r", "-t", "-z", "--full-tree", commit, git_dir=git_dir, binary=True)
    files: dict[str, _Entry] = {}
    known: set[str] = set()
    for rec in out.split(b"\0"):  # type: ignore[union-attr]
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, kind, sha = meta.decode().split(" ")
        known.add(sha)
        if kind != "tree":
            files[os.fsdecode(path)] = _Entry(mode, sha)
    return files, known


class _Ignores:
    """`.gitignore` files met during the walk, by directory: deeper files win, the last matching line wins."""

    def __init__(self, excludes: Sequence[str]) -> None:
        self.excludes = pathspec.GitIgnoreSpec.from_lines(list(excludes))
        self.specs: dict[str, pathspec.GitIgnoreSpec] = {}

    def add(self, prefix: str, text: str) -> None:
        self.specs[prefix] = pathspec.GitIgnoreSpec.from_lines(text.splitlines())

    def excluded(self, rel: str, is_dir: bool) -> bool:
        return self.excludes.match_file(rel + ("/" if is_dir else ""))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):
            prefix = "".join(p + "/" for p in parts[:depth])
            spec = self.specs.get(prefix)
            if spec is None:
                continue
            res = spec.check_file(rel[len(prefix):] + ("/" if is_dir else ""))
            if res.include is not None:
                return bool(res.include)
        return False


class _Walk:
    def __init__(self, base: dict[str, _Entry], known: set[str], objdir: Path, excludes: Sequence[str],
                 limits: Limits) -> None:
        self.base, self.known, self.objdir, self.limits = base, known, objdir, limits
        self.ign = _Ignores(excludes)
        self.tracked_dirs = {rel[: i + 1] for rel in base for i, c in enumerate(rel) if c == "/"}
        self.files: dict[str, _Entry] = {}
        self.entries = 0
        self.total = 0

    def _read(self, name: str, dfd: int, rel: str) -> bytes | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None  # vanished, or swapped for a link: not a file any more
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size > self.limits.max_file_bytes:
                raise TreeDiffError(f"{rel}: {st.st_size} bytes, over the {self.limits.max_file_bytes}-byte cap")
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                size += len(chunk)
                if size > self.limits.max_file_bytes:
                    raise TreeDiffError(f"{rel}: grew over the {self.limits.max_file_bytes}-byte cap while read")
            self.total += size
            if self.total > self.limits.max_total_bytes:
                raise TreeDiffError(f"the tree holds over {self.limits.max_total_bytes} bytes of files")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _add(self, rel: str, mode: str, data: bytes) -> None:
        sha = _blob_sha(data)
        if sha not in self.known:
            _write_object(self.objdir, b"blob", data)
        self.files[rel] = _Entry(mode, sha)

    def dir(self, dfd: int, prefix: str, ignored: bool, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise TreeDiffError(f"{prefix}: directories nested deeper than {self.limits.max_depth}")
        names = sorted(os.listdir(dfd))
        self.entries += len(names)
        if self.entries > self.limits.max_entries:
            raise TreeDiffError(f"the tree holds over {self.limits.max_entries} entries")
        if ".gitignore" in names:
            data = self._read(".gitignore", dfd, prefix + ".gitignore")
            if data is not None:
                self.ign.add(prefix, data.decode("utf-8", "replace"))
        for name in names:
            rel = prefix + name
            if name.lower() == ".git" or self.base.get(rel, _Entry("", "")).mode == "160000":
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            tracked = rel in self.base
            if stat.S_ISDIR(st.st_mode):
                sub_ignored = ignored or self.ign.ignored(rel, True)
                if self.ign.excluded(rel, True) or sub_ignored and rel + "/" not in self.tracked_dirs:
                    continue
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    self.dir(sub, rel + "/", sub_ignored, depth + 1)
                finally:
                    os.close(sub)
                continue
            if self.ign.excluded(rel, False) or not tracked and (ignored or self.ign.ignored(rel, False)):
                continue
            if stat.S_ISLNK(st.st_mode):
                try:
                    self._add(rel, "120000", os.fsencode(os.readlink(name, dir_fd=dfd)))
                except OSError:
                    continue
            elif stat.S_ISREG(st.st_mode):
                data = self._read(name, dfd, rel)
                if data is not None:
                    self._add(rel, "100755" if st.st_mode & stat.S_IXUSR else "100644", data)


def _build_tree(files: dict[str, _Entry], objdir: Path, known: set[str]) -> str:
    root: dict = {}
    for rel, entry in files.items():
        node, parts = root, rel.split("/")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a kept base file where the tree now has a directory
                child = node[part] = {}
            node = child
        if not isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = entry

    def write(node: dict) -> str:
        items = []
        for name, val in node.items():
            if isinstance(val, dict):
                if not val:
                    continue
                items.append((os.fsencode(name) + b"/", b"40000", os.fsencode(name), write(val)))
            else:
                items.append((os.fsencode(name), val.mode.encode(), os.fsencode(name), val.sha))
        items.sort(key=lambda t: t[0])
        data = b"".join(mode + b" " + name + b"\0" + bytes.fromhex(sha) for _, mode, name, sha in items)
        sha = hashlib.sha1(b"tree %d\0" % len(data) + data).hexdigest()
        return sha if sha in known else _write_object(objdir, b"tree", data)

    return write(root)


def tree_diff(tree: Path | str, git_dir: Path | str, base_commit: str, *,
              excludes: Sequence[str] = DEFAULT_EXCLUDES, limits: Limits = Limits()) -> str:
    """`git diff --binary` of the untrusted work tree `tree` against `base_commit` of the pristine `git_dir`
    (see the module docstring); "" when nothing changed. Raises `TreeDiffError` past `limits`."""
    base, known = base_entries(Path(git_dir), base_commit)
    objdir = Path(tempfile.mkdtemp(prefix="gagar-treediff-"))
    try:
        walk = _Walk(base, known, objdir, excludes, limits)
        root_fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            walk.dir(root_fd, "", False, 0)
        finally:
            os.close(root_fd)
        for rel, entry in base.items():  # excluded build caches and submodules keep their base state
            if rel not in walk.files and (entry.mode == "160000" or walk.ign.excluded(rel, False)
                                          or any(walk.ign.excluded(rel[:i], True) for i, c in enumerate(rel)
                                                 if c == "/")):
                walk.files[rel] = entry
        new_tree = _build_tree(walk.files, objdir, known)
        env = {"GIT_OBJECT_DIRECTORY": str(objdir),
               "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(Path(git_dir).resolve() / "objects")}
        out = gitsafe.git("--bare", "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--binary",
                          base_commit, new_tree, git_dir=git_dir, env=env, binary=True)
        return out.decode("utf-8", "replace")  # type: ignore[union-attr]
    finally:
        shutil.rmtree(objdir, ignore_errors=True)
