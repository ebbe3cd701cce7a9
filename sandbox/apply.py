"""Apply a model patch to a work tree with SWE-bench's fallback chain, then restore the task's tests.

`apply_patch(tree, patch, *, base_commit) -> ApplyOutcome(applied, method, log, info, changes)`
    Validates the patch (`sandbox.patchcheck.validate_patch`, which raises `PatchRejected` / `EmptyPatch`),
    then tries in order `git apply --verbose`, `git apply --verbose --3way`, `git apply --verbose --reject`
    (counted only when every hunk applied), and `patch --batch --forward --fuzz=5 -p1
    --no-backup-if-mismatch` (skipped for binary patches, which GNU patch cannot apply). The tree is reset to
    `base_commit` (`git reset --hard` + `git clean`) before every try, so a failed try leaves nothing behind.
    Each applier runs with a cap on the size of any file it writes (`RLIMIT_FSIZE`, through `prlimit`).
    What a try changed is taken from the tree itself (`sandbox.integrity.treefs`: metadata snapshots before and
    after), never from the parse alone: a change at a path the validated unified diff does not name, more bytes
    written than the patch can account for, a symlink resolving outside the tree or into `.git`, or any change
    to `.git` other than git's own bookkeeping resets the tree and raises `PatchRejected`. `changes` lists
    what the patch really changed; the steps after applying work from it.

`restore_task_tests(tree, *, base_commit, test_patch, model_patch_info, changed) -> RestoreOutcome(tampered, touched, log)`
    Policy: tampering is flagged and reverted, and the verdict is then computed on the task's own tests.
    Every file `test_patch` touches is reset to its `base_commit` state (removed when absent there), as is
    every file pytest reads as configuration that the model patch changed (`sandbox.integrity.pytestcfg`:
    `conftest.py`, `pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml`, `tox.ini`, a symlink at any of
    these names or at `pyproject.toml` / `setup.cfg`, and a `pyproject.toml` / `setup.cfg` whose pytest content
    changed); then `test_patch` is applied on top. `tampered` is True when the model patch touched any of these
    files (`touched` lists them). Raises `TestPatchFailed` when the task's own `test_patch` does not apply (an
    infrastructure problem).

Git runs through `sandbox.integrity.gitsafe` (trusted configuration only, hooks and drivers off) with the copy's git dir
named explicitly. That git dir is trusted at this point: the host made the copy from the pristine base and the
patch was refused if it touched `.git`; no container has run in the tree yet, and the host runs no git in it
once one has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.integrity import gitsafe, pytestcfg, treefs
from sandbox.patchcheck import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EXPAND,
    PatchInfo,
    PatchRejected,
    _to_bytes,
    validate_patch,
)

APPLY_METHODS = ("git apply", "git apply --3way", "git apply --reject", "patch --fuzz")
# Files under .git that git itself rewrites while applying/resetting; anything else changing is suspicious.
_GIT_BOOKKEEPING = ("objects", "logs", "refs", "rr-cache")
_GIT_BOOKKEEPING_FILES = ("index", "HEAD", "ORIG_HEAD", "FETCH_HEAD", "packed-refs", "AUTO_MERGE", "MERGE_MSG")


@dataclass
class ApplyOutcome:
    applied: bool
    method: str | None  # one of APPLY_METHODS, or None when nothing applied
    log: str
    info: PatchInfo | None = None
    changes: list[treefs.Change] = field(default_factory=list)  # what applying changed, read from the tree
    # Symlinks at pytest configuration names in the tree after applying (pytest reads through them).
    config_links: list[str] = field(default_factory=list)

    @property
    def changed_paths(self) -> list[str]:
        """Every path applying added, modified or deleted (directories included when their type changed)."""
        return [c.path for c in self.changes if c.kind != "dir" or c.change != "added"]


@dataclass
class RestoreOutcome:
    tampered: bool
    touched: list[str] = field(default_factory=list)  # protected paths the model patch touched
    log: str = ""


class TestPatchFailed(RuntimeError):
    """The task's own test_patch does not apply on top of the restored tree."""

    __test__ = False  # not a pytest test class


def _git(tree: Path, *args: str, max_file_bytes: int | None = None) -> tuple[int, str]:
    res = gitsafe.run(*args, git_dir=tree / ".git", work_tree=tree, max_file_bytes=max_file_bytes)
    return res.rc, res.text()


