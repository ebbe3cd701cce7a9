"""Candidates of known quality: the gold patch, then the gold patch degraded by 1, 2, 3 ... defects.

Public data has no ranked sets of passing patches for one issue, so they are made: each variant adds one more
defect to the previous one (debug output, dead helper, commented-out code, an unrelated edit in another file,
reformatting of untouched code, duplicated logic, a broad try/except, a rename outside the fix), so variant k
is strictly worse than variant k-1 by construction and the order gold > v1 > v2 > ... is known. Every edit
keeps behaviour; `gagar sft data --verify` re-checks that in the sandbox.
"""

from __future__ import annotations

import ast
import difflib
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from grader.features import patch_file_path
from sandbox.integrity import gitsafe
from sft import degrade_curly, degrade_py
from sft.degrade_common import Edit, FileCtx, code_mask

KINDS = (
    "debug_output",
    "dead_helper",
    "commented_out_code",
    "unrelated_edit",
    "reformat",
    "duplicated_logic",
    "broad_except",
    "rename_outside_fix",
)
EXTENSIONS = {"python": (".py",), "go": (".go",), "java": (".java",)}
_FRAMEWORK_LANG = {"pytest": "python", "unittest": "python", "go": "go", "junit": "java"}
# Defects that sit outside the lines the fix touches look at untouched code; the others sit next to the fix.
_OUTSIDE = {"unrelated_edit", "reformat", "rename_outside_fix"}
_TEST_PATH = re.compile(r"(^|/)(tests?|testing|src/test)/|(^|/)test_[^/]*\.py$|_test\.(py|go)$|Test\.java$")


class DegradeError(ValueError):
    """The instance cannot be degraded (no repo, gold patch does not apply, unsupported language)."""


@dataclass
class Applied:
    kind: str
    path: str
    marker: str
    description: str


@dataclass
class Variant:
    rollout_id: str
    patch: str
    applied: list[Applied] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)


def language_of(instance: dict[str, Any]) -> str:
    lang = instance.get("language") or _FRAMEWORK_LANG.get(str(instance.get("test_framework") or ""))
    if not lang:
        exts = {Path(pf).suffix for pf in _patch_paths(instance.get("patch") or "")}
        lang = next((k for k, v in EXTENSIONS.items() if exts & set(v)), None)
    if lang not in EXTENSIONS:
        raise DegradeError(f"{instance.get('instance_id')}: unsupported language {lang!r} (python, go, java)")
    return str(lang)


def _patch_paths(patch: str) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", patch, flags=re.M)


def _gold_lines(patch: str) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    added: dict[str, set[str]] = {}
    removed: dict[str, list[str]] = {}
    try:
        files = PatchSet(patch)
    except (UnidiffParseError, ValueError) as exc:
        raise DegradeError(f"gold patch is not a unified diff: {exc}") from exc
    for pf in files:
        path = patch_file_path(pf)
        for hunk in pf:
            for line in hunk:
                text = line.value.rstrip("\n")
                if line.is_added and text.strip():
                    added.setdefault(path, set()).add(text)
                elif line.is_removed:
                    removed.setdefault(path, []).append(text)
    return added, removed


def _git(repo: Path, *args: str, input_text: str | None = None) -> str:
    """Hardened git (`sandbox.integrity.gitsafe`) in the scratch repo this module made and edits itself."""
    res = gitsafe.run(*args, git_dir=repo / ".git", work_tree=repo, input=input_text, timeout=120)
    if not res.ok:
        raise DegradeError(f"git {' '.join(args[:2])} failed: {res.err[:300]}")
    return str(res.out)


def _handlers(language: str) -> dict[str, Callable[[FileCtx], Edit | None]]:
    if language == "python":
        return {k: getattr(degrade_py, k) for k in KINDS}
    return {k: (lambda ctx, f=getattr(degrade_curly, k): f(ctx, language)) for k in KINDS}


class _Tree:
    """A scratch clone at base_commit with the gold patch applied, edited in place."""

    def __init__(self, root: Path, base_commit: str, language: str, gold: str) -> None:
        self.root, self.base, self.language, self.gold = root, base_commit, language, gold
        self.added, self.removed = _gold_lines(gold)
        self.gold_files = [p for p in _patch_paths(gold) if p.endswith(EXTENSIONS[language])]

    def reset(self, *, gold: bool = True) -> None:
        """Back to the base commit, with the gold patch applied unless `gold=False`."""
        _git(self.root, "checkout", "--quiet", self.base, "--", ".")
        _git(self.root, "clean", "-fdq")
        if gold:
            _git(self.root, "apply", "--whitespace=nowarn", "-",
                 input_text=self.gold if self.gold.endswith("\n") else self.gold + "\n")

    def source_files(self) -> list[str]:
        files = _git(self.root, "ls-files").splitlines()
        return sorted(f for f in files if f.endswith(EXTENSIONS[self.language]) and not _TEST_PATH.search(f))

    def read(self, path: str) -> list[str]:
        return (self.root / path).read_text(encoding="utf-8").splitlines(keepends=True)

    def base_lines(self, path: str) -> list[str]:
        try:
            return _git(self.root, "cat-file", "blob", f"{self.base}:{path}").splitlines(keepends=True)
        except DegradeError:
            return []  # a file the gold patch creates

    def ctx(self, path: str, rng: random.Random) -> FileCtx:
        cur = self.read(path)
        base = self.base_lines(path)
        untouched: set[int] = set()
        for block in difflib.SequenceMatcher(None, base, cur, autojunk=False).get_matching_blocks():
            untouched.update(range(block.b, block.b + block.size))
        added = self.added.get(path, set())
        anchors = [i for i, ln in enumerate(cur) if i not in untouched and ln.rstrip("\n") in added]
        return FileCtx(path, cur, anchors, untouched, rng, self.removed.get(path, []))

    def patch(self) -> str:
        _git(self.root, "add", "-A")
        return _git(self.root, "diff", "--cached", "--no-color", "--no-ext-diff", "--no-textconv", "--binary",
                    self.base)


