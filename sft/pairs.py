"""Training records of the scoring judge: every pair of a known-order group, in both orders, answered by one token.

A group `gold > d1 > d2 > partial` gives six pairs and twelve records. Each record is the scoring judge's own
prompt (`grader.judge.scoring.pair_messages`: built from the same staged workspace, findings and view as at
inference) and the answer "A" or "B". Both orders of every pair are kept, so the answer is A in exactly half of
the records and the letter carries no information. Each record notes whether the better patch of its pair is the
bigger one (`bigger_wins`, changed lines), so the trainer can balance the size-inverted pairs (a complete fix
against a partial fix or a special case) against the others and "the smaller patch wins" is no shortcut.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

from grader.judge.scoring import ANSWERS, pair_messages, rollout_findings
from grader.records import Group
from grader.workspace import SharedWorkspace
from sandbox.patchcheck import diff_size
from sft.records import RecordError


def pair_records(group: Group, repos_dir: str | Path, order: list[str], *, findings: bool = True,
                 kinds: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """Both orders of every pair of `group`, whose known order (best first) is `order` (rollout ids).

    Each record: `messages` (system, user, and the assistant's one-token answer), `answer`, `better`, `worse`,
    `first` (the rollout shown as A), `bigger_wins` (the better patch changes more lines than the worse one;
    None when they are the same size), `kinds` (what each of the two is: its defects, `partial`, `hack`).
    """
    kinds = kinds or {}
    size = {c.rollout_id: diff_size(c.patch)[0] for c in group.candidates}
    out = []
    with SharedWorkspace(group, repos_dir) as ws:
        if ws.failed:
            rid, why = next(iter(ws.failed.items()))
            raise RecordError(f"{group.instance_id}: candidate {rid} could not be staged: {why}")
        shown = rollout_findings(ws) if findings else None
        for better, worse in combinations(order, 2):
            bigger = None if size[better] == size[worse] else size[better] > size[worse]
            for first, second in ((better, worse), (worse, better)):
                answer = ANSWERS[0] if first == better else ANSWERS[1]
                messages = pair_messages(ws, first, second, shown)
                messages.append({"role": "assistant", "content": answer})
                out.append({
                    "instance_id": group.instance_id, "messages": messages, "answer": answer, "better": better,
                    "worse": worse, "first": first, "bigger_wins": bigger, "findings": findings,
                    "kinds": {r: list(kinds.get(r, [])) for r in (better, worse)},
                })
    return out


def decision_prompt(record: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """(the prompt messages, the answer token) of a pair record."""
    msgs = record.get("messages")
    if not isinstance(msgs, list) or len(msgs) < 2 or msgs[-1].get("role") != "assistant" \
            or msgs[-1].get("content") not in ANSWERS:
        raise RecordError(f"{record.get('instance_id')}: not a pair record (it must end with the assistant's "
                          f"one-letter answer, {' or '.join(ANSWERS)}; build it with `gagar sft data --records pairs`)")
    return msgs[:-1], msgs[-1]["content"]