def _reset(tree: Path, base_commit: str, paths: Iterable[str] = ()) -> str:
    rc, out = _git(tree, "reset", "--hard", "--quiet", base_commit)
    if rc != 0:
        raise RuntimeError(f"cannot reset {tree} to {base_commit}: {out}")
    # -fd keeps ignored build outputs of the prepared copy; the patch's own paths and reject/backup files
    # are cleaned even when ignored, so the next try does not trip over them.
    _git(tree, "clean", "-ffdq")
    extra = [f":(literal){p}" for p in paths if p] + [":(glob)**/*.rej", ":(glob)**/*.orig"]
    _git(tree, "clean", "-ffdxq", "--", *extra)
    return out


def _git_state(tree: Path) -> dict[str, tuple[int, int]]:
    git_dir = tree / ".git"
    state: dict[str, tuple[int, int]] = {}
    if not git_dir.is_dir():
        return state
    for root, dirs, files in os.walk(git_dir):
        rel_root = os.path.relpath(root, git_dir)
        if rel_root == ".":
            dirs[:] = [d for d in dirs if d not in _GIT_BOOKKEEPING]
            files = [f for f in files if f not in _GIT_BOOKKEEPING_FILES and not f.endswith(".lock")]
        for name in files:
            st = os.lstat(os.path.join(root, name))
            state[os.path.join(rel_root, name)] = (st.st_size, st.st_mtime_ns)
    return state


def audit_tree(tree: Path, git_before: dict[str, tuple[int, int]] | None = None) -> list[str]:
    """Problems in `tree` after applying: escaping symlinks, symlinks into .git, nested .git, .git changes."""
    problems: list[str] = []
    root_real = os.path.realpath(tree)
    git_real = os.path.join(root_real, ".git")
    for root, dirs, files in os.walk(tree):
        if Path(root) == Path(tree):
            # the top-level .git may be a directory or, for a worktree copy, a "gitdir:" file
            dirs[:] = [d for d in dirs if d != ".git"]
            files = [f for f in files if f != ".git"]
        for name in dirs + files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, tree)
            if name.lower() == ".git":
                problems.append(f"{rel}: a nested .git entry appeared")
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not (target == root_real or target.startswith(root_real + "/")):
                    problems.append(f"{rel}: symlink resolves outside the tree (to {target})")
                elif target == git_real or target.startswith(git_real + "/"):
                    problems.append(f"{rel}: symlink points into .git")
    if git_before is not None:
        after = _git_state(tree)
        for path in sorted(set(after) | set(git_before)):
            if after.get(path) != git_before.get(path):
                problems.append(f".git/{path}: changed while applying the patch")
    return problems


def _try(tree: Path, method: str, patch_file: str, max_file_bytes: int) -> tuple[int, str]:
    if method == "patch --fuzz":
        argv = ["patch", "--batch", "--forward", "--fuzz=5", "-p1", "--no-backup-if-mismatch", "-i", patch_file]
        if gitsafe.PRLIMIT:  # the same cap on any file the applier writes
            argv = [gitsafe.PRLIMIT, f"--fsize={max_file_bytes}", "--", *argv]
        proc = subprocess.run(argv, cwd=tree, capture_output=True, env={**os.environ, "LC_ALL": "C"})
        out = (proc.stdout + proc.stderr).decode("utf-8", "replace")
        return proc.returncode, out.strip()
    flags = {"git apply": [], "git apply --3way": ["--3way"], "git apply --reject": ["--reject"]}[method]
    return _git(tree, "apply", "--verbose", *flags, patch_file, max_file_bytes=max_file_bytes)


def _size(entry: treefs.Entry | None) -> int:
    return entry.size if entry is not None and entry.kind == "file" else 0


def _file_cap(tree: Path, info: PatchInfo, before: dict[str, treefs.Entry], max_expand: int) -> int:
    """The most any one file written while applying may hold: a patched file (its base size plus the patch),
    an inflated binary, or git's index (`--3way` rewrites it)."""
    base = max([_size(before.get(p)) for p in info.paths] + [0])
    try:
        index = os.lstat(tree / ".git" / "index").st_size
    except OSError:
        index = 0
    return max_expand + info.size_bytes + max(base, index) + (1 << 20)


