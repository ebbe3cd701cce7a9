"""Edit formats of the single-turn policy (`trainer.agent.edits`): whatever the format, the answer becomes the unified
diff the sandbox applies, or a format error — never a different patch — and the diff-format parser's two fixed
defects (a hunk cut at its declared counts; a ```python block before the ```diff block)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from unidiff import PatchSet

from trainer.agent.edits import (
    Region,
    as_answer,
    changed_line,
    find_region,
    ideal_answer,
    make_diff,
    patched,
    shown,
    to_patch,
)
from trainer.agent.format import FormatError, extract_diff, recount_hunks

SRC = '''import os


class Box:
    def size(self, items):
        total = 0
        for x in items:
            if x > 0:
                total += x
        return total


def helper(a, b):
    return a - b
'''
FIXED = SRC.replace("return a - b", "return a + b")


def _region(text: str = SRC, line: int = 14) -> Region:
    return find_region("pkg/m.py", text, line, max_lines=30, max_chars=2000)


def _git_apply(tmp: Path, text: str, patch: str) -> str:
    """What `git apply` makes of `patch` on a file holding `text` (a scratch repository of the test's own)."""
    repo = tmp / "r"
    (repo / "pkg").mkdir(parents=True, exist_ok=True)
    (repo / "pkg" / "m.py").write_text(text)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (tmp / "p.diff").write_text(patch)
    subprocess.run(["git", "-C", str(repo), "apply", str(tmp / "p.diff")], check=True, capture_output=True)
    return (repo / "pkg" / "m.py").read_text()


# ── the two defects of the diff format (each fails on the code before the fix) ────────────────────────────────
def test_recount_never_cuts_a_hunk_at_its_declared_counts() -> None:
    """`@@ -2,3 +2,2 @@` over 2 context lines, `-old`, `+new`: the old rule ended the hunk once the declared
    counts were reached, dropping `+new` — a bare deletion the policy never wrote, which applies and can pass."""
    head = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n"
    patch = head + "@@ -2,3 +2,2 @@\n a\n b\n-old\n+new\n"
    fixed = recount_hunks(patch)
    assert fixed == head + "@@ -2,3 +2,3 @@\n a\n b\n-old\n+new\n"
    (hunk,) = PatchSet(fixed)[0]
    assert [str(x) for x in hunk if x.is_added] == ["+new\n"]


def test_extract_diff_finds_the_diff_block_after_a_python_block() -> None:
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    text = "The bug:\n```python\nx = a\n```\nThe fix:\n```diff\n" + diff + "```\n"
    assert extract_diff(text) == diff
    # an untagged block holding the diff is found too, and prose around it is ignored
    assert extract_diff("```python\nx = a\n```\n```\n" + diff + "```\nDone.") == diff


# ── function format ───────────────────────────────────────────────────────────────────────────────────────────
def test_region_is_the_innermost_function_or_a_window_of_it() -> None:
    r = _region(line=14)
    assert (r.start, r.end, r.function) == (13, 14, "helper")
    assert shown(r) == "def helper(a, b):\n    return a - b\n"
    m = _region(line=9)
    assert (m.start, m.end, m.function) == (5, 10, "size") and shown(m).startswith("def size(self, items):\n")
    w = find_region("pkg/m.py", SRC, 8, max_lines=3, max_chars=2000)
    assert (w.start, w.end, w.function) == (7, 9, None)  # a window of the function, centred on the line


def test_function_answer_becomes_the_diff_git_applies(tmp_path: Path) -> None:
    r = _region(line=14)
    patch = to_patch("function", "Fixed:\n```python\ndef helper(a, b):\n    return a + b\n```\n", r)
    assert patch == make_diff("pkg/m.py", SRC, FIXED)
    assert _git_apply(tmp_path, SRC, patch) == FIXED
    # a method, answered dedented as shown, is put back at its class's indentation
    m = _region(line=9)
    answer = "```python\n" + shown(m).replace("if x > 0:", "if x >= 0:") + "```"
    assert _git_apply(tmp_path / "b", SRC, to_patch("function", answer, m)) == SRC.replace("x > 0", "x >= 0")
    # the same code back: no change, an empty patch (the sandbox's empty_patch), not a format error
    assert to_patch("function", "```python\n" + shown(r) + "```", r) == ""


@pytest.mark.parametrize("answer, why", [
    ("return a + b", "no ```python block"),
    ("```python\ndef helper(a, b):\n    return (a +\n```", "does not parse"),
    ("```python\ndef other(a, b):\n    return a + b\n```", "whole function `helper`"),
    ("```python\nreturn a + b\n```", "whole function `helper`"),
    ("```python\n```", "empty"),
])
def test_function_answers_that_do_not_parse_are_format_errors(answer: str, why: str) -> None:
    out = to_patch("function", answer, _region(line=14))
    assert isinstance(out, FormatError) and why in out.message


# ── search/replace format ─────────────────────────────────────────────────────────────────────────────────────
def test_search_replace_blocks_become_the_diff(tmp_path: Path) -> None:
    r = _region(line=14)
    answer = "pkg/m.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```"
    patch = to_patch("search_replace", answer, r)
    assert patch == make_diff("pkg/m.py", SRC, FIXED) and _git_apply(tmp_path, SRC, patch) == FIXED
    other = "pkg/o.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n"
    both = to_patch("search_replace", answer + "\n" + other, r, {"pkg/o.py": "x = 1\n"}.get)
    assert [f.path for f in PatchSet(both)] == ["pkg/m.py", "pkg/o.py"]


@pytest.mark.parametrize("answer, why", [
    ("return a + b", "no <<<<<<< SEARCH"),
    ("<<<<<<< SEARCH\n    return a * b\n=======\n    return a + b\n>>>>>>> REPLACE", "not in pkg/m.py"),
    ("pkg/o.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE", "not unique in pkg/o.py (2 places)"),
    ("<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE", "empty"),
    ("nope.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE", "no file nope.py"),
])
def test_search_replace_answers_that_do_not_match_are_format_errors(answer: str, why: str) -> None:
    out = to_patch("search_replace", answer, _region(line=14), {"pkg/o.py": "x = 1\nx = 1\n"}.get)
    assert isinstance(out, FormatError) and why in out.message, out


def test_diff_answers_are_checked_by_unidiff() -> None:
    assert isinstance(to_patch("diff", "I would change the return.", None), FormatError)
    good = make_diff("pkg/m.py", SRC, FIXED)
    assert to_patch("diff", f"```diff\n{good}```", None) == good


def test_changed_line_is_the_first_line_a_patch_changes() -> None:
    assert changed_line(make_diff("pkg/m.py", SRC, FIXED), "pkg/m.py") == 14
    inserted = SRC.replace("        return total\n", "        total = abs(total)\n        return total\n")
    assert changed_line(make_diff("pkg/m.py", SRC, inserted), "pkg/m.py") == 9  # the line it follows
    assert changed_line(make_diff("pkg/m.py", SRC, FIXED), "other.py") is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["    x = 1", "    y = x", "", "    return y", "    if x:", "        x -= 1"]),
                min_size=1, max_size=12),
       st.integers(0, 11), st.sampled_from(["diff", "function", "search_replace"]), st.booleans())
