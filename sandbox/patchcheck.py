"""Validate a model patch before anything is written to disk.

`validate_patch(patch, repo_root, *, max_bytes=10 MiB) -> PatchInfo` is the single gate every patch goes
through before `git apply` or GNU `patch` sees it. It raises:

- `EmptyPatch` for an empty or whitespace-only patch (the driver reports `empty_patch`);
- `PatchRejected(message)` for anything unsafe or unparseable (the driver reports `rejected`); the message
  names the offending path or line so that a user can fix the patch.

`EmptyPatch` and `PatchRejected` both derive from `PatchError` but not from each other: catch `EmptyPatch`
first (or separately) when the two outcomes must be told apart.

Why not trust `git apply` alone: the appliers disagree on how to read a diff. GNU `patch -p1` turns
`b//etc/evil` into `etc/evil` and writes it with exit 0; it reads file names from `Index:` lines, context-diff
`***` headers and whitespace-separated `---`/`+++` names; git also reads `rename`/`copy` headers. So every
header line outside a hunk body is collected in every form any applier might use, and each name must be a
relative path inside the repository that does not pass through `..`, `.git` (any case) or a symlink leaving
the repository.

Only unified diffs are accepted: a context-diff, normal-diff or ed-script section (which `unidiff` does not parse
and GNU `patch` would apply) is refused, so no applier can write a file the validator never saw; the sandbox
still checks, after applying, that the tree changed only at validated paths (`sandbox.apply`). A git binary
hunk declares the size it inflates to: the sum over the patch is capped (`max_expand_bytes`), so a hunk of a
kilobyte cannot write gigabytes on the host.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from sandbox.gitbinary import BinarySection, MalformedBinary

DEFAULT_MAX_BYTES = 10 * 2**20
SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"
DEV_NULL = "/dev/null"
MAX_PATH_DEPTH = 128
DEFAULT_MAX_EXPAND = 64 << 20  # bytes the git binary hunks of one patch may inflate to

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# Lines of the diff formats GNU patch reads besides unified diffs: context diffs (`*** name`, `***************`,
# `*** 1,3 ****`), normal diffs (`3c3`, `5,7d4`) and ed scripts (`3a`, `2,4d`, `5s/x/y/`).
_FOREIGN = (
    (re.compile(r"^\*\*\*"), "a context-diff section"),
    (re.compile(r"^\d+(?:,\d+)?[acd]\d+(?:,\d+)?\s*$"), "a normal-diff command"),
    (re.compile(r"^\d+(?:,\d+)?(?:[acdi]\s*$|s/)"), "an ed-script command"),
)
_GIT_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


class PatchError(Exception):
    """Base of the two outcomes of validation that stop a patch from being applied."""


class PatchRejected(PatchError):
    """The patch is unsafe or malformed; `str(exc)` says why in words a user can act on."""


class EmptyPatch(PatchError):
    """The patch is empty or whitespace only (status `empty_patch`, not `rejected`)."""


@dataclass(frozen=True)
class FileChange:
    """One file entry of a patch. `path` is repo-relative (the old path for deletions)."""

    path: str
    change: str  # "added" | "deleted" | "modified" | "renamed" (a copy counts as "added" with old_path)
    binary: bool = False
    lines_added: int = 0
    lines_removed: int = 0
    old_path: str | None = None
    symlink: bool = False


@dataclass
class PatchInfo:
    """What a validated patch touches. `data` keeps the original bytes for the appliers."""

    files: list[FileChange] = field(default_factory=list)
    size_bytes: int = 0
    data: bytes = b""
    expanded_bytes: int = 0  # what the git binary hunks inflate to (their declared sizes)
    binary_sections: int = 0  # `GIT binary patch` sections seen by the scan (GNU patch is never given these)

    @property
    def paths(self) -> list[str]:
        """Every repo-relative path the patch reads or writes (old and new names of renames)."""
        out: list[str] = []
        for f in self.files:
            for p in (f.old_path, f.path):
                if p and p not in out:
                    out.append(p)
        return out

    @property
    def has_binary(self) -> bool:
        return self.binary_sections > 0 or any(f.binary for f in self.files)

    @property
    def lines_added(self) -> int:
        return sum(f.lines_added for f in self.files)

    @property
    def lines_removed(self) -> int:
        return sum(f.lines_removed for f in self.files)


def _show(text: str) -> str:
    """Printable form of a (possibly undecodable) name for error messages."""
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return repr(shown) if any(c in shown for c in "\t\r\n\x00") else f"'{shown}'"


def unquote_git_path(name: str) -> str:
    """Undo git's C-style quoting (`"b/\\056git/config"` is `b/.git/config`); plain names pass through."""
    if len(name) < 2 or not (name.startswith('"') and name.endswith('"')):
        return name
    body, out, i = name[1:-1], bytearray(), 0
    raw = body.encode("utf-8", "surrogateescape")
    while i < len(raw):
        c = raw[i]
        if c == 0x5C and i + 1 < len(raw):  # backslash
            nxt = chr(raw[i + 1])
            if nxt in _GIT_ESCAPES:
                out.append(_GIT_ESCAPES[nxt])
                i += 2
                continue
            octal = raw[i + 1 : i + 4]
            if len(octal) == 3 and all(0x30 <= b <= 0x37 for b in octal):
                out.append(int(octal, 8) & 0xFF)
                i += 4
                continue
        out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _strip_one(name: str) -> str:
    """The -p1 view of a header name: drop the first component (`a/`, `b/`, ...)."""
    return name.split("/", 1)[1] if "/" in name else name