def _unexpected(changes: list[treefs.Change], info: PatchInfo, before: dict[str, treefs.Entry],
                max_expand: int) -> list[str]:
    """What a successful try did that the validated patch does not account for."""
    allowed = set(info.paths)
    stray = [c.path for c in changes if c.path not in allowed and not (c.kind == "dir" and c.change == "added")]
    problems = []
    if stray:
        shown = ", ".join(stray[:5]) + (f" (+{len(stray) - 5} more)" if len(stray) > 5 else "")
        problems.append(f"applying changed {shown}, which the patch's unified diff does not name")
    written = sum(c.size for c in changes if c.kind == "file")
    limit = max_expand + info.size_bytes + sum(_size(before.get(c.path)) for c in changes)
    if written > limit:
        problems.append(f"applying wrote {written / 2**20:.1f} MiB, more than the patch can account for "
                        f"({limit / 2**20:.1f} MiB)")
    return problems


def _write_temp(data: bytes) -> str:
    fd, path = tempfile.mkstemp(prefix="gagar-patch-", suffix=".diff")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def _require_repo(tree: Path) -> None:
    if not (tree / ".git").exists():
        raise ValueError(f"{tree} is not a git work tree (no .git); the sandbox applies patches to a git copy")


def apply_patch(
    tree: Path, patch: bytes | str, *, base_commit: str, max_bytes: int = DEFAULT_MAX_BYTES,
    max_expand_bytes: int = DEFAULT_MAX_EXPAND, fresh: bool = False
) -> ApplyOutcome:
    """Apply `patch` to the git work tree `tree` (reset to `base_commit` first, unless `fresh`: a copy just
    made of a clean checkout of `base_commit`, where the reset's three git calls change nothing); see the
    module docstring. `max_expand_bytes` caps what the patch's git binary hunks may inflate to.

    Raises `PatchRejected`/`EmptyPatch` (validation or the post-apply audit); returns
    `ApplyOutcome(applied=False, method=None, log=...)` when no method of the chain applies it, with the tree
    reset to `base_commit`.
    """
    tree = Path(tree)
    _require_repo(tree)
    if not fresh:
        _reset(tree, base_commit)
    info = validate_patch(patch, tree, max_bytes=max_bytes, max_expand_bytes=max_expand_bytes)
    git_before = _git_state(tree)
    patch_file = _write_temp(info.data)
    log: list[str] = []
    try:
        for i, method in enumerate(APPLY_METHODS):
            if method == "patch --fuzz" and info.has_binary:
                log.append(f"$ {method}: skipped (GNU patch cannot apply git binary patches)")
                continue
            if i:
                _reset(tree, base_commit, info.paths)
            before = treefs.snapshot(tree)
            rc, out = _try(tree, method, patch_file, _file_cap(tree, info, before, max_expand_bytes))
            log.append(f"$ {method} (exit {rc})\n{out}")
            if rc != 0:
                continue
            after = treefs.snapshot(tree)
            changes = treefs.changes(before, after)
            problems = _unexpected(changes, info, before, max_expand_bytes) + audit_tree(tree, git_before)
            if problems:
                _reset(tree, base_commit, info.paths)
                raise PatchRejected("applying the patch produced unsafe results: " + "; ".join(problems))
            links = [p for p, e in after.items() if e.kind == "link" and pytestcfg.is_config_name(p)]
            return ApplyOutcome(True, method, "\n".join(log), info, changes, links)
        _reset(tree, base_commit, info.paths)
        return ApplyOutcome(False, None, "\n".join(log), info)
    finally:
        os.unlink(patch_file)


def _in_commit(tree: Path, commit: str, path: str) -> str | None:
    """The object type of `path` at `commit` ("blob", "tree", ...), or None when absent."""
    rc, out = _git(tree, "cat-file", "-t", f"{commit}:{path}")
    return out.strip() if rc == 0 else None


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _restore_path(tree: Path, base_commit: str, rel: str) -> str:
    # A model may have turned a parent directory into a symlink or a file; undo that first so that the
    # restore cannot be redirected.
    cur = tree
    for part in rel.split("/")[:-1]:
        cur = cur / part
        if cur.is_symlink() or (os.path.lexists(cur) and not cur.is_dir()):
            _remove(cur)
    target = tree / rel
    kind = _in_commit(tree, base_commit, rel)
    if kind is None:
        if os.path.lexists(target):
            _remove(target)
            return f"removed {rel} (absent at base)"
        return f"{rel}: absent at base and in the tree"
    if os.path.lexists(target) and (target.is_symlink() or kind != "tree" and target.is_dir()):
        _remove(target)
    rc, out = _git(tree, "checkout", base_commit, "--", rel)
    if rc != 0:
        raise TestPatchFailed(f"cannot restore {rel} from {base_commit}: {out}")
    return f"restored {rel} from base"