def test_ideal_answers_round_trip_to_the_same_diff(body: list[str], k: int, fmt: str, eol: bool) -> None:
    """For any function and any one-line edit of it, the answer the warm start teaches (`ideal_answer`) parses
    back, in every format, to exactly the diff between the two files (the last line with or without newline)."""
    old = "import os\n\ndef f(x):\n" + "\n".join(body) + ("\n" if eol else "")
    lines = old.splitlines(keepends=True)
    code = [i for i in range(3, len(lines)) if lines[i].strip()]
    assume(code)  # a one-line edit of a line of code (an edit of a blank line at a window's edge is ambiguous)
    at = code[k % len(code)]
    lines[at] = "    z = 0\n" if lines[at].endswith("\n") else "    z = 0"
    new = "".join(lines)
    region = find_region("pkg/m.py", old, at + 1, max_lines=30, max_chars=2000)
    answer = ideal_answer(fmt, region, new)
    patch = to_patch(fmt, answer, region)
    if fmt == "function" and isinstance(patch, FormatError):
        assert "does not parse" in patch.message  # e.g. an `if x:` left without a body: not valid Python
        return
    assert patch == make_diff("pkg/m.py", old, new)
    assert patched(old, patch, "pkg/m.py") == new  # and the diff, applied, gives the new file back


