"""The scoring judge (grader.judge.scoring): pair prompts, both-order averaging, ranking, the combined rule, fallbacks.

The model here is a stand-in object with a `score_continuations` method that reads the prompt (plumbing: it checks
what the judge does with the probabilities, not what a model learns); the real backends' scoring is checked in
test_grader_grammar.py and test_sft_scoring.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader.grade import grade_groups
from grader.heuristic import rank_workspace
from grader.judge.scoring import (
    ANSWERS,
    ScoringJudge,
    pair_messages,
    prefer_first,
    rank_verdicts,
    rollout_findings,
)
from grader.records import Group, load_groups, tier_weights
from grader.workspace import SharedWorkspace
from inference.base import BackendError
from sandbox.patchcheck import diff_size


def _own_lines(prompt: str, lab: str) -> int:
    """Changed lines the view shows as `lab`'s own (what the pair prompt puts under `A:` / `B:`)."""
    body = prompt.split("other changes:\n" if "other changes:\n" in prompt else "changes:\n", 1)[1]
    body = body.split("\n\nStatic findings", 1)[0]
    sections = {}
    current = None
    for line in body.splitlines():
        if line in ("A:", "B:") or line.startswith(("A: ", "B: ")):
            current = line[0]
            sections[current] = 0
        elif current and line.lstrip()[:1].isdigit() or (current and line.strip().startswith(("+", "-"))):
            sections[current] += 1
    return sections.get(lab, 0)


class SizeLover:
    """Prefers the candidate that shows more changed lines of its own (the opposite of the heuristic's prior)."""

    name = "size-lover"

    def __init__(self) -> None:
        self.requests = 0

    def score_continuations(self, requests):
        out = []
        for msgs, prefix, options in requests:
            assert prefix == "" and options == list(ANSWERS)
            self.requests += 1
            a, b = _own_lines(msgs[-1]["content"], "A"), _own_lines(msgs[-1]["content"], "B")
            p = 0.8 if a > b else 0.2 if a < b else 0.5
            out.append([math.log(p), math.log(1 - p)])
        return out


class AlwaysA:
    """A model that only ever prefers the first position."""

    name = "always-a"

    def score_continuations(self, requests):
        return [[math.log(0.9), math.log(0.1)] for _ in requests]


class Broken:
    name = "broken"

    def score_continuations(self, requests):
        return [BackendError("context overflow") for _ in requests]


@pytest.fixture(scope="module")
def tasks(bundled_tasks: Path) -> tuple[list[Group], Path]:
    return load_groups(bundled_tasks / "groups.jsonl"), bundled_tasks / "repos"


@given(st.floats(-50, 50), st.floats(-50, 50))
def test_the_pair_probability_is_the_renormalised_answer_and_swapping_answers_complements_it(a, b):
    p = prefer_first([a, b])
    assert 0.0 <= p <= 1.0
    assert p + prefer_first([b, a]) == pytest.approx(1.0)
    assert (p > 0.5) == (a > b) or a == b or abs(a - b) < 1e-12
    assert prefer_first([-1e6, 0.0]) == pytest.approx(0.0) and prefer_first([0.0, -1e6]) == pytest.approx(1.0)


def test_the_pair_prompt_shows_the_first_as_a_and_leaves_the_workspace_letters_alone(tasks):
    groups, repos = tasks
    group = groups[0]
    with SharedWorkspace(group, repos, seed=3) as ws:
        before = dict(ws.label_to_rollout)
        big, small = "bloated", "minimal"
        shown = rollout_findings(ws)
        ab = pair_messages(ws, big, small, shown)[-1]["content"]
        ba = pair_messages(ws, small, big, shown)[-1]["content"]
        assert ws.label_to_rollout == before and ws.seed == 3
    assert _own_lines(ab, "A") == _own_lines(ba, "B") > _own_lines(ab, "B") == _own_lines(ba, "A")
    # each candidate's findings follow it to its letter
    head_a = next(ln for ln in ab.splitlines() if ln.startswith("A: ") and "finding" in ln)
    head_b = next(ln for ln in ba.splitlines() if ln.startswith("B: ") and "finding" in ln)
    assert head_a[1:] == head_b[1:]
    assert ab.rstrip().endswith("Which candidate is better, A or B?")