def _touches_pytest_config(tree: Path, base_commit: str, rel: str, config_links: Iterable[str]) -> bool:
    """Whether a change at `rel` changes what pytest reads as configuration (`sandbox.integrity.pytestcfg`)."""
    name = rel.rsplit("/", 1)[-1]
    path = tree / rel
    if name in pytestcfg.ALWAYS or (name in pytestcfg.SECTIONED and os.path.islink(path)):
        return True
    # A configuration-named symlink (one the base already had) is read through: its target is configuration.
    real = os.path.realpath(path)
    if any(os.path.realpath(tree / link) == real for link in config_links):
        return True
    if name not in pytestcfg.SECTIONED:
        return False
    res = gitsafe.run("cat-file", "blob", f"{base_commit}:{rel}", git_dir=tree / ".git", binary=True)
    before = res.out if res.ok and len(res.out) <= pytestcfg.MAX_CONFIG_BYTES else None
    after = treefs.read_capped(path, pytestcfg.MAX_CONFIG_BYTES)
    if (after is None and os.path.lexists(path)) or (before is None and res.ok):
        return True  # too big (or not a file) to read: any change counts
    return pytestcfg.pytest_view(name, before) != pytestcfg.pytest_view(name, after)  # type: ignore[arg-type]


def restore_task_tests(
    tree: Path,
    *,
    base_commit: str,
    test_patch: bytes | str,
    model_patch_info: PatchInfo | None,
    extra_protected: Iterable[str] = (),
    changed: Iterable[str] | None = None,
    config_links: Iterable[str] = (),
) -> RestoreOutcome:
    """Reset the task's test files in `tree` and apply `test_patch` on top of the model's changes.

    Tampering is flagged and reverted; the verdict is then computed on the task's own tests. Protected paths:
    every path `test_patch` touches, `extra_protected` (e.g. test files named by the task's test ids), and every
    file pytest reads as configuration that the model patch changed (see the module docstring; a
    `pyproject.toml` / `setup.cfg` is reverted whole). `changed` is what applying really changed
    (`ApplyOutcome.changed_paths`; without it, the paths the patch names), `config_links` the configuration-named
    symlinks in the tree (`ApplyOutcome.config_links`). `tampered` is True when the model patch touched a
    protected path; `touched` lists those paths. Raises `TestPatchFailed` when `test_patch` does not apply.
    """
    tree = Path(tree)
    _require_repo(tree)
    test_data = _to_bytes(test_patch or b"")
    test_paths: list[str] = []
    if test_data.strip():
        # Only the names matter here: checked against an empty directory because the model may have planted
        # symlinks on the way to test files, which _restore_path removes instead of refusing.
        with tempfile.TemporaryDirectory(prefix="gagar-names-") as empty:
            test_paths = validate_patch(test_data, Path(empty), max_bytes=max(len(test_data), 1),
                                        max_expand_bytes=1 << 62).paths  # the task's own: trusted
    protected = set(test_paths) | set(extra_protected)
    if changed is None:
        changed = model_patch_info.paths if model_patch_info else []
    links = list(config_links)
    touched = sorted(p for p in set(changed)
                     if p in protected or _touches_pytest_config(tree, base_commit, p, links))
    log: list[str] = []
    for rel in sorted(protected | set(touched)):
        log.append(_restore_path(tree, base_commit, rel))
    if test_data.strip():
        patch_file = _write_temp(test_data)
        try:
            rc, out = _git(tree, "apply", "--verbose", patch_file)
            log.append(f"$ git apply test_patch (exit {rc})\n{out}")
            if rc != 0:
                raise TestPatchFailed(f"the task's test_patch does not apply after restoring its files:\n{out}")
        finally:
            os.unlink(patch_file)
    if touched:
        log.insert(0, "model patch touched protected test files (reverted): " + ", ".join(touched))
    return RestoreOutcome(tampered=bool(touched), touched=touched, log="\n".join(log))