def test_patched_applies_a_reference_fix_exactly() -> None:
    inserted = SRC.replace("        return total\n", "        total = abs(total)\n        return total\n")
    for new in (FIXED, inserted, SRC.replace("import os\n", "")):
        assert patched(SRC, make_diff("pkg/m.py", SRC, new), "pkg/m.py") == new
    assert patched(SRC.replace("a - b", "a * b"), make_diff("pkg/m.py", SRC, FIXED), "pkg/m.py") is None


def test_as_answer_writes_a_patch_in_the_region_formats_only_when_it_fits() -> None:
    r = _region(line=14)
    patch = make_diff("pkg/m.py", SRC, FIXED)
    assert as_answer("function", r, patch) == "```python\ndef helper(a, b):\n    return a + b\n```"
    # one line of context around the change (more where that is not unique in the file)
    assert as_answer("search_replace", r, patch) == ("pkg/m.py\n<<<<<<< SEARCH\ndef helper(a, b):\n    return a - b\n"
                                                     "=======\ndef helper(a, b):\n    return a + b\n>>>>>>> REPLACE")
    outside = make_diff("pkg/m.py", SRC, SRC.replace("import os", "import sys"))
    assert as_answer("function", r, outside) is None  # the prompt does not show that line
    assert as_answer("function", r, patch.replace("pkg/m.py", "pkg/n.py")) is None  # another file


class _Answers:
    """Test stand-in for the policy: answers the i-th prompt of a call with the i-th scripted text."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tok, self.texts = tokenizer, texts

    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, stop=None):
        from inference.base import Sample

        return [Sample(self.tok(t, add_special_tokens=False)["input_ids"], t, "stop") for t in self.texts]


@pytest.mark.docker
@pytest.mark.parametrize("fmt", ["function", "search_replace"])
def test_single_turn_region_answers_are_graded_as_their_diff(fmt, tmp_path_factory) -> None:
    """The real path on a bundled task: the prompt shows the code around the fix (here a module-level window,
    no function), the reference fix written in the format becomes a diff the sandbox resolves, and an answer that
    does not parse is a format error with an empty patch (the sandbox's empty_patch: reward 0)."""
    from trainer_fixtures import CONFIG, bundled_tasks, model_cache

    from sandbox.config import SandboxConfig
    from sandbox.records import Instance, Prediction
    from sandbox.run import evaluate_predictions
    from trainer.agent import run_single_turn
    from trainer.agent.prompts import single_turn_prompt
    from trainer.config import load_config
    from trainer.policy import base_model_path, load_tokenizer

    tasks = bundled_tasks(tmp_path_factory)
    tok = load_tokenizer(base_model_path(load_config(CONFIG, [f"model.cache_dir={model_cache(tmp_path_factory)}"]).model))
    rows = [Instance.from_dict(json.loads(x)) for x in (tasks / "instances.jsonl").read_text().splitlines()]
    inst = next(i for i in rows if i.instance_id == "acme__durations-42")
    prompt = single_turn_prompt(inst, tasks / "repos", 1200, fmt, 30)
    assert prompt.region is not None and "_TOKEN = re.compile" in prompt.messages[1]["content"]
    gold = as_answer(fmt, prompt.region, inst.patch)
    assert gold is not None
    trajs = run_single_turn([(inst, "gold"), (inst, "bad")], _Answers(tok, [gold, "I am not sure."]), tok,
                            repos_dir=tasks / "repos", max_context_chars=1200, max_new_tokens=64, temperature=1.0,
                            edit_format=fmt, max_region_lines=30)
    assert trajs[0].format_error is None and trajs[1].format_error and trajs[1].patch == ""
    cfg = SandboxConfig(repos_dir=tasks / "repos", memory="1g", timeout=120, run_id=f"test-edit-formats-{fmt}")
    preds = [Prediction(inst.instance_id, t.patch, "scripted", t.rollout_id) for t in trajs]
    verdicts = {r.rollout_id: r.status for r in evaluate_predictions({inst.instance_id: inst}, preds, cfg)}
    assert verdicts == {"gold": "resolved", "bad": "empty_patch"}
