"""The candidate view of the judge's prompt: what every candidate changes, with what they share shown once.

Candidates for one problem mostly make the same core change and differ in a few lines: a debug print, a dead
helper, a check one of them leaves out, a special case. Printing every full diff would spend most of a small
model's context (and of a CPU training budget) on repeats, so the view prints the changed lines every candidate
makes once, then, per candidate, only its other changed lines, each under the file and the function it is in,
added lines with their line number in that candidate's tree (what an answer cites as `file:line`). A candidate
that shares nothing with the others is simply shown whole. The full patches stay one `show_diff` call away.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from grader.features import patch_file_path
from grader.workspace import SharedWorkspace

MAX_FILE_BYTES = 1 << 20
# The view's budget (about 1.5k tokens for a group of four): changed lines shown per candidate and for the changes
# every candidate shares, and characters per line; the rest is one `show_diff` call away.
MAX_VIEW_LINES = 36
MAX_SHARED_LINES = 40
MAX_LINE_CHARS = 110
_DEF = re.compile(r"^(\s*)(?:async\s+def|def|class|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)")


@dataclass
class Changed:
    """One changed line of a candidate's patch."""

    path: str
    sign: str  # "+" or "-"
    text: str
    line: int | None  # in the candidate's tree (added lines); None for removed lines
    anchor: int  # the candidate-tree line nearest to it (where a removed line was), for its enclosing function
    run: int  # consecutive changed lines (no context line between them) share a run
    base: int = 0  # the base-tree line it replaces or follows: where patches of one base can be compared

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.sign, self.text.rstrip())


def changed_lines(patch: str) -> list[Changed]:
    """The +/- lines of a unified diff in patch order (an unparsable patch gives none: `show_diff` still works)."""
    try:
        files = PatchSet(patch)
    except (UnidiffParseError, ValueError):
        return []
    out = []
    run = 0
    for pf in files:
        path = patch_file_path(pf)
        for hunk in pf:
            last, base = hunk.target_start, hunk.source_start
            run += 1
            for ln in hunk:
                if ln.is_context:
                    run += 1
                if ln.target_line_no:
                    last = ln.target_line_no
                if ln.source_line_no:
                    base = ln.source_line_no
                if ln.is_added:
                    out.append(Changed(path, "+", ln.value.rstrip("\n"), ln.target_line_no, last, run, base))
                elif ln.is_removed:
                    out.append(Changed(path, "-", ln.value.rstrip("\n"), None, last, run, base))
    return out


def _read_lines(ws: SharedWorkspace, label: str, path: str) -> list[str]:
    try:
        p = ws.resolve(label, path)
        if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
            return []
        return p.read_text(encoding="utf-8", errors="replace").splitlines()
    except (OSError, ValueError, KeyError):
        return []


def enclosing(lines: list[str], line: int) -> str:
    """`def name` / `class name` / `func name` around 1-based `line` of a file (nearest less-indented one)."""
    if not lines:
        return ""
    i = min(max(line, 1), len(lines)) - 1
    here = lines[i]
    indent = len(here) - len(here.lstrip()) if here.strip() else 10**6
    for j in range(i, -1, -1):
        m = _DEF.match(lines[j])
        if m and (len(m.group(1)) < indent or j == i):
            kind = lines[j].split()[0]
            return f"{'def' if kind == 'async' else kind} {m.group(2)}"
    return ""


def _clip(text: str) -> str:
    text = text.rstrip()
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


def _render(rows: list[Changed], ws: SharedWorkspace, label: str, limit: int, numbers: bool) -> list[str]:
    out: list[str] = []
    files: dict[str, list[str]] = {}
    head = None
    where, run = "", None
    for k, c in enumerate(rows):
        if k == limit:
            out.append(f"  [{len(rows) - limit} more changed lines: show_diff shows them]")
            break
        if c.path not in files:
            files[c.path] = _read_lines(ws, label, c.path)
        if c.run != run:  # one place per run of changed lines: its first added line, or where it removes
            run = c.run
            first = next((r.line for r in rows[k:] if r.run == run and r.line), c.anchor)
            where = enclosing(files[c.path], first)
        if (c.path, where) != head:
            head = (c.path, where)
            out.append(f"  {c.path}" + (f" in {where}:" if where else ":"))
        num = f"{c.line:>5} " if numbers and c.line else "      "
        out.append(f"{num}{c.sign} {_clip(c.text)}")
    return out


def change_view(ws: SharedWorkspace, labels: list[str]) -> str:
    """The changes every candidate makes (once), then each candidate's other changed lines."""
    per = {lab: changed_lines(ws.candidate(lab).patch) for lab in labels}
    common: Counter[tuple[str, str, str]] | None = None
    for rows in per.values():
        c = Counter(r.key for r in rows)
        common = c if common is None else common & c
    common = common or Counter()
    own: dict[str, list[Changed]] = {}
    shared: list[Changed] = []
    for i, lab in enumerate(labels):
        left = Counter(common)
        own[lab] = []
        for r in per[lab]:
            if left[r.key] > 0:
                left[r.key] -= 1
                if i == 0:
                    shared.append(r)
            else:
                own[lab].append(r)
    out = ["Changes every candidate makes:"]
    out += _render(shared, ws, labels[0], MAX_SHARED_LINES, numbers=False) if shared else ["  none"]
    out.append("Each candidate's other changes:" if shared else "Each candidate's changes:")
    for lab in labels:
        body = _render(own[lab], ws, lab, MAX_VIEW_LINES, numbers=True)
        out += [f"{lab}:"] + body if body else [f"{lab}: nothing else"]
    return "\n".join(out)
