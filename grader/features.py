"""Diff features of each candidate, alone and relative to its group, each pinned to a file:line to cite.

Everything here reads the *structure* of a patch (which files, which lines, what kind of line), never its
prose, so text inside a diff that addresses the grader cannot buy a better score.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from grader.records import Group

# kind -> short wording used in evidence strings
KINDS = {
    "test_edit": "edits a test file",
    "out_of_scope": "changes a file outside the problem's evident scope",
    "unique_file": "changes a file no other passing candidate touches",
    "whitespace_only": "whitespace/formatting-only hunk",
    "debug_output": "adds debug output",
    "commented_code": "adds commented-out code",
    "todo": "adds a TODO/FIXME note",
    "unused_function": "adds a function that is never referenced",
    "duplicate_line": "adds a line duplicated elsewhere in the patch",
}

_DEBUG = {
    "py": re.compile(r"^\s*(print\s*\(|pprint\s*\(|breakpoint\s*\(|import\s+pdb|pdb\.set_trace)"),
    "js": re.compile(r"\bconsole\.(log|debug|trace|dir)\s*\(|^\s*debugger\s*;?"),
    "go": re.compile(r"\bfmt\.Print(ln|f)?\s*\(|\bprintln\s*\("),
    "java": re.compile(r"\bSystem\.(out|err)\.print(ln|f)?\s*\(|\.printStackTrace\s*\(\s*\)"),
}
_LANG = {".py": "py", ".js": "js", ".ts": "js", ".jsx": "js", ".tsx": "js", ".go": "go", ".java": "java",
         ".kt": "java", ".scala": "java"}
_COMMENT = {"py": "#", "js": "//", "go": "//", "java": "//"}
_CODE_LIKE = re.compile(
    r"^(return\b|if\b.*[:{(]|for\b.*[:{(]|while\b|def\s+\w+\(|class\s+\w+|import\s+\w|from\s+\S+\s+import\b|"
    r"func\s|[\w.\[\]]+\s*(=|\+=|-=|:=)\s*\S|[\w.]+\(.*\)\s*[;:]?$|[{}]\s*$|else\b|elif\b|try\b|except\b)"
)
_TODO = re.compile(r"\b(TODO|FIXME|XXX|HACK)\b")
_DEFS = {
    "py": re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\("),
    "js": re.compile(r"^\s*(?:export\s+)?(?:async\s+)?function\s+([A-Za-z_$][\w$]*)\s*\("),
    "go": re.compile(r"^\s*func\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)\s*[(\[]"),
    "java": re.compile(
        r"^\s*(?:(?:public|private|protected|static|final|synchronized|abstract)\s+)+[\w<>\[\],\s]+?\s+"
        r"([a-z_]\w*)\s*\([^;]*$"
    ),
}
_ENTRY_POINTS = {"main", "init", "setUp", "tearDown", "toString", "equals", "hashCode", "run", "call"}
_TEST_PATH = re.compile(
    r"(^|/)(tests?|testing|__tests__|spec)/|(^|/)test_[^/]*\.py$|_test\.(py|go)$|(^|/)conftest\.py$|"
    r"Tests?\.java$|(^|/)src/test/|\.(test|spec)\.[jt]sx?$"
)
_STOP = {"the", "and", "for", "with", "that", "this", "from", "into", "when", "should", "return", "returns"}


@dataclass
class Finding:
    kind: str
    file: str
    line: int
    detail: str = ""

    def cite(self) -> str:
        text = KINDS.get(self.kind, self.kind)
        return f"{self.file}:{self.line}: {text}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class FileChange:
    path: str
    added: list[tuple[int, str]] = field(default_factory=list)  # (target line, text)
    removed: list[tuple[int, str]] = field(default_factory=list)  # (source line, text)
    hunks: int = 0
    # change blocks: runs of -/+ lines between context lines, as (target line, removed, added)
    blocks: list[tuple[int, list[str], list[str]]] = field(default_factory=list)
    first_line: int = 1


@dataclass
class CandidateFeatures:
    rollout_id: str
    files: list[str] = field(default_factory=list)
    hunks: int = 0
    added: int = 0
    removed: int = 0
    findings: list[Finding] = field(default_factory=list)
    parse_error: str | None = None
    first_lines: dict[str, int] = field(default_factory=dict)  # path -> first changed line, for citations

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)


def patch_file_path(pf: Any) -> str:  # noqa: ANN401 - a unidiff PatchedFile
    """A unidiff file's repository path, without git's `a/`/`b/` prefix."""
    return pf.path[2:] if pf.path.startswith(("a/", "b/")) else pf.path


def is_test_path(path: str) -> bool:
    return bool(_TEST_PATH.search(path))


def added_lines(patch: str) -> dict[str, set[int]]:
    """{path: line numbers in the patched file} of the lines `patch` adds; {} for a patch that does not parse."""
    try:
        changes = parse_patch(patch)
    except (UnidiffParseError, ValueError):
        return {}
    return {fc.path: {n for n, _ in fc.added if n} for fc in changes}


def parse_patch(patch: str) -> list[FileChange]:
    """Files of a unified diff with the added/removed lines and their line numbers (unidiff)."""
    changes = []
    for pf in PatchSet(patch):
        fc = FileChange(patch_file_path(pf))
        for h in pf:
            fc.hunks += 1
            block: tuple[int, list[str], list[str]] | None = None
            next_target = h.target_start
            for ln in h:
                text = ln.value.rstrip("\n")
                if ln.is_context:
                    block = None
                    next_target = (ln.target_line_no or next_target) + 1
                    continue
                if block is None:
                    block = (max(1, next_target), [], [])
                    fc.blocks.append(block)
                if ln.is_added:
                    fc.added.append((ln.target_line_no, text))
                    block[2].append(text)
                    next_target = ln.target_line_no + 1
                elif ln.is_removed:
                    fc.removed.append((ln.source_line_no, text))
                    block[1].append(text)
        # Cite the first added line with content (a blank line is a poor citation), else the first change.
        content = [n for n, t in fc.added if t.strip()]
        if content or fc.added:
            fc.first_line = (content or [fc.added[0][0]])[0]
        elif fc.blocks:
            fc.first_line = fc.blocks[0][0]
        changes.append(fc)
    return changes


def _squash(lines: list[str]) -> list[str]:
    return [s for s in ("".join(line.split()) for line in lines) if s]


def _commented_code(lang: str, text: str) -> bool:
    marker = _COMMENT.get(lang)
    s = text.strip()
    if not marker or not s.startswith(marker):
        return False
    body = s[len(marker):].strip()
    if not body or _TODO.search(body) or body.startswith(("!", "-*-", "type:", "noqa", "pylint", "nolint")):
        return False
    return bool(_CODE_LIKE.match(body))


def _references(name: str, tree: Path | None, changes: list[FileChange], def_file: str, def_line: int) -> int:
    """Occurrences of `name` besides its definition, in the candidate's tree when given, else in the patch."""
    rx = re.compile(rf"\b{re.escape(name)}\b")
    hits = 0
    if tree is None:
        for fc in changes:
            for n, text in fc.added:
                if rx.search(text) and not (fc.path == def_file and n == def_line):
                    hits += 1
        return hits
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for fname in filenames:
            full = os.path.join(dirpath, fname)
            if os.path.islink(full) or os.path.splitext(fname)[1] not in _LANG:
                continue
            rel = os.path.relpath(full, tree)
            try:
                with open(full, encoding="utf-8", errors="replace") as f:
                    for n, text in enumerate(f, 1):
                        if rx.search(text) and not (rel == def_file and n == def_line):
                            hits += 1
            except OSError:
                continue
    return hits


