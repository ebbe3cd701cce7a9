"""The judge conversation format, the LLM judge loop (valid and fallback paths), aggregation and metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_grader_util import bundled_tasks

from grader.grade import grade_groups
from grader.judge.aggregate import aggregate_tiers, agreement, borda
from grader.judge.llm import LLMJudge
from grader.judge.prompt import (
    SYSTEM_PROMPT,
    Answer,
    ParseError,
    ToolCall,
    build_initial_messages,
    format_answer,
    format_tool_call,
    format_tool_result,
    parse_assistant,
    validate_answer,
)
from grader.metrics import evaluate, kendall_tau, pairwise_accuracy, top1
from grader.records import Group, load_groups, read_jsonl
from grader.workspace import SharedWorkspace


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return bundled_tasks(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def gold(tasks) -> dict[str, list[str]]:
    return {r["instance_id"]: r["order"] for r in read_jsonl(tasks / "labels.jsonl")}


def test_system_prompt_states_the_five_criteria_and_tools():
    for phrase in ("Approach suitability", "Implementation precision", "Minimality", "No unintended side effects",
                   "Codebase conventions", "<tool_call>", "<answer>", "read_file", "grep", "compare"):
        assert phrase in SYSTEM_PROMPT


def test_format_and_parse_round_trip():
    call = format_tool_call("read_file", {"candidate": "B", "path": "x.py", "start": 3})
    assert parse_assistant("Let me look.\n" + call) == ToolCall("read_file", {"candidate": "B", "path": "x.py", "start": 3})
    ans = format_answer(["B", "A"], {"A": 2, "B": 1}, {"A": ["x.py:3: debug print"], "B": []})
    parsed = parse_assistant(ans)
    assert parsed == Answer(["B", "A"], {"B": 1, "A": 2}, {"A": ["x.py:3: debug print"]})
    assert validate_answer(parsed, ["A", "B"]) == []
    assert format_tool_result("grep", "hits") == {"role": "tool", "name": "grep", "content": "hits"}


@pytest.mark.parametrize("text, kind", [
    ('```json\n{"ranking": ["a", "b"], "tiers": {"a": "T1", "b": 2}, "evidence": {"b": "x.py:1: y"}}\n```', Answer),
    ('<tool_call>{"name": "grep", "arguments": "{\\"candidate\\": \\"A\\", \\"pattern\\": \\"x\\"}"}</tool_call>', ToolCall),
    ('{"tool": "list_candidates"}', ToolCall),
    ("<answer>{\"ranking\": [\"A\"], \"tiers\": {\"A\": 1}}", Answer),  # unclosed tag
    ("I think A is best.", ParseError),
    ("<answer>not json</answer>", ParseError),
    ('<answer>{"ranking": "A,B"}</answer>', ParseError),
])
def test_parse_is_lenient_but_not_blind(text, kind):
    assert isinstance(parse_assistant(text), kind)


def test_validate_answer_catches_each_problem():
    labels = ["A", "B", "C"]
    assert any("leaves out C" in p for p in validate_answer(Answer(["A", "B"], {"A": 1, "B": 1}, {}), labels))
    assert any("repeats A" in p for p in validate_answer(Answer(["A", "A", "B", "C"], {}, {}), labels))
    assert any("unknown candidates D" in p for p in validate_answer(Answer(["A", "B", "C", "D"], {}, {}), labels))
    full = {"A": 1, "B": 2, "C": 3}
    ev = {"B": ["x.py:1: a"], "C": ["y.py:2: b"]}
    assert validate_answer(Answer(["A", "B", "C"], full, ev), labels) == []
    assert any("no evidence" in p for p in validate_answer(Answer(["A", "B", "C"], full, {"B": ["x"]}), labels))
    assert any("must be 1, 2 or 3" in p for p in validate_answer(Answer(["A", "B", "C"], {**full, "C": 4}, ev), labels))
    assert any("improve" in p for p in validate_answer(Answer(["C", "B", "A"], full, ev), labels))


class ScriptedJudge:
    """Stands for a competent model: it reads every candidate's diff through the tools, recognises each patch,
    and answers with the known-good order. It exercises the whole valid path (tool calls, tool results, answer
    parsing and validation, letter → rollout mapping) without a real model."""

    name = "scripted"

    def __init__(self, group: Group, order: list[str]) -> None:
        self.patches = {c.rollout_id: c.patch for c in group.candidates}
        self.order = order
        self.calls = 0

    def chat(self, messages: list[dict[str, Any]], *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        self.calls += 1
        user = messages[1]["content"]
        labels = user.split("Candidates (all pass the tests): ")[1].split("\n")[0].split(", ")
        seen = {m["content"].split(" diff")[0].split()[-1]: m["content"] for m in messages if m["role"] == "tool"}
        for lab in labels:
            if lab not in seen:
                return f"I will read {lab}.\n" + format_tool_call("show_diff", {"candidate": lab})
        identity = {}
        for lab, text in seen.items():
            body = text.split("\n", 1)[1]
            identity[lab] = next(r for r, p in self.patches.items() if p.strip().splitlines()[:6] == body.splitlines()[:6]
                                 and len(body) >= min(len(p.strip()), 5000) - 5)
        by_rollout = {r: lab for lab, r in identity.items()}
        ranking = [by_rollout[r] for r in self.order]
        tiers = {lab: (1 if i == 0 else 2 if i == 1 else 3) for i, lab in enumerate(ranking)}
        evidence = {lab: [f"file.py:{i}: worse than {ranking[0]}"] for i, lab in enumerate(ranking) if tiers[lab] > 1}
        return "Done.\n" + format_answer(ranking, tiers, evidence)


def test_llm_judge_valid_path_with_a_scripted_model(tasks, gold):
    groups = load_groups(tasks / "groups.jsonl")
    for g in groups:
        backend = ScriptedJudge(g, gold[g.instance_id])
        res = LLMJudge(backend, max_turns=8).grade(g, tasks / "repos", permutations=3)
        assert res.ranking == gold[g.instance_id]
        assert not res.fallback and res.judge == "llm:scripted"
        assert res.agreement == 1.0
        assert res.tiers[res.ranking[0]] == 1 and res.tiers[res.ranking[-1]] == 3
        assert res.weights[res.ranking[0]] == 1.0 and res.weights[res.ranking[-1]] < res.weights[res.ranking[0]]
        assert all(res.evidence[r] for r in res.ranking[1:])
        assert backend.calls == 3 * (len(g.candidates) + 1)  # one show_diff per candidate + answer, per permutation


def test_judge_retries_once_then_falls_back(tasks):
    g = load_groups(tasks / "groups.jsonl")[0]

    class Stubborn:
        """Stands for a model that keeps answering with an incomplete ranking."""
        name = "stubborn"
        calls = 0

        def chat(self, messages, *, max_new_tokens=512, temperature=0.0):
            self.calls += 1
            return '<answer>{"ranking": ["A"], "tiers": {"A": 1}}</answer>'

    b = Stubborn()
    res = LLMJudge(b).grade(g, tasks / "repos")
    assert b.calls == 2 and res.fallback and res.judge == "llm:stubborn"
    assert "leaves out" in res.notes[0]
    assert res.ranking[0] == "minimal"  # the heuristic's ranking stands in


def test_turn_budget_ends_the_loop(tasks):
    g = load_groups(tasks / "groups.jsonl")[0]

    class Explorer:
        name = "explorer"
        calls = 0

        def chat(self, messages, *, max_new_tokens=512, temperature=0.0):
            self.calls += 1
            return format_tool_call("list_candidates", {})

    b = Explorer()
    res = LLMJudge(b, max_turns=3).grade(g, tasks / "repos")
    assert res.fallback and b.calls == 4  # 3 tool turns + the final "answer now" turn


def test_llm_judge_end_to_end_with_a_tiny_random_model(tasks, tmp_path_factory):
    """An untrained (random-weight) model's reply is almost never a valid answer: the run must end in the
    heuristic fallback. A trained judge answers for itself: tests/test_sft_judge.py."""
    from inference.hf import TransformersBackend
    from sft.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-judge")
    backend = TransformersBackend(str(model_dir))
    groups = load_groups(tasks / "groups.jsonl")[:1]
    [res] = grade_groups(groups, tasks / "repos", judge="llm", backend=backend, max_new_tokens=24, max_turns=2,
                         answer_grammar=False)  # with the grammar it answers: tests/test_grader_grammar.py
    assert res.judge.startswith("llm:") and res.fallback
    assert sorted(res.ranking) == sorted(c.rollout_id for c in groups[0].candidates)
    assert set(res.weights) == set(res.ranking)
    with SharedWorkspace(groups[0], tasks / "repos") as ws:
        msgs = build_initial_messages(groups[0], ws, ws.labels)
        text = backend.chat(msgs + [{"role": "assistant", "content": format_tool_call("grep", {"candidate": "A"})},
                                    format_tool_result("grep", "x.py:1: y")], max_new_tokens=8)
        assert isinstance(text, str)  # tool-role messages go through the template


def test_borda_agreement_and_tiers():
    assert borda([["a", "b", "c"], ["b", "a", "c"], ["a", "c", "b"]]) == ["a", "b", "c"]
    assert agreement([["a", "b", "c"]] * 3) == 1.0
    assert agreement([["a", "b", "c"], ["c", "b", "a"]]) == 0.0
    assert aggregate_tiers([{"a": 2, "b": 1}, {"a": 2, "b": 3}, {"a": 1, "b": 1}], ["a", "b"]) == {"a": 2, "b": 2}


def test_metrics():
    gold = ["m", "g", "b", "u"]
    assert top1(gold, gold) and not top1(["g", "m", "b", "u"], gold)
    assert kendall_tau(gold, gold) == 1.0 and kendall_tau(gold[::-1], gold) == -1.0
    assert pairwise_accuracy(["g", "m", "b", "u"], gold) == pytest.approx(5 / 6)
    assert kendall_tau(["g", "m", "b", "u", "extra"], gold) == pytest.approx(4 / 6)
    m = evaluate({"i1": gold, "i2": gold[::-1]}, {"i1": gold, "i2": gold, "i3": gold})
    assert m["instances"] == 3 and m["graded"] == 2
    assert m["top1"] == pytest.approx(1 / 3) and m["kendall_tau"] == pytest.approx(0.0)
    json.dumps(m)


def test_transformers_backend_loads_a_peft_adapter(tmp_path_factory):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from inference.backends import make_backend
    from inference.hf import TransformersBackend
    from sft.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-judge")
    adapter = tmp_path_factory.mktemp("adapter")
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                                LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    peft_model.save_pretrained(adapter)
    backend = make_backend("transformers", str(model_dir), adapter=str(adapter))
    assert isinstance(backend, TransformersBackend) and backend.name == f"{model_dir.name}+{adapter.name}"
    assert isinstance(backend.model, PeftModel)
    assert isinstance(backend.chat([{"role": "user", "content": "hi"}], max_new_tokens=3), str)
    with pytest.raises(ValueError, match="--model"):
        make_backend("transformers", None)


def test_vllm_backend_explains_a_missing_vllm(monkeypatch):
    """A machine without vLLM (another environment, a partial install): the error says how to get it."""
    from inference.backends import make_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError, match="make venv"):
        make_backend("vllm", "some/model")


def test_permutations_expose_a_position_biased_model(tasks):
    """Stands for a model that always prefers the first letters: shuffling the letters per permutation turns
    its bias into disagreement between runs, which the grading reports."""
    g = load_groups(tasks / "groups.jsonl")[0]

    class Biased:
        name = "biased"

        def chat(self, messages, *, max_new_tokens=512, temperature=0.0):
            labels = messages[1]["content"].split("Candidates (all pass the tests): ")[1].split("\n")[0].split(", ")
            return format_answer(labels, {lab: 1 for lab in labels}, {})

    res = LLMJudge(Biased()).grade(g, tasks / "repos", permutations=4)
    assert not res.fallback and res.agreement is not None and res.agreement < 1.0
    assert sorted(res.ranking) == sorted(c.rollout_id for c in g.candidates)
    single = LLMJudge(Biased()).grade(g, tasks / "repos", permutations=1)
    assert single.agreement is None


@given(st.permutations(list("abcdef")), st.permutations(list("abcdef")))
def test_tau_and_pairwise_accuracy_agree(pred, gold):
    assert kendall_tau(pred, gold) == pytest.approx(2 * pairwise_accuracy(pred, gold) - 1)
    assert borda([pred]) == list(pred)
