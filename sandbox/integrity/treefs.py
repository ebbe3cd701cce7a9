"""Host-side views of a work tree a patch (or a test) wrote: what changed, and bounded reads of its files.

Why: what the rest of the pipeline believes a patch touched must come from the tree, not from a parse of the
patch. GNU `patch` reads diff formats the validator's parser does not (context diffs, ed scripts), and a git
binary hunk a kilobyte long can write gigabytes. So the sandbox snapshots the tree's metadata before applying
and after, and takes the difference as the set of paths the patch really changed (`changes`); every later step
(test restoration, `tampered_tests`, the static checks) works from that set. And no file of such a tree is ever
read whole on the host: `read_capped` refuses anything that is not a regular file or is over a size cap, and
never follows a symlink.

The snapshot is `lstat` metadata only (type, mode, size, mtime, inode, ctime), no content: a write, a rename into
place, a chmod, a new symlink, a deletion — each changes one of them. `.git` is left out at the top level.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

MAX_ENTRIES = 500_000
MAX_DEPTH = 256


class TreeTooLarge(RuntimeError):
    """The tree holds more entries (or deeper directories) than a snapshot walks."""


@dataclass(frozen=True)
class Entry:
    kind: str  # "file" | "link" | "dir" | "other"
    mode: int
    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int  # no process can set it: a file rewritten and given its old mtime back still shows


@dataclass(frozen=True)
class Change:
    path: str
    change: str  # "added" | "deleted" | "modified"
    kind: str  # what is there now ("file", "link", "dir", "other"); for a deletion, what was there
    size: int = 0  # bytes now (0 for a deletion)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


def entry(path: os.PathLike | str) -> Entry | None:
    """The `Entry` of one path (never following a symlink), None when nothing is there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return Entry(_kind(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def snapshot(tree: os.PathLike | str, *, max_entries: int = MAX_ENTRIES) -> dict[str, Entry]:
    """`{relative path: Entry}` for everything under `tree` but its top-level `.git`, without following
    symlinks. Raises `TreeTooLarge` past `max_entries` entries or `MAX_DEPTH` levels."""
    out: dict[str, Entry] = {}
    stack: list[tuple[str, str, int]] = [(os.fspath(tree), "", 0)]
    while stack:
        path, prefix, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TreeTooLarge(f"{prefix or '.'}: directories nested deeper than {MAX_DEPTH}")
        try:
            it = os.scandir(path)
        except OSError:
            continue
        with it:
            for e in it:
                if not prefix and e.name == ".git":
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                rel = prefix + e.name
                out[rel] = Entry(_kind(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns,
                                 st.st_ino, st.st_ctime_ns)
                if len(out) > max_entries:
                    raise TreeTooLarge(f"the tree holds over {max_entries} entries")
                if stat.S_ISDIR(st.st_mode):
                    stack.append((e.path, rel + "/", depth + 1))
    return out


def changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[Change]:
    """What differs between two snapshots of one tree: every added, deleted or modified entry. Directories are
    reported when added (a new package is a change of its own) or when their type changed, not when deleted
    (they go with what they held) or when only their metadata changed (a change inside them is reported)."""
    out: list[Change] = []
    for rel in sorted(set(before) | set(after)):
        b, a = before.get(rel), after.get(rel)
        if a is None:
            if b is not None and b.kind != "dir":
                out.append(Change(rel, "deleted", b.kind))
        elif b is None:
            out.append(Change(rel, "added", a.kind, a.size if a.kind == "file" else 0))
        elif a.kind != b.kind:
            out.append(Change(rel, "added" if b.kind == "dir" else "modified", a.kind, a.size))
        elif a.kind != "dir" and a != b:
            out.append(Change(rel, "modified", a.kind, a.size))
    return out


def read_capped(path: os.PathLike | str, max_bytes: int, *, dir_fd: int | None = None) -> bytes | None:
    """The bytes of the regular file at `path`, or None when it is missing, not a regular file (a symlink is
    never followed, a FIFO never opened for long), or larger than `max_bytes` — also when it grows past that
    while being read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                return None
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text_capped(path: os.PathLike | str, max_bytes: int) -> str | None:
    """`read_capped` decoded as UTF-8 (undecodable bytes replaced)."""
    data = read_capped(path, max_bytes)
    return None if data is None else data.decode("utf-8", "replace")