def candidate_features(rollout_id: str, patch: str, tree: Path | None = None) -> CandidateFeatures:
    """Features of one patch on its own; `tree` (the patched worktree) lets references be searched for."""
    cf = CandidateFeatures(rollout_id)
    try:
        changes = parse_patch(patch)
    except (UnidiffParseError, ValueError) as exc:
        cf.parse_error = f"the patch could not be parsed as a unified diff: {exc}"
        return cf
    # Copy-paste inside one file; short lines (`return x`, braces) repeat legitimately.
    dups = {
        fc.path: Counter(t.strip() for _, t in fc.added if len(t.strip()) >= 16 and re.search(r"\w", t))
        for fc in changes
    }
    dup_reported: set[tuple[str, str]] = set()
    for fc in changes:
        cf.files.append(fc.path)
        cf.first_lines[fc.path] = fc.first_line
        cf.hunks += fc.hunks
        cf.added += len(fc.added)
        cf.removed += len(fc.removed)
        lang = _LANG.get(os.path.splitext(fc.path)[1], "")
        # A def line that was only edited (renamed args, reformatted) is not a new function.
        old_defs = {m.group(1) for _, t in fc.removed if lang in _DEFS and (m := _DEFS[lang].match(t))}
        if is_test_path(fc.path):
            cf.findings.append(Finding("test_edit", fc.path, fc.first_line))
        for start, minus, plus in fc.blocks:
            # A block of blank lines only (a blank line dropped or added beside an edit) is layout that follows
            # the edit, not a reformatting of untouched code; it still costs its lines.
            if not any(t.strip() for t in minus + plus):
                continue
            if _squash(minus) == _squash(plus):
                cf.findings.append(Finding("whitespace_only", fc.path, max(1, start)))
        for n, text in fc.added:
            if lang in _DEBUG and _DEBUG[lang].search(text) and not _commented_code(lang, text):
                cf.findings.append(Finding("debug_output", fc.path, n, text.strip()[:60]))
            if _commented_code(lang, text):
                cf.findings.append(Finding("commented_code", fc.path, n, text.strip()[:60]))
            if _TODO.search(text):
                cf.findings.append(Finding("todo", fc.path, n, text.strip()[:60]))
            key = text.strip()
            if dups[fc.path].get(key, 0) > 1 and (fc.path, key) not in dup_reported:
                dup_reported.add((fc.path, key))
                cf.findings.append(Finding("duplicate_line", fc.path, n, f"{dups[fc.path][key]}x: {key[:50]}"))
            m = _DEFS[lang].match(text) if lang in _DEFS else None
            if m:
                name = m.group(1)
                if name in old_defs or name in _ENTRY_POINTS or name.startswith(
                    ("test", "Test", "__", "Benchmark", "Example")
                ):
                    continue
                if _references(name, tree, changes, fc.path, n) == 0:
                    cf.findings.append(Finding("unused_function", fc.path, n, name))
    return cf


