"""One judge training record: the exact conversation the judge has at inference, ending in the known answer.

Everything comes from the grader's own functions (`build_initial_messages`, `run_tool`, `format_tool_call`,
`format_tool_result`, `format_answer`, `SharedWorkspace`), so a change to the judge's prompt or tools changes
the training data the same way. The expert trajectory reads every candidate's diff (in letter order, so the
reading order carries no hint), then answers; letters are the workspace's seeded shuffle, as at inference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from grader.judge.prompt import (
    Answer,
    build_initial_messages,
    candidate_findings,
    cite_options,
    format_answer,
    format_tool_call,
    format_tool_result,
    validate_answer,
)
from grader.judge.tools import run_tool
from grader.records import Group
from grader.workspace import SharedWorkspace

_LETTER_PREFIX = re.compile(r"^\[as candidate [A-Z]+\]\s*")


class RecordError(ValueError):
    """The group cannot become a record (a candidate did not stage, the label does not validate)."""


def tiers_from_defects(order: list[str], defects: dict[str, int]) -> dict[str, int]:
    """Tier 1 for a clean candidate, 2 for one defect, 3 for two or more."""
    return {rid: min(3, 1 + defects.get(rid, 0)) for rid in order}


def build_record(
    group: Group,
    repos_dir: str | Path,
    order: list[str],
    tiers: dict[str, int],
    evidence: dict[str, list[str]],
    *,
    seed: int = 0,
    extra_calls: list[tuple[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """A chat record for `group` whose final answer ranks rollout ids `order` (best first).

    `tiers` and `evidence` are keyed by rollout id; the record holds them by letter, as the judge writes them.
    The returned dict has `messages` (what SFT trains on) plus the mapping needed to score a prediction.
    """
    return build_records(group, repos_dir, order, tiers, evidence, seeds=[seed], extra_calls=extra_calls)[0]


def build_records(
    group: Group,
    repos_dir: str | Path,
    order: list[str],
    tiers: dict[str, int],
    evidence: dict[str, list[str]],
    *,
    seeds: list[int],
    inspect: bool = True,
    cite: str = "given",
    extra_calls: list[tuple[str, dict[str, Any]]] | None = None,
    findings: bool | list[bool] = True,
) -> list[dict[str, Any]]:
    """One record per letter shuffle in `seeds`, all from one staged workspace.

    `findings` (one flag, or one per seed): whether the prompt shows the static findings; a judge trained on
    both kinds must read the code, since half of its prompts give it nothing to count.

    `inspect=False` answers straight from the first user turn (summary + static findings): the short
    conversation a small judge learns. `cite="findings"` answers from what the prompt shows: tiers from the
    number of static findings (`_visible_tiers`; `tiers` is then not used) and, for each candidate below
    tier 1, its first finding as evidence (or its diffstat line when it has none); `cite="given"` uses `tiers`
    and `evidence` (e.g. the known edits of a degradation).
    """
    if cite not in ("given", "findings"):
        raise ValueError(f"cite must be 'given' or 'findings', got {cite!r}")
    out = []
    with SharedWorkspace(group, repos_dir, seed=seeds[0]) as ws:
        if ws.failed:
            rid, why = next(iter(ws.failed.items()))
            raise RecordError(f"{group.instance_id}: candidate {rid} could not be staged: {why}")
        if cite == "findings":
            tiers = _visible_tiers(ws, order)
        shown = findings if isinstance(findings, list) else [findings] * len(seeds)
        for seed, with_findings in zip(seeds, shown, strict=True):
            ws.relabel(seed)
            ev = _cited(ws, tiers) if cite == "findings" else evidence
            out.append(_record(ws, order, tiers, ev, inspect, extra_calls or [], with_findings))
    return out


def _visible_tiers(ws: SharedWorkspace, order: list[str]) -> dict[str, int]:
    """Tiers from what the prompt shows: 1 with no static finding, 2 with one, 3 with more; never better than
    the candidate ranked above. A defect the findings miss (a rename, a reformat) still orders the ranking,
    but a tier the prompt gives no reason for would teach a small judge to guess."""
    found = candidate_findings(ws, ws.labels)
    tiers: dict[str, int] = {}
    floor = 1
    for rid in order:
        floor = max(floor, min(3, 1 + len(found[ws.rollout_to_label[rid]])))
        tiers[rid] = floor
    return tiers


def _cited(ws: SharedWorkspace, tiers: dict[str, int]) -> dict[str, list[str]]:
    # The first of what the judge may cite (grader.judge.prompt.cite_options): the same choices its decoder offers.
    options = cite_options(ws, ws.labels)
    return {ws.rollout_of(lab): options[lab][:1] for lab in ws.labels if tiers.get(ws.rollout_of(lab), 1) != 1}


def _record(
    ws: SharedWorkspace,
    order: list[str],
    tiers: dict[str, int],
    evidence: dict[str, list[str]],
    inspect: bool,
    extra_calls: list[tuple[str, dict[str, Any]]],
    findings: bool = True,
) -> dict[str, Any]:
    group = ws.group
    labels = list(ws.labels)
    messages = build_initial_messages(group, ws, labels, findings=findings)
    calls: list[tuple[str, dict[str, Any]]] = [("show_diff", {"candidate": lab}) for lab in labels] if inspect else []
    calls += extra_calls
    for name, args in calls:
        messages.append({"role": "assistant", "content": format_tool_call(name, args)})
        messages.append(format_tool_result(name, run_tool(ws, name, args)))
    to_label = ws.rollout_to_label
    ranking = [to_label[r] for r in order]
    tiers_l = {to_label[r]: int(tiers[r]) for r in order}
    ev_l = {to_label[r]: [_LETTER_PREFIX.sub("", s) for s in evidence.get(r, [])] for r in order}
    problems = validate_answer(Answer(ranking, tiers_l, ev_l), labels)
    if problems:
        raise RecordError(f"{group.instance_id}: label does not make a valid answer: {'; '.join(problems)}")
    messages.append({"role": "assistant", "content": format_answer(ranking, tiers_l, ev_l)})
    return {
        "instance_id": group.instance_id,
        "messages": messages,
        "order": list(order),
        "tiers": {r: int(tiers[r]) for r in order},
        "label_to_rollout": dict(ws.label_to_rollout),
        "workspace_seed": ws.seed,
        "findings": findings,
    }


def prompt_until_answer(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's conversation without its final answer: what the model answers from in answer-step eval."""
    msgs = record["messages"]
    if not msgs or msgs[-1].get("role") != "assistant":
        raise RecordError(f"{record.get('instance_id')}: record does not end with the assistant's answer")
    return msgs[:-1]