def _check_name(name: str, where: str, *, prefixed: bool) -> str | None:
    """Reject names that leave the repo or enter .git; return the repo-relative path (None for /dev/null)."""
    name = unquote_git_path(name)
    if name == DEV_NULL:
        return None
    if not name:
        raise PatchRejected(f"{where}: empty file name in a diff header")
    if name.startswith("/"):
        raise PatchRejected(
            f"{where}: absolute path {_show(name)}; patches must use repo-relative paths like a/src/x.py"
        )
    rel = _strip_one(name) if prefixed else name
    if rel.startswith("/"):
        raise PatchRejected(
            f"{where}: path {_show(name)} becomes the absolute path {_show(rel)} once the a/ or b/ prefix "
            "is stripped (GNU patch would silently write it inside the tree); use a/path and b/path"
        )
    parts = rel.split("/")
    if ".." in parts:
        raise PatchRejected(f"{where}: path {_show(name)} contains a '..' component; paths must stay inside the repository")
    if any(p.lower() == ".git" for p in parts):
        raise PatchRejected(f"{where}: path {_show(name)} writes into a .git directory, which patches may not touch")
    if len(parts) > MAX_PATH_DEPTH:  # the host walks the tree after applying: keep it within Python's stack
        raise PatchRejected(f"{where}: path {_show(name[:60])}... is {len(parts)} directories deep; the limit is "
                            f"{MAX_PATH_DEPTH}")
    if not rel or rel.endswith("/") or all(p in ("", ".") for p in parts):
        raise PatchRejected(f"{where}: path {_show(name)} does not name a file")
    return rel


def _header_names(line: str) -> list[tuple[str, bool]]:
    """Every file name an applier could read from one header line, with whether -p1 applies to it."""
    for key in ("rename from ", "rename to ", "copy from ", "copy to "):
        if line.startswith(key):
            return [(line[len(key) :].rstrip("\r\n"), False)]
    key = next((k for k in ("diff --git ", "--- ", "+++ ", "*** ", "Index: ") if line.startswith(k)), None)
    if key is None:
        return []
    prefixed = key != "Index: "
    rest = line[len(key) :].rstrip("\r\n")
    if key == "*** " and re.match(r"^\d+(,\d+)? \*\*\*\*", rest):
        return []  # a context-diff hunk range, not a name
    names: list[tuple[str, bool]] = []
    if rest.startswith('"'):
        names += [(m.group(0), prefixed) for m in re.finditer(r'"(?:[^"\\]|\\.)*"', rest)]
    head = rest.split("\t", 1)[0] if key != "diff --git " else ""
    if head:
        names.append((head, prefixed))
    # GNU patch ends a name at whitespace; git splits `diff --git` names on " b/": check every token too.
    names += [(tok, prefixed) for tok in rest.split() if not tok.startswith('"')]
    return names


