"""sft.tiny: the tiny random model + on-the-spot tokenizer that tests and the CPU demo use instead of a hub model."""

from __future__ import annotations

from pathlib import Path

import pytest

from sft.tiny import build_tiny_model

MESSAGES = [
    {"role": "system", "content": "You rank passing patches."},
    {"role": "user", "content": "diff --git a/calc.py b/calc.py\n+    return a + b\n"},
    {"role": "assistant", "content": '{"tool": "read_file", "args": {"path": "calc.py"}}'},
    {"role": "tool", "name": "read_file", "content": "def add(a, b):\n    return a + b\n"},
    {"role": "assistant", "content": '{"ranking": ["0", "1"], "tiers": {"0": 1, "1": 2}}'},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_loads_and_generates(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.config.model_type == "qwen2"
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert len(tok) <= model.config.vocab_size
    prompt = tok.apply_chat_template(
        MESSAGES[:2], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    assert tok.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    # Code must not tokenize byte by byte, or realistic prompts would not fit any max_length.
    code = "def parse_config(path: str) -> dict:\n    with open(path) as handle:\n        return json.load(handle)\n"
    ids = tok(code)["input_ids"]
    assert len(ids) < len(code) / 2
    assert tok.decode(ids) == code


def test_template_masks_only_assistant_turns(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    out = tok.apply_chat_template(MESSAGES, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    unmasked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert unmasked == MESSAGES[2]["content"] + "<|im_end|>" + MESSAGES[4]["content"] + "<|im_end|>"
    masked = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    for msg in MESSAGES[:2] + MESSAGES[3:4]:
        assert msg["content"] in masked
    assert "tool name=read_file" in masked


def test_cached_and_refuses_foreign_dir(tiny, tmp_path):
    before = {f: f.stat().st_mtime_ns for f in Path(tiny).rglob("*") if f.is_file()}
    assert build_tiny_model(tiny) == tiny
    # Reused, not rebuilt: every file of the model dir is untouched.
    assert before and {f: f.stat().st_mtime_ns for f in Path(tiny).rglob("*") if f.is_file()} == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_tiny_model(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_frequent_lines_become_phrases_but_never_a_prefix_of_another_line(tmp_path):
    import json

    from sft.tiny import frequent_lines

    head = "Candidates (all pass the tests): A, B"
    recs = [{"messages": [{"role": "system", "content": "You are a code-review judge, be careful.\nshort"},
                          {"role": "user", "content": head + (", C" if i % 2 else "")}]} for i in range(10)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = frequent_lines(path, share=0.3)
    assert "You are a code-review judge, be careful." in got  # in every record, long enough
    assert "short" not in got and head not in got  # too short; a prefix of `head + ", C"`


def test_corpus_tokenizer_makes_each_candidate_phrase_one_token(tmp_path):
    """A judge tokenizer (fit to a corpus) holds each letter-bearing key of the judge's format as one token, so
    a small model looks a candidate's findings count up in one hop; text still round-trips exactly."""
    import json

    from transformers import AutoTokenizer

    from grader.judge.prompt import candidate_phrases, findings_head, format_answer

    recs = [{"messages": [{"role": "user", "content": f"{findings_head('A', i % 3)}: x.py:{i}: adds debug output"},
                          {"role": "assistant", "content": format_answer(["A"], {"A": 1 + i % 3}, {})}]}
            for i in range(6)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m", vocab_size=1024, corpus=path))
    phrases = candidate_phrases()
    assert len(phrases) == len(set(phrases)) and '"C": ' in phrases and "C: two findings" in phrases
    for p in phrases:
        assert len(tok(p, add_special_tokens=False)["input_ids"]) == 1, p
    text = "B: one finding: a.py:3: x\nC: no findings\n" + format_answer(["C", "B"], {"B": 2, "C": 1}, {"B": ["a.py:3: x"]})
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    # The key and the count head arrive whole: the answer's `"B": ` and the prompt's `B: one finding`.
    pieces = [tok.decode([i]) for i in ids]
    assert "B: one finding" in pieces and '"B": ' in pieces and "C: no findings" in pieces
