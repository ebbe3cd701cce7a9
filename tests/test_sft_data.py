"""gagar sft data: records are the judge's own conversation, split by instance, with only assistant turns trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.judge.prompt import Answer, ToolCall, parse_assistant, validate_answer
from sft.cli import main as sft_main
from sft.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tasks(bundled_tasks):
    return bundled_tasks


@pytest.fixture(scope="module")
def data(tasks, tmp_path_factory):
    out = tmp_path_factory.mktemp("sftdata")
    rc = sft_main(
        [
            "data",
            "--instances",
            str(tasks / "instances.jsonl"),
            "--repos-dir",
            str(tasks / "repos"),
            "--out",
            str(out),
            "--variants",
            "2",
            "--groups-per-instance",
            "2",
            "--max-instances",
            "4",
        ]
    )
    assert rc == 0
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_records_are_judge_conversations_split_by_instance(data):
    train, val = _rows(data / "train.jsonl"), _rows(data / "val.jsonl")
    assert train and val
    src_train = {r["source_instance_id"] for r in train}
    src_val = {r["source_instance_id"] for r in val}
    assert not src_train & src_val, "an instance is in both splits"
    for rec in train + val:
        msgs = rec["messages"]
        assert [m["role"] for m in msgs[:2]] == ["system", "user"]
        assert msgs[-1]["role"] == "assistant"
        labels = sorted(rec["label_to_rollout"])
        for m in msgs[2:-1]:
            if m["role"] == "assistant":
                assert isinstance(parse_assistant(m["content"]), ToolCall)
            else:
                assert m["role"] == "tool" and not m["content"].startswith("error:")
        answer = parse_assistant(msgs[-1]["content"])
        assert isinstance(answer, Answer) and validate_answer(answer, labels) == []
        # The answer ranks the known order, and the gold patch comes first.
        ranked = [rec["label_to_rollout"][lab] for lab in answer.ranking]
        assert ranked == rec["order"] and ranked[0] == "gold"
        for rid, kinds in rec["defects"].items():
            assert rec["tiers"][rid] == min(3, 1 + len(kinds))
    labels = _rows(data / "val_labels.jsonl")
    groups = _rows(data / "val_groups.jsonl")
    assert (
        {g["instance_id"] for g in groups}
        == {lab["instance_id"] for lab in labels}
        == {r["instance_id"] for r in val}
    )
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["records"] == {"train": len(train), "val": len(val)}


def test_renamed_copies_keep_the_label_and_make_every_citation_a_copy(tasks, tmp_path):
    """`--rename 1` adds one renamed copy per train record: same letters, order and tiers; none of the
    repository's own path components left in the copy; every path the answer cites is one the copy's prompt
    shows (the judge can copy it, and cannot recall it from another record); val records are never renamed."""
    import re

    out = tmp_path / "renamed"
    assert sft_main(["data", "--instances", str(tasks / "instances.jsonl"), "--repos-dir", str(tasks / "repos"),
                     "--out", str(out), "--variants", "2", "--groups-per-instance", "1", "--max-instances", "4",
                     "--inspect", "none", "--cite", "findings", "--rename", "1"]) == 0
    train, val = _rows(out / "train.jsonl"), _rows(out / "val.jsonl")
    plain = [r for r in train if not r.get("renamed")]
    renamed = [r for r in train if r.get("renamed")]
    assert len(renamed) == len(plain) > 0 and not any(r.get("renamed") for r in val)
    for orig, copy in zip(plain, renamed, strict=True):
        assert (copy["order"], copy["tiers"], copy["label_to_rollout"]) == (orig["order"], orig["tiers"],
                                                                           orig["label_to_rollout"])
        a, b = parse_assistant(orig["messages"][-1]["content"]), parse_assistant(copy["messages"][-1]["content"])
        assert isinstance(b, Answer) and (b.ranking, b.tiers) == (a.ranking, a.tiers)
        assert b.evidence != a.evidence or not a.evidence
        paths = re.findall(r"[\w./-]+\.(?:py|go|java)\b", orig["messages"][1]["content"])
        stems = {p.rsplit("/", 1)[-1].rsplit(".", 1)[0] for p in paths} - {"__init__"}
        prompt = copy["messages"][1]["content"]
        assert not [s for s in stems if len(s) > 2 and re.search(rf"(?<![A-Za-z0-9]){re.escape(s)}\.", prompt)]
        for cites in b.evidence.values():
            for cite in cites:
                assert cite.split(":", 1)[0] in prompt
    # --cite findings answers from what the prompt shows: a tier per the number of findings the prompt
    # counts for the candidate, never better than the candidate ranked above.
    for rec in plain + list(val):
        ans = parse_assistant(rec["messages"][-1]["content"])
        prompt = rec["messages"][1]["content"]
        shown = prompt[prompt.index("Static findings"):].splitlines()[1:]
        floor = 1
        for lab in ans.ranking:
            [line] = [ln for ln in shown if ln.startswith(f"{lab}: ")]
            words = ["no", "one", "two", "three", "four", "five", "six"]
            count = words.index(line.split()[1])
            assert (count == 0) == line.endswith(": no findings")  # findings follow the count, if any
            floor = max(floor, min(3, 1 + count))
            assert ans.tiers[lab] == floor, (rec["instance_id"], lab, line)


def test_record_round_trips_through_chat_template(data, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny"))
    rec = _rows(data / "train.jsonl")[0]
    out = tok.apply_chat_template(rec["messages"], return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    want = "".join(m["content"] + "<|im_end|>" for m in rec["messages"] if m["role"] == "assistant")
    assert trained == want
    context = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    for m in rec["messages"]:
        if m["role"] != "assistant":
            assert m["content"] in context


def test_from_results_labels_real_rollouts(tasks, tmp_path):
    # Stand-in for a `gagar eval` run (which needs Docker): results derived from the tasks' expected verdicts.
    results = tmp_path / "results.jsonl"
    rows = [
        {
            "instance_id": e["instance_id"],
            "rollout_id": e["rollout_id"],
            "status": e["status"],
            "resolved": e["resolved"],
            "tampered_tests": e.get("tampered_tests", False),
        }
        for e in _rows(tasks / "expected.jsonl")
    ]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "real"
    rc = sft_main(
        [
            "data",
            "--instances",
            str(tasks / "instances.jsonl"),
            "--repos-dir",
            str(tasks / "repos"),
            "--out",
            str(out),
            "--from-results",
            str(results),
            "--predictions",
            str(tasks / "predictions.jsonl"),
            "--max-instances",
            "3",
        ]
    )
    assert rc == 0
    recs = _rows(out / "train.jsonl") + _rows(out / "val.jsonl")
    assert len(recs) == 3
    passing = {(r["instance_id"], str(r["rollout_id"])) for r in rows if r["resolved"]}
    for rec in recs:
        assert {(rec["instance_id"], rid) for rid in rec["order"]} <= passing
        assert isinstance(parse_assistant(rec["messages"][-1]["content"]), Answer)


def test_bad_input_exits_2(tmp_path, capsys):
    assert (
        sft_main(
            [
                "data",
                "--instances",
                str(tmp_path / "none.jsonl"),
                "--repos-dir",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "none.jsonl" in capsys.readouterr().err
    assert (
        sft_main(["data", "--instances", "x", "--repos-dir", str(tmp_path), "--out", "o", "--kinds", "nope"])
        == 2
    )
    capsys.readouterr()
    assert sft_main(["data", "--instances", "x", "--repos-dir", str(tmp_path), "--out", "o", "--rename", "-1"]) == 2
    assert "--rename >= 0" in capsys.readouterr().err


@pytest.mark.docker
def test_verify_keeps_only_variants_that_pass_in_the_sandbox(tasks, tmp_path):
    out = tmp_path / "verified"
    rc = sft_main(
        [
            "data",
            "--instances",
            str(tasks / "instances.jsonl"),
            "--repos-dir",
            str(tasks / "repos"),
            "--out",
            str(out),
            "--max-instances",
            "1",
            "--groups-per-instance",
            "1",
            "--verify",
            "--timeout",
            "120",
        ]
    )
    assert rc == 0
    results = _rows(out / "verify" / "results.jsonl")
    assert results and all(r["status"] in {"resolved", "unresolved"} for r in results)
    passed = {r["rollout_id"].split(":")[1] for r in results if r["resolved"]}
    recs = _rows(out / "train.jsonl") + _rows(out / "val.jsonl")
    assert recs and all(set(r["order"]) <= passed for r in recs)
    assert json.loads((out / "manifest.json").read_text())["verified"] is True


class ScriptedTeacher:
    """Stands for a teacher LLM behind an OpenAI-compatible server: it reads every candidate's diff with the
    judge's tools, then ranks the candidates by diff length, LONGEST first (the heuristic would not), so the labels
    show whose order was used. The HTTP server (a FastAPI stand-in endpoint) and the `openai` client are real."""

    name = "scripted-teacher"

    def chat_with_usage(self, messages, *, max_new_tokens=512, temperature=0.0):
        import re

        letters = re.search(r"Candidates \(all pass the tests\): ([A-Z, ]+)", messages[1]["content"]).group(1)
        letters = [x.strip() for x in letters.split(",")]
        seen = {}
        for m in messages:
            hit = re.match(r"\[show_diff result\]\ncandidate ([A-Z]+) diff", m["content"]) or re.match(
                r"candidate ([A-Z]+) diff", m["content"]
            )
            if hit and m["role"] in ("tool", "user"):
                seen[hit.group(1)] = len(m["content"])
        todo = [x for x in letters if x not in seen]
        if todo:
            call = {"name": "show_diff", "arguments": {"candidate": todo[0]}}
            text = "<tool_call>" + json.dumps(call) + "</tool_call>"
        else:
            ranking = sorted(letters, key=seen.__getitem__, reverse=True)
            tiers = {x: min(3, 1 + i) for i, x in enumerate(ranking)}
            evidence = {x: [f"diff of {x} is longer than needed"] for x in ranking[1:]}
            text = (
                "<answer>"
                + json.dumps({"ranking": ranking, "tiers": tiers, "evidence": evidence})
                + "</answer>"
            )
        return text, 0, 1


def _teacher_app(teacher: ScriptedTeacher):
    """A stand-in OpenAI chat endpoint (FastAPI) answering with the scripted teacher's replies."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/chat/completions")
    def chat(body: dict) -> dict:
        text, _, _ = teacher.chat_with_usage(body["messages"])
        return {"id": "chatcmpl-teacher", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}

    return app


