"""Grading groups: the Python API under `gagar grade` (heuristic or LLM judge, one workspace per group).

The LLM judge grades `batch_groups` groups at a time: their workspaces are open together and every
conversation (each group × each permutation) advances in the same model batch (`LLMJudge.grade_workspaces`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from itertools import islice
from pathlib import Path

from grader.hacks.detect import apply_hacks, workspace_hacks
from grader.heuristic import rank_workspace
from grader.judge.llm import LLMJudge
from grader.records import Grading, Group
from grader.workspace import SharedWorkspace
from inference.base import ChatBackend

JUDGES = ("heuristic", "llm")
BATCH_GROUPS = 8


def _llm(backend: ChatBackend | None, max_turns: int, max_new_tokens: int, stats: Counter[str] | None,
         answer_grammar: bool | None) -> LLMJudge:
    if backend is None:
        raise ValueError("judge='llm' needs a backend (see inference.backends.make_backend)")
    return LLMJudge(backend, max_turns=max_turns, max_new_tokens=max_new_tokens, stats=stats,
                    answer_grammar=answer_grammar)


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
    answer_grammar: bool | None = None,
) -> Grading:
    return grade_groups(
        [group], repos_dir, judge=judge, backend=backend, permutations=permutations, seed=seed,
        max_turns=max_turns, max_new_tokens=max_new_tokens, answer_grammar=answer_grammar,
    )[0]


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
    batch_groups: int = BATCH_GROUPS,
    on_result: Callable[[Grading], None] | None = None,
    stats: Counter[str] | None = None,
    answer_grammar: bool | None = None,
) -> list[Grading]:
    """Grade every group, in order; `on_result` is called after each (the CLI saves and advances its bar).

    `stats` (LLM judge) accumulates reply counts: `replies`, `unusable_replies`, `runs`, `failed_runs`,
    `grammar_answers`, ... `answer_grammar` (LLM judge): None decodes the answer in the answer grammar
    (`grader.judge.grammar`) whenever a free reply is unusable and the backend can score continuations; False never.
    """
    if judge not in JUDGES:
        raise ValueError(f"unknown judge {judge!r}; choose heuristic or llm")
    llm = _llm(backend, max_turns, max_new_tokens, stats, answer_grammar) if judge == "llm" else None
    it = iter(groups)
    out: list[Grading] = []
    while chunk := list(islice(it, max(1, batch_groups) if llm else 1)):
        with ExitStack() as stack:
            wss = [stack.enter_context(SharedWorkspace(g, repos_dir, seed=seed)) for g in chunk]
            if llm is None:
                results = [rank_workspace(ws) for ws in wss]
            else:
                graded = llm.grade_workspaces(wss, permutations=permutations, seed=seed)
                # Static hack evidence overrides the model's ranking: a judge can be talked out of a verdict (the
                # candidate's own code and comments are in its context), a finding on the code cannot.
                results = [apply_hacks(g, workspace_hacks(ws)) for g, ws in zip(graded, wss, strict=True)]
        for res in results:
            out.append(res)
            if on_result:
                on_result(res)
    return out