def _scan_headers(text: str) -> tuple[list[tuple[int, str, bool]], list[int]]:
    """Walk the diff, skipping hunk bodies by their line counts; return the (line_no, name, prefixed) headers
    and what each git binary section inflates to.

    Raises PatchRejected for malformed hunks and for sections in a diff format other than unified (context
    diffs, normal diffs, ed scripts), naming the line.
    """
    names: list[tuple[int, str, bool]] = []
    binaries: list[int] = []
    old_left = new_left = 0
    hunk_line = 0
    binary: BinarySection | None = None
    for no, line in enumerate(_split(text), 1):
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag in (" ", "\n", "\r") or line in ("", "\n", "\r\n"):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            elif tag == "\\":
                continue
            else:
                raise PatchRejected(
                    f"line {no}: malformed hunk (started at line {hunk_line}): expected a line starting with "
                    f"' ', '+', '-' or '\\' but got {_show(line[:60])}; the hunk header's line counts do not "
                    "match its body"
                )
            if old_left < 0 or new_left < 0:
                raise PatchRejected(
                    f"line {no}: malformed hunk (started at line {hunk_line}): more lines than its @@ header declares"
                )
            continue
        if binary is not None:
            if binary.feed(no, line.rstrip("\r\n")):
                continue
            binaries.append(binary.size)
            binary = None
        if line.rstrip("\r\n") == "GIT binary patch":
            binary = BinarySection(no)
            continue
        m = _HUNK_RE.match(line.encode("utf-8", "surrogateescape"))
        if m:
            old_left = 1 if m.group(2) is None else int(m.group(2))
            new_left = 1 if m.group(4) is None else int(m.group(4))
            hunk_line = no
            continue
        if line.startswith("@@"):
            raise PatchRejected(f"line {no}: malformed hunk header {_show(line.rstrip())}; expected '@@ -a,b +c,d @@'")
        for pattern, what in _FOREIGN:
            if pattern.match(line):
                raise PatchRejected(
                    f"line {no}: {what} ({_show(line.rstrip()[:60])}); only unified diffs (git diff, diff -u) are "
                    "accepted, because GNU patch would apply what the unified-diff parser does not see"
                )
        names += [(no, n, p) for n, p in _header_names(line)]
    if old_left > 0 or new_left > 0:
        raise PatchRejected(
            f"malformed hunk at line {hunk_line}: the patch ends before the hunk does "
            f"({max(old_left, 0)} old / {max(new_left, 0)} new lines missing); was it truncated?"
        )
    if binary is not None:
        if binary.header is not None:
            binary.feed(0, "")  # the last hunk of a patch may end without its blank line
        binaries.append(binary.size)
    return names, binaries


def _check_nul(data: bytes) -> None:
    in_binary = False
    for no, line in enumerate(data.split(b"\n"), 1):
        if line.startswith(b"diff --git "):
            in_binary = False
        elif line.rstrip(b"\r") == b"GIT binary patch":
            in_binary = True
        if b"\x00" in line and not in_binary:
            raise PatchRejected(
                f"line {no}: NUL byte outside a 'GIT binary patch' section; send binary files as a git binary "
                "diff (git diff --binary)"
            )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_on_disk(rel: str, root: Path) -> None:
    """Refuse a path whose existing prefix is a symlink leaving the repo (or leading into .git)."""
    root_real = os.path.realpath(root)
    git_dir = os.path.join(root_real, ".git")
    cur = str(root)
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            target = os.path.realpath(cur)
            if not _inside(target, root_real):
                raise PatchRejected(
                    f"path {_show(rel)} goes through the symlink {_show(os.path.relpath(cur, root))} which points "
                    f"outside the repository (to {_show(target)})"
                )
            if _inside(target, git_dir):
                raise PatchRejected(f"path {_show(rel)} goes through a symlink into .git")
        elif not os.path.lexists(cur):
            return


def _symlink_target(pf) -> str | None:
    added = [line.value for hunk in pf for line in hunk if line.is_added]
    if len(added) != 1:
        return None
    return added[0].rstrip("\r\n")


def _check_new_symlink(rel: str, target: str | None) -> None:
    if target is None:
        raise PatchRejected(f"{_show(rel)}: symlink entry without a single-line target; cannot verify where it points")
    if target.startswith("/"):
        raise PatchRejected(f"{_show(rel)}: creates a symlink to the absolute path {_show(target)}; symlinks must stay inside the repository")
    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    parts = resolved.split("/")
    if resolved == ".." or parts[0] == "..":
        raise PatchRejected(f"{_show(rel)}: creates a symlink to {_show(target)}, which points outside the repository")
    if any(p.lower() == ".git" for p in parts):
        raise PatchRejected(f"{_show(rel)}: creates a symlink into .git ({_show(target)})")


