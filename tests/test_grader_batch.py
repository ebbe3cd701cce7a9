"""Batched judging: many groups and their K permutations advance together, one model batch per turn, with the
same gradings as one conversation at a time; the transformers backend's left-padded batches answer exactly as
single calls do."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_grader_util import bundled_tasks

from grader.grade import grade_groups
from grader.judge.prompt import format_answer, format_tool_call
from grader.records import load_groups
from inference.base import BackendError


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return bundled_tasks(tmp_path_factory.getbasetemp())


class Batching:
    """Stands for a batched engine: answers by diff size after one list_candidates call; records batch sizes."""

    name = "batching"

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[int] = []
        self.fail_on = fail_on

    def _one(self, messages):
        user = messages[1]["content"]
        if self.fail_on and self.fail_on in user:
            return BackendError("context overflow (test)")
        if messages[-1]["role"] != "tool":
            return format_tool_call("list_candidates", {})
        rows = [ln for ln in messages[-1]["content"].splitlines() if ln[:1].isupper() and ": " in ln]
        size = {ln.split(":")[0]: int(ln.split("+")[1].split()[0]) for ln in rows}
        ranking = sorted(size, key=lambda lab: (size[lab], lab))
        tiers = {lab: 1 if i == 0 else 2 for i, lab in enumerate(ranking)}
        return format_answer(ranking, tiers, {lab: [f"x.py:1: +{size[lab]} lines"] for lab in ranking[1:]})

    def chat(self, messages, *, max_new_tokens=512, temperature=0.0):
        r = self._one(messages)
        if isinstance(r, BackendError):
            raise r
        return r

    def chat_batch(self, conversations, *, max_new_tokens=512, temperature=0.0):
        self.batches.append(len(conversations))
        return [self._one(m) for m in conversations]


def test_groups_and_permutations_share_batches(tasks):
    groups = load_groups(tasks / "groups.jsonl")[:4]
    batched = Batching()
    together = grade_groups(groups, tasks / "repos", judge="llm", backend=batched, permutations=3, batch_groups=4)
    # Two turns (a tool call, then the answer) for 4 groups x 3 permutations: two model batches of 12.
    assert batched.batches == [12, 12]
    single = Batching()
    alone = grade_groups(groups, tasks / "repos", judge="llm", backend=single, permutations=3, batch_groups=1)
    assert single.batches == [3, 3] * 4
    assert [g.to_dict() for g in together] == [g.to_dict() for g in alone]
    assert all(not g.fallback and g.agreement is not None for g in together)


def test_one_failing_conversation_does_not_fail_the_batch(tasks):
    groups = load_groups(tasks / "groups.jsonl")[:3]
    victim = groups[1].problem_statement.strip().splitlines()[0]
    res = grade_groups(groups, tasks / "repos", judge="llm", backend=Batching(fail_on=victim), batch_groups=3)
    assert [g.fallback for g in res] == [False, True, False]
    assert "context overflow" in res[1].notes[0]


def test_backends_without_chat_batch_still_work(tasks):
    class Plain(Batching):
        chat_batch = None  # a backend with only `chat`: called once per conversation

    res = grade_groups(load_groups(tasks / "groups.jsonl")[:2], tasks / "repos", judge="llm", backend=Plain(),
                       batch_groups=2)
    assert all(not g.fallback for g in res)


def test_transformers_batch_equals_single_calls(tmp_path_factory):
    from inference.hf import TransformersBackend
    from sft.tiny import build_tiny_model

    backend = TransformersBackend(str(build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-judge")))
    convs = [[{"role": "system", "content": "Rank."}, {"role": "user", "content": "A: +1 -0" + " x" * n}]
             for n in (0, 7, 30)]
    batch = backend.chat_batch(convs, max_new_tokens=6)
    assert batch == [backend.chat(c, max_new_tokens=6) for c in convs]  # left padding changes nothing (greedy)
    too_long = [{"role": "user", "content": "word " * 9000}]
    out = backend.chat_batch([convs[0], too_long], max_new_tokens=6)
    assert out[0] == batch[0] and isinstance(out[1], BackendError)
