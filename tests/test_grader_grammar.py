"""Answers decoded in the answer grammar (grader/judge/grammar.py) and the scoring they choose by (inference/hf.py)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grader_util import bundled_tasks

from grader.grade import grade_groups
from grader.judge.grammar import answer_program, decode_answers
from grader.judge.prompt import (
    build_initial_messages,
    cite_options,
    format_answer,
    parse_assistant,
    validate_answer,
)
from grader.records import load_groups
from grader.workspace import SharedWorkspace
from inference.base import BackendError

LETTERS = "ABCDEFGH"
cite_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(str.strip)


def _run(labels, cites, pick):
    """Drive one program with `pick(choice) -> index`; returns the answer and every choice seen."""
    prog, seen = answer_program(labels, cites), []
    try:
        choice = next(prog)
        while True:
            seen.append(choice)
            choice = prog.send(pick(choice))
    except StopIteration as stop:
        return stop.value, seen


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 8), seed=st.integers(0, 10**6), data=st.data())
def test_every_path_through_the_grammar_is_a_valid_answer(n, seed, data):
    labels = list(LETTERS[:n])
    random.Random(seed).shuffle(labels)
    cites = {lab: data.draw(st.lists(cite_text, min_size=1, max_size=4)) for lab in labels}
    rng = random.Random(seed)
    ans, seen = _run(labels, cites, lambda c: rng.randrange(len(c.options)))
    assert validate_answer(ans, labels) == []
    text = format_answer(ans.ranking, ans.tiers, ans.evidence)
    parsed = parse_assistant(text)  # what the judge reads back is what was decoded (quotes, unicode, escapes)
    assert (parsed.ranking, parsed.tiers, parsed.evidence) == (ans.ranking, ans.tiers, ans.evidence)
    for c in seen:
        assert text.startswith(c.prefix) and len(c.options) >= 2
        assert any(text[len(c.prefix):].startswith(o) for o in c.options)


def test_the_scorer_decides_every_choice():
    # Stands in for a model: always the last option (worst tier, last cite, last allowed letter), or the first.
    labels, cites = ["C", "A", "B"], {"A": ["a.py:1: x"], "B": ["b.py:2: y", "b.py:9: z"], "C": ["c.py:3: \"q\""]}
    ans, seen = _run(labels, cites, lambda c: len(c.options) - 1)
    assert len(seen) == 3 + 1 + 2  # a tier per letter, B's cite, two ranking picks within tier 3
    assert ans.tiers == {"A": 3, "B": 3, "C": 3} and ans.ranking == ["C", "B", "A"]
    assert ans.evidence == {"A": ["a.py:1: x"], "B": ["b.py:9: z"], "C": ['c.py:3: "q"']}
    ans, seen = _run(labels, cites, lambda c: 0)
    assert ans.ranking == ["A", "B", "C"] and ans.tiers == {"A": 1, "B": 1, "C": 1} and ans.evidence == {}
    assert len(seen) == 3 + 2


def test_the_ranking_follows_the_tiers_the_model_wrote():
    cites = {k: ["f.py:1: x"] for k in "ABCD"}
    want = {"A": 3, "B": 1, "C": 2, "D": 1}

    def pick(c):  # stands in for a model sure of each tier, indifferent to the order within a tier
        if c.prefix.endswith('": ') and '"ranking"' not in c.prefix:
            return want[c.prefix[-4]] - 1
        return len(c.options) - 1

    ans, seen = _run(list("ABCD"), cites, pick)
    assert ans.tiers == want and ans.ranking == ["D", "B", "C", "A"]
    assert [len(c.options) for c in seen if '"ranking"' in c.prefix] == [2]  # only B/D were open to choice


def test_a_candidate_without_cites_is_refused():
    with pytest.raises(ValueError, match="no evidence to cite for B"):
        next(answer_program(["A", "B"], {"A": ["x"], "B": []}))


def test_decode_answers_batches_steps_and_keeps_errors_in_place():
    calls = []

    def score(reqs):
        calls.append(len(reqs))
        return [BackendError("too long") if msgs == "bad" else [-float(i) for i in range(len(opts))]
                for msgs, _, opts in reqs]

    reqs = [("ok", ["A", "B"], {"A": ["x"], "B": ["y"]}), ("bad", ["A", "B"], {"A": ["x"], "B": ["y"]}),
            ("ok", ["A", "B", "C", "D"], {k: ["e"] for k in "ABCD"})]
    out = decode_answers(reqs, score)
    assert isinstance(out[1], BackendError)
    assert out[0].ranking == ["A", "B"] and out[2].ranking == ["A", "B", "C", "D"]
    assert calls[0] == 3 and len(calls) < 3 * 8  # all requests share each step's call


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return bundled_tasks(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from inference.hf import TransformersBackend
    from sft.tiny import build_tiny_model

    return TransformersBackend(str(build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-judge")), batch_size=3)


def test_scores_are_the_models_log_probabilities_of_each_whole_text(backend, tasks):
    """Left-padded batched scores equal an unpadded forward over each full text (positions and masks right)."""
    import torch

    group = load_groups(tasks / "groups.jsonl")[0]
    with SharedWorkspace(group, tasks / "repos") as ws:
        msgs = build_initial_messages(group, ws, ws.labels)
    short = [{"role": "user", "content": "hi"}]
    reqs = [(msgs, '<answer>{"ranking": [', ['"A", ', '"B", ', '"C"], ']), (short, "x", ["1", "22 22", "ü"])]
    got = backend.score_continuations(reqs)
    tok, model = backend.tokenizer, backend.model
    for (m, prefix, options), scores in zip(reqs, got, strict=True):
        head = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        full = [tok(head + prefix + o, add_special_tokens=False)["input_ids"] for o in options]
        with torch.no_grad():
            whole = []
            for ids in full:
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
                whole.append(float(logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).sum()))
        # Each score is log P(text) minus the shared part's log P: differences between options must agree.
        diffs_got = [s - scores[0] for s in scores]
        diffs_ref = [w - whole[0] for w in whole]
        assert diffs_got == pytest.approx(diffs_ref, abs=5e-3)  # padded vs unpadded kernels differ slightly


def test_a_random_model_answers_in_the_grammar_and_the_free_mode_still_falls_back(backend, tasks):
    groups = load_groups(tasks / "groups.jsonl")[:3]
    stats: Counter[str] = Counter()
    graded = grade_groups(groups, tasks / "repos", judge="llm", backend=backend, max_new_tokens=16, max_turns=2,
                          stats=stats)
    assert stats["grammar_answers"] == stats["runs"] == len(groups)  # a random model's free reply is unusable
    for g, res in zip(groups, graded, strict=True):
        assert not res.fallback and sorted(res.ranking) == sorted(c.rollout_id for c in g.candidates)
        assert set(res.tiers) == set(res.ranking)
    with SharedWorkspace(groups[0], tasks / "repos") as ws:
        offered = {c for cs in cite_options(ws, ws.labels).values() for c in cs}
    cited = {e.split("] ", 1)[1] for evs in graded[0].evidence.values() for e in evs if e.startswith("[as cand")}
    assert cited <= offered  # the evidence is what the prompt showed, never invented text
    [free] = grade_groups(groups[:1], tasks / "repos", judge="llm", backend=backend, max_new_tokens=16,
                          max_turns=2, answer_grammar=False)
    assert free.fallback