def test_from_results_with_a_teacher_over_http(tasks, tmp_path):
    import threading

    from inference.serve import Server

    server = Server(_teacher_app(ScriptedTeacher()), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        results = tmp_path / "results.jsonl"
        expected = _rows(tasks / "expected.jsonl")
        results.write_text("".join(json.dumps({**e, "tampered_tests": False}) + "\n" for e in expected))
        out = tmp_path / "teacher"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc = sft_main(
            [
                "data",
                "--instances",
                str(tasks / "instances.jsonl"),
                "--repos-dir",
                str(tasks / "repos"),
                "--out",
                str(out),
                "--from-results",
                str(results),
                "--predictions",
                str(tasks / "predictions.jsonl"),
                "--max-instances",
                "2",
                "--labeller",
                "teacher",
                "--base-url",
                url,
                "--model",
                "teacher",
            ]
        )
    finally:
        server.shutdown()
    assert rc == 0
    patches = {
        (p["instance_id"], str(p["rollout_id"])): p["model_patch"] for p in _rows(tasks / "predictions.jsonl")
    }
    recs = _rows(out / "train.jsonl") + _rows(out / "val.jsonl")
    assert len(recs) == 2
    for rec in recs:
        # The teacher's order (longest diff first) is the record's label, mapped back from its letters.
        by_len = sorted(rec["order"], key=lambda r: len(patches[(rec["instance_id"], r)]), reverse=True)
        assert rec["order"] == by_len and len(rec["order"]) >= 3
