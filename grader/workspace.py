"""The shared workspace: one clone at `base_commit` and one git worktree per passing candidate.

The judge sees every candidate side by side under neutral letters (A, B, C, ...) whose order is shuffled per
workspace (seeded), so neither the rollout ids nor the input order can leak a preference. Patches are
untrusted: each is validated, then applied with the sandbox's own chain (`sandbox.apply.apply_patch`: git apply,
--3way, --reject, patch --fuzz), so a patch that passed in the sandbox is always staged; a candidate whose patch
is refused or does not apply is reported in `failed` instead of aborting the group.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from grader.records import Candidate, Group, InputError
from sandbox.apply import apply_patch
from sandbox.integrity import gitsafe
from sandbox.patchcheck import EmptyPatch, PatchRejected

MAX_PATCH_BYTES = 1 << 20
_PATH_LINE = re.compile(r"^(?:diff --git (\S+) (\S+)|--- (\S+)|\+\+\+ (\S+)|(?:rename|copy) (?:from|to) (.+))$")


class PatchRefused(ValueError):
    """A patch that must not be applied (paths escaping the tree, into .git, over the size cap)."""


def letter(i: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA: neutral labels that carry no order information beyond the shuffle."""
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def _check_path(raw: str) -> None:
    path = raw.strip().strip('"')
    if path == "/dev/null":
        return
    if "\0" in path:
        raise PatchRefused(f"path {raw!r} contains a NUL byte")
    if path.startswith("/"):
        raise PatchRefused(f"absolute path {path!r} in the patch")
    parts = [p for p in path.split("/") if p]
    if parts and parts[0] in ("a", "b") and len(parts) > 1:
        parts = parts[1:]
    if ".." in parts:
        raise PatchRefused(f"path {path!r} climbs out of the repository")
    if any(p == ".git" for p in parts):
        raise PatchRefused(f"path {path!r} writes into .git")


def check_patch(patch: str, repo_root: Path, max_bytes: int = MAX_PATCH_BYTES) -> None:
    """Refuse a dangerous patch before anything touches disk.

    Uses the sandbox's validator when it is installed (one policy for evaluation and grading); the local
    checks below are the minimum guard either way.
    """
    if len(patch.encode("utf-8", "surrogateescape")) > max_bytes:
        raise PatchRefused(f"patch is larger than {max_bytes} bytes")
    for line in patch.splitlines():
        m = _PATH_LINE.match(line)
        if m:
            for g in m.groups():
                if g:
                    _check_path(g)
    try:
        from sandbox.patchcheck import PatchError, validate_patch
    except ImportError:
        return
    try:
        validate_patch(patch, repo_root, max_bytes=max_bytes)
    except PatchError as exc:
        raise PatchRefused(str(exc)) from exc


