"""The agentic LLM judge: a tool loop over the shared workspace ending in a validated listwise answer.

One run: the model sees the criteria and a summary, calls tools (bounded by `max_turns`), and answers with a
ranking, tiers and evidence. Runs are batched: every (group, permutation) conversation that is still active
advances by one turn per backend call (`chat_batch`: one left-padded forward batch in-process, one vLLM batch,
or concurrent requests to a server), so K permutations of G groups cost about as many model calls as one run. An unusable reply (unparsable, or an invalid answer) is answered with the problem
and one retry is allowed; a second unusable reply, a backend error or an exhausted turn budget ends the run.
With K permutations the letters are reshuffled per run and the successful runs are Borda-aggregated. When no
run succeeds the heuristic ranking is returned with `fallback: true`, so the trainer always gets a grading.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.heuristic import append_unapplied, rank_workspace
from grader.judge.aggregate import aggregate_tiers, agreement, borda
from grader.judge.grammar import decode_answers
from grader.judge.prompt import (
    Answer,
    ParseError,
    ToolCall,
    build_initial_messages,
    cite_options,
    format_answer,
    format_tool_result,
    parse_assistant,
    validate_answer,
)
from grader.judge.tools import run_tool
from grader.records import Grading, Group, tier_weights
from grader.workspace import SharedWorkspace
from inference.base import BackendError, ChatBackend, chat_batch

log = logging.getLogger(__name__)

MAX_UNUSABLE = 2  # the first unusable reply gets feedback and a retry; the second ends the run
GRAMMAR_NOTE = "answers decoded in the answer grammar"  # ends a grading's note when any answer was


def decoded_in_grammar(notes: list[str]) -> bool:
    """Whether a grading (by its `notes`) rests on answers decoded in the answer grammar, not free replies."""
    return any(n.endswith(GRAMMAR_NOTE) for n in notes)


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
    grammar: bool = False  # the answer was decoded in the answer grammar (the free reply was unusable)


class _Run:
    """One conversation in flight: a workspace, its letter shuffle (seed), the messages so far."""

    def __init__(self, ws: SharedWorkspace, seed: int, findings: bool = True) -> None:
        self.ws, self.seed = ws, seed
        ws.relabel(seed)
        self.labels = list(ws.labels)
        self.messages = build_initial_messages(ws.group, ws, self.labels, findings=findings)
        self.unusable = 0
        self.calls = 0
        self.retries = 0  # replies that were neither a usable tool call nor a valid answer
        self.replies = 0
        self.needs_grammar = False  # the free reply was unusable: decode the answer in the grammar instead
        self.result: RunResult | None = None

    def fail(self, reason: str) -> None:
        self.result = RunResult(False, reason=reason, messages=self.messages, tool_calls=self.calls)

    def advance(self, reply: str | BackendError, turn: int, max_turns: int, grammar: bool = False) -> None:
        """Take the model's reply of this turn: run its tool call, accept its answer, or ask again (with
        `grammar`: mark the run for an answer decoded in the grammar instead)."""
        if isinstance(reply, BackendError):
            return self.fail(f"backend error: {reply}")
        self.replies += 1
        self.ws.relabel(self.seed)  # tools and letters are this run's; other runs share the workspace
        self.messages.append({"role": "assistant", "content": reply})
        parsed = parse_assistant(reply)
        if isinstance(parsed, ToolCall) and turn < max_turns:
            self.calls += 1
            self.messages.append(format_tool_result(parsed.name, run_tool(self.ws, parsed.name, parsed.arguments)))
            return None
        if isinstance(parsed, Answer):
            problems = validate_answer(parsed, self.labels)
            if not problems:
                self.result = _mapped(self.ws, parsed, self.messages, self.calls)
                return None
            problem = "your answer is not valid: " + "; ".join(problems)
        elif isinstance(parsed, ParseError):
            problem = f"I could not read your reply: {parsed.message}"
        else:
            problem = "no more tool calls are allowed"
        self.unusable += 1
        self.retries += 1
        if grammar:
            self.messages.pop()  # the grammar answer replaces the unusable reply, decoded from what preceded it
            self.needs_grammar = True
            return None
        if self.unusable >= MAX_UNUSABLE or turn == max_turns:
            return self.fail(problem)
        self.messages.append({
            "role": "user",
            "content": f"{problem[0].upper()}{problem[1:]}. Candidates: {', '.join(self.labels)}. "
            "Reply with one <tool_call>{...}</tool_call> or the final <answer>{...}</answer>.",
        })
        return None


def _mapped(ws: SharedWorkspace, ans: Answer, messages: list[dict[str, Any]], calls: int) -> RunResult:
    r = ws.rollout_of
    # Evidence may mention letters; they are only meaningful with the run's mapping, so name it.
    evidence = {r(lab): [f"[as candidate {lab}] {s}" for s in ans.evidence.get(lab, [])] for lab in ans.ranking}
    return RunResult(
        True,
        ranking=[r(lab) for lab in ans.ranking],
        tiers={r(lab): ans.tiers[lab] for lab in ans.ranking},
        evidence=evidence,
        messages=messages,
        tool_calls=calls,
    )


class LLMJudge:
    def __init__(
        self,
        backend: ChatBackend,
        *,
        max_turns: int = 12,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        stats: Counter[str] | None = None,
        answer_grammar: bool | None = None,
        findings: bool = True,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        score = getattr(backend, "score_continuations", None)
        if answer_grammar and not callable(score):
            raise ValueError(f"the {getattr(backend, 'name', 'model')} backend cannot decode answers in the grammar "
                             "(it scores no continuations); use the transformers backend or answer_grammar=False")
        # None: wherever the backend can. An unusable free reply then becomes the model's most likely valid
        # answer (grader.judge.grammar) rather than a retry and, failing that, the heuristic fallback.
        self.score = score if answer_grammar is not False and callable(score) else None
        self.backend = backend
        # Without the static findings in its prompt the judge has only the code to go by (the ablation that shows
        # whether a trained judge reads the diffs or counts findings).
        self.findings = findings
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.name = f"llm:{getattr(backend, 'name', type(backend).__name__)}"
        # Counts over every run: replies, unusable replies, runs, failed runs, model batches (parse rate, speed).
        self.stats: Counter[str] = stats if stats is not None else Counter()

    def run_all(self, runs: list[_Run]) -> list[RunResult]:
        """Advance every run by one turn per batched model call until each has a result."""
        for turn in range(self.max_turns + 1):
            active = [run for run in runs if run.result is None]
            if not active:
                break
            if turn == self.max_turns:
                for run in active:
                    run.messages.append({"role": "user", "content": "Turn budget used up: give your final <answer> now."})
            replies = chat_batch(self.backend, [run.messages for run in active],
                                 max_new_tokens=self.max_new_tokens, temperature=self.temperature)
            self.stats["batches"] += 1
            for run, reply in zip(active, replies, strict=True):
                run.advance(reply, turn, self.max_turns, grammar=self.score is not None)
            self._decode_in_grammar([run for run in active if run.needs_grammar])
        for run in runs:
            if run.result is None:
                run.fail("turn budget exhausted")
            self.stats.update(runs=1, failed_runs=int(not run.result.ok), replies=run.replies,
                              unusable_replies=run.retries, tool_calls=run.calls)
        return [run.result for run in runs if run.result is not None]

    def _decode_in_grammar(self, runs: list[_Run]) -> None:
        """Answer for every run whose free reply was unusable: the model's most likely valid answer."""
        if not runs or self.score is None:
            return
        requests = []
        for run in runs:
            run.ws.relabel(run.seed)
            requests.append((list(run.messages), run.labels, cite_options(run.ws, run.labels)))
        for run, ans in zip(runs, decode_answers(requests, self.score), strict=True):
            run.needs_grammar = False
            if isinstance(ans, BackendError):
                run.fail(f"backend error: {ans}")
                continue
            run.messages.append({"role": "assistant", "content": format_answer(ans.ranking, ans.tiers, ans.evidence)})
            run.ws.relabel(run.seed)
            run.result = _mapped(run.ws, ans, run.messages, run.calls)
            run.result.grammar = True
            self.stats["grammar_answers"] += 1

    def run_once(self, ws: SharedWorkspace) -> RunResult:
        """One tool-loop conversation over the workspace's current letters."""
        return self.run_all([_Run(ws, ws.seed, self.findings)])[0]

    def grade_workspaces(
        self, workspaces: list[SharedWorkspace], *, permutations: int = 1, seed: int = 0
    ) -> list[Grading]:
        """Grade many open workspaces together: all their permutations advance in the same batches."""
        if permutations < 1:
            raise ValueError("permutations must be at least 1")
        judged = [ws for ws in workspaces if len(ws.labels) >= 2]
        runs = {id(ws): [_Run(ws, seed + k, self.findings) for k in range(permutations)] for ws in judged}
        self.run_all([run for rs in runs.values() for run in rs])
        out = []
        for ws in workspaces:
            if id(ws) not in runs:
                # Nothing to compare: the heuristic's verdict (one candidate, or unstageable ones) is exact.
                g = rank_workspace(ws)
                g.judge = self.name
                g.notes.append("fewer than two stageable candidates: no model call needed")
            else:
                g = self._combine(ws, [run.result for run in runs[id(ws)] if run.result is not None], permutations)
            out.append(g)
        return out

    def _combine(self, ws: SharedWorkspace, runs: list[RunResult], permutations: int) -> Grading:
        iid = ws.group.instance_id
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
        in_grammar = sum(run.grammar for run in good)
        if in_grammar:
            failed_notes.append(f"{in_grammar} of {len(good)} {GRAMMAR_NOTE}")
        return Grading(
            instance_id=iid,
            ranking=ranking,
            tiers=tiers,
            weights=tier_weights(tiers),
            evidence=evidence,
            judge=self.name,
            fallback=False,
            agreement=agreement([run.ranking for run in good]) if permutations > 1 else None,
            notes=failed_notes,
        )

    def grade_workspace(self, ws: SharedWorkspace, *, permutations: int = 1, seed: int = 0) -> Grading:
        return self.grade_workspaces([ws], permutations=permutations, seed=seed)[0]

    def grade(self, group: Group, repos_dir: str | Path, *, permutations: int = 1, seed: int = 0) -> Grading:
        with SharedWorkspace(group, repos_dir, seed=seed) as ws:
            return self.grade_workspace(ws, permutations=permutations, seed=seed)