def _split(text: str) -> list[str]:
    """Split on "\n" only: str.splitlines also breaks on \x0b, \x85, U+2028..., which no applier does."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _lines(text: str, counter: list[int]) -> Iterator[str]:
    for line in _split(text):
        counter[0] += 1
        yield line


def _to_bytes(patch: str | bytes) -> bytes:
    if isinstance(patch, (bytes, bytearray, memoryview)):
        return bytes(patch)
    if not isinstance(patch, str):
        raise PatchRejected(f"a patch must be text, got {type(patch).__name__}")
    try:
        # surrogateescape gives back the original bytes of a diff that was decoded with it
        return patch.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        line = patch.count("\n", 0, exc.start) + 1
        raise PatchRejected(f"line {line}: the patch text holds an unpaired surrogate (invalid Unicode)") from None


def validate_patch(patch: str | bytes, repo_root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                   max_expand_bytes: int = DEFAULT_MAX_EXPAND) -> PatchInfo:
    """Check a unified/git diff against `repo_root` (the tree it will be applied to) and describe it.

    Accepts text and git binary patches and non-UTF-8 bytes (names are decoded with surrogateescape;
    `PatchInfo.data` keeps the original bytes, which is what the appliers must be given).

    Raises `EmptyPatch` for an empty/whitespace-only patch and `PatchRejected` when the patch is over
    `max_bytes`, malformed (the message names the line), has absolute paths (including `b//etc/evil`), `..` or
    `.git` components (any case), goes through an existing symlink leaving the repo, creates a symlink
    pointing outside the repo or into .git, creates a symlink and also writes under it, has NUL bytes outside
    a `GIT binary patch` section, has a section in a format other than unified (context diff, normal diff, ed
    script), or has git binary hunks that inflate to more than `max_expand_bytes` in all. Nothing is written.
    """
    data = _to_bytes(patch)
    if len(data) > max_bytes:
        raise PatchRejected(
            f"patch is {len(data) / 2**20:.1f} MiB, over the {max_bytes / 2**20:.1f} MiB cap; send a smaller diff"
        )
    if not data.strip():
        raise EmptyPatch("the patch is empty")
    _check_nul(data)
    text = data.decode("utf-8", "surrogateescape")
    try:
        headers, binaries = _scan_headers(text)
    except MalformedBinary as exc:
        raise PatchRejected(str(exc)) from None
    if sum(binaries) > max_expand_bytes:
        raise PatchRejected(
            f"the patch's git binary hunks inflate to {sum(binaries) / 2**20:.1f} MiB, over the "
            f"{max_expand_bytes / 2**20:.1f} MiB cap on what applying a patch may write"
        )

    counter = [0]
    try:
        ps = PatchSet(_lines(text, counter))
    except UnidiffParseError as exc:
        raise PatchRejected(f"line {counter[0]}: malformed diff ({exc})".rstrip()) from None
    if not ps:
        raise PatchRejected(
            "no file changes found: expected a unified diff (git diff / diff -u) with '---'/'+++' or "
            "'diff --git' headers"
        )

    for no, name, prefixed in headers:
        _check_name(name, f"line {no}", prefixed=prefixed)

    files: list[FileChange] = []
    symlinks: set[str] = set()
    seen: dict[str, int] = {}
    for pf in ps:
        where = f"diff starting at line {pf.diff_line_no}"
        src = _check_name(pf.source_file, where, prefixed=True) if pf.source_file else None
        tgt = _check_name(pf.target_file, where, prefixed=True) if pf.target_file else None
        info_lines = [str(x) for x in (pf.patch_info or [])]
        renamed = any(x.startswith("rename from ") for x in info_lines)
        copied = any(x.startswith("copy from ") for x in info_lines)
        if pf.target_mode == GITLINK_MODE or pf.source_mode == GITLINK_MODE:
            raise PatchRejected(f"{where}: submodule (gitlink) entries are not supported in patches")
        if tgt is None:
            change, path, old = "deleted", src, None
        elif src is None:
            change, path, old = "added", tgt, None
        elif renamed:
            change, path, old = "renamed", tgt, src
        elif copied:
            change, path, old = "added", tgt, src
        else:
            change, path, old = "modified", tgt, (src if src != tgt else None)
        if path is None:
            raise PatchRejected(f"{where}: both sides of the diff are /dev/null")
        is_link = tgt is not None and pf.target_mode == SYMLINK_MODE
        if is_link:
            _check_new_symlink(path, _symlink_target(pf))
            symlinks.add(path)
        for p in {path, old} - {None}:
            seen[p] = seen.get(p, 0) + 1
        files.append(
            FileChange(
                path=path,
                change=change,
                binary=bool(pf.is_binary_file),
                lines_added=pf.added,
                lines_removed=pf.removed,
                old_path=old,
                symlink=is_link,
            )
        )

    for link in symlinks:
        if seen.get(link, 0) > 1:
            raise PatchRejected(f"{_show(link)}: the patch creates this symlink and also edits the same path")
        for f in files:
            for p in (f.path, f.old_path):
                if p and p.startswith(link + "/"):
                    raise PatchRejected(
                        f"{_show(p)}: the patch creates the symlink {_show(link)} and also writes under it"
                    )

    repo_root = Path(repo_root)
    checked: set[str] = set()
    for _, name, prefixed in headers:
        rel = _check_name(name, "", prefixed=prefixed)
        if rel and rel not in checked:
            checked.add(rel)
            _check_on_disk(rel, repo_root)
    for f in files:
        for p in (f.path, f.old_path):
            if p and p not in checked:
                checked.add(p)
                _check_on_disk(p, repo_root)
    return PatchInfo(files=files, size_bytes=len(data), data=data, expanded_bytes=sum(binaries),
                     binary_sections=len(binaries))
