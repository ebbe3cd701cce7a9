"""The agentic LLM judge: a tool loop over the shared workspace ending in a validated listwise answer.

One run: the model sees the criteria and a summary, calls tools (bounded by `max_turns`), and answers with a
ranking, tiers and evidence. An unusable reply (unparsable, or an invalid answer) is answered with the problem
and one retry is allowed; a second unusable reply, a backend error or an exhausted turn budget ends the run.
With K permutations the letters are reshuffled per run and the successful runs are Borda-aggregated. When no
run succeeds the heuristic ranking is returned with `fallback: true`, so the trainer always gets a grading.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.aggregate import aggregate_tiers, agreement, borda
from grader.backends import BackendError, ChatBackend
from grader.heuristic import append_unapplied, rank_workspace, weights_for
from grader.prompt import (
    Answer,
    ParseError,
    ToolCall,
    build_initial_messages,
    format_tool_result,
    parse_assistant,
    validate_answer,
)
from grader.records import Grading, Group
from grader.tools import run_tool
from grader.workspace import SharedWorkspace

log = logging.getLogger(__name__)

MAX_UNUSABLE = 2  # the first unusable reply gets feedback and a retry; the second ends the run


@dataclass
class RunResult:
    """One permutation's outcome, in rollout ids (letters already mapped back)."""

    ok: bool
    ranking: list[str] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)
    evidence: dict[str, list[str]] = field(default_factory=dict)
    reason: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0


class LLMJudge:
    def __init__(
        self,
        backend: ChatBackend,
        *,
        max_turns: int = 12,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.backend = backend
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.name = f"llm:{getattr(backend, 'name', type(backend).__name__)}"

    def _reply(self, messages: list[dict[str, Any]]) -> str:
        return self.backend.chat(messages, max_new_tokens=self.max_new_tokens, temperature=self.temperature)

    def run_once(self, ws: SharedWorkspace) -> RunResult:
        """One tool-loop conversation over the workspace's current labels."""
        labels = list(ws.labels)
        messages = build_initial_messages(ws.group, ws, labels)
        unusable = 0
        calls = 0
        for turn in range(self.max_turns + 1):
            if turn == self.max_turns:
                messages.append({"role": "user", "content": "Turn budget used up: give your final <answer> now."})
            try:
                text = self._reply(messages)
            except BackendError as exc:
                return RunResult(False, reason=f"backend error: {exc}", messages=messages, tool_calls=calls)
            messages.append({"role": "assistant", "content": text})
            parsed = parse_assistant(text)
            if isinstance(parsed, ToolCall) and turn < self.max_turns:
                calls += 1
                messages.append(format_tool_result(parsed.name, run_tool(ws, parsed.name, parsed.arguments)))
                continue
            if isinstance(parsed, Answer):
                problems = validate_answer(parsed, labels)
                if not problems:
                    return self._mapped(ws, parsed, messages, calls)
                problem = "your answer is not valid: " + "; ".join(problems)
            elif isinstance(parsed, ParseError):
                problem = f"I could not read your reply: {parsed.message}"
            else:
                problem = "no more tool calls are allowed"
            unusable += 1
            if unusable >= MAX_UNUSABLE or turn == self.max_turns:
                return RunResult(False, reason=problem, messages=messages, tool_calls=calls)
            messages.append({
                "role": "user",
                "content": f"{problem[0].upper()}{problem[1:]}. Candidates: {', '.join(labels)}. "
                "Reply with one <tool_call>{...}</tool_call> or the final <answer>{...}</answer>.",
            })
        return RunResult(False, reason="turn budget exhausted", messages=messages, tool_calls=calls)

    @staticmethod
    def _mapped(ws: SharedWorkspace, ans: Answer, messages: list[dict[str, Any]], calls: int) -> RunResult:
        r = ws.rollout_of
        # Evidence may mention letters; they are only meaningful with the run's mapping, so name it.
        evidence = {
            r(lab): [f"[as candidate {lab}] {s}" for s in ans.evidence.get(lab, [])] for lab in ans.ranking
        }
        return RunResult(
            True,
            ranking=[r(lab) for lab in ans.ranking],
            tiers={r(lab): ans.tiers[lab] for lab in ans.ranking},
            evidence=evidence,
            messages=messages,
            tool_calls=calls,
        )

    def grade_workspace(self, ws: SharedWorkspace, *, permutations: int = 1, seed: int = 0) -> Grading:
        if permutations < 1:
            raise ValueError("permutations must be at least 1")
        iid = ws.group.instance_id
        if len(ws.labels) < 2:
            # Nothing to compare: the heuristic's verdict (one candidate, or unstageable ones) is exact.
            g = rank_workspace(ws)
            g.judge = self.name
            g.notes.append("fewer than two stageable candidates: no model call needed")
            return g
        runs: list[RunResult] = []
        for k in range(permutations):
            ws.relabel(seed + k)
            runs.append(self.run_once(ws))
        good = [run for run in runs if run.ok]
        failed_notes = [f"permutation {i}: {run.reason}" for i, run in enumerate(runs) if not run.ok]
        if not good:
            g = rank_workspace(ws)
            g.judge = self.name
            g.fallback = True
            g.notes.extend(failed_notes)
            log.info("%s: judge output unusable, heuristic fallback (%s)", iid, "; ".join(failed_notes))
            return g
        ranking = borda([run.ranking for run in good])
        tiers = aggregate_tiers([run.tiers for run in good], ranking)
        evidence: dict[str, list[str]] = {rid: [] for rid in ranking}
        for run in good:
            for rid, ev in run.evidence.items():
                evidence[rid].extend(e for e in ev if e not in evidence[rid])
        append_unapplied(ranking, tiers, evidence, ws.failed)
        return Grading(
            instance_id=iid,
            ranking=ranking,
            tiers=tiers,
            weights=weights_for(tiers),
            evidence=evidence,
            judge=self.name,
            fallback=False,
            agreement=agreement([run.ranking for run in good]) if permutations > 1 else None,
            notes=failed_notes,
        )

    def grade(self, group: Group, repos_dir: str | Path, *, permutations: int = 1, seed: int = 0) -> Grading:
        with SharedWorkspace(group, repos_dir, seed=seed) as ws:
            return self.grade_workspace(ws, permutations=permutations, seed=seed)