class SharedWorkspace:
    """Context manager holding a group's base clone and candidate worktrees in a temporary directory."""

    def __init__(
        self,
        group: Group,
        repos_dir: str | Path,
        *,
        seed: int = 0,
        work_root: str | Path | None = None,
        max_patch_bytes: int = MAX_PATCH_BYTES,
    ) -> None:
        self.group = group
        self.repos_dir = Path(repos_dir)
        self.seed = seed
        self.max_patch_bytes = max_patch_bytes
        self._work_root = Path(work_root) if work_root else None
        self.root: Path | None = None
        self.base_dir: Path | None = None
        self.labels: list[str] = []
        self.label_to_rollout: dict[str, str] = {}
        self.rollout_to_label: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.apply_methods: dict[str, str] = {}  # rollout id -> the method of the sandbox's chain that applied it
        self._dirs: dict[str, Path] = {}

    # -- lifecycle -----------------------------------------------------------------------------------------
    def __enter__(self) -> SharedWorkspace:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open(self) -> None:
        src = self.repos_dir / self.group.repo_dirname
        if not (src / ".git").exists() and not (src / "HEAD").exists():
            raise InputError(
                f"{self.group.instance_id}: no git repository at {src} (expected <repos-dir>/owner__name)"
            )
        if self._work_root:
            self._work_root.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="gagar-ws-", dir=self._work_root))
        try:
            self._build(src)
        except BaseException:
            self.close()
            raise

    def _build(self, src: Path) -> None:
        assert self.root is not None
        self.base_dir = self.root / "base"
        # base_commit only (no later history the judge could read), through the hardened git helper.
        try:
            gitsafe.export_commit(src, self.group.base_commit, self.base_dir)
        except gitsafe.GitError as exc:
            raise InputError(
                f"{self.group.instance_id}: base_commit {self.group.base_commit} is not in {src} ({exc})"
            ) from exc
        for i, cand in enumerate(self.group.candidates):
            reason = self._stage(cand, i)
            if reason:
                self.failed[cand.rollout_id] = reason
        self.relabel(self.seed)

    def relabel(self, seed: int) -> None:
        """Give the staged candidates fresh letters in a seeded shuffle (one per judge permutation)."""
        self.seed = seed
        order = [c.rollout_id for c in self.group.candidates if c.rollout_id in self._dirs]
        random.Random(f"{self.group.instance_id}:{seed}").shuffle(order)
        self.labels = [letter(i) for i in range(len(order))]
        self.label_to_rollout = dict(zip(self.labels, order, strict=True))
        self.rollout_to_label = {r: lab for lab, r in self.label_to_rollout.items()}

    def _stage(self, cand: Candidate, index: int) -> str | None:
        """Create the candidate's worktree and apply its patch; return why it failed, or None."""
        assert self.root is not None and self.base_dir is not None
        if not cand.patch.strip():
            return "empty patch"
        try:
            check_patch(cand.patch, self.base_dir, self.max_patch_bytes)
        except PatchRefused as exc:
            return f"patch refused: {exc}"
        # Directory names are positional, not rollout ids: paths must not reveal which candidate is which.
        wt = self.root / "cands" / f"c{index}"
        base_git = self.base_dir / ".git"
        gitsafe.git("worktree", "add", "--detach", "--quiet", str(wt), self.group.base_commit, git_dir=base_git)
        # The sandbox's own chain (git apply → --3way → --reject → patch --fuzz), so every patch the sandbox
        # applied — every passing one — is staged here too, and reaches the hack check and the judge. The
        # worktree is the grader's own (nothing but a validated patch wrote to it): git may run in it.
        text = cand.patch if cand.patch.endswith("\n") else cand.patch + "\n"
        try:
            outcome = apply_patch(wt, text, base_commit=self.group.base_commit, max_bytes=self.max_patch_bytes,
                                  fresh=True)
        except (PatchRejected, EmptyPatch) as exc:
            outcome, refused = None, f"patch refused: {exc}"
        if outcome is not None and outcome.applied:
            self._dirs[cand.rollout_id] = wt
            self.apply_methods[cand.rollout_id] = str(outcome.method)
            return None
        shutil.rmtree(wt, ignore_errors=True)
        gitsafe.run("worktree", "prune", git_dir=base_git)
        if outcome is None:
            return refused
        tried = [ln for ln in outcome.log.splitlines() if ln.startswith("$ ")]
        first = next((ln for ln in outcome.log.splitlines() if ln and not ln.startswith("$ ")), "no method applied")
        return (f"patch does not apply to {self.group.base_commit[:12]} (tried {len(tried)} methods: "
                f"{', '.join(t[2:].split(' (')[0] for t in tried)}): {first}")

    def close(self) -> None:
        if self.root is not None and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    # -- lookups -------------------------------------------------------------------------------------------
    def rollout_of(self, label: str) -> str:
        return self.label_to_rollout[label]

    def label_of(self, rollout_id: str) -> str:
        return self.rollout_to_label[rollout_id]

    def candidate(self, label: str) -> Candidate:
        return self.group.candidate(self.rollout_of(label))

    def worktree(self, label: str) -> Path:
        """The tree of a candidate (by letter) or of the unpatched base (`base`)."""
        if label.lower() == "base":
            if self.base_dir is None:
                raise KeyError("base")
            return self.base_dir
        return self._dirs[self.label_to_rollout[label.upper()]]

    def resolve(self, label: str, rel_path: str) -> Path:
        """A path inside a tree, refusing anything that leaves it (absolute, `..`, symlinks out, `.git`)."""
        root = self.worktree(label).resolve()
        rel = rel_path.strip()
        while rel.startswith("./"):
            rel = rel[2:]
        if not rel or os.path.isabs(rel):
            raise ValueError(f"path must be relative to the repository root, got {rel_path!r}")
        target = (root / rel).resolve()
        if target != root and root not in target.parents:
            raise ValueError(f"path {rel_path!r} is outside the repository")
        if ".git" in target.relative_to(root).parts:
            raise ValueError("the .git directory is not readable")
        return target