def _try_kind(
    tree: _Tree, kind: str, handler: Callable[[FileCtx], Edit | None], rng: random.Random, used: set[str]
) -> Applied | None:
    gold = [f for f in tree.gold_files if not _TEST_PATH.search(f) and (tree.root / f).is_file()]
    others = [f for f in tree.source_files() if f not in tree.gold_files]
    rng.shuffle(others)
    if kind == "unrelated_edit":
        # One unrelated file per group: a second unrelated edit would not make a variant clearly worse.
        targets = [f for f in others if f not in used]
    elif kind in _OUTSIDE:
        targets = gold + others
    else:
        targets = gold
    for path in targets:
        try:
            ctx = tree.ctx(path, rng)
        except (OSError, UnicodeDecodeError):
            continue
        edit = handler(ctx)
        if edit is None or edit.lines == ctx.lines or not _still_parses(tree.language, ctx.lines, edit.lines):
            continue
        (tree.root / path).write_text("".join(edit.lines), encoding="utf-8")
        return Applied(kind, path, edit.marker.rstrip("\n"), edit.description)
    return None


def _still_parses(language: str, before: list[str], after: list[str]) -> bool:
    """A last syntax guard on every edit: Python must parse; Go/Java braces (outside strings) must balance."""
    text = "".join(after)
    if language == "python":
        try:
            ast.parse(text)
        except SyntaxError:
            return False
        return True
    mask = code_mask(text, language)
    code = [c for c, m in zip(text, mask, strict=True) if m and c in "{}()"]
    return code.count("{") == code.count("}") and code.count("(") == code.count(")")


def _evidence(tree: _Tree, applied: list[Applied]) -> list[str]:
    out = []
    for a in applied:
        lines = [ln.rstrip("\n") for ln in tree.read(a.path)]
        n = next((i + 1 for i, ln in enumerate(lines) if ln == a.marker), None)
        where = f"{a.path}:{n}" if n else a.path
        out.append(f"{where}: {a.description}")
    return out


@contextmanager
def scratch_tree(instance: dict[str, Any], repos_dir: str | Path, work_root: str | Path | None = None
                 ) -> Iterator[_Tree]:
    """A scratch copy of the instance's repository at `base_commit` with the gold patch applied (removed after)."""
    iid = str(instance.get("instance_id"))
    gold = instance.get("patch") or ""
    if not gold.strip():
        raise DegradeError(f"{iid}: no gold patch")
    language = language_of(instance)
    src = Path(repos_dir) / str(instance.get("repo", "")).replace("/", "__")
    if not (src / ".git").exists() and not (src / "HEAD").exists():
        raise DegradeError(f"{iid}: no git repository at {src} (expected <repos-dir>/owner__name)")
    tmp = Path(tempfile.mkdtemp(prefix="gagar-sft-", dir=work_root))
    try:
        root = tmp / "repo"
        try:
            gitsafe.export_commit(src, str(instance["base_commit"]), root)
        except gitsafe.GitError as exc:
            raise DegradeError(f"{iid}: {exc}") from exc
        tree = _Tree(root, str(instance["base_commit"]), language, gold)
        tree.reset()
        yield tree
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_variants(
    instance: dict[str, Any],
    repos_dir: str | Path,
    *,
    n_variants: int = 3,
    seed: int = 0,
    kinds: tuple[str, ...] | list[str] = KINDS,
    work_root: str | Path | None = None,
) -> list[Variant]:
    """The gold patch (rollout id `gold`) and up to `n_variants` cumulatively degraded copies (`d1`, `d2`, ...).

    Returned best first: that list order is the known quality order. Kinds that do not fit this instance's
    code (no function to rename in, no other file to touch) are skipped; fewer variants come back then.
    """
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise DegradeError(f"unknown degradation(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    with scratch_tree(instance, repos_dir, work_root) as tree:
        return degrade_on(tree, str(instance.get("instance_id")), n_variants=n_variants, seed=seed, kinds=kinds)


def degrade_on(tree: _Tree, iid: str, *, n_variants: int, seed: int, kinds: tuple[str, ...] | list[str] = KINDS
               ) -> list[Variant]:
    """`build_variants` on an open scratch tree (reset to the gold patch first, so one tree serves many seeds)."""
    tree.reset()
    rng = random.Random(f"{iid}:{seed}")
    handlers = _handlers(tree.language)
    variants = [Variant("gold", tree.gold)]
    applied: list[Applied] = []
    order = list(kinds)
    rng.shuffle(order)
    used: set[str] = set()
    for kind in order:
        if len(variants) > n_variants:
            break
        done = _try_kind(tree, kind, handlers[kind], rng, used)
        if done is None:
            continue
        used.add(done.path)
        applied.append(done)
        variants.append(Variant(f"d{len(applied)}", tree.patch(), list(applied), _evidence(tree, applied)))
    return variants