def _scope_tokens(problem: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{2,}", problem) if w.lower() not in _STOP}


def _in_scope(path: str, tokens: set[str], problem: str) -> bool:
    if path in problem or os.path.basename(path) in problem:
        return True
    stem = os.path.splitext(os.path.basename(path))[0].lower()
    parts = {p.lower() for p in re.split(r"[/_.\-]", os.path.splitext(path)[0]) if len(p) > 2}
    return stem in tokens or bool(parts & tokens - {"src", "lib", "main", "pkg", "internal"})


def group_features(group: Group, trees: dict[str, Path] | None = None) -> dict[str, CandidateFeatures]:
    """Features of every candidate, plus the group-relative ones: unique files and out-of-scope files.

    A file is in the problem's evident scope when the problem statement names it (path, file name or stem),
    or when at least half of the passing candidates touch it: agreement among independent fixes is the best
    scope signal a grader has without knowing the answer.
    """
    trees = trees or {}
    feats = {c.rollout_id: candidate_features(c.rollout_id, c.patch, trees.get(c.rollout_id)) for c in group.candidates}
    usable = [f for f in feats.values() if f.parse_error is None]
    touched = Counter(p for f in usable for p in set(f.files))
    tokens = _scope_tokens(group.problem_statement)
    n = len(usable)
    for f in usable:
        first = _first_lines(group.candidate(f.rollout_id).patch)
        for path in f.files:
            line = first.get(path, 1)
            if n > 1 and touched[path] == 1:
                f.findings.append(Finding("unique_file", path, line))
            consensus = touched[path] >= 2 and touched[path] * 2 >= n
            if not consensus and not is_test_path(path) and not _in_scope(path, tokens, group.problem_statement):
                f.findings.append(Finding("out_of_scope", path, line))
    return feats


def _first_lines(patch: str) -> dict[str, int]:
    try:
        return {fc.path: fc.first_line for fc in parse_patch(patch)}
    except (UnidiffParseError, ValueError):
        return {}


def apply_file_patch(text: str | None, pf) -> str:  # noqa: ANN001 - unidiff PatchedFile
    """The new text of one file of a unified diff, given its old text (None for a new file)."""
    old = (text or "").splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for hunk in pf:
        start = max(hunk.source_start - 1, 0)
        out += old[pos:start]
        pos = start
        for line in hunk:
            if line.is_context or line.is_removed:
                pos += 1
            if line.is_context or line.is_added:
                out.append(line.value)
    out += old[pos:]
    return "".join(out)
