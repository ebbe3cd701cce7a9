"""Answers decoded inside the answer grammar: the model makes every choice, the format is given.

A judge's final answer has a fixed shape (`grader.judge.prompt.format_answer`): a tier per letter, one evidence string
for each candidate below tier 1, then the ranking (every letter once; tiers never improve down the ranking).
When a model's free-form reply is not a valid answer, the judge decodes one in this grammar instead of asking
again: at each choice point (the next tier, the evidence to cite, the next letter of the ranking) the backend
scores every allowed continuation by its log-probability after the text so far, and the most likely one is
taken. The ranking comes last, so it follows the verdicts the model has just written: across tiers they fix
it, within a tier the model chooses. The result is the model's own most likely valid answer, in exactly the form
it was trained on (the same `json.dumps` rendering). Structured-output decoding does the same token by token
(vLLM's guided decoding, OpenAI's JSON schemas).

`answer_program` is a generator: it yields `Choice(prefix, options)` and is sent the index of the option taken;
it returns the `Answer`. `decode_answers` drives many programs together, one batched scoring call per step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from grader.judge.prompt import TIERS, Answer, format_answer
from inference.base import BackendError

Messages = list[dict[str, Any]]
# (conversation, assistant text so far, options) -> one log-probability per option, for many requests at once;
# a request the model cannot score (too long for it) gets a BackendError in its place
ScoreFn = Callable[[Sequence[tuple[Messages, str, list[str]]]], list[list[float] | BackendError]]


@dataclass
class Choice:
    prefix: str  # the answer text before the options (starts with `<answer>`)
    options: list[str]  # continuations, each ending where the next choice (or the end) begins


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def answer_program(
    labels: Sequence[str], cites: dict[str, list[str]]
) -> Generator[Choice, int, Answer]:
    """The choices that make one valid answer for `labels`; `cites[label]` are the evidence strings allowed.

    In the answer's order: a tier per letter (letter order), one cite per letter below tier 1, then the ranking,
    where each next letter is one of the remaining letters of the best remaining tier (tiers never improve down
    the ranking). Each option is scored with the delimiter that follows it (`1, ` vs `1}`), so it is compared
    as the model would write it. A choice with one option is taken without asking.
    """
    order = sorted(labels)
    missing = [lab for lab in order if not cites.get(lab)]
    if missing:
        raise ValueError(f"no evidence to cite for {', '.join(missing)}")
    text = '<answer>{"tiers": {'
    tiers: dict[str, int] = {}
    for i, lab in enumerate(order):
        text += _q(lab) + ": "
        end = ", " if i < len(order) - 1 else "}"
        opts = [f"{t}{end}" for t in TIERS]
        tiers[lab] = TIERS[(yield Choice(text, opts))]
        text += f"{tiers[lab]}{end}"
    text += ', "evidence": {'
    evidence: dict[str, list[str]] = {}
    cited = [lab for lab in order if tiers[lab] > 1]
    for i, lab in enumerate(cited):
        text += _q(lab) + ": ["
        end = "], " if i < len(cited) - 1 else "]"
        opts = [_q(c) + end for c in cites[lab]]
        k = 0 if len(opts) == 1 else (yield Choice(text, opts))
        evidence[lab] = [cites[lab][k]]
        text += opts[k]
    text += '}, "ranking": ['
    ranking: list[str] = []
    remaining = list(order)
    while remaining:
        best = min(tiers[lab] for lab in remaining)
        allowed = [lab for lab in remaining if tiers[lab] == best]
        end = "" if len(remaining) == 1 else ", "
        opts = [_q(lab) + end for lab in allowed]
        k = 0 if len(opts) == 1 else (yield Choice(text, opts))
        ranking.append(allowed[k])
        remaining.remove(allowed[k])
        text += opts[k]
    answer = Answer(ranking, tiers, evidence)
    # The grammar is the format's: what was scored is exactly what format_answer writes.
    assert text + "]}</answer>" == format_answer(ranking, tiers, evidence), text
    return answer


def decode_answers(
    requests: Sequence[tuple[Messages, Sequence[str], dict[str, list[str]]]], score: ScoreFn
) -> list[Answer | BackendError]:
    """The most likely valid answer for each (conversation, labels, cites), all advancing in one batch per step."""
    programs = [answer_program(labels, cites) for _, labels, cites in requests]
    pending: dict[int, Choice] = {}
    done: dict[int, Answer | BackendError] = {}
    for i, prog in enumerate(programs):
        try:
            pending[i] = next(prog)
        except StopIteration as stop:
            done[i] = stop.value
    while pending:
        idx = list(pending)
        scores = score([(requests[i][0], pending[i].prefix, pending[i].options) for i in idx])
        for i, row in zip(idx, scores, strict=True):
            if isinstance(row, BackendError):
                done[i] = row
                del pending[i]
                continue
            best = max(range(len(row)), key=row.__getitem__)
            try:
                pending[i] = programs[i].send(best)
            except StopIteration as stop:
                done[i] = stop.value
                del pending[i]
    return [done[i] for i in range(len(requests))]