def test_a_position_bias_cancels_out_and_the_heuristic_breaks_the_ties(tasks):
    groups, repos = tasks
    judge = ScoringJudge(AlwaysA())
    with SharedWorkspace(groups[1], repos) as ws:
        [g] = judge.grade_workspaces([ws])
        heuristic = rank_workspace(ws)
    assert g.ranking == heuristic.ranking and not g.fallback
    assert set(g.tiers.values()) == {1}  # P = 0.5 against the best: no confident verdict demotes anyone


def test_the_scorer_ranks_by_the_model_and_the_combined_rule_by_its_confidence(tasks):
    groups, repos = tasks
    group = next(g for g in groups if len(g.candidates) == 4)
    size = {c.rollout_id: diff_size(c.patch)[0] for c in group.candidates}
    model = SizeLover()
    judges = {c: ScoringJudge(model, combine="confident", confidence=c) for c in (0.25, 0.35, 0.5)}
    scorer = ScoringJudge(model)
    with SharedWorkspace(group, repos) as ws:
        [v] = scorer.verdicts([ws])
        heuristic = rank_workspace(ws)
        by_score = scorer.grading(ws, v)
        combined = {c: j.grading(ws, v) for c, j in judges.items()}
    n = len(group.candidates)
    assert model.requests == n * (n - 1)  # every pair, both orders
    assert by_score.ranking[0] == max(size, key=size.get)  # the model's preference, not the heuristic's
    assert by_score.ranking != heuristic.ranking
    assert combined[0.25].ranking == by_score.ranking  # |0.8 - 0.5| >= 0.25: every verdict is confident
    assert combined[0.35].ranking == combined[0.5].ranking == heuristic.ranking
    assert rank_verdicts(v, None)[0] == by_score.ranking
    for g in (by_score, *combined.values()):
        assert sorted(g.ranking) == sorted(size)
        assert g.weights == tier_weights(g.tiers)
        tiers = [g.tiers[r] for r in g.ranking]
        assert tiers == sorted(tiers) and tiers[0] == 1
        assert all(g.evidence[r] for r in g.ranking[1:])  # each candidate below the best says why


def test_unscorable_pairs_fall_back_to_the_heuristic(tasks):
    groups, repos = tasks
    with SharedWorkspace(groups[0], repos) as ws:
        [g] = ScoringJudge(Broken()).grade_workspaces([ws])
        heuristic = rank_workspace(ws)
    assert g.fallback and g.ranking == heuristic.ranking and "context overflow" in g.notes[0]


def test_grade_groups_scores_and_static_hack_verdicts_still_win(tasks):
    groups, repos = tasks
    group = next(g for g in groups if "hack-special-case" in {c.rollout_id for c in g.candidates})
    [g] = grade_groups([group], repos, judge="score", backend=SizeLover())
    assert g.judge == "score:size-lover" and not g.fallback
    assert g.hacks.get("hack-special-case") == "special_casing" and g.ranking[-1] == "hack-special-case"
    [c] = grade_groups([group], repos, judge="combined", backend=SizeLover(), confidence=0.5)
    assert c.judge.startswith("combined:size-lover")


def test_a_backend_without_scores_and_a_combined_judge_without_confidence_are_refused():
    class ChatOnly:
        name = "chat"

        def chat(self, messages, **kw):
            return ""

    with pytest.raises(ValueError, match="cannot score continuations"):
        ScoringJudge(ChatOnly())
    with pytest.raises(ValueError, match="confidence"):
        ScoringJudge(SizeLover(), combine="confident")
    with pytest.raises(ValueError, match="confidence"):
        ScoringJudge(SizeLover(), combine="confident", confidence=0.7)
