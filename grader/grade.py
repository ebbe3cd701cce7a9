"""Grading groups: the Python API under `gagar grade` (heuristic or LLM judge, one workspace per group)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from grader.backends import ChatBackend
from grader.hacks import apply_hacks, workspace_hacks
from grader.heuristic import rank_workspace
from grader.judge import LLMJudge
from grader.records import Grading, Group
from grader.workspace import SharedWorkspace

JUDGES = ("heuristic", "llm")


def grade_group(
    group: Group,
    repos_dir: str | Path,
    *,
    judge: str = "heuristic",
    backend: ChatBackend | None = None,
    permutations: int = 1,
    seed: int = 0,
    max_turns: int = 12,
    max_new_tokens: int = 512,
) -> Grading:
    if judge not in JUDGES:
        raise ValueError(f"unknown judge {judge!r}; choose heuristic or llm")
    with SharedWorkspace(group, repos_dir, seed=seed) as ws:
        if judge == "heuristic":
            return rank_workspace(ws)
        if backend is None:
            raise ValueError("judge='llm' needs a backend (see grader.backends)")
        llm = LLMJudge(backend, max_turns=max_turns, max_new_tokens=max_new_tokens)
        graded = llm.grade_workspace(ws, permutations=permutations, seed=seed)
        # Static hack evidence overrides the model's ranking: a judge can be talked out of a verdict (the
        # candidate's own code and comments are in its context), a finding on the code cannot.
        return apply_hacks(graded, workspace_hacks(ws))


def grade_groups(
    groups: Iterable[Group],
    repos_dir: str | Path,
    *,
    judge: str = "heuristic",
    backend: ChatBackend | None = None,
    permutations: int = 1,
    seed: int = 0,
    max_turns: int = 12,
    max_new_tokens: int = 512,
    on_result: Callable[[Grading], None] | None = None,
) -> list[Grading]:
    """Grade every group in order; `on_result` is called after each (the CLI saves and advances its bar)."""
    out = []
    for g in groups:
        res = grade_group(
            g, repos_dir, judge=judge, backend=backend, permutations=permutations, seed=seed,
            max_turns=max_turns, max_new_tokens=max_new_tokens,
        )
        out.append(res)
        if on_result:
            on_result(res)
    return out
