"""Scope of a patch against its task's reference fix: does it change code outside the functions the fix changes?

A synthesized task's gold patch is the revert of one mutation inside one function (`gagar tasks synth`), so the
functions it touches are where a fix belongs. A passing patch that also edits other functions, or module-level
code, has crept out of scope; the count of such changed lines is what GAGAR's judge is meant to push down.
Positions are compared in the base tree both patches apply to (`grader.judge.view.Changed.base`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from grader.judge.view import changed_lines
from sandbox.integrity.gitsafe import GitError, source_git
from sandbox.records import Instance
from sft.degrade_py import enclosing_function


@dataclass(frozen=True)
class Scope:
    """Where a task's fix belongs: per file, the (first, last) base lines of the functions it changes."""

    spans: dict[str, list[tuple[int, int]]]

    def outside(self, patch: str) -> int:
        """Changed lines of `patch` outside those functions (every line of a file the fix does not touch)."""
        return sum(1 for c in changed_lines(patch)
                   if not any(lo <= c.base <= hi for lo, hi in self.spans.get(c.path, [])))


def task_scope(instance: Instance, repo: Path) -> Scope:
    """The functions (innermost `def`) the reference patch changes, read from the task's base commit; a change
    at module level makes the whole file its scope (there is no function to stay inside)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for c in changed_lines(instance.patch):
        if c.path.endswith(".py"):
            try:
                text = source_git(repo, "cat-file", "blob", f"{instance.base_commit}:{c.path}", binary=True)
                tree = ast.parse(text.decode("utf-8", "replace"))
            except (GitError, SyntaxError, ValueError):
                tree = None
            fn = enclosing_function(tree, c.base) if tree is not None else None
            span = (fn.lineno, fn.end_lineno or fn.lineno) if fn is not None else (1, 10**9)
        else:
            span = (1, 10**9)
        if span not in spans.setdefault(c.path, []):
            spans[c.path].append(span)
    return Scope(spans)
